-- 0003: the job model's claiming side: priorities, named queues, fleet-wide concurrency keys,
-- evaluation timeouts, results, a bounded error history, and paused queues.

-- Lower numbers are claimed first (as in Oban and River); 0 is the default.
ALTER TABLE trio_supervise_items ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
-- The named queue the item waits in; each runner serves its queues with their own limits.
ALTER TABLE trio_supervise_items ADD COLUMN queue TEXT NOT NULL DEFAULT 'default';
-- At most concurrency_limit items sharing a concurrency_key run at once, fleet-wide.
ALTER TABLE trio_supervise_items ADD COLUMN concurrency_key TEXT;
ALTER TABLE trio_supervise_items ADD COLUMN concurrency_limit INTEGER;
-- Seconds an evaluation may take (NULL: the driver's timeout, or none).
ALTER TABLE trio_supervise_items ADD COLUMN timeout REAL;
-- The JSON result a completed item was stopped with (NULL: none).
ALTER TABLE trio_supervise_items ADD COLUMN result TEXT;
-- The last few errors, oldest first (the newest MAX_ERRORS kept): a JSON array of
-- {at (microseconds since the epoch), worker, attempt, error}, where error is the stored error
-- text (its first line the summary, any trimmed traceback on the lines after it).
ALTER TABLE trio_supervise_items ADD COLUMN errors TEXT NOT NULL DEFAULT '[]';

-- Serves claims: one queue's claimable items in (priority, due_at, id) order.
DROP INDEX trio_supervise_items_claim_idx;
CREATE INDEX trio_supervise_items_claim_idx
    ON trio_supervise_items (queue, priority, due_at, id)
    WHERE state IN ('queued', 'running');

-- Serves the concurrency-key check: the running items of one key.
CREATE INDEX trio_supervise_items_key_idx
    ON trio_supervise_items (concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;

-- Queues paused across the fleet: their items are not claimed until resumed.
CREATE TABLE trio_supervise_paused_queues (
    queue     TEXT    PRIMARY KEY NOT NULL,
    paused_at INTEGER NOT NULL
);
