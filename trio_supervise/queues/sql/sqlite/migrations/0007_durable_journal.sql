-- 0007: durable workflows (issue 31). Each item incarnation's journal (steps, sleeps, waits and
-- version markers by position, written fenced by the lease version) and the events sent to it.
-- Both name the incarnation, so an item id used again never sees an earlier journal, and both
-- go with their item when it is deleted or pruned (the trigger).

-- An event sent while its item runs: the evaluation's reschedule makes it due at once instead
-- (the evaluation may have looked for the event before it came). Cleared by every settlement.
ALTER TABLE trio_supervise_items ADD COLUMN event_woken INTEGER NOT NULL DEFAULT 0;

CREATE TABLE trio_supervise_journal (
    item_id     TEXT    NOT NULL,
    incarnation INTEGER NOT NULL,
    position    INTEGER NOT NULL,
    kind        TEXT    NOT NULL CHECK (kind IN ('step', 'sleep', 'wait', 'patch')),
    name        TEXT    NOT NULL,
    result      TEXT    NOT NULL DEFAULT 'null',
    attempts    INTEGER NOT NULL DEFAULT 1,
    started_at  INTEGER NOT NULL,
    finished_at INTEGER,
    wake_at     INTEGER,
    PRIMARY KEY (item_id, incarnation, position)
) WITHOUT ROWID;

CREATE TABLE trio_supervise_events (
    seq         INTEGER PRIMARY KEY,
    item_id     TEXT    NOT NULL,
    incarnation INTEGER NOT NULL,
    name        TEXT    NOT NULL,
    payload     TEXT    NOT NULL,
    sent_at     INTEGER NOT NULL
);
CREATE INDEX trio_supervise_events_item_idx
    ON trio_supervise_events (item_id, incarnation, seq);

CREATE TRIGGER trio_supervise_items_journal_delete
AFTER DELETE ON trio_supervise_items
BEGIN
    DELETE FROM trio_supervise_journal WHERE item_id = OLD.id AND incarnation = OLD.incarnation;
    DELETE FROM trio_supervise_events WHERE item_id = OLD.id AND incarnation = OLD.incarnation;
END;
