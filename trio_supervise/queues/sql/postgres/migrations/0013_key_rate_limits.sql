-- Rate limits per concurrency key (issue 33). See schema.sql.
CREATE TABLE trio_supervise_key_rates (
    key             text          PRIMARY KEY,
    rate_limit      integer,
    period_us       bigint,
    starts          timestamptz[] NOT NULL DEFAULT '{}',
    throttled_until timestamptz
);
