"""P10: bulk enqueue against a raw multi-row INSERT floor, on SQLite (P10s) and PostgreSQL (P10p).

Ours is today's fastest way to put *count* items in the queue through the public API: the
queue's ``enqueue_many`` when it has one (picked up by ``getattr``, so this measure follows the
API when it lands), otherwise ``enqueue`` called from ``ENQUEUERS`` concurrent tasks (the
PostgreSQL pool runs that many statements at once; on SQLite they share one writer). The result
says which path was measured (``path`` in the details). ``enqueue_many`` is called with batches of
``ENQUEUE_MANY_BATCH`` entries, each its own transaction: 10,000 (ten commits for the 100,000) is
how a bulk load is meant to be fed; with 1,000 a commit's flush per call weighs as much as the
rows on a slow disk, against the floor's single commit.

The floor writes the same columns the queue's ``enqueue`` writes, from one connection in one
transaction: PostgreSQL multi-row ``INSERT ... VALUES`` statements of ``FLOOR_ROWS`` rows;
SQLite ``executemany`` of one ``INSERT``.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

import trio_supervise as ts
from trio_supervise.queues import SQLiteQueue

from ._common import Config, Result, best_of, rate, wall

ENQUEUERS = 10
ROUNDS = 3
"""Runs of each side per measure, the best counting (see :func:`~benchmarks._common.best_of`)."""
ENQUEUE_MANY_BATCH = 10_000
FLOOR_ROWS = 1000
_COLUMNS = (
    "id, spec_id, tenant_id, subject_id, config, state, due_at, idempotency_key, created_at,"
    " updated_at"
)


async def enqueue_all(queue: ts.WorkQueue, count: int) -> str:
    """Put *count* no-op items in *queue* the fastest way the API offers; returns which way.

    An ``enqueue_many`` that refuses the guessed entry shape (``TypeError`` on the first batch,
    before anything is written) is reported in the returned path, and the items go in one at a
    time: the measure keeps running and says why it did not use the bulk call.
    """
    enqueue_many: Callable[..., Awaitable[Any]] | None = getattr(queue, "enqueue_many", None)
    done = 0
    refused = ""
    if enqueue_many is not None:
        entry = _entry_maker()  # looked up once: the lookup is the harness's, not the API's cost
        try:
            while done < count:
                size = min(ENQUEUE_MANY_BATCH, count - done)
                await enqueue_many([entry() for _ in range(size)])
                done += size
        except TypeError as error:
            if done:
                raise
            refused = f"enqueue_many refused the entries ({error}); "
        else:
            return f"enqueue_many, batches of {ENQUEUE_MANY_BATCH}"
    left = count

    async def enqueuer() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await queue.enqueue("noop")

    async with trio.open_nursery() as nursery:
        for _ in range(ENQUEUERS):
            nursery.start_soon(enqueuer)
    return f"{refused}enqueue from {ENQUEUERS} concurrent tasks" + (
        "" if enqueue_many else " (no enqueue_many yet)"
    )


def _entry_maker() -> Callable[[], Any]:
    """What makes one ``enqueue_many`` entry: the library's entry record when it exports one
    (named ``EnqueueEntry`` or ``NewItem``), else the keyword arguments of ``enqueue`` as a dict."""
    for name in ("EnqueueEntry", "NewItem"):
        record = getattr(ts, name, None)
        if record is not None:
            return functools.partial(record, spec_id="noop")
    return lambda: {"spec_id": "noop"}


def _result(backend: str, suffix: str, count: int, ours: float, floor: float, path: str) -> Result:
    return Result(
        id=f"P10{suffix}",
        title=f"bulk enqueue of {count:,} items, {backend}",
        ours=ours,
        baseline=floor,
        baseline_name="raw multi-row INSERT, one connection, one transaction",
        better="higher",
        goal=0.5,
        unit="items/s",
        detail={"items": count, "path": path},
    )


# -- SQLite -----------------------------------------------------------------------------------


def sqlite_rates(directory: str, count: int) -> tuple[float, float, str]:
    """(ours, floor, path) in items/s on fresh files in *directory*."""
    ours_path = os.path.join(directory, "bulk.db")
    floor_path = os.path.join(directory, "bulk_floor.db")

    async def ours() -> tuple[float, str]:
        queue = await SQLiteQueue.connect(ours_path)
        try:
            with wall() as w:
                how = await enqueue_all(queue, count)
            counts = await queue.counts()
        finally:
            await queue.aclose()
        if sum(counts.values()) != count:
            raise RuntimeError(f"P10s: {sum(counts.values())} of {count} items stored")
        return rate(count, w.seconds), how

    async def migrate() -> None:
        queue = await SQLiteQueue.connect(floor_path)
        await queue.aclose()

    ours_rate, how = trio.run(ours)
    trio.run(migrate)
    conn = sqlite3.connect(floor_path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        with wall() as w:
            now_us = time.time_ns() // 1000
            conn.execute("BEGIN IMMEDIATE")
            # Multi-row INSERTs of FLOOR_ROWS rows (4 parameters a row, well under SQLite's
            # 32,766), as on PostgreSQL: faster than executemany, which binds and steps one row
            # at a time from Python.
            row = "(?, 'noop', '', '', '{}', 'queued', ?, NULL, ?, ?)"
            for start in range(0, count, FLOOR_ROWS):
                rows = min(FLOOR_ROWS, count - start)
                values: list[object] = []
                for n in range(start, start + rows):
                    values += (f"floor-{n:08d}", now_us, now_us, now_us)
                conn.execute(
                    f"INSERT INTO trio_supervise_items ({_COLUMNS}) VALUES "
                    + ", ".join([row] * rows),
                    values,
                )
            conn.execute("COMMIT")
        stored = conn.execute("SELECT count(*) FROM trio_supervise_items").fetchone()[0]
    finally:
        conn.close()
    if stored != count:
        raise RuntimeError(f"P10s floor: {stored} of {count} rows stored")
    for path in (ours_path, floor_path):
        os.remove(path)
    return ours_rate, rate(count, w.seconds), how


def _count(config: Config) -> int:
    """100,000 items (the goal's size) with ``enqueue_many``; one item at a time takes too long
    for the full run's budget, so then 20,000. The count measured is in the details."""
    full = 100_000 if hasattr(ts.MemoryQueue, "enqueue_many") else 20_000
    return config.size(full, 2_000, 100)


def p10s(config: Config) -> Result:
    count = _count(config)
    # A run is a few tens of milliseconds: the best of three on each side, as the other measures
    # take the best of theirs (each round on files of its own, ours then the floor).
    rounds = []
    with tempfile.TemporaryDirectory(prefix="trio_supervise_bench_") as directory:
        for n in range(ROUNDS):
            os.mkdir(path := os.path.join(directory, str(n)))
            rounds.append(sqlite_rates(path, count))
    (ours, how), floor = max((r[0], r[2]) for r in rounds), max(r[1] for r in rounds)
    return _result("SQLite", "s", count, ours, floor, how)


# -- PostgreSQL -------------------------------------------------------------------------------


def postgres_floor_rate(dsn: str, schema: str, count: int) -> float:
    """Items per second for multi-row INSERTs of ``FLOOR_ROWS`` rows in one transaction."""
    from .postgres import _connect

    with _connect(dsn, options=f"-c search_path={schema}") as conn:
        conn.execute("TRUNCATE trio_supervise_items")
        with wall() as w, conn.transaction():
            for start in range(0, count, FLOOR_ROWS):
                size = min(FLOOR_ROWS, count - start)
                values = ", ".join(
                    ["(%s, 'noop', '', '', '{}'::jsonb, 'queued', now(), NULL, now(), now())"]
                    * size
                )
                conn.execute(
                    f"INSERT INTO trio_supervise_items ({_COLUMNS}) VALUES {values}",
                    [f"floor-{n:08d}" for n in range(start, start + size)],
                )
        row = conn.execute("SELECT count(*) FROM trio_supervise_items").fetchone()
        assert row is not None
        conn.execute("TRUNCATE trio_supervise_items")
    if row[0] != count:
        raise RuntimeError(f"P10p floor: {row[0]} of {count} rows stored")
    return rate(count, w.seconds)


def postgres_rate(dsn: str, schema: str, count: int) -> tuple[float, str]:
    from trio_supervise.queues import PostgresQueue

    from .postgres import _connect

    with _connect(dsn, options=f"-c search_path={schema}") as conn:
        conn.execute("TRUNCATE trio_supervise_items")

    async def main() -> tuple[float, str]:
        queue = await PostgresQueue.connect(dsn, schema=schema, listen=False)
        try:
            with wall() as w:
                how = await enqueue_all(queue, count)
            counts = await queue.counts()
        finally:
            await queue.aclose()
        if sum(counts.values()) != count:
            raise RuntimeError(f"P10p: {sum(counts.values())} of {count} items stored")
        return rate(count, w.seconds), how

    result: tuple[float, str] = trio.run(main)
    return result


def p10p(config: Config) -> Result:
    from .postgres import TS_SCHEMA, bench_schema

    assert config.dsn is not None
    count = _count(config)
    dsn = config.dsn
    with bench_schema(dsn, TS_SCHEMA):
        (ours, how), floor = best_of(
            ROUNDS,
            lambda: postgres_rate(dsn, TS_SCHEMA, count),
            lambda: postgres_floor_rate(dsn, TS_SCHEMA, count),
        )
    return _result("PostgreSQL", "p", count, ours, floor, how)
