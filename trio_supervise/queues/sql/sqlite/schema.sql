-- The current SQLite schema, applied as a whole to an empty database.
-- It must equal the result of applying every file in migrations/ in order
-- (tests/queues/test_migrations.py checks that). Version: see the newest migration.
-- Times are integer microseconds since the Unix epoch (UTC), so they sort and compare exactly.

CREATE TABLE trio_supervise_items (
    id               TEXT    PRIMARY KEY NOT NULL,
    spec_id          TEXT    NOT NULL,
    tenant_id        TEXT    NOT NULL DEFAULT '',
    subject_id       TEXT    NOT NULL DEFAULT '',
    config           TEXT    NOT NULL DEFAULT '{}',
    state            TEXT    NOT NULL DEFAULT 'queued'
        CHECK (state IN ('queued', 'running', 'completed', 'cancelled', 'dead')),
    due_at           INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_expires_at INTEGER,
    lease_version    INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    error_count      INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    idempotency_key  TEXT    UNIQUE,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 0,
    CHECK ((state = 'running') = (lease_expires_at IS NOT NULL))
);

-- Serves claims: walk the claimable items in (due_at, id) order and stop at the limit.
CREATE INDEX trio_supervise_items_claim_idx
    ON trio_supervise_items (due_at, id)
    WHERE state IN ('queued', 'running');

-- Serves counts, listing and inspection by spec.
CREATE INDEX trio_supervise_items_spec_state_idx
    ON trio_supervise_items (spec_id, state);

-- Serves listing: one range per state in (due_at, id) order, so a page costs the rows shown.
CREATE INDEX trio_supervise_items_state_due_idx
    ON trio_supervise_items (state, due_at, id);
