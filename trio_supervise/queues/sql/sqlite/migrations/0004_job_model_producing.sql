-- 0004: the job model's producing side: child items and fan-in, uniqueness scopes, retention.

-- The item whose outcome created this one (NULL: enqueued from outside).
ALTER TABLE trio_supervise_items ADD COLUMN parent_id TEXT;
-- How many of this item's children it still waits for; while above 0 the item is not due.
ALTER TABLE trio_supervise_items ADD COLUMN waiting_children INTEGER NOT NULL DEFAULT 0;
-- How long idempotency_key holds: 'forever' (the default, as before), 'unfinished' (until the
-- item finishes) or 'period' (until unique_until).
ALTER TABLE trio_supervise_items ADD COLUMN unique_scope TEXT NOT NULL DEFAULT 'forever';
ALTER TABLE trio_supervise_items ADD COLUMN unique_until INTEGER;
-- A key whose scope has lapsed moves here from idempotency_key, so a new item may take it while
-- this one can still be found by it.
ALTER TABLE trio_supervise_items ADD COLUMN released_key TEXT;
-- The parent's lease version when its outcome created this child and waits for it (NULL: not
-- waited for, or counted already): a child's finish counts once, toward that wait only.
ALTER TABLE trio_supervise_items ADD COLUMN parent_version INTEGER;

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

-- Exact item counts per (spec, queue, state), kept by the triggers below, so that counts() and
-- the queues' counts (every /metrics scrape and status page) read a few rows, not every item
-- ever finished. SQLite has one writer at a time, so the triggers update the counts directly.
-- Groups that reach 0 keep their row (n = 0), which reads skip.
CREATE TABLE trio_supervise_counts (
    spec_id TEXT    NOT NULL,
    queue   TEXT    NOT NULL,
    state   TEXT    NOT NULL,
    n       INTEGER NOT NULL,
    PRIMARY KEY (spec_id, queue, state)
) WITHOUT ROWID;

CREATE TRIGGER trio_supervise_items_counted_insert
AFTER INSERT ON trio_supervise_items
BEGIN
    INSERT INTO trio_supervise_counts (spec_id, queue, state, n)
    VALUES (NEW.spec_id, NEW.queue, NEW.state, 1)
    ON CONFLICT (spec_id, queue, state) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER trio_supervise_items_counted_update
AFTER UPDATE OF state, spec_id, queue ON trio_supervise_items
WHEN OLD.state IS NOT NEW.state OR OLD.spec_id IS NOT NEW.spec_id OR OLD.queue IS NOT NEW.queue
BEGIN
    UPDATE trio_supervise_counts SET n = n - 1
    WHERE spec_id = OLD.spec_id AND queue = OLD.queue AND state = OLD.state;
    INSERT INTO trio_supervise_counts (spec_id, queue, state, n)
    VALUES (NEW.spec_id, NEW.queue, NEW.state, 1)
    ON CONFLICT (spec_id, queue, state) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER trio_supervise_items_counted_delete
AFTER DELETE ON trio_supervise_items
BEGIN
    UPDATE trio_supervise_counts SET n = n - 1
    WHERE spec_id = OLD.spec_id AND queue = OLD.queue AND state = OLD.state;
END;

-- The items already there, counted once (the triggers count every change from here on).
INSERT INTO trio_supervise_counts (spec_id, queue, state, n)
SELECT spec_id, queue, state, count(*) FROM trio_supervise_items GROUP BY spec_id, queue, state;
