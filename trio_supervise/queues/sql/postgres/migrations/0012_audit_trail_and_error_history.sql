-- 0012: the console's audit trail, kept with the items so that it survives a restart (who did
-- what, to what, when, and how it went), oldest first for retention; and the items whose error
-- history is not empty, by when they last changed, for reading recent errors newest first; and
-- each item's trace context (the W3C traceparent of the span current at its enqueue): a
-- column without a default rewrites nothing.
-- The index adds no cost to an update that changes no error: updated_at is indexed already
-- (trio_supervise_items_finished_idx), so such an update was never a HOT one.

ALTER TABLE trio_supervise_items ADD COLUMN traceparent text;

CREATE TABLE trio_supervise_audit (
    seq     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL,
    who     text        NOT NULL,
    address text        NOT NULL,
    action  text        NOT NULL,
    target  text        NOT NULL,
    ok      boolean     NOT NULL,
    result  text        NOT NULL
);

CREATE INDEX trio_supervise_audit_at_idx ON trio_supervise_audit (at, seq);

CREATE INDEX trio_supervise_items_errors_idx
    ON trio_supervise_items (updated_at, id)
    WHERE errors <> '[]'::jsonb;
