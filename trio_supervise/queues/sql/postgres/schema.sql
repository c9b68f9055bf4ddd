-- The current PostgreSQL schema, applied as a whole to an empty database.
-- It must equal the result of applying every file in migrations/ in order
-- (tests/queues/test_migrations.py checks that). Version: see the newest migration.

CREATE TABLE trio_supervise_items (
    id               text        PRIMARY KEY,
    spec_id          text        NOT NULL,
    tenant_id        text        NOT NULL DEFAULT '',
    subject_id       text        NOT NULL DEFAULT '',
    config           jsonb       NOT NULL DEFAULT '{}',
    state            text        NOT NULL DEFAULT 'queued'
        CHECK (state IN ('queued', 'running', 'completed', 'cancelled', 'dead')),
    due_at           timestamptz NOT NULL,
    lease_owner      text,
    lease_expires_at timestamptz,
    lease_version    bigint      NOT NULL DEFAULT 0,
    cancel_requested boolean     NOT NULL DEFAULT false,
    error_count      integer     NOT NULL DEFAULT 0,
    last_error       text,
    idempotency_key  text        UNIQUE,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    attempt          integer     NOT NULL DEFAULT 0,
    CONSTRAINT trio_supervise_items_lease_check
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
