-- Flow control (issue 33): rate limits on named queues, start deadlines. See schema.sql.
CREATE TABLE trio_supervise_queue_rates (
    queue           TEXT    PRIMARY KEY NOT NULL,
    rate_limit      INTEGER NOT NULL,
    period_us       INTEGER NOT NULL,
    starts          TEXT    NOT NULL DEFAULT '[]',
    throttled_until INTEGER
) WITHOUT ROWID;

ALTER TABLE trio_supervise_items ADD COLUMN start_by INTEGER;
