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
    priority         INTEGER NOT NULL DEFAULT 0,
    queue            TEXT    NOT NULL DEFAULT 'default',
    concurrency_key  TEXT,
    concurrency_limit INTEGER,
    timeout          REAL,
    result           TEXT,
    errors           TEXT    NOT NULL DEFAULT '[]',
    parent_id        TEXT,
    waiting_children INTEGER NOT NULL DEFAULT 0,
    unique_scope     TEXT    NOT NULL DEFAULT 'forever',
    unique_until     INTEGER,
    released_key     TEXT,
    parent_version   INTEGER,
    incarnation      INTEGER NOT NULL DEFAULT 0,
    parent_incarnation INTEGER,
    tags             TEXT    NOT NULL DEFAULT '[]',
    event_woken      INTEGER NOT NULL DEFAULT 0,
    start_by         INTEGER,
    traceparent      TEXT,
    CHECK ((state = 'running') = (lease_expires_at IS NOT NULL))
);

-- Serves claims: one queue's claimable items in (priority, due_at, id) order; lower priority
-- numbers first.
CREATE INDEX trio_supervise_items_claim_idx
    ON trio_supervise_items (queue, priority, due_at, id)
    WHERE state IN ('queued', 'running');

-- Serves the concurrency-key check: the running items of one key.
CREATE INDEX trio_supervise_items_key_idx
    ON trio_supervise_items (concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;

-- Serves counts, listing and inspection by spec.
CREATE INDEX trio_supervise_items_spec_state_idx
    ON trio_supervise_items (spec_id, state);

-- Serves listing: one range per state in (due_at, id) order, so a page costs the rows shown.
CREATE INDEX trio_supervise_items_state_due_idx
    ON trio_supervise_items (state, due_at, id);

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

-- The counters lease versions and incarnations are drawn from (one row): a number one gave is
-- never given again, so a reused item id never meets its predecessor's versions (schema 0005).
CREATE TABLE trio_supervise_counters (
    next_version     INTEGER NOT NULL,
    next_incarnation INTEGER NOT NULL
);
INSERT INTO trio_supervise_counters (next_version, next_incarnation) VALUES (1, 1);

-- Each schedule's last enqueued fire, fleet-wide: a fire at or before it is never enqueued again.
CREATE TABLE trio_supervise_schedules (
    name         TEXT    PRIMARY KEY NOT NULL,
    last_fire_at INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
) WITHOUT ROWID;

-- Queues paused across the fleet: their items are not claimed until resumed.
CREATE TABLE trio_supervise_paused_queues (
    queue     TEXT    PRIMARY KEY NOT NULL,
    paused_at INTEGER NOT NULL
);

-- Rate-limited queues (schema 0008): at most rate_limit claims in any period_us, fleet-wide
-- (docs/flow-control.md). starts: the latest claims' times (a JSON array, oldest first, at
-- most rate_limit of them), written by the claims under the write lock; throttled_until: while
-- that log is full, when it lets a claim in again (what next_due_at waits for).
CREATE TABLE trio_supervise_queue_rates (
    queue           TEXT    PRIMARY KEY NOT NULL,
    rate_limit      INTEGER NOT NULL,
    period_us       INTEGER NOT NULL,
    starts          TEXT    NOT NULL DEFAULT '[]',
    throttled_until INTEGER
) WITHOUT ROWID;

-- Rate limits per concurrency key (docs/flow-control.md). A row with a rate_limit is a rule: a
-- key, or a template over {tenant} and {subject} whose keys each have a window of their own. A
-- row's starts are a key's log (the key a rule holds, with or without a rule of its own
-- name): its latest claims' times, written by the claims of its items under the claim's lock
-- (SQLite's write lock; on PostgreSQL the key's advisory lock); throttled_until: while that
-- log is full, when it lets a claim in again (what a claim's window and next_due_at skip to).
CREATE TABLE trio_supervise_key_rates (
    key             TEXT    PRIMARY KEY NOT NULL,
    rate_limit      INTEGER,
    period_us       INTEGER,
    starts          TEXT    NOT NULL DEFAULT '[]',
    throttled_until INTEGER
) WITHOUT ROWID;

-- The rules apart from the logs (schema 0011): a claim reads every rule and its own keys' logs,
-- not every key's row (one per key ever started under a rule).
CREATE INDEX trio_supervise_key_rates_rules_idx
    ON trio_supervise_key_rates (key)
    WHERE rate_limit IS NOT NULL;

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

-- Durable workflows: each item incarnation's journal and the events sent to it, deleted
-- with their item (schema 0007).
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

-- The console's audit trail: who did what, to what, when, and how it went;
-- read newest first, pruned oldest first by retention.
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

-- Serves recent errors: the items whose error history is not empty, by when they last changed
-- (an item's errors are never newer than that).
CREATE INDEX trio_supervise_items_errors_idx
    ON trio_supervise_items (updated_at, id)
    WHERE errors <> '[]';
