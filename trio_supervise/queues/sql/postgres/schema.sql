-- The current PostgreSQL schema, applied as a whole to an empty database.
-- It must equal the result of applying every file in migrations/ in order
-- (tests/queues/test_migrations.py checks that). Version: see the newest migration.

-- The sequences lease versions and incarnations are drawn from: a number one gave is never given
-- again, so a reused item id never meets its predecessor's versions (schema 0008).
CREATE SEQUENCE trio_supervise_lease_versions;
CREATE SEQUENCE trio_supervise_incarnations;

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
    idempotency_key  text,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    attempt          integer     NOT NULL DEFAULT 0,
    priority         integer     NOT NULL DEFAULT 0,
    queue            text        NOT NULL DEFAULT 'default',
    concurrency_key  text,
    concurrency_limit integer,
    timeout          double precision,
    result           jsonb,
    errors           jsonb       NOT NULL DEFAULT '[]',
    parent_id        text,
    waiting_children integer     NOT NULL DEFAULT 0,
    unique_scope     text        NOT NULL DEFAULT 'forever',
    unique_until     timestamptz,
    released_key     text,
    parent_version   bigint,
    incarnation      bigint      NOT NULL DEFAULT nextval('trio_supervise_incarnations'),
    parent_incarnation bigint,
    tags             jsonb       NOT NULL DEFAULT '[]'::jsonb,
    event_woken      boolean     NOT NULL DEFAULT false,
    start_by         timestamptz,
    traceparent      text,
    CONSTRAINT trio_supervise_items_lease_check
        CHECK ((state = 'running') = (lease_expires_at IS NOT NULL))
);

-- Serves uniqueness of held keys and lookups by key: only items that hold a key are in it (a
-- UNIQUE column would index a NULL for every item, written again by every claim and settlement).
CREATE UNIQUE INDEX trio_supervise_items_idempotency_key_idx
    ON trio_supervise_items (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Serves claims: one queue's queued items in (priority, due_at, id) order; lower priority
-- numbers first. Running items are not in it: they would sit at its head (the oldest due_at),
-- and every claim would visit each of them before the first claimable one.
CREATE INDEX trio_supervise_items_claim_idx
    ON trio_supervise_items (queue, priority, due_at, id)
    WHERE state = 'queued';

-- Serves the rescue of expired leases by claims: one queue's running items by lease expiry;
-- and every read of running items (the only index that holds them all).
CREATE INDEX trio_supervise_items_lease_idx
    ON trio_supervise_items (queue, lease_expires_at)
    WHERE state = 'running';

-- Serves the concurrency-key check: the running items of one key.
CREATE INDEX trio_supervise_items_key_idx
    ON trio_supervise_items (concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;

-- Serves listing and inspection by spec. Running items are not in it, nor in the listing
-- index below (schema 0007): a claim and a settlement are not HOT updates, so each would write
-- an entry into both. The running items (the leases in flight) are all in the lease index.
CREATE INDEX trio_supervise_items_spec_state_idx
    ON trio_supervise_items (spec_id, state)
    WHERE state <> 'running';

-- Serves listing: one range per state in (due_at, id) order, so a page costs the rows shown
-- (the running state's page: its rows from the lease index, sorted).
CREATE INDEX trio_supervise_items_state_due_idx
    ON trio_supervise_items (state, due_at, id)
    WHERE state <> 'running';

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

-- Each schedule's last enqueued fire, fleet-wide: a fire at or before it is never enqueued again.
CREATE TABLE trio_supervise_schedules (
    name         text        PRIMARY KEY,
    last_fire_at timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL
);

-- Queues paused across the fleet: their items are not claimed until resumed.
CREATE TABLE trio_supervise_paused_queues (
    queue     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);

-- Rate-limited queues (schema 0011): at most rate_limit claims in any period_us, fleet-wide
-- (docs/flow-control.md). starts: the latest claims' times (oldest first, at most rate_limit
-- of them), written by the claims, which take turns on the row's lock; throttled_until: while
-- that log is full, when it lets a claim in again (what next_due_at waits for).
CREATE TABLE trio_supervise_queue_rates (
    queue           text          PRIMARY KEY,
    rate_limit      integer       NOT NULL,
    period_us       bigint        NOT NULL,
    starts          timestamptz[] NOT NULL DEFAULT '{}',
    throttled_until timestamptz
);

-- Rate limits per concurrency key (docs/flow-control.md). A row with a rate_limit is a rule: a
-- key, or a template over {tenant} and {subject} whose keys each have a window of their own. A
-- row's starts are a key's log (the key a rule holds, with or without a rule of its own
-- name): its latest claims' times, written by the claims of its items under the claim's lock
-- (SQLite's write lock; on PostgreSQL the key's advisory lock); throttled_until: while that
-- log is full, when it lets a claim in again (what a claim's window and next_due_at skip to).
CREATE TABLE trio_supervise_key_rates (
    key             text          PRIMARY KEY,
    rate_limit      integer,
    period_us       bigint,
    starts          timestamptz[] NOT NULL DEFAULT '{}',
    throttled_until timestamptz
);

-- The rules apart from the logs (schema 0014): a claim reads every rule and its own keys' logs,
-- not every key's row (one per key ever started under a rule).
CREATE INDEX trio_supervise_key_rates_rules_idx
    ON trio_supervise_key_rates (key)
    WHERE rate_limit IS NOT NULL;

-- Exact item counts per (spec, queue, state), so that counts() and the queues' counts (every
-- /metrics scrape and status page) read a few rows, not every item ever finished. No writer
-- updates a shared counter row (that would serialise every claim and settlement of the fleet on
-- it): each writing statement appends its net change per group to trio_supervise_count_deltas,
-- and a read sums trio_supervise_counts and the deltas in one snapshot, so it is exact. Now and
-- then (one writing statement in 50, at READ COMMITTED, when nobody else is at it) the deltas
-- are folded into trio_supervise_counts, keeping them few; a fold takes an advisory lock, so
-- only one runs at a time and nobody waits for it.
CREATE TABLE trio_supervise_counts (
    spec_id text   NOT NULL,
    queue   text   NOT NULL,
    state   text   NOT NULL,
    n       bigint NOT NULL,
    PRIMARY KEY (spec_id, queue, state)
);

CREATE TABLE trio_supervise_count_deltas (
    spec_id text   NOT NULL,
    queue   text   NOT NULL,
    state   text   NOT NULL,
    n       bigint NOT NULL
);

CREATE FUNCTION trio_supervise_fold_counts() RETURNS void
LANGUAGE sql SET search_path FROM CURRENT AS $$
    WITH moved AS (
        DELETE FROM trio_supervise_count_deltas RETURNING spec_id, queue, state, n
    )
    INSERT INTO trio_supervise_counts AS c (spec_id, queue, state, n)
    SELECT spec_id, queue, state, sum(n) FROM moved GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (spec_id, queue, state) DO UPDATE SET n = c.n + excluded.n;
    DELETE FROM trio_supervise_counts WHERE n = 0;
$$;

CREATE FUNCTION trio_supervise_count_changes() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO trio_supervise_count_deltas (spec_id, queue, state, n)
        SELECT spec_id, queue, state, count(*) FROM trio_supervise_new_rows GROUP BY 1, 2, 3;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO trio_supervise_count_deltas (spec_id, queue, state, n)
        SELECT spec_id, queue, state, -count(*) FROM trio_supervise_old_rows GROUP BY 1, 2, 3;
    ELSE
        INSERT INTO trio_supervise_count_deltas (spec_id, queue, state, n)
        SELECT spec_id, queue, state, sum(n) FROM (
            SELECT spec_id, queue, state, 1 AS n FROM trio_supervise_new_rows
            UNION ALL
            SELECT spec_id, queue, state, -1 AS n FROM trio_supervise_old_rows
        ) AS changed
        GROUP BY 1, 2, 3
        HAVING sum(n) <> 0;
    END IF;
    IF random() < 0.02
        AND current_setting('transaction_isolation') = 'read committed'
        AND pg_try_advisory_xact_lock(
            hashtextextended('trio_supervise:counts:' || current_schema(), 0)
        )
    THEN
        PERFORM trio_supervise_fold_counts();
    END IF;
    RETURN NULL;
END;
$$;

CREATE FUNCTION trio_supervise_count_reset() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM trio_supervise_counts;
    DELETE FROM trio_supervise_count_deltas;
    RETURN NULL;
END;
$$;

CREATE TRIGGER trio_supervise_items_counted_insert
AFTER INSERT ON trio_supervise_items
REFERENCING NEW TABLE AS trio_supervise_new_rows
FOR EACH STATEMENT EXECUTE FUNCTION trio_supervise_count_changes();

CREATE TRIGGER trio_supervise_items_counted_update
AFTER UPDATE ON trio_supervise_items
REFERENCING OLD TABLE AS trio_supervise_old_rows NEW TABLE AS trio_supervise_new_rows
FOR EACH STATEMENT EXECUTE FUNCTION trio_supervise_count_changes();

CREATE TRIGGER trio_supervise_items_counted_delete
AFTER DELETE ON trio_supervise_items
REFERENCING OLD TABLE AS trio_supervise_old_rows
FOR EACH STATEMENT EXECUTE FUNCTION trio_supervise_count_changes();

CREATE TRIGGER trio_supervise_items_counted_truncate
AFTER TRUNCATE ON trio_supervise_items
FOR EACH STATEMENT EXECUTE FUNCTION trio_supervise_count_reset();

-- Durable workflows: each item incarnation's journal and the events sent to it, deleted
-- with their item (schema 0010).
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

-- The console's audit trail: who did what, to what, when, and how it went;
-- read newest first, pruned oldest first by retention.
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

-- Serves recent errors: the items whose error history is not empty, by when they last changed
-- (an item's errors are never newer than that).
CREATE INDEX trio_supervise_items_errors_idx
    ON trio_supervise_items (updated_at, id)
    WHERE errors <> '[]'::jsonb;
