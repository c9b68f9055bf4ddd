-- Rate limits on named queues (issue 33): see schema.sql.
CREATE TABLE trio_supervise_queue_rates (
    queue           text          PRIMARY KEY,
    rate_limit      integer       NOT NULL,
    period_us       bigint        NOT NULL,
    starts          timestamptz[] NOT NULL DEFAULT '{}',
    throttled_until timestamptz
);
