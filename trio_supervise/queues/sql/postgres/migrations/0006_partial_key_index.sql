-- 0006: the idempotency key's uniqueness is a partial index over the items that hold a key.
-- A UNIQUE column's index holds a NULL entry for every row, so every claim and settlement (which
-- never touch the key, but are not HOT updates: they change indexed columns) wrote an entry
-- into it for items that have no key, most of them. Enqueues that take a key infer this index
-- (ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL); lookups by key
-- (= ANY(...)) imply the predicate and still use it.

ALTER TABLE trio_supervise_items DROP CONSTRAINT trio_supervise_items_idempotency_key_key;

-- Serves uniqueness of held keys and lookups by key.
CREATE UNIQUE INDEX trio_supervise_items_idempotency_key_idx
    ON trio_supervise_items (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
