-- Named queries of the SQLite backend: each block starts with "-- name: <name>".
-- Parameters are sqlite3's :name. Times are integer microseconds since the Unix epoch; "now"
-- always comes from the queue's clock. Lists of values arrive as JSON arrays (json_each), so
-- every statement here is static text.

-- name: version_table_exists
SELECT count(*) AS present FROM sqlite_master
WHERE type = 'table' AND name = 'trio_supervise_schema_version';

-- name: create_version_table
CREATE TABLE IF NOT EXISTS trio_supervise_schema_version (
    version    INTEGER PRIMARY KEY NOT NULL,
    applied_at INTEGER NOT NULL
);

-- name: schema_version
SELECT coalesce(max(version), 0) AS version FROM trio_supervise_schema_version;

-- name: record_version
INSERT INTO trio_supervise_schema_version (version, applied_at) VALUES (:version, :now);

-- name: enqueue
-- Run with executemany, one parameter set per entry, in one transaction. An entry whose
-- idempotency key another item holds is skipped (DO NOTHING).
INSERT INTO trio_supervise_items (
    id, spec_id, tenant_id, subject_id, config, state, due_at, idempotency_key,
    created_at, updated_at, priority, queue, timeout, unique_scope, unique_until
) VALUES (
    :id, :spec_id, :tenant_id, :subject_id, :config, 'queued', :due_at, :idempotency_key,
    :now, :now, :priority, :queue, :timeout, :unique_scope, :now + :period_us
)
ON CONFLICT (idempotency_key) DO NOTHING;

-- name: enqueued
-- The rows just inserted, by id (when some of a batch were not).
SELECT id, due_at, created_at, unique_until, due_at <= :now AS due_now
FROM trio_supervise_items
WHERE id IN (SELECT value FROM json_each(:ids));

-- name: release_keys
-- A key whose holder's scope has lapsed ('unfinished': the holder finished; 'period': past
-- unique_until) moves to the holder's released_key, so the insert after it may take it.
UPDATE trio_supervise_items SET released_key = idempotency_key, idempotency_key = NULL
WHERE idempotency_key IN (SELECT value FROM json_each(:keys))
  AND (
      (unique_scope = 'unfinished' AND state IN ('completed', 'cancelled', 'dead'))
      OR (unique_scope = 'period' AND unique_until <= :now)
  );

-- name: holders
SELECT * FROM trio_supervise_items
WHERE idempotency_key IN (SELECT value FROM json_each(:keys));

-- name: existing_ids
SELECT id FROM trio_supervise_items WHERE id IN (SELECT value FROM json_each(:ids));

-- name: get_by_key
-- The key's holder, else the newest item that held it.
SELECT * FROM trio_supervise_items
WHERE idempotency_key = :key OR released_key = :key
ORDER BY idempotency_key IS NULL, created_at DESC, id DESC
LIMIT 1;

-- name: get
SELECT * FROM trio_supervise_items WHERE id = :id;

-- name: list_state
-- One page of one state, after the cursor (due_at, id): a range of the state index, so it
-- costs the rows shown. list_items runs one per state and merges them.
SELECT * FROM trio_supervise_items
WHERE state = :state AND (due_at, id) > (:after_due, :after_id)
ORDER BY due_at, id
LIMIT :limit;

-- name: list_state_specs
SELECT * FROM trio_supervise_items
WHERE state = :state AND (due_at, id) > (:after_due, :after_id)
  AND spec_id IN (SELECT value FROM json_each(:spec_ids))
ORDER BY due_at, id
LIMIT :limit;

-- name: counts
SELECT spec_id, state, count(*) AS n FROM trio_supervise_items GROUP BY spec_id, state;

-- name: request_cancel
-- Queued: cancelled at once. Running: flagged for its owner. Otherwise: unchanged.
UPDATE trio_supervise_items SET
    state = CASE WHEN state = 'queued' THEN 'cancelled' ELSE state END,
    cancel_requested = cancel_requested OR state IN ('queued', 'running'),
    updated_at = CASE
        WHEN state = 'queued' OR (state = 'running' AND NOT cancel_requested) THEN :now
        ELSE updated_at
    END
WHERE id = :id
RETURNING *;

-- name: retry
UPDATE trio_supervise_items SET
    state = 'queued',
    due_at = :at,
    lease_owner = NULL,
    lease_expires_at = NULL,
    error_count = 0,
    attempt = 0,
    cancel_requested = 0,
    updated_at = :now
WHERE id = :id AND state <> 'running'
RETURNING *, due_at <= :now AS due_now;

-- name: claim_due
-- One queue's claimable rows in (priority, due_at, id) order (none while it is paused), leased
-- in one statement inside BEGIN IMMEDIATE. Running rows whose lease has expired are rescued
-- here too. The claim counts the attempt.
UPDATE trio_supervise_items SET
    state = 'running',
    lease_owner = :worker_id,
    lease_expires_at = :now + :lease_us,
    lease_version = lease_version + 1,
    attempt = attempt + 1,
    updated_at = :now
WHERE id IN (
    SELECT id FROM trio_supervise_items
    WHERE queue = :queue AND state IN ('queued', 'running')
      AND spec_id IN (SELECT value FROM json_each(:spec_ids))
      AND CASE WHEN state = 'queued' THEN due_at ELSE lease_expires_at END <= :now
      AND NOT EXISTS (SELECT 1 FROM trio_supervise_paused_queues AS p WHERE p.queue = :queue)
    ORDER BY priority, due_at, id
    LIMIT :limit
)
RETURNING *;

-- name: renew
UPDATE trio_supervise_items SET
    lease_expires_at = :now + :lease_us,
    updated_at = :now
WHERE id = :id AND lease_version = :version AND lease_owner = :owner AND state = 'running'
RETURNING id, lease_version, lease_owner, cancel_requested;

-- name: mark_error
UPDATE trio_supervise_items SET
    error_count = error_count + 1,
    last_error = :error,
    errors = (
        -- The history with this error appended (lease owner and attempt as stored), the newest
        -- :max_errors kept; SET reads the row as it was, so errors is the old array.
        SELECT json_group_array(json(value)) FROM json_each(json_insert(errors, '$[#]', json_object(
            'at', :now, 'worker', coalesce(lease_owner, ''), 'attempt', attempt, 'error', :error
        )))
        WHERE key > json_array_length(errors) - :max_errors
    ),
    updated_at = :now
WHERE id = :id AND lease_version = :version AND state = 'running'
RETURNING id;

-- name: settle
-- One outcome, fenced on (id, version) and the running state.
UPDATE trio_supervise_items SET
    state = CASE :kind
        WHEN 'complete' THEN 'completed'
        WHEN 'cancel' THEN 'cancelled'
        WHEN 'dead' THEN 'dead'
        ELSE 'queued'
    END,
    due_at = CASE
        WHEN :kind = 'reschedule' THEN :at
        WHEN :kind IN ('continue', 'retry', 'release') THEN :now + :delay_us
        ELSE due_at
    END,
    config = CASE WHEN :kind = 'reschedule' THEN :config ELSE config END,
    result = CASE WHEN :kind = 'complete' THEN :result ELSE result END,
    error_count = CASE
        WHEN :kind IN ('continue', 'reschedule') THEN 0
        WHEN :kind IN ('retry', 'dead') THEN error_count + 1
        ELSE error_count
    END,
    last_error = CASE WHEN :kind IN ('retry', 'dead') THEN :error ELSE last_error END,
    errors = CASE WHEN :kind IN ('retry', 'dead') THEN (
            -- The history with this error appended (lease owner and attempt as stored), the newest
            -- :max_errors kept; SET reads the row as it was, so errors is the old array.
            SELECT json_group_array(json(value)) FROM json_each(json_insert(errors, '$[#]', json_object(
                'at', :now, 'worker', coalesce(lease_owner, ''), 'attempt', attempt, 'error', :error
            )))
            WHERE key > json_array_length(errors) - :max_errors
        ) ELSE errors END,
    attempt = CASE
        WHEN :kind IN ('continue', 'reschedule') THEN 0
        WHEN :kind = 'release' THEN max(attempt - 1, 0)
        ELSE attempt
    END,
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = :now
WHERE id = :id AND lease_version = :version AND state = 'running'
RETURNING id, spec_id, state, due_at <= :now AS due_now;

-- name: next_due_at
-- Also returns how far away that is, in seconds by the queue's clock.
SELECT t.at, (t.at - :now) / 1000000.0 AS wait
FROM (
    SELECT min(CASE WHEN state = 'queued' THEN due_at ELSE lease_expires_at END) AS at
    FROM trio_supervise_items
    WHERE state IN ('queued', 'running')
      AND spec_id IN (SELECT value FROM json_each(:spec_ids))
      AND (:queues IS NULL OR queue IN (SELECT value FROM json_each(:queues)))
      AND queue NOT IN (SELECT queue FROM trio_supervise_paused_queues)
) AS t;

-- name: pause_queue
INSERT INTO trio_supervise_paused_queues (queue, paused_at) VALUES (:queue, :now)
ON CONFLICT (queue) DO NOTHING
RETURNING queue;

-- name: resume_queue
DELETE FROM trio_supervise_paused_queues WHERE queue = :queue RETURNING queue;

-- name: paused_queues
SELECT queue, paused_at FROM trio_supervise_paused_queues;

-- name: queue_counts
SELECT queue, state, count(*) AS n FROM trio_supervise_items GROUP BY queue, state;
