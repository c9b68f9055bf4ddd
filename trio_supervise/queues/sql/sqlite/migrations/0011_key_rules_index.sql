-- The key rate rules apart from the keys' logs (see schema.sql): a claim reads every rule and
-- the logs of its own keys, and without this index it read every key's row to find the rules.
CREATE INDEX trio_supervise_key_rates_rules_idx
    ON trio_supervise_key_rates (key)
    WHERE rate_limit IS NOT NULL;
