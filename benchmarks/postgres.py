"""P2, P2f, P6 and P7: the runner on PostgreSQL against Procrastinate, the raw SQL floor, polling,
and one worker process.

Benchmark data lives in schemas of its own (``bench_ts_<pid>``, ``bench_floor_<pid>``,
``bench_p7_<pid>``), dropped at the end; Procrastinate gets a database of its own
(``bench_procrastinate_<pid>``), dropped too. The process id keeps two runs on one server (CI and a
developer, say) from dropping each other's data mid-run.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import trio

import trio_supervise as ts
from trio_supervise.queues import PostgresQueue
from trio_supervise.queues.sql._postgres_db import migrate_dsn

from ._common import (
    Config,
    NoopDriver,
    Result,
    best_of,
    child_env,
    machine_cpu,
    noop_step,
    now,
    rate,
    run_json,
    wall,
)
from ._cost import Cost, server_cost
from ._runs import noop_rate, run_until

CONCURRENCY = 64
FLOOR_BATCH = 100
_RUN = os.getpid()
TS_SCHEMA = f"bench_ts_{_RUN}"
FLOOR_SCHEMA = f"bench_floor_{_RUN}"
P7_SCHEMA = f"bench_p7_{_RUN}"
PROCRASTINATE_DB = f"bench_procrastinate_{_RUN}"
PGQUEUER_DB = f"bench_pgqueuer_{_RUN}"
PGQUEUER_BATCHES = (64, 200)
OURS_CONCURRENCY_PER_BATCH = 2
"""P8: our runner's concurrency in claim batches (two: one is claimed while one is evaluated)."""


def _connect(dsn: str, **kwargs: object):  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(dsn, autocommit=True, **kwargs)  # type: ignore[arg-type]


def drop_schema(dsn: str, schema: str) -> None:
    with _connect(dsn) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@contextlib.contextmanager
def bench_schema(dsn: str, schema: str) -> Iterator[None]:
    """A fresh queue schema for the body, dropped afterwards."""
    drop_schema(dsn, schema)
    trio.run(_migrate, dsn, schema)
    try:
        yield
    finally:
        drop_schema(dsn, schema)


async def _migrate(dsn: str, schema: str) -> None:
    await migrate_dsn(dsn, schema=schema)


def fill(dsn: str, schema: str, count: int, spec_id: str = "noop") -> None:
    """Insert *count* queued items, due now, in one statement (setup, not measured)."""
    with _connect(dsn, options=f"-c search_path={schema}") as conn:
        conn.execute("TRUNCATE trio_supervise_items")
        conn.execute(
            """
            INSERT INTO trio_supervise_items (id, spec_id, state, due_at, created_at, updated_at)
            SELECT 'item-' || lpad(n::text, 8, '0'), %s, 'queued', now(), now(), now()
            FROM generate_series(1, %s) AS n
            """,
            (spec_id, count),
        )
        conn.execute("VACUUM ANALYZE trio_supervise_items")


def completed(dsn: str, schema: str) -> int:
    with _connect(dsn, options=f"-c search_path={schema}") as conn:
        row = conn.execute(
            "SELECT count(*) FROM trio_supervise_items WHERE state = 'completed'"
        ).fetchone()
        assert row is not None
        return int(row[0])


@contextlib.contextmanager
def _metered(dsn: str, costs: list[Cost] | None) -> Iterator[None]:
    """The body's server cost appended to *costs*; nothing measured when it is None."""
    if costs is None:
        yield
        return
    with server_cost(dsn) as cost:
        yield
    costs.append(cost)


# -- ours: the runner in this process ---------------------------------------------------------


def runner_rate(
    dsn: str,
    schema: str,
    count: int,
    concurrency: int = CONCURRENCY,
    cores: list[float] | None = None,
    claim_batch: int | None = None,
    costs: list[Cost] | None = None,
) -> float:
    """Items per second through one runner on PostgreSQL (no-op driver, *concurrency* at once,
    claimed in batches of *claim_batch*, as many as the concurrency if None). The machine's
    busy cores during the drain are appended to *cores* if given, its server cost (P8c, P14)
    to *costs*."""
    fill(dsn, schema, count)

    async def main() -> float:
        queue = await PostgresQueue.connect(dsn, schema=schema)
        try:
            with machine_cpu() as cpu, _metered(dsn, costs):
                drained = await noop_rate(queue, count, concurrency, claim_batch)
            if cores is not None:
                cores.append(cpu.cores)
            return drained
        finally:
            await queue.aclose()

    result: float = trio.run(main)
    if completed(dsn, schema) != count:
        raise RuntimeError("PostgreSQL runner: not every item completed")
    return result


# -- the raw SQL floor ------------------------------------------------------------------------

_FLOOR_CLAIM = """
WITH due AS (
    SELECT id FROM trio_supervise_items
    WHERE state = 'queued' AND due_at <= now()
    ORDER BY due_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE trio_supervise_items AS i SET
    state = 'running', lease_owner = 'floor', lease_expires_at = now() + interval '60 seconds',
    lease_version = i.lease_version + 1, updated_at = now()
FROM due WHERE i.id = due.id
RETURNING i.id, i.lease_version
"""

_FLOOR_COMPLETE = """
UPDATE trio_supervise_items AS i SET
    state = 'completed', lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
FROM unnest(%(ids)s::text[], %(versions)s::bigint[]) AS s(id, version)
WHERE i.id = s.id AND i.lease_version = s.version AND i.state = 'running'
"""


def floor_rate(dsn: str, schema: str, count: int, costs: list[Cost] | None = None) -> float:
    """Items per second for one connection claiming 100 with SKIP LOCKED, completing them in one
    statement, the no-op run between (the floor any PostgreSQL queue can reach); its server
    cost appended to *costs* if given."""
    fill(dsn, schema, count)
    with (
        _connect(dsn, options=f"-c search_path={schema}") as conn,
        _metered(dsn, costs),
        wall() as w,
    ):
        done = 0
        while True:
            rows = conn.execute(_FLOOR_CLAIM, {"limit": FLOOR_BATCH}).fetchall()
            if not rows:
                break
            conn.execute(
                _FLOOR_COMPLETE,
                {"ids": [r[0] for r in rows], "versions": [r[1] for r in rows]},
            )
            done += len(rows)
    if done != count or completed(dsn, schema) != count:
        raise RuntimeError("raw floor: not every item completed")
    return rate(count, w.seconds)


# -- Procrastinate ----------------------------------------------------------------------------


def _database_dsn(dsn: str, database: str) -> str:
    """*dsn* naming another database on the same server."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    params["dbname"] = database
    return make_conninfo(**params)


@contextlib.contextmanager
def own_database(dsn: str, database: str) -> Iterator[str]:
    """A fresh database on *dsn*'s server for the body (its DSN), dropped afterwards."""
    with _connect(dsn) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {database}")
    try:
        yield _database_dsn(dsn, database)
    finally:
        with _connect(dsn) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def procrastinate_rate(dsn: str, count: int) -> float:
    """Jobs per second for one Procrastinate worker, same no-op, same concurrency."""
    import procrastinate

    with own_database(dsn, PROCRASTINATE_DB) as database_dsn:
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=database_dsn))

        @app.task(name="noop", queue="bench")
        async def noop() -> None:
            await noop_step()

        async def main() -> float:
            async with app.open_async():
                await app.schema_manager.apply_schema_async()
                for start in range(0, count, 1000):
                    await noop.batch_defer_async(*[{} for _ in range(min(1000, count - start))])
                gc.collect()
                with wall() as w:
                    await app.run_worker_async(
                        queues=["bench"],
                        concurrency=CONCURRENCY,
                        wait=False,
                        install_signal_handlers=False,
                        listen_notify=False,
                    )
                async with app.connector.pool.connection() as conn:  # type: ignore[attr-defined]
                    cursor = await conn.execute(
                        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
                    )
                    row = await cursor.fetchone()
                if row[0] != count:
                    raise RuntimeError(f"procrastinate: {row[0]} of {count} jobs succeeded")
            return rate(count, w.seconds)

        return asyncio.run(main())


def p2(config: Config) -> list[Result]:
    assert config.dsn is not None
    count = config.size(20_000, 5_000, 200)
    procrastinate_count = config.size(4_000, 600, 50)
    with bench_schema(config.dsn, TS_SCHEMA), bench_schema(config.dsn, FLOOR_SCHEMA):
        dsn = config.dsn
        ours, floor = best_of(
            2,
            lambda: runner_rate(dsn, TS_SCHEMA, count),
            lambda: floor_rate(dsn, FLOOR_SCHEMA, count),
        )
    theirs = procrastinate_rate(config.dsn, procrastinate_count)
    return [
        Result(
            id="P2",
            title="PostgreSQL runner, one process, no-op, concurrency 64",
            ours=ours,
            baseline=theirs,
            baseline_name="Procrastinate 3 worker, same server, no-op, concurrency 64",
            better="higher",
            goal=10.0,
            unit="items/s",
            detail={"items": count, "baseline_items": procrastinate_count},
        ),
        Result(
            id="P2f",
            title="PostgreSQL runner against the raw SQL floor",
            ours=ours,
            baseline=floor,
            baseline_name="one connection: claim 100 SKIP LOCKED, complete in one statement",
            better="higher",
            goal=0.8,
            unit="items/s",
            detail={"items": count, "floor_batch": FLOOR_BATCH},
        ),
    ]


# -- P8: PgQueuer -----------------------------------------------------------------------------


def pgqueuer_rates(
    dsn: str, count: int, batches: Sequence[int]
) -> dict[int, tuple[float, float, dict[str, Any]]]:
    """Jobs per second for one PgQueuer worker process (``benchmarks._pgqueuer``) per batch size,
    in a database of its own on the same server, each with the machine's busy cores meanwhile
    and its CPU and WAL per job (``Cost.per_item``)."""
    with own_database(dsn, PGQUEUER_DB) as database_dsn:
        out = run_json("benchmarks._pgqueuer", database_dsn, count, *batches)
    return {
        int(batch): (float(value), float(out["cores"][batch]), dict(out["costs"][batch]))
        for batch, value in out["rates"].items()
    }


def p8(config: Config) -> list[Result]:
    """Our runner and PgQueuer at its fastest, interleaved (twice, once in the quick run), the
    better run of each. Skipped, and said so, without the ``bench`` extra's PgQueuer.

    Each side gets the same two batch sizes (``PGQUEUER_BATCHES``). PgQueuer's is its
    ``batch_size`` and it runs without a concurrency cap; ours is the claim batch, with the
    concurrency at ``OURS_CONCURRENCY_PER_BATCH`` times it (the settle batch at least the
    concurrency), so the runner claims the next batch while it evaluates and writes the last:
    with the concurrency equal to the claim batch, every claim waited for the batch before it
    to be evaluated and taken for a write. Both are documented settings a user would raise."""
    assert config.dsn is not None
    missing = [name for name in ("pgqueuer", "asyncpg", "uvloop") if not _installed(name)]
    if missing:
        print(f"skipping P8: {', '.join(missing)} not installed (the bench extra)", file=sys.stderr)
        return []
    count = config.size(20_000, 5_000, 200)
    # Each side gets the same two batch sizes and its better one counts: PgQueuer's batch size,
    # our runner's claim batch (its concurrency twice that, see the docstring).
    ours: dict[int, list[float]] = {batch: [] for batch in PGQUEUER_BATCHES}
    theirs: dict[int, list[float]] = {batch: [] for batch in PGQUEUER_BATCHES}
    # The machine's busy cores during each run: under the machine's core count, a side waited
    # on round trips rather than on the CPU.
    our_cores: dict[int, list[float]] = {batch: [] for batch in PGQUEUER_BATCHES}
    their_cores: dict[int, list[float]] = {batch: [] for batch in PGQUEUER_BATCHES}
    # P8c and P14: CPU and WAL per item of each run, ours and theirs, and of the raw floor.
    our_costs: dict[int, list[Cost]] = {batch: [] for batch in PGQUEUER_BATCHES}
    their_costs: dict[int, list[dict[str, Any]]] = {batch: [] for batch in PGQUEUER_BATCHES}
    floor_costs: list[Cost] = []
    with bench_schema(config.dsn, TS_SCHEMA), bench_schema(config.dsn, FLOOR_SCHEMA):
        for _ in range(config.size(2, 1, 1)):
            for batch in PGQUEUER_BATCHES:
                ours[batch].append(
                    runner_rate(
                        config.dsn,
                        TS_SCHEMA,
                        count,
                        batch * OURS_CONCURRENCY_PER_BATCH,
                        our_cores[batch],
                        claim_batch=batch,
                        costs=our_costs[batch],
                    )
                )
            for batch, (value, cores, cost) in pgqueuer_rates(
                config.dsn, count, PGQUEUER_BATCHES
            ).items():
                theirs[batch].append(value)
                their_cores[batch].append(cores)
                their_costs[batch].append(cost)
            floor_rate(config.dsn, FLOOR_SCHEMA, count, costs=floor_costs)
    our_best = {batch: max(values) for batch, values in ours.items()}
    our_batch = max(our_best, key=lambda batch: our_best[batch])
    best = {batch: max(values) for batch, values in theirs.items()}
    best_batch = max(best, key=lambda batch: best[batch])
    result = Result(
        id="P8",
        title="PostgreSQL runner vs PgQueuer, one process each",
        ours=our_best[our_batch],
        baseline=best[best_batch],
        baseline_name=(
            f"PgQueuer {_version('pgqueuer')} (asyncpg, uvloop, no concurrency cap), "
            f"best batch size ({best_batch})"
        ),
        better="higher",
        goal=2.0,
        unit="items/s",
        detail={
            "items": count,
            "ours_runs": {str(batch): values for batch, values in ours.items()},
            "ours_batch": our_batch,
            "ours_concurrency": our_batch * OURS_CONCURRENCY_PER_BATCH,
            "pgqueuer_runs": {str(batch): values for batch, values in theirs.items()},
            "pgqueuer_batch": best_batch,
            "ours_cores_busy": {str(batch): values for batch, values in our_cores.items()},
            "pgqueuer_cores_busy": {str(batch): values for batch, values in their_cores.items()},
            "cpus": os.cpu_count(),
        },
    )
    # The cost of each side's best run (its fastest batch), per item.
    our_cost = [c.per_item(count) for c in our_costs[our_batch]]
    their_cost = their_costs[best_batch]
    floor_cost = [c.per_item(count) for c in floor_costs]
    return [result, *cost_results(our_cost, their_cost, floor_cost, best_batch, count)]


def cost_results(
    ours: list[dict[str, Any]],
    theirs: list[dict[str, Any]],
    floor: list[dict[str, Any]],
    their_batch: int,
    count: int,
) -> list[Result]:
    """P8c (CPU per item, worker and server, vs PgQueuer) and P14 / P14f (WAL bytes per item vs
    PgQueuer and vs the raw floor), each side's cheapest run."""

    # Not "ours": a measure's details sit beside its fields in the JSON record.
    detail = {"items": count, "ours_cost": ours, "pgqueuer_cost": theirs, "floor_cost": floor}
    pgqueuer = f"PgQueuer {_version('pgqueuer')}, batch size {their_batch}"
    floor_name = "one connection: claim 100 SKIP LOCKED, complete in one statement"
    measures = [
        ("P8c", "CPU per item, worker process + its server backends, vs PgQueuer", "cpu_us",
         theirs, pgqueuer, 0.5, "CPU µs/item"),
        ("P14", "WAL bytes per completed item vs PgQueuer", "wal_bytes",
         theirs, pgqueuer, 1.0, "WAL bytes/item"),
        ("P14f", "WAL bytes per completed item vs the raw SQL floor", "wal_bytes",
         floor, floor_name, 1.5, "WAL bytes/item"),
    ]  # fmt: skip
    return [
        Result(
            id=id_,
            title=title,
            ours=min(float(run[key]) for run in ours),
            baseline=min(float(run[key]) for run in baseline),
            baseline_name=name,
            better="lower",
            goal=goal,
            unit=unit,
            detail=detail,
        )
        for id_, title, key, baseline, name, goal, unit in measures
    ]


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _version(distribution: str) -> str:
    from importlib.metadata import version

    return version(distribution)


# -- P6: latency with NOTIFY ------------------------------------------------------------------


def latency(
    dsn: str, schema: str, samples: int, poll_interval: float, *, own_process: bool = False
) -> list[float]:
    """Seconds from ``enqueue`` being called (on another queue object, so the wake-up travels
    through NOTIFY) to the evaluation starting.

    The producer is a task beside the runner, in its process, or with *own_process* a process of
    its own (:mod:`benchmarks._producer`), as an application's producers are: then its Python
    work (the call, its thread hop, Trio's scheduling) never competes with the runner's wake-up
    for this process's interpreter, as nothing competes with the listener in
    :func:`notify_round_trips`, whose sender runs to completion before the listener reads (the
    benchmarks page, P6, says how the two compare on a two-core machine)."""
    started: dict[str, float] = {}
    sent: dict[str, float] = {}
    child = (
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks._producer", dsn, schema, str(samples)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        if own_process
        else None
    )

    async def main() -> None:
        consumer = await PostgresQueue.connect(dsn, schema=schema)
        producer = None if child else await PostgresQueue.connect(dsn, schema=schema, listen=False)
        done = trio.Event()

        def on_done(item: ts.WorkItem) -> None:
            started[item.id] = now()
            if len(started) >= samples:
                done.set()

        settings = ts.RunnerSettings(
            worker_id="bench", concurrency=CONCURRENCY, poll_interval=poll_interval
        )

        async def produce() -> None:
            await trio.sleep(0.5)  # the runner is idle and listening
            if child is not None:
                sent.update(await trio.to_thread.run_sync(_produced, child))
                return
            assert producer is not None
            for n in range(samples):
                item_id = f"lat-{n:05d}"
                before = now()
                await producer.enqueue("noop", item_id=item_id)
                sent[item_id] = before
                # Spread out, off the poll grid, so every sample starts from an idle wait.
                await trio.sleep(0.013)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(produce)
                await run_until(consumer, NoopDriver(on_done=on_done), settings, done, limit=120.0)
        finally:
            if producer is not None:
                await producer.aclose()
            await consumer.aclose()

    with _connect(dsn, options=f"-c search_path={schema}") as conn:
        conn.execute("TRUNCATE trio_supervise_items")
    try:
        if child is not None:
            assert child.stdout is not None
            line = child.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"P6 producer did not start: {line!r}")
        trio.run(main)
    finally:
        if child is not None:
            if child.stdin is not None and not child.stdin.closed:
                with contextlib.suppress(BrokenPipeError):
                    child.stdin.close()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()
    return sorted(started[key] - sent[key] for key in sent)


def _produced(child: subprocess.Popen[str]) -> dict[str, float]:
    """Tell the producer process to go; the send time of each item it enqueued."""
    assert child.stdin is not None
    assert child.stdout is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    line = child.stdout.readline()
    if not line.startswith("{"):
        raise RuntimeError(f"P6 producer failed: {line!r}")
    sent: dict[str, float] = json.loads(line)
    return sent


_RAW_ENQUEUE = """
INSERT INTO trio_supervise_items (id, spec_id, state, due_at, created_at, updated_at)
VALUES (%s, 'raw', 'queued', now(), now(), now())
"""


def notify_round_trips(dsn: str, samples: int, schema: str | None = None) -> list[float]:
    """Seconds from a sender starting to its ``NOTIFY`` arriving on another connection that
    ``LISTEN``s. With *schema*, the sender commits a transaction that inserts one queued row
    into that schema's item table and sends the ``NOTIFY`` (the floor any durable enqueue's
    wake-up sits on: the commit waits for its WAL to reach the disk); without, it sends a bare
    autocommit ``NOTIFY``, which writes nothing. Spaced like :func:`latency`'s samples, so the
    listener is idle before each."""
    import time

    channel = f"bench_p6_{_RUN}"
    values: list[float] = []
    options = {} if schema is None else {"options": f"-c search_path={schema}"}
    with _connect(dsn) as listener, _connect(dsn, **options) as sender:
        listener.execute(f"LISTEN {channel}")
        for n in range(samples):
            before = now()
            if schema is None:
                sender.execute(f"NOTIFY {channel}, '{n}'")
            else:
                with sender.transaction():
                    sender.execute(_RAW_ENQUEUE, (f"raw-{n:05d}",))
                    sender.execute(f"NOTIFY {channel}, '{n}'")
            for _ in listener.notifies(timeout=5.0, stop_after=1):
                values.append(now() - before)
            time.sleep(0.013)
    if len(values) != samples:
        raise RuntimeError(f"P6: {len(values)} of {samples} notifications arrived")
    return sorted(values)


def p6(config: Config) -> Result:
    assert config.dsn is not None
    samples = config.size(400, 150, 10)
    poll_interval = 1.0
    with bench_schema(config.dsn, TS_SCHEMA):
        values = latency(config.dsn, TS_SCHEMA, samples, poll_interval)
        elsewhere = latency(config.dsn, TS_SCHEMA, samples, poll_interval, own_process=True)
        # The durable floor: what an enqueue's own commit costs before any wake-up can start.
        durable = notify_round_trips(config.dsn, samples, TS_SCHEMA)
    raw = notify_round_trips(config.dsn, samples)
    p50 = statistics.median(values)
    elsewhere_p50 = statistics.median(elsewhere)
    raw_p50 = statistics.median(raw)
    durable_p50 = statistics.median(durable)
    # Against the durable floor (issue 34): a committed INSERT + NOTIFY round trip, since no
    # enqueue can wake anyone before its commit. The bare LISTEN/NOTIFY is in the details.
    return Result(
        id="P6",
        title="PostgreSQL enqueue-to-start latency p50 with NOTIFY",
        ours=p50,
        baseline=durable_p50,
        baseline_name="a committed INSERT + NOTIFY round trip between two connections, p50",
        better="lower",
        goal=1.5,
        unit="s",
        detail={
            "p50": p50,
            "p99": _percentile(values, 0.99),
            "max": values[-1],
            "raw_p50": raw_p50,
            "raw_p99": _percentile(raw, 0.99),
            # The same round trip with the NOTIFY sent by a committed transaction that inserts
            # one queued row: a durable enqueue cannot wake anyone sooner than this.
            "insert_notify_p50": durable_p50,
            "insert_notify_ratio": durable_p50 / raw_p50,
            "raw_ratio": p50 / raw_p50,
            "ratio_to_insert_notify": p50 / durable_p50,
            # The producer in a process of its own (see latency).
            "own_process_p50": elsewhere_p50,
            "own_process_p99": _percentile(elsewhere, 0.99),
            "own_process_ratio": elsewhere_p50 / raw_p50,
            "samples": samples,
            "poll_interval": poll_interval,
        },
    )


def _percentile(ordered: Sequence[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


# -- P7: two worker processes against one -----------------------------------------------------


@contextlib.contextmanager
def worker_processes(
    dsn: str, schema: str, processes: int
) -> Iterator[list[subprocess.Popen[str]]]:
    """*processes* worker processes (:mod:`benchmarks._worker`, each a runner) on *schema*,
    connected and ready; told to stop (their stdin closed) and waited for afterwards."""
    env = child_env()
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks._worker", dsn, schema, f"w{n}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for n in range(processes)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            line = worker.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"worker did not start: {line!r}")
        yield workers
    finally:
        for worker in workers:
            if worker.stdin is not None and not worker.stdin.closed:
                with contextlib.suppress(BrokenPipeError):
                    worker.stdin.close()
        for worker in workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()


def go_and_wait(workers: Sequence[subprocess.Popen[str]]) -> list[tuple[float, float]]:
    """Tell every worker to go; per worker, once it sees nothing left to claim, the time it
    reports (``time.perf_counter()``, the same monotonic clock in every process) and the CPU
    seconds it spent since "go"."""
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
    done = []
    for worker in workers:
        assert worker.stdout is not None
        line = worker.stdout.readline().split()
        if not line or line[0] != "done":
            raise RuntimeError(f"P7 worker failed: {line!r}")
        done.append((float(line[1]), float(line[2])))
    return done


def processes_rate(dsn: str, schema: str, count: int, processes: int) -> tuple[float, float]:
    """Items per second for *processes* worker processes sharing one queue (each a runner), and
    the machine's cores kept busy meanwhile (every process, the server's included).

    Each worker connects and reports ready; the clock starts when all are told to go and stops
    when the last worker sees nothing left to claim.
    """
    fill(dsn, schema, count)
    with worker_processes(dsn, schema, processes) as workers, machine_cpu() as cpu:
        start = now()
        ends = [end for end, _ in go_and_wait(workers)]
    if completed(dsn, schema) != count:
        raise RuntimeError("P7: not every item completed")
    return rate(count, max(ends) - start), cpu.cores


def p7(config: Config) -> Result:
    assert config.dsn is not None
    count = config.size(30_000, 5_000, 200)
    with bench_schema(config.dsn, P7_SCHEMA):
        dsn = config.dsn
        (one, one_cores), (two, two_cores) = best_of(
            2,
            lambda: processes_rate(dsn, P7_SCHEMA, count, 1),
            lambda: processes_rate(dsn, P7_SCHEMA, count, 2),
        )
    cpus = os.cpu_count() or 1
    # What the cores allow (issue 34): at the same CPU per item, two workers do at most
    # cpus / one_cores times what one did (and never more than twice).
    ceiling = min(2.0, cpus / one_cores) if one_cores > 0 else 2.0
    return Result(
        id="P7",
        title="two worker processes against one, PostgreSQL, divided by what the cores allow",
        ours=two,
        baseline=one * ceiling,
        baseline_name="one worker process, times what the cores allow two (at most 2)",
        better="higher",
        goal=0.95,
        unit="items/s",
        detail={
            "items": count,
            "cpus": cpus,
            # The cores busy during the better run of each (the workers, the server, the rest of
            # the machine), and what that allows: at the same CPU per item, two workers can do
            # at most cpus / one_cores times what one did.
            "one_cores_busy": one_cores,
            "two_cores_busy": two_cores,
            "cpu_ceiling": cpus / one_cores if one_cores > 0 else math.nan,
            "one_items_per_s": one,
            "raw_ratio": two / one,
        },
    )
