"""P13: flow control (rate limits) on SQLite and PostgreSQL.

- ``P13s``/``P13p``: the runner's throughput on an unlimited queue (draining *due* no-op items,
  as P9 does) while the same runner serves a rate-limited queue with a full backlog (it never
  drains: the limit holds it back), against a runner serving the unlimited queue alone, with
  no limited queue in the table. Goal >= 0.9.
- ``P13rs``/``P13rp``: the rate four runners (each with its own connections, in one process)
  achieve on a queue limited to ``LIMIT`` starts per ``PERIOD`` with a backlog of ``count``
  no-op items, against the limit: ``(count - LIMIT)`` starts over the time from the first
  start to the last (a sliding window starts ``LIMIT`` at once, then ``LIMIT`` a period later,
  so that is the limit exactly when every window is used). Goal >= 0.95 (above 1.0 would break
  the limit).
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from collections.abc import Awaitable, Callable

import trio

import trio_supervise as ts
from trio_supervise.queues import SQLiteQueue

from ._common import Config, NoopDriver, Result, now, rate, wall
from ._runs import run_until

CONCURRENCY = 64
LIMITED_SLOTS = 8
BACKLOG_RATE = ts.RateLimit(100, 1.0)
LIMIT, PERIOD = 50, 0.5
RUNNERS = 4


def sizes(config: Config) -> tuple[int, int, int]:
    """(due items drained, the limited queue's backlog, items through the P13r limit)."""
    return (
        config.size(20_000, 5_000, 100),
        config.size(10_000, 2_000, 50),
        config.size(600, 300, 2 * LIMIT),
    )


async def _fill(queue: ts.WorkQueue, due: int, backlog: int) -> None:
    """*due* items in ``default`` and *backlog* in ``limited`` (rate-limited), all due now."""
    assert isinstance(queue, ts.queues.RateLimitStore)
    await queue.set_rate_limit("limited", BACKLOG_RATE)
    for start in range(0, due, 5_000):
        count = min(5_000, due - start)
        await queue.enqueue_many([ts.NewItem(spec_id="noop") for _ in range(count)])
    for start in range(0, backlog, 5_000):
        count = min(5_000, backlog - start)
        await queue.enqueue_many(
            [ts.NewItem(spec_id="noop", queue="limited") for _ in range(count)]
        )


async def _drain_beside(queue: ts.WorkQueue, due: int, *, beside: bool) -> tuple[float, float]:
    """Default-queue items per second for a runner serving ``default``, and ``limited`` too
    when *beside*; and this process's CPU time per default-queue item, in microseconds (every
    thread: on SQLite the writer's statements too), a figure the machine's other tenants move
    far less than the rate."""
    evaluated = 0
    done = trio.Event()

    def on_done(item: ts.WorkItem) -> None:
        nonlocal evaluated
        if item.queue == ts.DEFAULT_QUEUE:
            evaluated += 1
            if evaluated >= due:
                done.set()

    settings = ts.RunnerSettings(
        worker_id="bench",
        claim_batch=CONCURRENCY,
        settle_batch=max(100, CONCURRENCY),
        queues={ts.DEFAULT_QUEUE: CONCURRENCY, **({"limited": LIMITED_SLOTS} if beside else {})},
    )
    gc.collect()
    cpu = time.process_time()
    with wall() as w:
        await run_until(queue, NoopDriver(on_done=on_done), settings, done)
    return rate(due, w.seconds), (time.process_time() - cpu) / due * 1e6


async def _achieved(open_queue: Callable[[], Awaitable[ts.WorkQueue]], count: int) -> float:
    """Starts per second of *count* limited items through ``RUNNERS`` runners."""
    queues = [await open_queue() for _ in range(RUNNERS)]
    first = queues[0]
    assert isinstance(first, ts.queues.RateLimitStore)
    await first.set_rate_limit("limited", ts.RateLimit(LIMIT, PERIOD))
    await first.enqueue_many([ts.NewItem(spec_id="noop", queue="limited") for _ in range(count)])
    starts: list[float] = []
    done = trio.Event()

    def on_done(item: ts.WorkItem) -> None:
        starts.append(now())
        if len(starts) >= count:
            done.set()

    async def one(queue: ts.WorkQueue, n: int) -> None:
        settings = ts.RunnerSettings(
            worker_id=f"bench-{n}", claim_batch=LIMIT, queues={"limited": LIMIT}
        )
        await run_until(queue, NoopDriver(on_done=on_done), settings, done)

    try:
        async with trio.open_nursery() as nursery:
            for n, queue in enumerate(queues):
                nursery.start_soon(one, queue, n)
    finally:
        for queue in queues:
            await queue.aclose()
    starts.sort()
    return (count - LIMIT) / (starts[-1] - starts[0])


Drain = tuple[float, float]
"""A drain's items per second and CPU microseconds per item (:func:`_drain_beside`)."""


def _results(
    backend: str, suffix: str, config: Config, drains: tuple[Drain, Drain, Drain], got: float
) -> list[Result]:
    due, backlog, count = sizes(config)
    (beside, beside_cpu), (alone, alone_cpu), (served, served_cpu) = drains
    return [
        Result(
            id=f"P13{suffix}",
            title=f"unlimited queue beside a rate-limited backlog vs alone, {backend}",
            ours=beside,
            baseline=alone,
            baseline_name=f"the same {due:,} items, a runner serving their queue alone",
            better="higher",
            goal=0.9,
            unit="items/s",
            detail={
                "due": due,
                "backlog": backlog,
                "backlog_rate": str(BACKLOG_RATE),
                # The same runner serving both queues, the limited one empty: what serving a
                # second queue costs, apart from its rate-limited backlog.
                "vs_two_queues_served": round(beside / served, 3),
                # This process's CPU per drained item (us), and alone's over beside's: the
                # ratio's direction, far less moved by the machine's other tenants.
                "cpu_us_per_item": {
                    "beside": round(beside_cpu, 1),
                    "alone": round(alone_cpu, 1),
                    "served": round(served_cpu, 1),
                },
                "cpu_ratio": round(alone_cpu / beside_cpu, 3),
            },
        ),
        Result(
            id=f"P13r{suffix}",
            title=f"rate achieved by {RUNNERS} runners vs the limit, {backend}",
            ours=got,
            baseline=LIMIT / PERIOD,
            baseline_name=f"the limit, {LIMIT}/{PERIOD:g}s",
            better="higher",
            goal=0.95,
            unit="starts/s",
            detail={"items": count, "runners": RUNNERS},
        ),
    ]


def p13s(config: Config) -> list[Result]:
    due, backlog, count = sizes(config)
    with tempfile.TemporaryDirectory(prefix="trio_supervise_bench_") as directory:

        async def drain(name: str, with_backlog: int, beside: bool) -> Drain:
            queue = await SQLiteQueue.connect(os.path.join(directory, name))
            try:
                await _fill(queue, due, with_backlog)
                return await _drain_beside(queue, due, beside=beside)
            finally:
                await queue.aclose()

        alone = trio.run(drain, "alone.db", 0, False)
        served = trio.run(drain, "served.db", 0, True)
        beside = trio.run(drain, "beside.db", backlog, True)
        path = os.path.join(directory, "rate.db")

        async def open_sqlite() -> ts.WorkQueue:
            return await SQLiteQueue.connect(path)

        got = trio.run(_achieved, open_sqlite, count)
    return _results("SQLite", "s", config, (beside, alone, served), got)


def p13p(config: Config) -> list[Result]:
    from trio_supervise.queues import PostgresQueue

    from .postgres import TS_SCHEMA, bench_schema

    assert config.dsn is not None
    dsn = config.dsn
    due, backlog, count = sizes(config)

    async def drain(with_backlog: int, beside: bool) -> Drain:
        queue = await PostgresQueue.connect(dsn, schema=TS_SCHEMA)
        try:
            await _fill(queue, due, with_backlog)
            return await _drain_beside(queue, due, beside=beside)
        finally:
            await queue.aclose()

    async def open_postgres() -> ts.WorkQueue:
        return await PostgresQueue.connect(dsn, schema=TS_SCHEMA, pool_size=3)

    with bench_schema(dsn, TS_SCHEMA):
        alone = trio.run(drain, 0, False)
    with bench_schema(dsn, TS_SCHEMA):
        served = trio.run(drain, 0, True)
    with bench_schema(dsn, TS_SCHEMA):
        beside = trio.run(drain, backlog, True)
    with bench_schema(dsn, TS_SCHEMA):
        got = trio.run(_achieved, open_postgres, count)
    return _results("PostgreSQL", "p", config, (beside, alone, served), got)
