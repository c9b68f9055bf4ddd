-- Rate limits per concurrency key (issue 33). See schema.sql.
CREATE TABLE trio_supervise_key_rates (
    key             TEXT    PRIMARY KEY NOT NULL,
    rate_limit      INTEGER,
    period_us       INTEGER,
    starts          TEXT    NOT NULL DEFAULT '[]',
    throttled_until INTEGER
) WITHOUT ROWID;
