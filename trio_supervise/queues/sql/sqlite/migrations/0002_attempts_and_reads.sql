-- 0002: attempts counted by the claim itself, and an index per state for status reads.

-- Claims since the last successful evaluation; the claim statement adds one.
ALTER TABLE trio_supervise_items ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0;

-- Serves listing: one range per state in (due_at, id) order, so a page costs the rows shown.
CREATE INDEX trio_supervise_items_state_due_idx
    ON trio_supervise_items (state, due_at, id);
