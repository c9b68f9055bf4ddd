-- Flow control (issue 33): rate limits on named queues, start deadlines. See schema.sql.
CREATE TABLE trio_supervise_queue_rates (
    queue           text          PRIMARY KEY,
    rate_limit      integer       NOT NULL,
    period_us       bigint        NOT NULL,
    starts          timestamptz[] NOT NULL DEFAULT '{}',
    throttled_until timestamptz
);

ALTER TABLE trio_supervise_items ADD COLUMN start_by timestamptz;
