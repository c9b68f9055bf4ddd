-- Named queries of the PostgreSQL backend: each block starts with "-- name: <name>".
-- Parameters are psycopg's %(name)s. Every "now" is COALESCE(%(now)s::timestamptz, now()):
-- the queue passes NULL to use the database's clock (the default), or an injected clock's time.
-- Durations arrive as integer microseconds, so they round exactly as Python's timedelta does.

-- name: version_table_exists
SELECT to_regclass('trio_supervise_schema_version') IS NOT NULL AS present;

-- name: create_version_table
CREATE TABLE IF NOT EXISTS trio_supervise_schema_version (
    version    integer     PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: schema_version
SELECT coalesce(max(version), 0) AS version FROM trio_supervise_schema_version;

-- name: record_version
INSERT INTO trio_supervise_schema_version (version) VALUES (%(version)s);

-- name: migration_lock
-- Held until the transaction ends: concurrent migrators of one schema take turns.
SELECT pg_advisory_xact_lock(
    hashtextextended('trio_supervise:migrate:' || coalesce(%(schema)s::text, current_schema(), ''), 0)
);

-- name: enqueue_many
-- One statement for a whole batch: one array per column, one row per entry. An entry whose
-- idempotency key another item holds is skipped (DO NOTHING) and not returned.
INSERT INTO trio_supervise_items AS i (
    id, spec_id, tenant_id, subject_id, config, state, due_at, idempotency_key,
    created_at, updated_at, priority, queue, timeout, unique_scope, unique_until
)
SELECT n.id, n.spec_id, n.tenant_id, n.subject_id, n.config::jsonb, 'queued',
    coalesce(n.due_at, %(now)s::timestamptz, now()), n.idempotency_key,
    coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()),
    n.priority, n.queue, n.timeout, n.unique_scope,
    coalesce(%(now)s::timestamptz, now()) + n.period_us * interval '1 microsecond'
FROM unnest(
    %(ids)s::text[], %(spec_ids)s::text[], %(tenant_ids)s::text[], %(subject_ids)s::text[],
    %(configs)s::text[], %(due_ats)s::timestamptz[], %(keys)s::text[], %(priorities)s::int[],
    %(queues)s::text[], %(timeouts)s::float8[], %(scopes)s::text[], %(periods_us)s::bigint[]
) AS n(
    id, spec_id, tenant_id, subject_id, config, due_at, idempotency_key, priority, queue,
    timeout, unique_scope, period_us
)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING i.id, i.due_at, i.created_at, i.unique_until,
    i.due_at <= coalesce(%(now)s::timestamptz, now()) AS due_now;

-- name: release_keys
-- A key whose holder's scope has lapsed ('unfinished': the holder finished; 'period': past
-- unique_until) moves to the holder's released_key, so the insert after it may take it. A
-- concurrent enqueuer of the key waits here on the holder's row, then finds it released.
UPDATE trio_supervise_items SET released_key = idempotency_key, idempotency_key = NULL
WHERE idempotency_key = ANY(%(keys)s::text[])
  AND (
      (unique_scope = 'unfinished' AND state IN ('completed', 'cancelled', 'dead'))
      OR (unique_scope = 'period' AND unique_until <= coalesce(%(now)s::timestamptz, now()))
  );

-- name: holders
SELECT * FROM trio_supervise_items WHERE idempotency_key = ANY(%(keys)s::text[]);

-- name: existing_ids
SELECT id FROM trio_supervise_items WHERE id = ANY(%(ids)s::text[]);

-- name: get_by_key
-- The key's holder, else the newest item that held it.
SELECT * FROM trio_supervise_items
WHERE idempotency_key = %(key)s OR released_key = %(key)s
ORDER BY idempotency_key IS NULL, created_at DESC, id DESC
LIMIT 1;

-- name: get
SELECT * FROM trio_supervise_items WHERE id = %(id)s;

-- name: list_state
-- One page of one state, after the cursor (due_at, id): a range of the state index, so it
-- costs the rows shown. list_items runs one per state and merges them.
SELECT * FROM trio_supervise_items
WHERE state = %(state)s
  AND (due_at, id) > (%(after_due)s::timestamptz, %(after_id)s::text)
ORDER BY due_at, id
LIMIT %(limit)s;

-- name: list_state_specs
SELECT * FROM trio_supervise_items
WHERE state = %(state)s
  AND (due_at, id) > (%(after_due)s::timestamptz, %(after_id)s::text)
  AND spec_id = ANY(%(spec_ids)s::text[])
ORDER BY due_at, id
LIMIT %(limit)s;

-- name: counts
SELECT spec_id, state, count(*) AS n FROM trio_supervise_items GROUP BY spec_id, state;

-- name: request_cancel
-- Queued: cancelled at once. Running: flagged for its owner. Otherwise: unchanged.
UPDATE trio_supervise_items SET
    state = CASE WHEN state = 'queued' THEN 'cancelled' ELSE state END,
    cancel_requested = cancel_requested OR state IN ('queued', 'running'),
    updated_at = CASE
        WHEN state = 'queued' OR (state = 'running' AND NOT cancel_requested)
        THEN coalesce(%(now)s::timestamptz, now())
        ELSE updated_at
    END
WHERE id = %(id)s
RETURNING *;

-- name: retry
UPDATE trio_supervise_items SET
    state = 'queued',
    due_at = coalesce(%(at)s::timestamptz, %(now)s::timestamptz, now()),
    lease_owner = NULL,
    lease_expires_at = NULL,
    error_count = 0,
    attempt = 0,
    cancel_requested = false,
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s AND state <> 'running'
RETURNING *, due_at <= coalesce(%(now)s::timestamptz, now()) AS due_now;

-- name: claim_due
-- One statement: lock one queue's first claimable rows in (priority, due_at, id) order (none
-- while the queue is paused), skipping rows another claimer holds, and lease them. Running rows whose lease has expired are rescued here too.
-- The claim counts the attempt.
WITH due AS (
    SELECT id FROM trio_supervise_items
    WHERE queue = %(queue)s AND state IN ('queued', 'running')
      AND spec_id = ANY(%(spec_ids)s::text[])
      AND CASE WHEN state = 'queued' THEN due_at ELSE lease_expires_at END
          <= coalesce(%(now)s::timestamptz, now())
      AND NOT EXISTS (
          SELECT 1 FROM trio_supervise_paused_queues AS p WHERE p.queue = %(queue)s
      )
    ORDER BY priority, due_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE trio_supervise_items AS i SET
    state = 'running',
    lease_owner = %(worker_id)s,
    lease_expires_at = coalesce(%(now)s::timestamptz, now())
        + %(lease_us)s::bigint * interval '1 microsecond',
    lease_version = i.lease_version + 1,
    attempt = i.attempt + 1,
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM due
WHERE i.id = due.id
RETURNING i.*;

-- name: renew_many
-- Fenced on (id, version, owner) and the running state; rows that come back are renewed.
UPDATE trio_supervise_items AS i SET
    lease_expires_at = coalesce(%(now)s::timestamptz, now())
        + %(lease_us)s::bigint * interval '1 microsecond',
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::text[], %(versions)s::bigint[], %(owners)s::text[]) AS l(id, version, owner)
WHERE i.id = l.id AND i.lease_version = l.version AND i.lease_owner = l.owner
  AND i.state = 'running'
RETURNING i.id, i.lease_version, i.lease_owner, i.cancel_requested;

-- name: mark_error
UPDATE trio_supervise_items SET
    error_count = error_count + 1,
    last_error = %(error)s,
    errors = (
        -- The history with this error appended (lease owner and attempt as stored), the newest
        -- max_errors kept; SET reads the row as it was, so errors is the old array.
        SELECT jsonb_agg(e.value ORDER BY e.n)
        FROM jsonb_array_elements(errors || jsonb_build_array(jsonb_build_object(
            'at', (extract(epoch FROM coalesce(%(now)s::timestamptz, now())) * 1000000)::bigint,
            'worker', coalesce(lease_owner, ''), 'attempt', attempt, 'error', %(error)s::text
        ))) WITH ORDINALITY AS e(value, n)
        WHERE e.n > jsonb_array_length(errors) + 1 - %(max_errors)s::int
    ),
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s AND lease_version = %(version)s AND state = 'running'
RETURNING id;

-- name: settle_many
-- Every outcome in one statement, fenced on (id, version) and the running state. The batch
-- never holds two entries for one (id, version): the queue drops repeats before sending.
UPDATE trio_supervise_items AS i SET
    state = CASE s.kind
        WHEN 'complete' THEN 'completed'
        WHEN 'cancel' THEN 'cancelled'
        WHEN 'dead' THEN 'dead'
        ELSE 'queued'
    END,
    due_at = CASE
        WHEN s.kind = 'reschedule' THEN s.at
        WHEN s.kind IN ('continue', 'retry', 'release')
        THEN coalesce(%(now)s::timestamptz, now()) + s.delay_us * interval '1 microsecond'
        ELSE i.due_at
    END,
    config = CASE WHEN s.kind = 'reschedule' THEN s.config::jsonb ELSE i.config END,
    result = CASE WHEN s.kind = 'complete' THEN s.result::jsonb ELSE i.result END,
    error_count = CASE
        WHEN s.kind IN ('continue', 'reschedule') THEN 0
        WHEN s.kind IN ('retry', 'dead') THEN i.error_count + 1
        ELSE i.error_count
    END,
    last_error = CASE WHEN s.kind IN ('retry', 'dead') THEN s.error ELSE i.last_error END,
    errors = CASE WHEN s.kind IN ('retry', 'dead') THEN (
            -- The history with this error appended (lease owner and attempt as stored), the newest
            -- max_errors kept; SET reads the row as it was, so errors is the old array.
            SELECT jsonb_agg(e.value ORDER BY e.n)
            FROM jsonb_array_elements(i.errors || jsonb_build_array(jsonb_build_object(
                'at', (extract(epoch FROM coalesce(%(now)s::timestamptz, now())) * 1000000)::bigint,
                'worker', coalesce(i.lease_owner, ''), 'attempt', i.attempt, 'error', s.error
            ))) WITH ORDINALITY AS e(value, n)
            WHERE e.n > jsonb_array_length(i.errors) + 1 - %(max_errors)s::int
        ) ELSE i.errors END,
    attempt = CASE
        WHEN s.kind IN ('continue', 'reschedule') THEN 0
        WHEN s.kind = 'release' THEN greatest(i.attempt - 1, 0)
        ELSE i.attempt
    END,
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(
    %(ids)s::text[], %(versions)s::bigint[], %(kinds)s::text[], %(delays_us)s::bigint[],
    %(ats)s::timestamptz[], %(configs)s::text[], %(errors)s::text[], %(results)s::text[]
) WITH ORDINALITY AS s(id, version, kind, delay_us, at, config, error, result, ord)
WHERE i.id = s.id AND i.lease_version = s.version AND i.state = 'running'
RETURNING s.ord, i.spec_id, i.state,
    i.due_at <= coalesce(%(now)s::timestamptz, now()) AS due_now;

-- name: notify
SELECT pg_notify(%(channel)s, spec_id) FROM unnest(%(spec_ids)s::text[]) AS n(spec_id);

-- name: next_due_at
-- Also returns how far away that is by the queue's clock, so waits agree with the database.
SELECT t.at, extract(epoch FROM t.at - coalesce(%(now)s::timestamptz, now()))::float8 AS wait
FROM (
    SELECT min(CASE WHEN state = 'queued' THEN due_at ELSE lease_expires_at END) AS at
    FROM trio_supervise_items
    WHERE state IN ('queued', 'running') AND spec_id = ANY(%(spec_ids)s::text[])
      AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
      AND queue NOT IN (SELECT queue FROM trio_supervise_paused_queues)
) AS t;

-- name: pause_queue
INSERT INTO trio_supervise_paused_queues (queue, paused_at)
VALUES (%(queue)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (queue) DO NOTHING
RETURNING queue;

-- name: resume_queue
DELETE FROM trio_supervise_paused_queues WHERE queue = %(queue)s RETURNING queue;

-- name: paused_queues
SELECT queue, paused_at FROM trio_supervise_paused_queues;

-- name: queue_counts
SELECT queue, state, count(*) AS n FROM trio_supervise_items GROUP BY queue, state;
