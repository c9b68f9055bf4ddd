-- Rate limits on named queues (issue 33): see schema.sql.
CREATE TABLE trio_supervise_queue_rates (
    queue           TEXT    PRIMARY KEY NOT NULL,
    rate_limit      INTEGER NOT NULL,
    period_us       INTEGER NOT NULL,
    starts          TEXT    NOT NULL DEFAULT '[]',
    throttled_until INTEGER
) WITHOUT ROWID;
