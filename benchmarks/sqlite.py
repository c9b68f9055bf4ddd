"""P3: the runner on SQLite against the raw SQLite floor of the same shape.

The floor: one connection, ``BEGIN IMMEDIATE``, claim 100 due items in one ``UPDATE ...
RETURNING``, ``COMMIT``; then complete them in one ``UPDATE`` in a second transaction. Both run
on a fresh file with the queue's own schema, in a temporary directory removed afterwards.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
import time

import trio

from trio_supervise.queues import SQLiteQueue

from . import _runs
from ._common import Config, Result, best_of, rate, wall
from ._runs import noop_rate

CONCURRENCY = 64
FLOOR_BATCH = 100


def _fill(path: str, count: int) -> None:
    """A migrated file holding *count* queued items, due now (setup, not measured)."""

    async def migrate() -> None:
        queue = await SQLiteQueue.connect(path)
        await queue.aclose()

    trio.run(migrate)
    now_us = time.time_ns() // 1000
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, created_at, updated_at)"
            " VALUES (?, 'noop', 'queued', ?, ?, ?)",
            ((f"item-{n:08d}", now_us - 1, now_us, now_us) for n in range(count)),
        )
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
    finally:
        conn.close()


def _completed(path: str) -> int:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute(
            "SELECT count(*) FROM trio_supervise_items WHERE state = 'completed'"
        ).fetchone()
        return int(row[0])
    finally:
        conn.close()


def runner_rate(directory: str, count: int) -> float:
    """Items per second through one runner on a SQLite file (no-op driver, 64 at once)."""
    path = os.path.join(directory, "runner.db")
    _fill(path, count)

    async def main() -> float:
        queue = await SQLiteQueue.connect(path)
        try:
            return await noop_rate(queue, count, CONCURRENCY)
        finally:
            await queue.aclose()

    result: float = trio.run(main)
    if _completed(path) != count:
        raise RuntimeError("SQLite runner: not every item completed")
    os.remove(path)
    return result


_CLAIM = """
UPDATE trio_supervise_items SET
    state = 'running', lease_owner = 'floor', lease_expires_at = :now + 60000000,
    lease_version = lease_version + 1, updated_at = :now
WHERE id IN (
    SELECT id FROM trio_supervise_items
    WHERE state IN ('queued', 'running') AND due_at <= :now
    ORDER BY due_at, id LIMIT :limit
)
RETURNING id, lease_version
"""

_COMPLETE = """
UPDATE trio_supervise_items SET
    state = 'completed', lease_owner = NULL, lease_expires_at = NULL, updated_at = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'running'
"""


def floor_rate(directory: str, count: int) -> float:
    """Items per second for the raw floor: claim 100 in one statement, complete in one."""
    path = os.path.join(directory, "floor.db")
    _fill(path, count)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        done = 0
        with _runs.timed_window(), wall() as w:
            while True:
                now_us = time.time_ns() // 1000
                conn.execute("BEGIN IMMEDIATE")
                rows = conn.execute(_CLAIM, {"now": now_us, "limit": FLOOR_BATCH}).fetchall()
                conn.execute("COMMIT")
                if not rows:
                    break
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(_COMPLETE, {"now": now_us, "ids": json.dumps([r[0] for r in rows])})
                conn.execute("COMMIT")
                done += len(rows)
    finally:
        conn.close()
    if done != count or _completed(path) != count:
        raise RuntimeError("SQLite floor: not every item completed")
    os.remove(path)
    return rate(count, w.seconds)


def p3(config: Config) -> Result:
    count = config.size(20_000, 5_000, 200)
    with tempfile.TemporaryDirectory(prefix="trio_supervise_bench_") as directory:
        ours, floor = best_of(
            2, lambda: runner_rate(directory, count), lambda: floor_rate(directory, count)
        )
    return Result(
        id="P3",
        title="SQLite runner against the raw SQLite floor",
        ours=ours,
        baseline=floor,
        baseline_name="one connection: claim 100 in one statement, complete in one",
        better="higher",
        goal=0.6,
        unit="items/s",
        detail={"items": count, "floor_batch": FLOOR_BATCH},
    )
