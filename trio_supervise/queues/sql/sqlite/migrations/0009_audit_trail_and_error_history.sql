-- 0009: the console's audit trail, kept with the items so that it survives a restart (who did
-- what, to what, when, and how it went), oldest first for retention; and the items whose error
-- history is not empty, by when they last changed, for reading recent errors newest first; and
-- each item's trace context (the W3C traceparent of the span current at its enqueue).

ALTER TABLE trio_supervise_items ADD COLUMN traceparent TEXT;

CREATE TABLE trio_supervise_audit (
    seq     INTEGER PRIMARY KEY NOT NULL,
    at      INTEGER NOT NULL,
    who     TEXT    NOT NULL,
    address TEXT    NOT NULL,
    action  TEXT    NOT NULL,
    target  TEXT    NOT NULL,
    ok      INTEGER NOT NULL,
    result  TEXT    NOT NULL
);

CREATE INDEX trio_supervise_audit_at_idx ON trio_supervise_audit (at, seq);

CREATE INDEX trio_supervise_items_errors_idx
    ON trio_supervise_items (updated_at, id)
    WHERE errors <> '[]';
