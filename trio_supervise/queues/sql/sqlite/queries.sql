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
-- Run with executemany, one parameter set per entry, in one transaction, for a batch with a
-- fractional timeout (enqueue_rows below otherwise). An entry whose idempotency key another
-- item holds is skipped (DO NOTHING).
INSERT INTO trio_supervise_items (
    id, spec_id, tenant_id, subject_id, config, state, due_at, idempotency_key,
    created_at, updated_at, priority, queue, timeout, unique_scope, unique_until,
    concurrency_key, concurrency_limit, tags, start_by, traceparent, incarnation
) VALUES (
    :id, :spec_id, :tenant_id, :subject_id, :config, 'queued', :due_at, :idempotency_key,
    :now, :now, :priority, :queue, :timeout, :unique_scope, :now + :period_us,
    :concurrency_key, :concurrency_limit, :tags, :start_by, :traceparent, :incarnation
)
ON CONFLICT (idempotency_key) DO NOTHING;

-- name: enqueue_rows
-- The same insert as one statement over json_each(:rows), two to three times as fast as
-- executemany of enqueue, whose per-row cost is binding the parameters and stepping the
-- statement from Python. A template: the queue fills in each column's placeholder
-- (NEW_ROW_COLUMNS in sql/_rows.py) with the parameter of the column's name when every row has
-- the same value there (most of a batch: one spec, no key, no timeout...), else with the
-- row's value from the JSON; the fewer values the JSON holds per row, the faster (see
-- _enqueue_rows_query in sql/_sqlite.py). Scalars come out of json_extract as SQL values (text,
-- integer, real, NULL). WHERE true: an upsert's SELECT needs a WHERE (SQLite's parsing
-- ambiguity).
INSERT INTO trio_supervise_items (
    id, spec_id, tenant_id, subject_id, config, state, due_at, idempotency_key,
    created_at, updated_at, priority, queue, timeout, unique_scope, unique_until,
    concurrency_key, concurrency_limit, tags, start_by, traceparent, incarnation
)
SELECT {id}, {spec_id}, {tenant_id}, {subject_id}, {config}, 'queued', {due_at},
    {idempotency_key}, :now, :now, {priority}, {queue}, {timeout}, {unique_scope},
    :now + {period_us}, {concurrency_key}, {concurrency_limit}, {tags}, {start_by},
    {traceparent},
    :incarnation
FROM json_each(:rows) AS r
WHERE true
ON CONFLICT (idempotency_key) DO NOTHING;

-- name: next_version
-- A lease version never given before, for a claim's rows (schema 0005), inside the caller's
-- write transaction.
UPDATE trio_supervise_counters SET next_version = next_version + 1
RETURNING next_version - 1 AS version;

-- name: claim_version
-- A claim's lease version (next_version), and its queue's rate limit with the starts it
-- recorded (NULL for a queue without one), in the one statement a claim took before rate
-- limits: an unlimited queue's claim costs one index probe more, no statement.
UPDATE trio_supervise_counters SET next_version = next_version + 1
RETURNING next_version - 1 AS version, (
    SELECT json_array(r.rate_limit, r.period_us, json(r.starts))
    FROM trio_supervise_queue_rates AS r WHERE r.queue = :queue
) AS rate, (
    -- Whether a key rate limit exists (then the claim reads them: claimable_keys, key_rates_of).
    SELECT 1 FROM trio_supervise_key_rates AS k WHERE k.rate_limit IS NOT NULL LIMIT 1
) AS key_rated;

-- name: record_starts
-- A rate-limited queue's starts after a claim (see docs/flow-control.md), in its transaction.
UPDATE trio_supervise_queue_rates SET starts = :starts, throttled_until = :throttled_until
WHERE queue = :queue;

-- name: rate_of
SELECT rate_limit, period_us, starts FROM trio_supervise_queue_rates WHERE queue = :queue;

-- name: set_rate
INSERT INTO trio_supervise_queue_rates (queue, rate_limit, period_us, starts, throttled_until)
VALUES (:queue, :rate_limit, :period_us, :starts, :throttled_until)
ON CONFLICT (queue) DO UPDATE SET rate_limit = excluded.rate_limit,
    period_us = excluded.period_us, starts = excluded.starts,
    throttled_until = excluded.throttled_until;

-- name: clear_rate
DELETE FROM trio_supervise_queue_rates WHERE queue = :queue;

-- name: queue_rates
SELECT queue, rate_limit, period_us, throttled_until FROM trio_supervise_queue_rates;

-- name: claimable_keys
-- A claim's keys when key rate limits exist (see docs/flow-control.md), under the write lock:
-- the keys of the first :limit rows claim_due's window could take, leaving out (as it does)
-- keys at their concurrency limit and keys whose rate window is full (throttled_until later
-- than :now: a full window lets none start). key_rates_of reads their rules and logs, and
-- claim_due then takes unkeyed rows and rows of these keys only, each no more than its window
-- lets start. So a claim reads the logs of at most :limit keys and passes as many caps,
-- however many keys are waiting (all of them, each cap looked up for each row of the window,
-- made a claim cost the number of keys waiting times the rows it read).
SELECT DISTINCT concurrency_key AS key FROM (
    SELECT concurrency_key FROM trio_supervise_items AS c
    WHERE queue = :queue AND state IN ('queued', 'running')
      AND spec_id IN (SELECT value FROM json_each(:spec_ids))
      AND CASE WHEN state = 'queued' THEN due_at <= :now ELSE lease_expires_at <= :lease_now END
      AND NOT EXISTS (SELECT 1 FROM trio_supervise_paused_queues AS p WHERE p.queue = :queue)
      AND (c.concurrency_key IS NULL OR ((
          SELECT count(*) FROM trio_supervise_items AS r
          WHERE r.state = 'running' AND r.concurrency_key = c.concurrency_key
            AND r.lease_expires_at > :lease_now
      ) < c.concurrency_limit AND NOT EXISTS (
          SELECT 1 FROM trio_supervise_key_rates AS t
          WHERE t.key = c.concurrency_key AND t.throttled_until > :now
      )))
    ORDER BY priority, due_at, id
    LIMIT :limit
) WHERE concurrency_key IS NOT NULL;

-- name: key_rates_of
-- Every key rate rule (from the rules index, schema 0011), and the logs of :keys; with the
-- time to judge them by. Two arms, not one OR: that read every key's row.
SELECT key, rate_limit, period_us, starts, :now AS now FROM trio_supervise_key_rates
WHERE rate_limit IS NOT NULL
UNION ALL
SELECT key, rate_limit, period_us, starts, :now AS now FROM trio_supervise_key_rates
WHERE key IN (SELECT value FROM json_each(:keys)) AND rate_limit IS NULL;

-- name: record_key_starts
-- A key's starts after a claim (or a changed rule), in its transaction.
INSERT INTO trio_supervise_key_rates (key, starts, throttled_until)
VALUES (:key, :starts, :throttled_until)
ON CONFLICT (key) DO UPDATE SET starts = excluded.starts,
    throttled_until = excluded.throttled_until;

-- name: prune_key_logs
-- Retention: the logs of keys whose latest start is older than the longest rule's period (no
-- window counts it any more), :limit of them (-1: all). Starts are kept oldest first.
DELETE FROM trio_supervise_key_rates WHERE key IN (
    SELECT key FROM trio_supervise_key_rates
    WHERE rate_limit IS NULL
      AND (json_extract(starts, '$[#-1]') IS NULL OR json_extract(starts, '$[#-1]') + (
          SELECT coalesce(max(period_us), 0) FROM trio_supervise_key_rates
          WHERE rate_limit IS NOT NULL
      ) < :now)
    ORDER BY key
    LIMIT :limit
);

-- name: set_key_rate
INSERT INTO trio_supervise_key_rates (key, rate_limit, period_us)
VALUES (:key, :rate_limit, :period_us)
ON CONFLICT (key) DO UPDATE SET rate_limit = excluded.rate_limit,
    period_us = excluded.period_us;

-- name: clear_key_rate
UPDATE trio_supervise_key_rates SET rate_limit = NULL, period_us = NULL WHERE key = :key;

-- name: forget_key
DELETE FROM trio_supervise_key_rates WHERE key = :key;

-- name: all_key_rates
SELECT key, rate_limit, period_us, starts, throttled_until FROM trio_supervise_key_rates
ORDER BY key;

-- name: lock_key_rates
SELECT key, rate_limit, period_us, starts, throttled_until FROM trio_supervise_key_rates
ORDER BY key;

-- name: next_incarnation
-- An incarnation never given before, for an insert's rows (schema 0005), inside the caller's
-- write transaction.
UPDATE trio_supervise_counters SET next_incarnation = next_incarnation + 1
RETURNING next_incarnation - 1 AS incarnation;

-- name: release_keys
-- A key whose holder's scope has lapsed ('unfinished': the holder finished; 'period': past
-- unique_until) moves to the holder's released_key, so the insert after it may take it.
UPDATE trio_supervise_items SET released_key = idempotency_key, idempotency_key = NULL
WHERE idempotency_key IN (SELECT value FROM json_each(:keys))
  AND (
      (unique_scope = 'unfinished' AND state IN ('completed', 'cancelled', 'dead'))
      OR (unique_scope = 'period' AND unique_until <= :now)
  );

-- name: debounce
-- A debounced enqueue meets its key's queued holder (not one waiting for children): the holder
-- takes the entry's config and due time (see docs/flow-control.md).
UPDATE trio_supervise_items SET config = :config, due_at = :due_at, updated_at = :now
WHERE id = :id AND state = 'queued' AND waiting_children = 0
RETURNING {item_columns};

-- name: release_running_key
-- A debounced enqueue meets its key's running holder: the key moves to the new item (the
-- running one keeps it as released_key, as a lapsed holder does).
UPDATE trio_supervise_items SET released_key = idempotency_key, idempotency_key = NULL
WHERE id = :id AND state = 'running' AND idempotency_key IS NOT NULL
RETURNING id;

-- name: holders
SELECT {item_columns} FROM trio_supervise_items
WHERE idempotency_key IN (SELECT value FROM json_each(:keys));

-- name: existing_ids
SELECT id FROM trio_supervise_items WHERE id IN (SELECT value FROM json_each(:ids));

-- name: get_by_key
-- The key's holder, else the newest item that held it.
SELECT {item_columns} FROM trio_supervise_items
WHERE idempotency_key = :key OR released_key = :key
ORDER BY idempotency_key IS NULL, created_at DESC, id DESC
LIMIT 1;

-- name: get
SELECT {item_columns} FROM trio_supervise_items WHERE id = :id;

-- name: list_state
-- One page of one state, after the cursor (due_at, id): a range of the state index, so it
-- costs the rows shown. list_items runs one per state and merges them. With :tags (a JSON
-- array), only items carrying every one of them: a filter on the same range.
SELECT {item_columns} FROM trio_supervise_items
WHERE state = :state AND (due_at, id) > (:after_due, :after_id)
  AND (:tags IS NULL OR NOT EXISTS (
      SELECT 1 FROM json_each(:tags) AS w
      WHERE w.value NOT IN (SELECT value FROM json_each(trio_supervise_items.tags))
  ))
ORDER BY due_at, id
LIMIT :limit;

-- name: list_state_specs
SELECT {item_columns} FROM trio_supervise_items
WHERE state = :state AND (due_at, id) > (:after_due, :after_id)
  AND spec_id IN (SELECT value FROM json_each(:spec_ids))
  AND (:tags IS NULL OR NOT EXISTS (
      SELECT 1 FROM json_each(:tags) AS w
      WHERE w.value NOT IN (SELECT value FROM json_each(trio_supervise_items.tags))
  ))
ORDER BY due_at, id
LIMIT :limit;

-- name: counts
-- From the counts the triggers keep (schema 0004): a few rows, however many items there are.
SELECT spec_id, state, sum(n) AS n FROM trio_supervise_counts
GROUP BY spec_id, state
HAVING sum(n) > 0;

-- name: request_cancel
-- Queued: cancelled at once (a parent cancelled while it waits for children waits no more).
-- Running: flagged for its owner. Anything else (finished, or flagged already) is not written:
-- no row comes back, and the queue reads the item as it is.
UPDATE trio_supervise_items SET
    state = CASE WHEN state = 'queued' THEN 'cancelled' ELSE state END,
    cancel_requested = 1,
    waiting_children = CASE WHEN state = 'queued' THEN 0 ELSE waiting_children END,
    updated_at = :now
WHERE id = :id AND (state = 'queued' OR (state = 'running' AND NOT cancel_requested))
RETURNING {item_columns};

-- name: retry
UPDATE trio_supervise_items SET
    state = 'queued',
    due_at = :at,
    lease_owner = NULL,
    lease_expires_at = NULL,
    error_count = 0,
    attempt = 0,
    cancel_requested = 0,
    waiting_children = 0,
    updated_at = :now
WHERE id = :id AND state <> 'running'
RETURNING {item_columns}, due_at <= :now AS due_now;

-- name: claim_due
-- One queue's claimable rows in (priority, due_at, id) order (none while it is paused), leased
-- in one statement inside BEGIN IMMEDIATE. Running rows whose lease has expired are rescued
-- here too. The claim counts the attempt.
--
-- Concurrency keys (see docs/queues.md, "Concurrency keys"): a keyed row is claimable only while fewer
-- than its concurrency_limit running rows of its key hold a live lease (lease_expires_at >
-- now; an expired one is being rescued, not run). The window leaves out rows whose key is at
-- its limit, so blocked keyed rows at the head never starve the rows behind them; of the
-- window's rows of one key, only the first (limit - live) are taken: a keyed row's rank is
-- the count of the window's rows of its key before it. Unkeyed rows skip every count, so the
-- common claim costs what it did before keys. The counts are atomic: BEGIN IMMEDIATE makes
-- this the only writer, and the window is materialized before any row is written. Each live
-- count is a probe of trio_supervise_items_key_idx.
WITH window_rows AS MATERIALIZED (
    SELECT id, priority, due_at, concurrency_key, concurrency_limit
    FROM trio_supervise_items AS c
    WHERE queue = :queue AND state IN ('queued', 'running')
      AND spec_id IN (SELECT value FROM json_each(:spec_ids))
      AND CASE WHEN state = 'queued' THEN due_at <= :now ELSE lease_expires_at <= :lease_now END
      AND NOT EXISTS (SELECT 1 FROM trio_supervise_paused_queues AS p WHERE p.queue = :queue)
      AND (c.concurrency_key IS NULL OR ((
          SELECT count(*) FROM trio_supervise_items AS r
          WHERE r.state = 'running' AND r.concurrency_key = c.concurrency_key
            AND r.lease_expires_at > :lease_now
      ) < c.concurrency_limit AND (:key_caps IS NULL OR coalesce((
          -- With key rate limits (docs/flow-control.md), only the keys claimable_keys found,
          -- each with a cap (a large one if no rule holds it); a key whose window is full
          -- (cap 0) is left out.
          SELECT k.value FROM json_each(:key_caps) AS k WHERE k.key = c.concurrency_key
      ), 0) > 0)))
    ORDER BY priority, due_at, id
    LIMIT :limit
)
UPDATE trio_supervise_items SET
    state = 'running',
    lease_owner = :worker_id,
    lease_expires_at = :now + :lease_us,
    -- From the database's counter (next_version): never a version this id had before, in any
    -- incarnation; and above the row's own, whoever wrote it.
    lease_version = max(lease_version + 1, :version),
    attempt = attempt + 1,
    updated_at = :now
WHERE id IN (
    SELECT w.id FROM window_rows AS w
    WHERE w.concurrency_key IS NULL OR ((
        SELECT count(*) FROM trio_supervise_items AS r
        WHERE r.state = 'running' AND r.concurrency_key = w.concurrency_key
          AND r.lease_expires_at > :lease_now
    ) + (
        SELECT count(*) FROM window_rows AS e
        WHERE e.concurrency_key = w.concurrency_key
          AND (e.priority, e.due_at, e.id) < (w.priority, w.due_at, w.id)
    ) < w.concurrency_limit AND (:key_caps IS NULL OR (
        -- Of a rate-limited key's rows, only as many as its window lets start.
        SELECT count(*) FROM window_rows AS e
        WHERE e.concurrency_key = w.concurrency_key
          AND (e.priority, e.due_at, e.id) < (w.priority, w.due_at, w.id)
    ) < coalesce((
        SELECT k.value FROM json_each(:key_caps) AS k WHERE k.key = w.concurrency_key
    ), 2147483647)))
)
RETURNING {item_columns};

-- name: renew_many
-- Fenced on (id, version, owner) and the running state; rows that come back are renewed. A
-- template, as settle_many below: {rows} is one "(?, ?, ?)" per lease, in the columns of l;
-- ?1 is now, ?2 is lease_us, ?3 lease_now (the time that judges an expiry, see StepGuard). A
-- keyed row's expired lease is not renewed: its slot was free from the moment it expired (a
-- claim may have given it to another item of the key), so the late owner must stop.
WITH l (id, version, owner) AS (VALUES {rows})
UPDATE trio_supervise_items SET
    lease_expires_at = ?1 + ?2,
    updated_at = ?1
FROM l
WHERE trio_supervise_items.id = l.id AND trio_supervise_items.lease_version = l.version
  AND trio_supervise_items.lease_owner = l.owner AND trio_supervise_items.state = 'running'
  AND (concurrency_key IS NULL OR lease_expires_at > ?3)
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

-- name: settle_many
-- Every outcome of a batch in one statement, fenced on (id, version) and the running state:
-- stepping one statement per outcome from Python costs twice what the writes do. A template:
-- the queue fills in {outcomes} (settle_outcomes, or settle_plain_outcomes for a batch of plain
-- outcomes) and in it {rows}, one "(?, ?, ...)" of numbered parameters per outcome; ?1 is now,
-- ?2 is max_errors (_execute_values in sql/_sqlite.py). The batch never holds two outcomes for
-- one (id, version): the queue drops repeats before sending. RETURNING may name only the
-- updated table, so the queue finds each row's outcome by (id, lease_version).
WITH s (id, version, kind, error, delay_us, at, config, result) AS ({outcomes})
UPDATE trio_supervise_items SET
    state = CASE s.kind
        WHEN 'complete' THEN 'completed'
        WHEN 'cancel' THEN 'cancelled'
        WHEN 'dead' THEN 'dead'
        ELSE 'queued'
    END,
    due_at = CASE
        -- An event came while it ran (schema 0007): its reschedule is due at once.
        WHEN s.kind = 'reschedule' AND trio_supervise_items.event_woken THEN ?1
        WHEN s.kind = 'reschedule' THEN s.at
        WHEN s.kind IN ('continue', 'retry', 'release') THEN ?1 + s.delay_us
        ELSE trio_supervise_items.due_at
    END,
    config = CASE WHEN s.kind = 'reschedule' THEN s.config ELSE trio_supervise_items.config END,
    result = CASE WHEN s.kind = 'complete' THEN s.result ELSE trio_supervise_items.result END,
    error_count = CASE
        WHEN s.kind IN ('continue', 'reschedule') THEN 0
        WHEN s.kind IN ('retry', 'dead') OR (s.kind = 'release' AND s.error IS NOT NULL) THEN error_count + 1
        ELSE error_count
    END,
    last_error = CASE WHEN s.kind IN ('retry', 'dead') OR (s.kind = 'release' AND s.error IS NOT NULL) THEN s.error ELSE last_error END,
    errors = CASE WHEN s.kind IN ('retry', 'dead') OR (s.kind = 'release' AND s.error IS NOT NULL) THEN (
            -- The history with this error appended (lease owner and attempt as stored), the newest
            -- max_errors kept; SET reads the row as it was, so errors is the old array.
            SELECT json_group_array(json(value)) FROM json_each(json_insert(errors, '$[#]', json_object(
                'at', ?1, 'worker', coalesce(lease_owner, ''), 'attempt', attempt, 'error', s.error
            )))
            WHERE key > json_array_length(errors) - ?2
        ) ELSE errors END,
    attempt = CASE
        WHEN s.kind IN ('continue', 'reschedule') THEN 0
        WHEN s.kind = 'release' THEN max(attempt - 1, 0)
        ELSE attempt
    END,
    lease_owner = NULL,
    lease_expires_at = NULL,
    event_woken = 0,
    updated_at = ?1
FROM s
WHERE trio_supervise_items.id = s.id AND trio_supervise_items.lease_version = s.version
  AND trio_supervise_items.state = 'running'
RETURNING id, lease_version, spec_id, state, parent_id, concurrency_key, due_at <= ?1 AS due_now;

-- name: settle_outcomes
-- settle_many's outcomes, each row the eight columns of s.
VALUES {rows}

-- name: settle_plain_outcomes
-- settle_many's outcomes when none has an error, a delay, a time, a config or a result (a batch
-- of completions, releases or cancellations): the id, version and kind a row, the rest written
-- here. Python's sqlite3 binds a NULL parameter at three times an integer's cost (a failed
-- adapter lookup), and the full rows held four of them per outcome.
SELECT column1, column2, column3, NULL, 0, NULL, NULL, NULL FROM (VALUES {rows})

-- name: set_parent
-- A child a settlement just enqueued (in its transaction): its parent and the parent's
-- incarnation, and the parent's lease version when it waits for it.
UPDATE trio_supervise_items SET
    parent_id = :parent_id,
    parent_version = :parent_version,
    parent_incarnation = (
        SELECT p.incarnation FROM trio_supervise_items AS p WHERE p.id = :parent_id
    )
WHERE id = :id;

-- name: wait_for_children
-- A parent settled "continue, waiting for its children": how many it waits for, never due
-- (:waiting) meanwhile, or due now when none was created.
UPDATE trio_supervise_items SET
    waiting_children = :n,
    due_at = CASE WHEN :n > 0 THEN :waiting ELSE :now END
WHERE id = :id AND lease_version = :version AND state = 'queued'
RETURNING spec_id, :n = 0 AS due_now;

-- name: waited_parent
-- A child that just finished, if its parent waits for it and it has not been counted yet.
SELECT parent_id, parent_version FROM trio_supervise_items
WHERE id = :id AND parent_version IS NOT NULL AND state IN ('completed', 'cancelled', 'dead');

-- name: counted
UPDATE trio_supervise_items SET parent_version = NULL WHERE id = :id;

-- name: count_down
-- One less child to wait for, if the parent still waits at that lease version; the last one
-- makes it due now (SET reads the row as it was).
UPDATE trio_supervise_items SET
    waiting_children = waiting_children - 1,
    due_at = CASE WHEN waiting_children = 1 THEN :now ELSE due_at END,
    updated_at = :now
WHERE id = :parent_id AND lease_version = :parent_version AND state = 'queued'
  AND waiting_children > 0
RETURNING spec_id, waiting_children = 0 AS due_now;

-- name: list_children
-- The children of the parent's current incarnation (those of an earlier item with its id are
-- not its own). A child that records no incarnation was written by a worker of an older
-- release during a rolling upgrade: it is listed as before (by the parent's id alone).
SELECT {item_columns} FROM trio_supervise_items WHERE parent_id = :parent_id
  AND (parent_incarnation IS NULL OR parent_incarnation = (
      SELECT p.incarnation FROM trio_supervise_items AS p WHERE p.id = :parent_id
  ))
ORDER BY created_at, id
LIMIT :limit;

-- name: next_due_at
-- Also returns how far away that is, in seconds by the queue's clock. A keyed row whose key is
-- at its limit is claimable no sooner than its key frees, with no write in between: when the
-- limit-th latest live lease of the key expires (blocked.until, nth = its limit). A row of a
-- rate-limited queue whose window is full, no sooner than the window lets a claim in
-- (throttled_until); with no rate limit anywhere that probe is not made.
WITH blocked AS (
    SELECT concurrency_key AS k, lease_expires_at AS until,
        row_number() OVER (PARTITION BY concurrency_key ORDER BY lease_expires_at DESC) AS nth
    FROM trio_supervise_items
    WHERE state = 'running' AND concurrency_key IS NOT NULL AND lease_expires_at > :lease_now
)
SELECT t.at, (t.at - :now) / 1000000.0 AS wait, (
    -- Every queue waited on is rate-limited and its window full: nothing can be claimed
    -- before the earliest of them frees, whatever is written meanwhile (held: seconds to it).
    SELECT CASE WHEN count(*) = (SELECT count(DISTINCT value) FROM json_each(:queues))
        THEN (min(r.throttled_until) - :now) / 1000000.0 END
    FROM trio_supervise_queue_rates AS r
    WHERE :queues IS NOT NULL AND r.throttled_until > :now
      AND r.queue IN (SELECT value FROM json_each(:queues))
) AS held
FROM (
    SELECT min(max(CASE WHEN c.concurrency_key IS NULL THEN c.base ELSE max(c.base, coalesce((
        SELECT b.until FROM blocked AS b
        WHERE b.k = c.concurrency_key AND b.nth = c.concurrency_limit
    ), c.base)) END, CASE WHEN (SELECT 1 FROM trio_supervise_queue_rates LIMIT 1) IS NULL THEN 0
        ELSE coalesce((
            SELECT r.throttled_until FROM trio_supervise_queue_rates AS r
            WHERE r.queue = c.queue AND r.throttled_until > :now
        ), 0) END, CASE WHEN c.concurrency_key IS NULL
        OR (SELECT 1 FROM trio_supervise_key_rates LIMIT 1) IS NULL THEN 0
        ELSE coalesce((
            -- Nor before its key's rate limit lets a start in (docs/flow-control.md).
            SELECT k.throttled_until FROM trio_supervise_key_rates AS k
            WHERE k.key = c.concurrency_key AND k.throttled_until > :now
        ), 0) END)) AS at
    FROM (
        SELECT CASE WHEN state = 'queued' THEN due_at ELSE lease_expires_at END AS base,
            concurrency_key, concurrency_limit, queue
        FROM trio_supervise_items
        WHERE state IN ('queued', 'running')
          AND spec_id IN (SELECT value FROM json_each(:spec_ids))
          AND (:queues IS NULL OR queue IN (SELECT value FROM json_each(:queues)))
          AND queue NOT IN (SELECT queue FROM trio_supervise_paused_queues)
    ) AS c
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
SELECT queue, state, sum(n) AS n FROM trio_supervise_counts
GROUP BY queue, state
HAVING sum(n) > 0;

-- Retention and editing (issue 15): prune, delete, edit_config.

-- name: prune
-- One state's oldest finished items (by updated_at), at most :limit (-1: all), in the caller's
-- short BEGIN IMMEDIATE transaction. The state list is spelled out so the planner uses the
-- partial index trio_supervise_items_finished_idx (a bound :state alone cannot imply it).
DELETE FROM trio_supervise_items
WHERE id IN (
    SELECT id FROM trio_supervise_items
    WHERE state IN ('completed', 'cancelled', 'dead') AND state = :state
      AND updated_at <= :now - :age_us
    ORDER BY updated_at
    LIMIT :limit
);

-- name: prune_count
-- What prune would delete, without deleting it.
SELECT count(*) AS n FROM (
    SELECT 1 FROM trio_supervise_items
    WHERE state IN ('completed', 'cancelled', 'dead') AND state = :state
      AND updated_at <= :now - :age_us
    LIMIT :limit
) AS t;

-- name: delete_item
DELETE FROM trio_supervise_items
-- Not a running item, a parent waiting for children, or a child its parent waits for (cancel
-- it first, so the parent's fan-in counts it).
WHERE id = :id AND state <> 'running' AND waiting_children = 0 AND (
    parent_version IS NULL OR NOT EXISTS (
        SELECT 1 FROM trio_supervise_items AS p
        WHERE p.id = trio_supervise_items.parent_id
          AND p.lease_version = trio_supervise_items.parent_version
          AND p.state = 'queued' AND p.waiting_children > 0
    )
)
RETURNING {item_columns};

-- name: edit_config
UPDATE trio_supervise_items SET config = :config, updated_at = :now
WHERE id = :id AND state <> 'running'
RETURNING {item_columns};

-- Schedules (schema 0005): each one's last enqueued fire, fleet-wide.

-- name: record_fire
-- Moves the schedule's last fire to :fire if it is later (the first fire inserts the row); a
-- row back means the fire is new, to be enqueued in the same transaction.
INSERT INTO trio_supervise_schedules (name, last_fire_at, updated_at) VALUES (:name, :fire, :now)
ON CONFLICT (name) DO UPDATE SET last_fire_at = excluded.last_fire_at, updated_at = excluded.updated_at
WHERE excluded.last_fire_at > trio_supervise_schedules.last_fire_at
RETURNING name;

-- name: last_fires
SELECT name, last_fire_at FROM trio_supervise_schedules
WHERE name IN (SELECT value FROM json_each(:names));

-- Durable workflows (schema 0007): each item incarnation's journal and its events.

-- name: journal_item
SELECT state, incarnation, lease_version FROM trio_supervise_items WHERE id = :id;

-- name: record_entry
-- Fenced: written only while the lease version holds the running item, under its incarnation.
-- A position is written once, except a pending wait, which its resolution replaces. No row
-- back: the queue reads why (a stale lease, or the position taken).
INSERT INTO trio_supervise_journal (
    item_id, incarnation, position, kind, name, result, attempts, started_at, finished_at, wake_at
)
SELECT id, incarnation, :position, :kind, :name, :result, :attempts, :started_at, :finished_at,
    :wake_at
FROM trio_supervise_items WHERE id = :id AND lease_version = :version AND state = 'running'
ON CONFLICT (item_id, incarnation, position) DO UPDATE SET
    kind = excluded.kind, name = excluded.name, result = excluded.result,
    attempts = excluded.attempts, started_at = excluded.started_at,
    finished_at = excluded.finished_at, wake_at = excluded.wake_at
WHERE trio_supervise_journal.kind = 'wait' AND trio_supervise_journal.finished_at IS NULL
RETURNING position;

-- name: record_entries
-- record_entry for a group of entries in one statement: each row of :rows is
-- [id, version, position, kind, name, result (JSON text), attempts, started_at, finished_at,
-- wake_at], each fenced on its own as record_entry is. The group holds one entry per item and
-- position. The rows written come back.
INSERT INTO trio_supervise_journal (
    item_id, incarnation, position, kind, name, result, attempts, started_at, finished_at, wake_at
)
SELECT i.id, i.incarnation, json_extract(r.value, '$[2]'), json_extract(r.value, '$[3]'),
    json_extract(r.value, '$[4]'), json_extract(r.value, '$[5]'), json_extract(r.value, '$[6]'),
    json_extract(r.value, '$[7]'), json_extract(r.value, '$[8]'), json_extract(r.value, '$[9]')
FROM json_each(:rows) AS r
JOIN trio_supervise_items AS i ON i.id = json_extract(r.value, '$[0]')
WHERE i.lease_version = json_extract(r.value, '$[1]') AND i.state = 'running'
ON CONFLICT (item_id, incarnation, position) DO UPDATE SET
    kind = excluded.kind, name = excluded.name, result = excluded.result,
    attempts = excluded.attempts, started_at = excluded.started_at,
    finished_at = excluded.finished_at, wake_at = excluded.wake_at
WHERE trio_supervise_journal.kind = 'wait' AND trio_supervise_journal.finished_at IS NULL
RETURNING item_id, position;

-- name: journal_items
-- read_journal for a group of items (:ids, a JSON array): the items there are.
SELECT id, incarnation FROM trio_supervise_items
WHERE id IN (SELECT value FROM json_each(:ids));

-- name: journal_entries_of
SELECT j.item_id, j.position, j.kind, j.name, j.result, j.attempts, j.started_at, j.finished_at,
    j.wake_at
FROM trio_supervise_journal AS j
JOIN trio_supervise_items AS i ON i.id = j.item_id AND i.incarnation = j.incarnation
WHERE i.id IN (SELECT value FROM json_each(:ids))
ORDER BY j.item_id, j.position;

-- name: journal_events_of
SELECT e.item_id, e.name, e.payload, e.sent_at FROM trio_supervise_events AS e
JOIN trio_supervise_items AS i ON i.id = e.item_id AND i.incarnation = e.incarnation
WHERE i.id IN (SELECT value FROM json_each(:ids))
ORDER BY e.item_id, e.seq;

-- name: journal_position
SELECT kind, name FROM trio_supervise_journal
WHERE item_id = :id AND incarnation = :incarnation AND position = :position;

-- name: insert_event
INSERT INTO trio_supervise_events (item_id, incarnation, name, payload, sent_at)
VALUES (:id, :incarnation, :name, :payload, :now);

-- name: wake_running
-- An event for a running item: its evaluation's reschedule is due at once (settle_many).
UPDATE trio_supervise_items SET event_woken = 1 WHERE id = :id AND state = 'running';

-- name: wake_waiting
-- An event a queued item waits for (a pending wait of that name): due now.
UPDATE trio_supervise_items SET due_at = :now, updated_at = :now
WHERE id = :id AND state = 'queued' AND waiting_children = 0 AND due_at > :now
  AND EXISTS (
      SELECT 1 FROM trio_supervise_journal AS j
      WHERE j.item_id = trio_supervise_items.id
        AND j.incarnation = trio_supervise_items.incarnation
        AND j.kind = 'wait' AND j.finished_at IS NULL AND j.name = :name
  )
RETURNING spec_id;

-- name: record_audit
INSERT INTO trio_supervise_audit (at, who, address, action, target, ok, result)
VALUES (:at, :who, :address, :action, :target, :ok, :result);

-- name: recent_audit
-- The latest entries, newest first (the later recorded first among equal times).
SELECT at, who, address, action, target, ok, result FROM trio_supervise_audit
ORDER BY at DESC, seq DESC
LIMIT :limit;

-- name: prune_audit
-- The oldest entries recorded at least :age_us ago, at most :limit (-1: all).
DELETE FROM trio_supervise_audit
WHERE seq IN (
    SELECT seq FROM trio_supervise_audit
    WHERE at <= :now - :age_us
    ORDER BY at, seq
    LIMIT :limit
);

-- name: prune_audit_count
SELECT count(*) AS n FROM (
    SELECT 1 FROM trio_supervise_audit WHERE at <= :now - :age_us LIMIT :limit
) AS t;

-- name: items_with_errors
-- Items whose error history is not empty, by (updated_at, id) descending, after the cursor
-- (:updated_at NULL: from the newest); trio_supervise_items_errors_idx serves it.
SELECT {item_columns} FROM trio_supervise_items
WHERE errors <> '[]' AND (:updated_at IS NULL OR (updated_at, id) < (:updated_at, :id))
ORDER BY updated_at DESC, id DESC
LIMIT :limit;
