-- 0004: the job model's producing side: child items and fan-in, uniqueness scopes, retention.

-- The item whose outcome created this one (NULL: enqueued from outside).
ALTER TABLE trio_supervise_items ADD COLUMN parent_id text;
-- How many of this item's children it still waits for; while above 0 the item is not due.
ALTER TABLE trio_supervise_items ADD COLUMN waiting_children integer NOT NULL DEFAULT 0;
-- How long idempotency_key holds: 'forever' (the default, as before), 'unfinished' (until the
-- item finishes) or 'period' (until unique_until).
ALTER TABLE trio_supervise_items ADD COLUMN unique_scope text NOT NULL DEFAULT 'forever';
ALTER TABLE trio_supervise_items ADD COLUMN unique_until timestamptz;
-- A key whose scope has lapsed moves here from idempotency_key, so a new item may take it while
-- this one can still be found by it.
ALTER TABLE trio_supervise_items ADD COLUMN released_key text;
-- The parent's lease version when its outcome created this child and waits for it (NULL: not
-- waited for, or counted already): a child's finish counts once, toward that wait only.
ALTER TABLE trio_supervise_items ADD COLUMN parent_version bigint;

-- Serves a parent's reads of its children and the fan-in on a child's settlement.
CREATE INDEX trio_supervise_items_parent_idx
    ON trio_supervise_items (parent_id)
    WHERE parent_id IS NOT NULL;

-- Serves lookups by a released key (items show --key, uniqueness).
CREATE INDEX trio_supervise_items_released_key_idx
    ON trio_supervise_items (released_key)
    WHERE released_key IS NOT NULL;

-- Serves retention: one finished state's oldest items first, by when they last changed.
CREATE INDEX trio_supervise_items_finished_idx
    ON trio_supervise_items (state, updated_at)
    WHERE state IN ('completed', 'cancelled', 'dead');

-- Exact item counts per (spec, queue, state), so that counts() and the queues' counts (every
-- /metrics scrape and status page) read a few rows, not every item ever finished. No writer
-- updates a shared counter row (that would serialise every claim and settlement of the fleet on
-- it): each writing statement appends its net change per group to trio_supervise_count_deltas,
-- and a read sums trio_supervise_counts and the deltas in one snapshot, so it is exact. Now and
-- then (one writing statement in 50, at READ COMMITTED, when nobody else is at it) the deltas
-- are folded into trio_supervise_counts, keeping them few; a fold takes an advisory lock, so
-- only one runs at a time and nobody waits for it.
CREATE TABLE trio_supervise_counts (
    spec_id text   NOT NULL,
    queue   text   NOT NULL,
    state   text   NOT NULL,
    n       bigint NOT NULL,
    PRIMARY KEY (spec_id, queue, state)
);

CREATE TABLE trio_supervise_count_deltas (
    spec_id text   NOT NULL,
    queue   text   NOT NULL,
    state   text   NOT NULL,
    n       bigint NOT NULL
);

CREATE FUNCTION trio_supervise_fold_counts() RETURNS void
LANGUAGE sql SET search_path FROM CURRENT AS $$
    WITH moved AS (
        DELETE FROM trio_supervise_count_deltas RETURNING spec_id, queue, state, n
    )
    INSERT INTO trio_supervise_counts AS c (spec_id, queue, state, n)
    SELECT spec_id, queue, state, sum(n) FROM moved GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (spec_id, queue, state) DO UPDATE SET n = c.n + excluded.n;
    DELETE FROM trio_supervise_counts WHERE n = 0;
$$;

CREATE FUNCTION trio_supervise_count_changes() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO trio_supervise_count_deltas (spec_id, queue, state, n)
        SELECT spec_id, queue, state, count(*) FROM trio_supervise_new_rows GROUP BY 1, 2, 3;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO trio_supervise_count_deltas (spec_id, queue, state, n)
        SELECT spec_id, queue, state, -count(*) FROM trio_supervise_old_rows GROUP BY 1, 2, 3;
    ELSE
        INSERT INTO trio_supervise_count_deltas (spec_id, queue, state, n)
        SELECT spec_id, queue, state, sum(n) FROM (
            SELECT spec_id, queue, state, 1 AS n FROM trio_supervise_new_rows
            UNION ALL
            SELECT spec_id, queue, state, -1 AS n FROM trio_supervise_old_rows
        ) AS changed
        GROUP BY 1, 2, 3
        HAVING sum(n) <> 0;
    END IF;
    IF random() < 0.02
        AND current_setting('transaction_isolation') = 'read committed'
        AND pg_try_advisory_xact_lock(
            hashtextextended('trio_supervise:counts:' || current_schema(), 0)
        )
    THEN
        PERFORM trio_supervise_fold_counts();
    END IF;
    RETURN NULL;
END;
$$;

CREATE FUNCTION trio_supervise_count_reset() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM trio_supervise_counts;
    DELETE FROM trio_supervise_count_deltas;
    RETURN NULL;
END;
$$;

CREATE TRIGGER trio_supervise_items_counted_insert
AFTER INSERT ON trio_supervise_items
REFERENCING NEW TABLE AS trio_supervise_new_rows
FOR EACH STATEMENT EXECUTE FUNCTION trio_supervise_count_changes();

CREATE TRIGGER trio_supervise_items_counted_update
AFTER UPDATE ON trio_supervise_items
REFERENCING OLD TABLE AS trio_supervise_old_rows NEW TABLE AS trio_supervise_new_rows
FOR EACH STATEMENT EXECUTE FUNCTION trio_supervise_count_changes();

CREATE TRIGGER trio_supervise_items_counted_delete
AFTER DELETE ON trio_supervise_items
REFERENCING OLD TABLE AS trio_supervise_old_rows
FOR EACH STATEMENT EXECUTE FUNCTION trio_supervise_count_changes();

CREATE TRIGGER trio_supervise_items_counted_truncate
AFTER TRUNCATE ON trio_supervise_items
FOR EACH STATEMENT EXECUTE FUNCTION trio_supervise_count_reset();

-- The items already there, counted once, after the triggers exist (creating them locked out
-- writers until this transaction commits, so no change is missed or counted twice).
INSERT INTO trio_supervise_counts (spec_id, queue, state, n)
SELECT spec_id, queue, state, count(*) FROM trio_supervise_items GROUP BY spec_id, queue, state;
