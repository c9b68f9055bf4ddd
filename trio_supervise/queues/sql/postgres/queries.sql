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
-- One statement for a whole batch, and for a batch without keys the whole enqueue: in
-- autocommit it is its own transaction, one round trip. One array per column, one row per
-- entry. An entry whose idempotency key another item holds is skipped (DO NOTHING). It returns
-- one row: how many items it inserted and the now() it stored as their created_at (the queue
-- knows the rest of what it wrote). Given a channel, it also sends, in the same statement
-- (delivered at commit only), one notification per (queue, spec id) of the inserted items due
-- now: the pair as a JSON array, exactly as due_payload in sql/_postgres_listen.py writes it (to_json
-- escapes as Python's json.dumps(ensure_ascii=False) does), or the spec id alone for an item
-- with a concurrency key (its key may be at its limit) or a pair too long for NOTIFY.
-- The text arrays travel in psycopg's binary format: as text, quoting 10,000 strings takes
-- four times as long.
-- Each column comes as the array <column>_array (the columns are NEW_ROW_COLUMNS in
-- sql/_rows.py, which NewItem's fields declare). A column with one value in every row (most of
-- a batch: the same spec, no key, no timeout, ...) comes as an empty array and that value as a
-- scalar of the column's name: unnest pads the shorter arrays with NULLs (id_array is always
-- whole) and coalesce fills them in; a column sent whole comes with a NULL scalar. Each array
-- costs about as much to send and unpack as the ids.
WITH inserted AS (
    INSERT INTO trio_supervise_items AS i (
        id, spec_id, tenant_id, subject_id, config, state, due_at, idempotency_key,
        created_at, updated_at, priority, queue, timeout, unique_scope, unique_until,
        concurrency_key, concurrency_limit, tags, start_by, traceparent, incarnation
    )
    SELECT n.id,
        coalesce(n.spec_id, %(spec_id)s::text),
        coalesce(n.tenant_id, %(tenant_id)s::text),
        coalesce(n.subject_id, %(subject_id)s::text),
        coalesce(n.config, %(config)s::text)::jsonb,
        'queued',
        coalesce(n.due_at, %(due_at)s::timestamptz, %(now)s::timestamptz, now()),
        coalesce(n.idempotency_key, %(idempotency_key)s::text),
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()),
        coalesce(n.priority, %(priority)s::int),
        coalesce(n.queue, %(queue)s::text),
        coalesce(n.timeout, %(timeout)s::float8),
        coalesce(n.unique_scope, %(unique_scope)s::text),
        coalesce(%(now)s::timestamptz, now())
            + coalesce(n.period_us, %(period_us)s::bigint) * interval '1 microsecond',
        coalesce(n.concurrency_key, %(concurrency_key)s::text),
        coalesce(n.concurrency_limit, %(concurrency_limit)s::int),
        coalesce(n.tags, %(tags)s::text)::jsonb,
        coalesce(n.start_by, %(start_by)s::timestamptz),
        coalesce(n.traceparent, %(traceparent)s::text),
        -- One number of the sequence for the statement's rows (schema 0008).
        (SELECT nextval('trio_supervise_incarnations'))
    FROM unnest(
        %(id_array)b::text[], %(spec_id_array)b::text[], %(tenant_id_array)b::text[],
        %(subject_id_array)b::text[], %(config_array)b::text[],
        %(due_at_array)s::timestamptz[], %(idempotency_key_array)b::text[],
        %(priority_array)s::int[], %(queue_array)b::text[], %(timeout_array)s::float8[],
        %(unique_scope_array)b::text[], %(period_us_array)s::bigint[],
        %(concurrency_key_array)b::text[], %(concurrency_limit_array)s::int[],
        %(tags_array)b::text[], %(start_by_array)s::timestamptz[],
        %(traceparent_array)b::text[]
    ) AS n(
        id, spec_id, tenant_id, subject_id, config, due_at, idempotency_key, priority, queue,
        timeout, unique_scope, period_us, concurrency_key, concurrency_limit, tags, start_by,
        traceparent
    )
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING i.queue, i.spec_id, i.concurrency_key IS NULL AS hinted,
        i.due_at <= i.created_at AS due
), woken AS (
    SELECT DISTINCT queue, spec_id, hinted FROM inserted
    WHERE due AND %(channel)s::text IS NOT NULL
)
SELECT (SELECT count(*) FROM inserted) AS inserted,
    coalesce(%(now)s::timestamptz, now()) AS now,
    (
        SELECT count(pg_notify(%(channel)s::text, CASE
            WHEN woken.hinted AND octet_length(pair.payload) < 8000 THEN pair.payload
            ELSE woken.spec_id
        END))
        FROM woken, LATERAL (
            SELECT '[' || to_json(woken.queue)::text || ',' || to_json(woken.spec_id)::text || ']'
                AS payload
        ) AS pair
    ) AS notified;

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

-- name: debounce
-- A debounced enqueue meets its key's queued holder (not one waiting for children): the holder
-- takes the entry's config and due time (see docs/flow-control.md).
UPDATE trio_supervise_items SET config = %(config)s::jsonb,
    due_at = coalesce(%(due_at)s::timestamptz, %(now)s::timestamptz, now()),
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s AND state = 'queued' AND waiting_children = 0
RETURNING {item_columns};

-- name: release_running_key
-- A debounced enqueue meets its key's running holder: the key moves to the new item (the
-- running one keeps it as released_key, as a lapsed holder does).
UPDATE trio_supervise_items SET released_key = idempotency_key, idempotency_key = NULL
WHERE id = %(id)s AND state = 'running' AND idempotency_key IS NOT NULL
RETURNING id;

-- name: holders
SELECT {item_columns} FROM trio_supervise_items WHERE idempotency_key = ANY(%(keys)s::text[]);

-- name: existing_ids
SELECT id FROM trio_supervise_items WHERE id = ANY(%(ids)s::text[]);

-- name: get_by_key
-- The key's holder, else the newest item that held it.
SELECT {item_columns} FROM trio_supervise_items
WHERE idempotency_key = %(key)s OR released_key = %(key)s
ORDER BY idempotency_key IS NULL, created_at DESC, id DESC
LIMIT 1;

-- name: get
SELECT {item_columns} FROM trio_supervise_items WHERE id = %(id)s;

-- name: list_state
-- One page of one state but running, after the cursor (due_at, id). list_items runs one per
-- state and merges them: a range of the listing index (every state but running: schema 0007),
-- so it costs the rows shown. The statement spells out that it never reads running rows, so
-- that even a generic plan of it uses that index. With %(tags)s (a JSON array), only items
-- carrying every one of them: a filter on the same range. The running state has a statement of
-- its own (list_running): one statement with an arm per kind, of which only one could return
-- rows, had the planner cost the other arm too, and at a million rows it planned a parallel
-- scan for it, whose workers started (3-4 ms) to read nothing.
SELECT {item_columns} FROM trio_supervise_items
WHERE state = %(state)s AND state <> 'running'
  AND (due_at, id) > (%(after_due)s::timestamptz, %(after_id)s::text)
  AND (%(tags)s::jsonb IS NULL OR tags @> %(tags)s::jsonb)
ORDER BY due_at, id
LIMIT %(limit)s;

-- name: list_state_specs
-- list_state of some specs only.
SELECT {item_columns} FROM trio_supervise_items
WHERE state = %(state)s AND state <> 'running'
  AND (due_at, id) > (%(after_due)s::timestamptz, %(after_id)s::text)
  AND (%(tags)s::jsonb IS NULL OR tags @> %(tags)s::jsonb)
  AND spec_id = ANY(%(spec_ids)s::text[])
ORDER BY due_at, id
LIMIT %(limit)s;

-- name: list_running
-- list_state of the running state: the running rows (the leases in flight, a few) from the lease
-- index, sorted.
SELECT {item_columns} FROM trio_supervise_items
WHERE state = 'running'
  AND (due_at, id) > (%(after_due)s::timestamptz, %(after_id)s::text)
  AND (%(tags)s::jsonb IS NULL OR tags @> %(tags)s::jsonb)
ORDER BY due_at, id
LIMIT %(limit)s;

-- name: list_running_specs
-- list_running of some specs only.
SELECT {item_columns} FROM trio_supervise_items
WHERE state = 'running'
  AND (due_at, id) > (%(after_due)s::timestamptz, %(after_id)s::text)
  AND (%(tags)s::jsonb IS NULL OR tags @> %(tags)s::jsonb)
  AND spec_id = ANY(%(spec_ids)s::text[])
ORDER BY due_at, id
LIMIT %(limit)s;

-- name: counts
-- The folded counts plus the deltas not folded yet, in one snapshot: exact, and a few rows
-- however many items there are (schema 0004).
SELECT spec_id, state, sum(n)::bigint AS n FROM (
    SELECT spec_id, state, n FROM trio_supervise_counts
    UNION ALL
    SELECT spec_id, state, n FROM trio_supervise_count_deltas
) AS c
GROUP BY spec_id, state
HAVING sum(n) > 0;

-- name: request_cancel
-- Queued: cancelled at once (a parent cancelled while it waits for children waits no more).
-- Running: flagged for its owner. Anything else (finished, or flagged already) is not written:
-- no row comes back, and the queue reads the item as it is.
UPDATE trio_supervise_items SET
    state = CASE WHEN state = 'queued' THEN 'cancelled' ELSE state END,
    cancel_requested = true,
    waiting_children = CASE WHEN state = 'queued' THEN 0 ELSE waiting_children END,
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s AND (state = 'queued' OR (state = 'running' AND NOT cancel_requested))
RETURNING {item_columns};

-- name: retry
UPDATE trio_supervise_items SET
    state = 'queued',
    due_at = coalesce(%(at)s::timestamptz, %(now)s::timestamptz, now()),
    lease_owner = NULL,
    lease_expires_at = NULL,
    error_count = 0,
    attempt = 0,
    cancel_requested = false,
    waiting_children = 0,
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s AND state <> 'running'
RETURNING {item_columns}, due_at <= coalesce(%(now)s::timestamptz, now()) AS due_now;

-- name: claim_due
-- One statement, in autocommit: lock one queue's first claimable rows in (priority, due_at, id)
-- order (none while the queue is paused), skipping rows another claimer holds, and lease the
-- unkeyed ones. Running rows whose lease has expired are rescued here too. The claim counts
-- the attempt.
--
-- Concurrency keys (see docs/queues.md, "Concurrency keys"): the window (head) leaves out keyed rows
-- whose key is at its limit, so a head of blocked keyed rows never starves the rows behind it.
-- This statement never leases a keyed row: its snapshot may predate another claimer's commit,
-- so two claimers could each count zero running rows of a key and each take one. It reports
-- how many keyed rows its window held instead (one row with a NULL id when it leased none);
-- if any, the queue claims them with claim_keys and claim_keyed in one transaction. Without
-- keyed rows (the common case) a claim stays this one round trip. A rate-limited queue's rows
-- are left out unless %(rated)s (the rated path, under the limit's row lock, passes it); the
-- statement says whether the queue has a limit (rated), and the queue then claims that way.
WITH rate AS MATERIALIZED (
    -- The queue's rate limit, if it has one: its rows are claimed only by the rated path (see
    -- lock_rate), which passes rated; here they are left out and the statement says so.
    SELECT 1 FROM trio_supervise_queue_rates AS r WHERE r.queue = %(queue)s
), live AS MATERIALIZED (
    -- Live leases per key, counted once per statement (and only if a keyed row asks: a CTE
    -- is read lazily), from the partial index over running keyed rows.
    SELECT concurrency_key AS k, count(*) AS n FROM trio_supervise_items
    WHERE state = 'running' AND concurrency_key IS NOT NULL
      AND lease_expires_at > coalesce(%(lease_now)s::timestamptz, now())
    GROUP BY concurrency_key
), queued AS (
    -- The window's queued rows: a walk of the claim index (queued rows only) in order.
    SELECT c.id, c.concurrency_key, c.priority, c.due_at FROM trio_supervise_items AS c
    WHERE c.queue = %(queue)s AND c.state = 'queued'
      AND c.spec_id = ANY(%(spec_ids)s::text[])
      AND c.due_at <= coalesce(%(now)s::timestamptz, now())
      AND NOT EXISTS (
          SELECT 1 FROM trio_supervise_paused_queues AS p WHERE p.queue = %(queue)s
      )
      AND (%(rated)s::boolean OR NOT EXISTS (SELECT 1 FROM rate))
      AND (c.concurrency_key IS NULL OR (coalesce((SELECT l.n FROM live AS l WHERE l.k = c.concurrency_key), 0) < c.concurrency_limit
          AND coalesce((
              -- A key whose rate limit's window is full is left out (docs/flow-control.md):
              -- a probe of the key's row by its primary key, for keyed rows only.
              SELECT t.throttled_until FROM trio_supervise_key_rates AS t
              WHERE t.key = c.concurrency_key
          ), '-infinity') <= coalesce(%(now)s::timestamptz, now())))
    ORDER BY c.priority, c.due_at, c.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), expired AS (
    -- The window's running rows whose lease has expired: a range of the lease index (none,
    -- mostly: one probe), sorted.
    SELECT c.id, c.concurrency_key, c.priority, c.due_at FROM trio_supervise_items AS c
    WHERE c.queue = %(queue)s AND c.state = 'running'
      AND c.spec_id = ANY(%(spec_ids)s::text[])
      AND c.lease_expires_at <= coalesce(%(lease_now)s::timestamptz, now())
      AND NOT EXISTS (
          SELECT 1 FROM trio_supervise_paused_queues AS p WHERE p.queue = %(queue)s
      )
      AND (%(rated)s::boolean OR NOT EXISTS (SELECT 1 FROM rate))
      AND (c.concurrency_key IS NULL OR (coalesce((SELECT l.n FROM live AS l WHERE l.k = c.concurrency_key), 0) < c.concurrency_limit
          AND coalesce((
              -- A key whose rate limit's window is full is left out (docs/flow-control.md):
              -- a probe of the key's row by its primary key, for keyed rows only.
              SELECT t.throttled_until FROM trio_supervise_key_rates AS t
              WHERE t.key = c.concurrency_key
          ), '-infinity') <= coalesce(%(now)s::timestamptz, now())))
    ORDER BY c.priority, c.due_at, c.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), head AS (
    -- The first rows of both in (priority, due_at, id) order. A row of either left out is
    -- locked until the statement ends, never leased.
    SELECT id, concurrency_key FROM (
        SELECT * FROM queued UNION ALL SELECT * FROM expired
    ) AS w
    ORDER BY priority, due_at, id
    LIMIT %(limit)s
), claimed AS (
    UPDATE trio_supervise_items AS i SET
    state = 'running',
    lease_owner = %(worker_id)s,
    lease_expires_at = coalesce(%(now)s::timestamptz, now())
        + %(lease_us)s::bigint * interval '1 microsecond',
    lease_version = greatest(i.lease_version + 1, nextval('trio_supervise_lease_versions')),
    attempt = i.attempt + 1,
    updated_at = coalesce(%(now)s::timestamptz, now())
    FROM head
    WHERE i.id = head.id AND head.concurrency_key IS NULL
    -- The item's fields, named (see item_columns in queues/_sql.py), the JSON as its text.
    RETURNING {item_columns:i}
)
SELECT claimed.*,
    (SELECT count(*) FROM head WHERE head.concurrency_key IS NOT NULL) AS keyed,
    NOT %(rated)s::boolean AND EXISTS (SELECT 1 FROM rate) AS rated
FROM (VALUES (1)) AS one LEFT JOIN claimed ON true;

-- name: claim_keys
-- Statement 1 of a keyed claim (inside a transaction): the distinct keys among the window's
-- keyed rows (the same window as claim_due's), each locked with a transaction-scoped advisory
-- lock, keyed by the schema and the key. A try-lock never waits, so claimers never deadlock;
-- a key another claimer holds is left out of this claim (it is being claimed right now). The
-- lock function is volatile, so it runs on the final distinct keys only, never pushed down.
WITH live AS MATERIALIZED (
    -- Live leases per key, counted once per statement (and only if a keyed row asks: a CTE
    -- is read lazily), from the partial index over running keyed rows.
    SELECT concurrency_key AS k, count(*) AS n FROM trio_supervise_items
    WHERE state = 'running' AND concurrency_key IS NOT NULL
      AND lease_expires_at > coalesce(%(lease_now)s::timestamptz, now())
    GROUP BY concurrency_key
)
SELECT k.key, EXISTS (
    -- Whether a key rate limit exists (then the claim reads them: key_rates_of).
    SELECT 1 FROM trio_supervise_key_rates AS r WHERE r.rate_limit IS NOT NULL
) AS key_rated FROM (
    SELECT DISTINCT head.concurrency_key AS key FROM (
        SELECT w.concurrency_key FROM (
            (
                SELECT c.concurrency_key, c.priority, c.due_at, c.id FROM trio_supervise_items AS c
                WHERE c.queue = %(queue)s AND c.state = 'queued'
                  AND c.spec_id = ANY(%(spec_ids)s::text[])
                  AND c.due_at <= coalesce(%(now)s::timestamptz, now())
                  AND c.concurrency_key IS NOT NULL
                  AND coalesce((SELECT l.n FROM live AS l WHERE l.k = c.concurrency_key), 0) < c.concurrency_limit
                  AND coalesce((
                      SELECT t.throttled_until FROM trio_supervise_key_rates AS t
                      WHERE t.key = c.concurrency_key
                  ), '-infinity') <= coalesce(%(now)s::timestamptz, now())
                ORDER BY c.priority, c.due_at, c.id
                LIMIT %(limit)s
            )
            UNION ALL
            (
                SELECT c.concurrency_key, c.priority, c.due_at, c.id FROM trio_supervise_items AS c
                WHERE c.queue = %(queue)s AND c.state = 'running'
                  AND c.spec_id = ANY(%(spec_ids)s::text[])
                  AND c.lease_expires_at <= coalesce(%(lease_now)s::timestamptz, now())
                  AND c.concurrency_key IS NOT NULL
                  AND coalesce((SELECT l.n FROM live AS l WHERE l.k = c.concurrency_key), 0) < c.concurrency_limit
                  AND coalesce((
                      SELECT t.throttled_until FROM trio_supervise_key_rates AS t
                      WHERE t.key = c.concurrency_key
                  ), '-infinity') <= coalesce(%(now)s::timestamptz, now())
                ORDER BY c.priority, c.due_at, c.id
                LIMIT %(limit)s
            )
        ) AS w
        WHERE NOT EXISTS (
            SELECT 1 FROM trio_supervise_paused_queues AS p WHERE p.queue = %(queue)s
        )
        ORDER BY w.priority, w.due_at, w.id
        LIMIT %(limit)s
    ) AS head
) AS k
WHERE pg_try_advisory_xact_lock(
    hashtextextended('trio_supervise:concurrency_key:' || current_schema() || ':' || k.key, 0)
);

-- name: claim_keyed
-- Statement 2 of a keyed claim, in the same transaction after claim_keys. Atomic because every
-- claim of a keyed row happens here, under its key's advisory lock, and this statement's
-- snapshot is taken after the lock was granted, so after the previous holder committed: the
-- live rows it counts per key include every claim of that key ever committed. Writes that run
-- without the lock only lower the count (settlements, expiring leases), which errs on the safe
-- side. Keyed rows are claimable only if their key is locked (%(keys)s) and has free slots;
-- of the window's rows of one key only the first (limit - live) are leased (row_number over
-- the key, in a CTE of its own: FOR UPDATE cannot share a SELECT with a window function).
WITH live AS MATERIALIZED (
    -- Live leases per key, counted once per statement (and only if a keyed row asks: a CTE
    -- is read lazily), from the partial index over running keyed rows.
    SELECT concurrency_key AS k, count(*) AS n FROM trio_supervise_items
    WHERE state = 'running' AND concurrency_key IS NOT NULL
      AND lease_expires_at > coalesce(%(lease_now)s::timestamptz, now())
    GROUP BY concurrency_key
), queued AS (
    -- claim_due's window, as there: queued rows from the claim index, expired ones from the
    -- lease index, the first of both.
    SELECT c.id, c.priority, c.due_at, c.concurrency_key, c.concurrency_limit,
        CASE WHEN c.concurrency_key IS NULL THEN 0 ELSE coalesce((SELECT l.n FROM live AS l WHERE l.k = c.concurrency_key), 0) END AS live
    FROM trio_supervise_items AS c
    WHERE c.queue = %(queue)s AND c.state = 'queued'
      AND c.spec_id = ANY(%(spec_ids)s::text[])
      AND c.due_at <= coalesce(%(now)s::timestamptz, now())
      AND NOT EXISTS (
          SELECT 1 FROM trio_supervise_paused_queues AS p WHERE p.queue = %(queue)s
      )
      AND (%(rated)s::boolean OR NOT EXISTS (
          SELECT 1 FROM trio_supervise_queue_rates AS r WHERE r.queue = %(queue)s
      ))
      AND (c.concurrency_key IS NULL OR (
          c.concurrency_key = ANY(%(keys)s::text[])
          AND coalesce((SELECT l.n FROM live AS l WHERE l.k = c.concurrency_key), 0) < c.concurrency_limit
      ))
    ORDER BY c.priority, c.due_at, c.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), expired AS (
    SELECT c.id, c.priority, c.due_at, c.concurrency_key, c.concurrency_limit,
        CASE WHEN c.concurrency_key IS NULL THEN 0 ELSE coalesce((SELECT l.n FROM live AS l WHERE l.k = c.concurrency_key), 0) END AS live
    FROM trio_supervise_items AS c
    WHERE c.queue = %(queue)s AND c.state = 'running'
      AND c.spec_id = ANY(%(spec_ids)s::text[])
      AND c.lease_expires_at <= coalesce(%(lease_now)s::timestamptz, now())
      AND NOT EXISTS (
          SELECT 1 FROM trio_supervise_paused_queues AS p WHERE p.queue = %(queue)s
      )
      AND (%(rated)s::boolean OR NOT EXISTS (
          SELECT 1 FROM trio_supervise_queue_rates AS r WHERE r.queue = %(queue)s
      ))
      AND (c.concurrency_key IS NULL OR (
          c.concurrency_key = ANY(%(keys)s::text[])
          AND coalesce((SELECT l.n FROM live AS l WHERE l.k = c.concurrency_key), 0) < c.concurrency_limit
      ))
    ORDER BY c.priority, c.due_at, c.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), head AS (
    SELECT * FROM (SELECT * FROM queued UNION ALL SELECT * FROM expired) AS w
    ORDER BY priority, due_at, id
    LIMIT %(limit)s
), ranked AS (
    SELECT head.*, row_number() OVER (
        PARTITION BY head.concurrency_key ORDER BY head.priority, head.due_at, head.id
    ) AS rank
    FROM head
)
UPDATE trio_supervise_items AS i SET
    state = 'running',
    lease_owner = %(worker_id)s,
    lease_expires_at = coalesce(%(now)s::timestamptz, now())
        + %(lease_us)s::bigint * interval '1 microsecond',
    lease_version = greatest(i.lease_version + 1, nextval('trio_supervise_lease_versions')),
    attempt = i.attempt + 1,
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM ranked
WHERE i.id = ranked.id
  AND (ranked.concurrency_key IS NULL OR (ranked.rank <= ranked.concurrency_limit - ranked.live
      -- With key rate limits, no more of a key's rows than its window lets start.
      AND ranked.rank <= coalesce(
          (%(key_caps)s::jsonb ->> ranked.concurrency_key)::bigint, 2147483647)))
-- The same columns as claim_due's.
RETURNING {item_columns:i};

-- name: lock_rate
-- The rated path of a claim (a queue with a rate limit; see docs/flow-control.md), statement 1
-- in a transaction: the limit's row, locked until commit, so the fleet's claims of the queue
-- take turns. FOR UPDATE reads the row as the previous holder committed it (its starts), and
-- the claim that follows (claim_due with rated) takes its snapshot after the lock was granted.
-- The time to claim at: the queue's clock, else the database's clock as it reads now (not the
-- transaction's start, which may be before a wait for the lock).
SELECT rate_limit, period_us, starts,
    coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
FROM trio_supervise_queue_rates WHERE queue = %(queue)s
FOR UPDATE;

-- name: record_starts
-- Statement 3 of the rated path: the starts after the claim.
UPDATE trio_supervise_queue_rates SET starts = %(starts)s::timestamptz[],
    throttled_until = %(throttled_until)s::timestamptz
WHERE queue = %(queue)s;

-- name: rate_of
SELECT rate_limit, period_us, starts FROM trio_supervise_queue_rates WHERE queue = %(queue)s
FOR UPDATE;

-- name: set_rate
INSERT INTO trio_supervise_queue_rates AS r (queue, rate_limit, period_us, starts, throttled_until)
VALUES (%(queue)s, %(rate_limit)s, %(period_us)s, %(starts)s::timestamptz[],
    %(throttled_until)s::timestamptz)
ON CONFLICT (queue) DO UPDATE SET rate_limit = excluded.rate_limit,
    period_us = excluded.period_us, starts = excluded.starts,
    throttled_until = excluded.throttled_until;

-- name: clear_rate
DELETE FROM trio_supervise_queue_rates WHERE queue = %(queue)s;

-- name: queue_rates
SELECT queue, rate_limit, period_us, throttled_until FROM trio_supervise_queue_rates;

-- name: key_rates_of
-- Every key rate rule, and the logs of the keys a keyed claim locked (claim_keys), read after
-- the locks were granted: so every committed claim of those keys is in them. With the time to
-- judge them by: the queue's clock, else the database's as it reads now.
-- Two arms, not one OR: that read every key's row; the rules come from their index (0014).
WITH judged AS (SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now)
SELECT key, rate_limit, period_us, starts, judged.now FROM trio_supervise_key_rates, judged
WHERE rate_limit IS NOT NULL
UNION ALL
SELECT key, rate_limit, period_us, starts, judged.now FROM trio_supervise_key_rates, judged
WHERE key = ANY(%(keys)s::text[]) AND rate_limit IS NULL;

-- name: record_key_starts
-- A key's starts after a claim (or a changed rule), in its transaction.
INSERT INTO trio_supervise_key_rates AS r (key, starts, throttled_until)
VALUES (%(key)s, %(starts)s::timestamptz[], %(throttled_until)s::timestamptz)
ON CONFLICT (key) DO UPDATE SET starts = excluded.starts,
    throttled_until = excluded.throttled_until;

-- name: prune_key_logs
-- Retention: the logs of keys whose latest start is older than the longest rule's period (no
-- window counts it any more), as many as the limit (NULL: all). The rows are locked first, and
-- their test read again on a row a claim has just written (FOR UPDATE), so a log a claim
-- extends meanwhile is kept; one a claim holds is skipped, for the next pass.
DELETE FROM trio_supervise_key_rates WHERE key IN (
    SELECT key FROM trio_supervise_key_rates
    WHERE rate_limit IS NULL
      AND (cardinality(starts) = 0 OR starts[cardinality(starts)] + (
          SELECT coalesce(max(period_us), 0) FROM trio_supervise_key_rates
          WHERE rate_limit IS NOT NULL
      ) * interval '1 microsecond' < coalesce(%(now)s::timestamptz, now()))
    ORDER BY key
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
);

-- name: set_key_rate
INSERT INTO trio_supervise_key_rates AS r (key, rate_limit, period_us)
VALUES (%(key)s, %(rate_limit)s, %(period_us)s)
ON CONFLICT (key) DO UPDATE SET rate_limit = excluded.rate_limit,
    period_us = excluded.period_us;

-- name: clear_key_rate
UPDATE trio_supervise_key_rates SET rate_limit = NULL, period_us = NULL WHERE key = %(key)s;

-- name: forget_key
DELETE FROM trio_supervise_key_rates WHERE key = %(key)s;

-- name: all_key_rates
SELECT key, rate_limit, period_us, starts, throttled_until FROM trio_supervise_key_rates
ORDER BY key;

-- name: lock_key_rates
-- A changed rule rewrites the keys' logs: locked, so no claim writes one meanwhile.
SELECT key, rate_limit, period_us, starts, throttled_until FROM trio_supervise_key_rates
ORDER BY key
FOR UPDATE;

-- name: renew_many
-- Fenced on (id, version, owner) and the running state; rows that come back are renewed.
-- A keyed row's expired lease is not renewed: its slot was free from the moment it expired
-- (a claim may have given it to another item of the key), so the late owner must stop.
UPDATE trio_supervise_items AS i SET
    lease_expires_at = coalesce(%(now)s::timestamptz, now())
        + %(lease_us)s::bigint * interval '1 microsecond',
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)b::text[], %(versions)b::bigint[], %(owners)b::text[]) AS l(id, version, owner)
WHERE i.id = l.id AND i.lease_version = l.version AND i.lease_owner = l.owner
  AND i.state = 'running'
  AND (i.concurrency_key IS NULL OR i.lease_expires_at > coalesce(%(lease_now)s::timestamptz, now()))
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
        WHEN s.kind = 'reschedule' AND i.event_woken THEN coalesce(%(now)s::timestamptz, now())
        WHEN s.kind = 'reschedule' THEN s.at
        WHEN s.kind IN ('continue', 'retry', 'release')
        THEN coalesce(%(now)s::timestamptz, now()) + s.delay_us * interval '1 microsecond'
        ELSE i.due_at
    END,
    config = CASE WHEN s.kind = 'reschedule' THEN s.config::jsonb ELSE i.config END,
    result = CASE WHEN s.kind = 'complete' THEN s.result::jsonb ELSE i.result END,
    error_count = CASE
        WHEN s.kind IN ('continue', 'reschedule') THEN 0
        WHEN s.kind IN ('retry', 'dead') OR (s.kind = 'release' AND s.error IS NOT NULL) THEN i.error_count + 1
        ELSE i.error_count
    END,
    last_error = CASE WHEN s.kind IN ('retry', 'dead') OR (s.kind = 'release' AND s.error IS NOT NULL) THEN s.error ELSE i.last_error END,
    errors = CASE WHEN s.kind IN ('retry', 'dead') OR (s.kind = 'release' AND s.error IS NOT NULL) THEN (
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
    event_woken = false,
    updated_at = coalesce(%(now)s::timestamptz, now())
-- The columns every entry fills come as array literals the client builds in one join each
-- (see settle_params in sql/_postgres_arrays.py); the others travel in binary, and an array whose values
-- are all NULL comes as NULL, which unnest pads with NULLs as it does a shorter array.
FROM unnest(
    %(ids)s::text[], %(versions)s::bigint[], %(kinds)s::text[], %(delays_us)s::bigint[],
    %(ats)b::timestamptz[], %(configs)b::text[], %(errors)b::text[], %(results)b::text[]
) WITH ORDINALITY AS s(id, version, kind, delay_us, at, config, error, result, ord)
WHERE i.id = s.id AND i.lease_version = s.version AND i.state = 'running'
RETURNING s.ord, i.spec_id, i.state, i.parent_id, i.concurrency_key,
    i.due_at <= coalesce(%(now)s::timestamptz, now()) AS due_now;

-- name: settle_alone
-- A runner's batch of settlements of items without a parent (Settlement._parentless), none
-- with children or waits, settled by one statement in autocommit: its own transaction, one
-- round trip, where the general way takes three (BEGIN, settle_many, COMMIT), and one row back
-- (the positions settled, as one array) instead of one per entry; the wake-ups are sent by the
-- statement itself (NOTIFY, as _notify sends them: the spec ids of the rows due now and of the
-- rows holding a key). No parent's fan-in can follow from such a batch; any other batch is
-- written the general way, in one transaction with its fan-in. Below, settle_many.
WITH settled AS (
{settle_many}
), woken AS (
    SELECT DISTINCT spec_id FROM settled
    WHERE (state = 'queued' AND due_now) OR concurrency_key IS NOT NULL
)
SELECT (SELECT array_agg(ord) FROM settled) AS ords,
    (SELECT count(pg_notify(%(channel)s::text, spec_id)) FROM woken) AS notified;

-- name: set_parents
-- The children a settlement just enqueued (in its transaction): their parent and the parent's
-- incarnation, and the parent's lease version when it waits for them.
UPDATE trio_supervise_items AS i SET
    parent_id = c.parent_id,
    parent_version = c.parent_version,
    parent_incarnation = (
        SELECT p.incarnation FROM trio_supervise_items AS p WHERE p.id = c.parent_id
    )
FROM unnest(%(ids)s::text[], %(parent_ids)s::text[], %(parent_versions)s::bigint[])
    AS c(id, parent_id, parent_version)
WHERE i.id = c.id;

-- name: wait_for_children
-- A parent settled "continue, waiting for its children": how many it waits for, never due
-- (%(waiting)s) meanwhile, or due now when none was created.
UPDATE trio_supervise_items SET
    waiting_children = %(n)s,
    due_at = CASE WHEN %(n)s > 0 THEN %(waiting)s::timestamptz
        ELSE coalesce(%(now)s::timestamptz, now()) END
WHERE id = %(id)s AND lease_version = %(version)s AND state = 'queued'
RETURNING spec_id, %(n)s = 0 AS due_now;

-- name: fan_in
-- Children that just finished: each waited-for one counts once (parent_version cleared) toward
-- its parent's wait, if the parent still waits at that lease version; the last makes it due
-- now. One UPDATE of the parent row, so concurrent finishes serialise on its row lock and
-- each sees the count the other left (READ COMMITTED re-reads the locked row).
WITH done AS (
    SELECT id, parent_id, parent_version FROM trio_supervise_items
    WHERE id = ANY(%(ids)s::text[]) AND parent_version IS NOT NULL
      AND state IN ('completed', 'cancelled', 'dead')
    FOR UPDATE
), cleared AS (
    UPDATE trio_supervise_items AS c SET parent_version = NULL FROM done WHERE c.id = done.id
), counted AS (
    SELECT parent_id, parent_version, count(*)::int AS n FROM done
    GROUP BY parent_id, parent_version
)
UPDATE trio_supervise_items AS p SET
    waiting_children = greatest(p.waiting_children - counted.n, 0),
    due_at = CASE WHEN p.waiting_children <= counted.n
        THEN coalesce(%(now)s::timestamptz, now()) ELSE p.due_at END,
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM counted
WHERE p.id = counted.parent_id AND p.lease_version = counted.parent_version
  AND p.state = 'queued' AND p.waiting_children > 0
RETURNING p.spec_id, p.waiting_children = 0 AS due_now;

-- name: list_children
-- The children of the parent's current incarnation (those of an earlier item with its id are
-- not its own). A child that records no incarnation was written by a worker of an older
-- release during a rolling upgrade: it is listed as before (by the parent's id alone).
SELECT {item_columns} FROM trio_supervise_items WHERE parent_id = %(parent_id)s
  AND (parent_incarnation IS NULL OR parent_incarnation = (
      SELECT p.incarnation FROM trio_supervise_items AS p WHERE p.id = %(parent_id)s
  ))
ORDER BY created_at, id
LIMIT %(limit)s;

-- name: notify
SELECT pg_notify(%(channel)s, spec_id) FROM unnest(%(spec_ids)s::text[]) AS n(spec_id);

-- name: next_due_at
-- Also returns how far away that is by the queue's clock, so waits agree with the database.
-- A keyed row whose key is at its limit is claimable no sooner than its key frees, with no
-- write in between: when the limit-th latest live lease of the key expires (blocked.until,
-- nth = its limit). With no live keyed lease anywhere (blocked is empty: one probe of the
-- partial key index) that changes nothing, and the plain minimum is all it computes; else the
-- earliest time per (key, limit) meets blocked, a few rows (a correlated subquery would be
-- costed per row, past the JIT threshold, on every wait). A full rate-limited queue
-- (throttled) takes the second way too, per queue.
WITH blocked AS MATERIALIZED (
    SELECT concurrency_key AS k, lease_expires_at AS until,
        row_number() OVER (PARTITION BY concurrency_key ORDER BY lease_expires_at DESC) AS nth
    FROM trio_supervise_items
    WHERE state = 'running' AND concurrency_key IS NOT NULL
      AND lease_expires_at > coalesce(%(lease_now)s::timestamptz, now())
), due AS NOT MATERIALIZED (
    -- The queued rows of the specs (the spec index) and the running ones (the lease index,
    -- which alone holds them: schema 0007).
    SELECT due_at AS base, concurrency_key, concurrency_limit, queue FROM trio_supervise_items
    WHERE state = 'queued' AND spec_id = ANY(%(spec_ids)s::text[])
    UNION ALL
    SELECT lease_expires_at, concurrency_key, concurrency_limit, queue FROM trio_supervise_items
    WHERE state = 'running' AND spec_id = ANY(%(spec_ids)s::text[])
), throttled AS MATERIALIZED (
    -- Rate-limited queues whose window is full (see lock_rate): claimable no sooner than it
    -- lets a claim in. None, mostly: one probe of a small table.
    SELECT queue, throttled_until AS until FROM trio_supervise_queue_rates
    WHERE throttled_until > coalesce(%(now)s::timestamptz, now())
), held AS MATERIALIZED (
    -- Keys whose rate limit's window is full: their rows are claimable no sooner than it
    -- lets a claim in. None, mostly: one probe of a small table.
    SELECT key AS k, throttled_until AS until FROM trio_supervise_key_rates
    WHERE throttled_until > coalesce(%(now)s::timestamptz, now())
), t AS MATERIALIZED (  -- computed once, though read twice below
    SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM blocked)
        AND NOT EXISTS (SELECT 1 FROM throttled)
        AND NOT EXISTS (SELECT 1 FROM held) THEN least(
        -- The plain minimum without reading every queued row: the earliest queued row, the
        -- first of a walk of the state index in due_at order, and the earliest lease among
        -- the running rows (the in-flight ones, few). least() skips a NULL.
        (
            SELECT due_at FROM trio_supervise_items
            WHERE state = 'queued' AND spec_id = ANY(%(spec_ids)s::text[])
              AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
              AND queue NOT IN (SELECT queue FROM trio_supervise_paused_queues)
            ORDER BY due_at
            LIMIT 1
        ),
        (
            SELECT min(lease_expires_at) FROM trio_supervise_items
            WHERE state = 'running' AND spec_id = ANY(%(spec_ids)s::text[])
              AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
              AND queue NOT IN (SELECT queue FROM trio_supervise_paused_queues)
        )
    ) ELSE (
        SELECT min(greatest(c.base, b.until, r.until, h.until))
        FROM (
            SELECT min(base) AS base, concurrency_key, concurrency_limit, queue FROM due
            WHERE (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
              AND queue NOT IN (SELECT queue FROM trio_supervise_paused_queues)
            GROUP BY concurrency_key, concurrency_limit, queue
        ) AS c
        LEFT JOIN blocked AS b ON b.k = c.concurrency_key AND b.nth = c.concurrency_limit
        LEFT JOIN throttled AS r ON r.queue = c.queue
        LEFT JOIN held AS h ON h.k = c.concurrency_key
    ) END AS at
)
SELECT t.at, extract(epoch FROM t.at - coalesce(%(now)s::timestamptz, now()))::float8 AS wait,
    -- Every queue waited on is throttled (see throttled): nothing can be claimed before the
    -- earliest of them frees, whatever is written meanwhile (held: seconds to it).
    (
        SELECT CASE WHEN count(*) = (SELECT count(DISTINCT q) FROM unnest(%(queues)s::text[]) AS q)
            THEN extract(epoch FROM min(r.until) - coalesce(%(now)s::timestamptz, now()))::float8
        END
        FROM throttled AS r WHERE r.queue = ANY(%(queues)s::text[])
    ) AS held
FROM t;

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
SELECT queue, state, sum(n)::bigint AS n FROM (
    SELECT queue, state, n FROM trio_supervise_counts
    UNION ALL
    SELECT queue, state, n FROM trio_supervise_count_deltas
) AS c
GROUP BY queue, state
HAVING sum(n) > 0;

-- Retention and editing (issue 15): prune, delete, edit_config.

-- name: prune
-- One state's oldest finished items (by updated_at), at most %(limit)s (NULL: all), in one
-- short statement; rows another pruner (or a retry) holds are skipped, so pruners never wait
-- on each other. A CTE (materialized, as it locks), not "id IN (subquery)": the planner may run
-- such a subquery more than once, and its LIMIT then bounds nothing. The state list is spelled
-- out so that even a generic plan of this prepared statement uses the partial index
-- trio_supervise_items_finished_idx; the locked ids are deleted through the primary key.
WITH doomed AS MATERIALIZED (
    SELECT id FROM trio_supervise_items
    WHERE state IN ('completed', 'cancelled', 'dead') AND state = %(state)s
      AND updated_at <= coalesce(%(now)s::timestamptz, now())
          - %(age_us)s::bigint * interval '1 microsecond'
    ORDER BY updated_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM trio_supervise_items
WHERE id = ANY (ARRAY(SELECT id FROM doomed));

-- name: prune_count
-- What prune would delete, without deleting it.
SELECT count(*) AS n FROM (
    SELECT 1 FROM trio_supervise_items
    WHERE state IN ('completed', 'cancelled', 'dead') AND state = %(state)s
      AND updated_at <= coalesce(%(now)s::timestamptz, now())
          - %(age_us)s::bigint * interval '1 microsecond'
    LIMIT %(limit)s
) AS t;

-- name: delete_item
DELETE FROM trio_supervise_items
-- Not a running item, a parent waiting for children, or a child its parent waits for (cancel
-- it first, so the parent's fan-in counts it).
WHERE id = %(id)s AND state <> 'running' AND waiting_children = 0 AND (
    parent_version IS NULL OR NOT EXISTS (
        SELECT 1 FROM trio_supervise_items AS p
        WHERE p.id = trio_supervise_items.parent_id
          AND p.lease_version = trio_supervise_items.parent_version
          AND p.state = 'queued' AND p.waiting_children > 0
    )
)
RETURNING {item_columns};

-- name: edit_config
UPDATE trio_supervise_items SET
    config = %(config)s::jsonb,
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s AND state <> 'running'
RETURNING {item_columns};

-- Schedules (schema 0008): each one's last enqueued fire, fleet-wide.

-- name: record_fire
-- Moves the schedule's last fire to %(fire)s if it is later (the first fire inserts the row); a
-- row back means the fire is new, to be enqueued in the same transaction. Concurrent recorders
-- of one schedule wait on its row, then see the other's fire.
INSERT INTO trio_supervise_schedules AS s (name, last_fire_at, updated_at)
VALUES (%(name)s, %(fire)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (name) DO UPDATE SET last_fire_at = excluded.last_fire_at, updated_at = excluded.updated_at
WHERE excluded.last_fire_at > s.last_fire_at
RETURNING name;

-- name: last_fires
SELECT name, last_fire_at FROM trio_supervise_schedules WHERE name = ANY(%(names)s::text[]);

-- Durable workflows (schema 0010): each item incarnation's journal and its events.

-- name: journal_item
SELECT state, incarnation, lease_version FROM trio_supervise_items WHERE id = %(id)s;

-- name: journal_item_locked
-- send_event's look at the item: its row held until the event is in, so a delete or prune
-- waits for it (and its trigger then takes the event too).
SELECT state, incarnation, lease_version FROM trio_supervise_items WHERE id = %(id)s FOR SHARE;

-- name: record_entry
-- Fenced: written only while the lease version holds the running item, under its incarnation.
-- A position is written once, except a pending wait, which its resolution replaces. No row
-- back: the queue reads why (a stale lease, or the position taken).
INSERT INTO trio_supervise_journal AS j (
    item_id, incarnation, position, kind, name, result, attempts, started_at, finished_at, wake_at
)
SELECT id, incarnation, %(position)s, %(kind)s, %(name)s, %(result)s::jsonb, %(attempts)s,
    %(started_at)s, %(finished_at)s, %(wake_at)s
FROM trio_supervise_items
WHERE id = %(id)s AND lease_version = %(version)s AND state = 'running'
ON CONFLICT (item_id, incarnation, position) DO UPDATE SET
    kind = excluded.kind, name = excluded.name, result = excluded.result,
    attempts = excluded.attempts, started_at = excluded.started_at,
    finished_at = excluded.finished_at, wake_at = excluded.wake_at
WHERE j.kind = 'wait' AND j.finished_at IS NULL
RETURNING position;

-- name: record_entries
-- record_entry for a group of entries in one statement, each fenced on its own as record_entry
-- is. The group holds one entry per item and position (ON CONFLICT touches a row once). The
-- rows written come back.
INSERT INTO trio_supervise_journal AS j (
    item_id, incarnation, position, kind, name, result, attempts, started_at, finished_at, wake_at
)
SELECT i.id, i.incarnation, r.position, r.kind, r.name, r.result::jsonb, r.attempts,
    r.started_at, r.finished_at, r.wake_at
FROM unnest(
    %(ids)s::text[], %(versions)s::bigint[], %(positions)s::int[], %(kinds)s::text[],
    %(names)s::text[], %(results)s::text[], %(attempts)s::int[],
    %(started_ats)s::timestamptz[], %(finished_ats)s::timestamptz[], %(wake_ats)s::timestamptz[]
) AS r(id, version, position, kind, name, result, attempts, started_at, finished_at, wake_at)
JOIN trio_supervise_items AS i ON i.id = r.id
WHERE i.lease_version = r.version AND i.state = 'running'
ON CONFLICT (item_id, incarnation, position) DO UPDATE SET
    kind = excluded.kind, name = excluded.name, result = excluded.result,
    attempts = excluded.attempts, started_at = excluded.started_at,
    finished_at = excluded.finished_at, wake_at = excluded.wake_at
WHERE j.kind = 'wait' AND j.finished_at IS NULL
RETURNING j.item_id, j.position;

-- name: journal_items
-- read_journal for a group of items: the items there are.
SELECT id, incarnation FROM trio_supervise_items WHERE id = ANY(%(ids)s::text[]);

-- name: journal_entries_of
SELECT j.item_id, j.position, j.kind, j.name, j.result, j.attempts, j.started_at, j.finished_at,
    j.wake_at
FROM trio_supervise_journal AS j
JOIN trio_supervise_items AS i ON i.id = j.item_id AND i.incarnation = j.incarnation
WHERE i.id = ANY(%(ids)s::text[])
ORDER BY j.item_id, j.position;

-- name: journal_events_of
SELECT e.item_id, e.name, e.payload, e.sent_at FROM trio_supervise_events AS e
JOIN trio_supervise_items AS i ON i.id = e.item_id AND i.incarnation = e.incarnation
WHERE i.id = ANY(%(ids)s::text[])
ORDER BY e.item_id, e.seq;

-- name: journal_position
SELECT kind, name FROM trio_supervise_journal
WHERE item_id = %(id)s AND incarnation = %(incarnation)s AND position = %(position)s;

-- name: insert_event
INSERT INTO trio_supervise_events (item_id, incarnation, name, payload, sent_at)
VALUES (%(id)s, %(incarnation)s, %(name)s, %(payload)s::jsonb,
    coalesce(%(now)s::timestamptz, now()));

-- name: wake_running
-- An event for a running item: its evaluation's reschedule is due at once (settle_many). The
-- item's row is held (journal_item_locked) from before the event is in, so a settlement either
-- waits for this and sees the flag, or went first and the item is queued for wake_waiting.
UPDATE trio_supervise_items SET event_woken = true WHERE id = %(id)s AND state = 'running';

-- name: wake_waiting
-- An event a queued item waits for (a pending wait of that name): due now.
UPDATE trio_supervise_items AS i SET
    due_at = coalesce(%(now)s::timestamptz, now()),
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE i.id = %(id)s AND i.state = 'queued' AND i.waiting_children = 0
  AND i.due_at > coalesce(%(now)s::timestamptz, now())
  AND EXISTS (
      SELECT 1 FROM trio_supervise_journal AS j
      WHERE j.item_id = i.id AND j.incarnation = i.incarnation
        AND j.kind = 'wait' AND j.finished_at IS NULL AND j.name = %(name)s
  )
RETURNING i.spec_id;

-- name: record_audit
INSERT INTO trio_supervise_audit (at, who, address, action, target, ok, result)
VALUES (%(at)s, %(who)s, %(address)s, %(action)s, %(target)s, %(ok)s, %(result)s);

-- name: recent_audit
-- The latest entries, newest first (the later recorded first among equal times).
SELECT at, who, address, action, target, ok, result FROM trio_supervise_audit
ORDER BY at DESC, seq DESC
LIMIT %(limit)s;

-- name: prune_audit
-- The oldest entries recorded at least %(age_us)s ago, at most %(limit)s (NULL: all); rows
-- another pruner holds are skipped.
WITH doomed AS MATERIALIZED (
    SELECT seq FROM trio_supervise_audit
    WHERE at <= coalesce(%(now)s::timestamptz, now()) - %(age_us)s::bigint * interval '1 microsecond'
    ORDER BY at, seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM trio_supervise_audit WHERE seq = ANY (ARRAY(SELECT seq FROM doomed));

-- name: prune_audit_count
SELECT count(*) AS n FROM (
    SELECT 1 FROM trio_supervise_audit
    WHERE at <= coalesce(%(now)s::timestamptz, now()) - %(age_us)s::bigint * interval '1 microsecond'
    LIMIT %(limit)s
) AS t;

-- name: items_with_errors
-- Items whose error history is not empty, by (updated_at, id) descending, after the cursor
-- (%(updated_at)s NULL: from the newest); trio_supervise_items_errors_idx serves it.
SELECT {item_columns} FROM trio_supervise_items
WHERE errors <> '[]'::jsonb
  AND (%(updated_at)s::timestamptz IS NULL OR (updated_at, id) < (%(updated_at)s::timestamptz, %(id)s::text))
ORDER BY updated_at DESC, id DESC
LIMIT %(limit)s;
