-- 0010: durable workflows (issue 31). Each item incarnation's journal (steps, sleeps, waits and
-- version markers by position, written fenced by the lease version) and the events sent to it.
-- Both name the incarnation, so an item id used again never sees an earlier journal, and both
-- go with their item when it is deleted or pruned (one trigger per statement).

-- An event sent while its item runs: the evaluation's reschedule makes it due at once instead
-- (the evaluation may have looked for the event before it came). Cleared by every settlement.
ALTER TABLE trio_supervise_items ADD COLUMN event_woken boolean NOT NULL DEFAULT false;

CREATE TABLE trio_supervise_journal (
    item_id     text        NOT NULL,
    incarnation bigint      NOT NULL,
    position    integer     NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('step', 'sleep', 'wait', 'patch')),
    name        text        NOT NULL,
    result      jsonb       NOT NULL DEFAULT 'null'::jsonb,
    attempts    integer     NOT NULL DEFAULT 1,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    wake_at     timestamptz,
    PRIMARY KEY (item_id, incarnation, position)
);

CREATE TABLE trio_supervise_events (
    seq         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item_id     text        NOT NULL,
    incarnation bigint      NOT NULL,
    name        text        NOT NULL,
    payload     jsonb       NOT NULL,
    sent_at     timestamptz NOT NULL
);
CREATE INDEX trio_supervise_events_item_idx
    ON trio_supervise_events (item_id, incarnation, seq);

CREATE FUNCTION trio_supervise_drop_journals() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM trio_supervise_journal;
        DELETE FROM trio_supervise_events;
        RETURN NULL;
    END IF;
    DELETE FROM trio_supervise_journal AS j USING trio_supervise_gone_rows AS g
    WHERE j.item_id = g.id AND j.incarnation = g.incarnation;
    DELETE FROM trio_supervise_events AS e USING trio_supervise_gone_rows AS g
    WHERE e.item_id = g.id AND e.incarnation = g.incarnation;
    RETURN NULL;
END;
$$;

CREATE TRIGGER trio_supervise_items_journal_delete
AFTER DELETE ON trio_supervise_items
REFERENCING OLD TABLE AS trio_supervise_gone_rows
FOR EACH STATEMENT EXECUTE FUNCTION trio_supervise_drop_journals();

CREATE TRIGGER trio_supervise_items_journal_truncate
AFTER TRUNCATE ON trio_supervise_items
FOR EACH STATEMENT EXECUTE FUNCTION trio_supervise_drop_journals();
