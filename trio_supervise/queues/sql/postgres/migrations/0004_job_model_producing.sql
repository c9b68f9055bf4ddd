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
