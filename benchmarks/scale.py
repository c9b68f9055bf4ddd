"""P9: what a big table costs. On SQLite (``P9s``, ``P9hs``) and PostgreSQL (``P9p``, ``P9hp``).

- ``P9s``/``P9p``: the runner's claim throughput (draining *due* no-op items, as P3 and P2 do)
  with ``finished`` completed items and ``future`` not-yet-due items (due in a day) in the table,
  against the same drain on a table holding only the due items. Goal >= 0.8.
- ``P9hs``/``P9hp``: one ``/metrics`` scrape plus one status page (``/``) at that size, against
  the same pair at ``SMALL_TABLE`` rows. Goal <= 2. The operations app is called in-process (no
  HTTP server, so the time is the queue reads and the rendering) with ``cache_for=0``, so every
  request reads the queue; the median of ``REQUESTS`` pairs counts.

The full run uses the goal's sizes (1,000,000 finished, 100,000 not yet due); the quick run a
tenth of them; the sizes used are in the details. Tables are built in one transaction (SQLite
``executemany``, PostgreSQL ``generate_series``), then analysed, before any clock starts.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import tempfile
import time
from typing import Any

import trio

import trio_supervise as ts
from trio_supervise.queues import SQLiteQueue

from ._common import Config, Result, now
from ._runs import noop_rate

CONCURRENCY = 64
SMALL_TABLE = 1_000
REQUESTS = 5
_DAY_US = 86_400 * 1_000_000


def sizes(config: Config) -> tuple[int, int, int]:
    """(due items drained, finished items, not-yet-due items)."""
    return (
        config.size(20_000, 5_000, 100),
        config.size(1_000_000, 100_000, 300),
        config.size(100_000, 10_000, 30),
    )


# -- the operations app, called in-process -------------------------------------------------------


class _Source:
    """A healthy service with no workers and no errors: the page's queue part is measured."""

    healthy = True

    def workers(self) -> list[Any]:
        return []

    def recent_errors(self) -> list[Any]:
        return []


async def _get(app: Any, path: str) -> int:
    status = 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])

    await app({"type": "http", "method": "GET", "path": path, "headers": []}, receive, send)
    return status


async def scrape_and_page_seconds(queue: ts.WorkQueue, requests: int = REQUESTS) -> float:
    """Median seconds for one ``/metrics`` plus one ``/`` on *queue*, nothing cached."""
    from prometheus_client import CollectorRegistry

    from trio_supervise.console import OperationsApp

    app = OperationsApp(_Source(), CollectorRegistry(), queue=queue, cache_for=0.0)
    times = []
    for _ in range(requests):
        started = now()
        statuses = (await _get(app, "/metrics"), await _get(app, "/"))
        times.append(now() - started)
        if statuses != (200, 200):
            raise RuntimeError(f"P9h: the operations app answered {statuses}")
    return statistics.median(times)


def _claim_result(backend: str, suffix: str, config: Config, big: float, empty: float) -> Result:
    due, finished, future = sizes(config)
    return Result(
        id=f"P9{suffix}",
        title=f"claim, {finished:,} done + {future:,} later vs empty, {backend}",
        ours=big,
        baseline=empty,
        baseline_name=f"the same {due:,} due items in an otherwise empty table",
        better="higher",
        goal=0.9,
        unit="items/s",
        detail={"due": due, "finished": finished, "not_yet_due": future},
    )


def _http_result(backend: str, suffix: str, config: Config, big: float, small: float) -> Result:
    _, finished, future = sizes(config)
    return Result(
        id=f"P9h{suffix}",
        title=f"/metrics + / at {finished + future:,} rows vs {SMALL_TABLE:,}, {backend}",
        ours=big,
        baseline=small,
        baseline_name=f"the same requests with {SMALL_TABLE:,} rows",
        better="lower",
        goal=1.5,
        unit="s",
        detail={"rows": finished + future, "small_rows": SMALL_TABLE, "requests": REQUESTS},
    )


# -- SQLite -----------------------------------------------------------------------------------


def fill_sqlite(path: str, due: int, finished: int = 0, future: int = 0) -> None:
    """A migrated file with *due* queued items due now, *finished* completed ones and *future*
    queued ones due in a day, in one transaction (setup, not measured)."""

    async def migrate() -> None:
        queue = await SQLiteQueue.connect(path)
        await queue.aclose()

    trio.run(migrate)
    now_us = time.time_ns() // 1000
    groups = [
        ("due", "queued", now_us - 1, due),
        ("done", "completed", now_us - _DAY_US, finished),
        ("later", "queued", now_us + _DAY_US, future),
    ]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for prefix, state, due_at, count in groups:
            conn.executemany(
                "INSERT INTO trio_supervise_items"
                " (id, spec_id, state, due_at, created_at, updated_at)"
                " VALUES (?, 'noop', ?, ?, ?, ?)",
                ((f"{prefix}-{n:08d}", state, due_at, now_us, now_us) for n in range(count)),
            )
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
    finally:
        conn.close()


def _sqlite_drain(path: str, due: int) -> float:
    async def main() -> float:
        queue = await SQLiteQueue.connect(path)
        try:
            return await noop_rate(queue, due, CONCURRENCY)
        finally:
            await queue.aclose()

    result: float = trio.run(main)
    return result


def _sqlite_http(path: str) -> float:
    async def main() -> float:
        queue = await SQLiteQueue.connect(path)
        try:
            return await scrape_and_page_seconds(queue)
        finally:
            await queue.aclose()

    result: float = trio.run(main)
    return result


def p9s(config: Config) -> list[Result]:
    due, finished, future = sizes(config)
    with tempfile.TemporaryDirectory(prefix="trio_supervise_bench_") as directory:
        empty_path = os.path.join(directory, "empty.db")
        big_path = os.path.join(directory, "big.db")
        small_path = os.path.join(directory, "small.db")
        fill_sqlite(empty_path, due)
        fill_sqlite(big_path, due, finished, future)
        fill_sqlite(small_path, 0, SMALL_TABLE - SMALL_TABLE // 10, SMALL_TABLE // 10)
        small_http = _sqlite_http(small_path)
        big_http = _sqlite_http(big_path)
        empty = _sqlite_drain(empty_path, due)
        big = _sqlite_drain(big_path, due)
    return [
        _claim_result("SQLite", "s", config, big, empty),
        _http_result("SQLite", "s", config, big_http, small_http),
    ]


# -- PostgreSQL -------------------------------------------------------------------------------


def fill_postgres(dsn: str, schema: str, due: int, finished: int = 0, future: int = 0) -> None:
    """The PostgreSQL twin of :func:`fill_sqlite`, by ``generate_series`` in one transaction."""
    from .postgres import _connect

    groups = [
        ("due", "queued", "now() - interval '1 microsecond'", due),
        ("done", "completed", "now() - interval '1 day'", finished),
        ("later", "queued", "now() + interval '1 day'", future),
    ]
    with _connect(dsn, options=f"-c search_path={schema}") as conn:
        with conn.transaction():
            conn.execute("TRUNCATE trio_supervise_items")
            for prefix, state, due_at, count in groups:
                conn.execute(
                    "INSERT INTO trio_supervise_items"
                    " (id, spec_id, state, due_at, created_at, updated_at)"
                    f" SELECT %s || lpad(n::text, 8, '0'), 'noop', %s, {due_at}, now(), now()"
                    " FROM generate_series(1, %s) AS n",
                    (f"{prefix}-", state, count),
                )
        conn.execute("VACUUM ANALYZE trio_supervise_items")


def _postgres_run(dsn: str, schema: str, due: int) -> tuple[float, float]:
    """(drain rate of *due* items, scrape + page seconds before the drain)."""
    from trio_supervise.queues import PostgresQueue

    async def main() -> tuple[float, float]:
        queue = await PostgresQueue.connect(dsn, schema=schema)
        try:
            seconds = await scrape_and_page_seconds(queue)
            drained = await noop_rate(queue, due, CONCURRENCY) if due else 0.0
            return drained, seconds
        finally:
            await queue.aclose()

    result: tuple[float, float] = trio.run(main)
    return result


def p9p(config: Config) -> list[Result]:
    from .postgres import TS_SCHEMA, bench_schema

    assert config.dsn is not None
    dsn = config.dsn
    due, finished, future = sizes(config)
    with bench_schema(dsn, TS_SCHEMA):
        fill_postgres(dsn, TS_SCHEMA, 0, SMALL_TABLE - SMALL_TABLE // 10, SMALL_TABLE // 10)
        _, small_http = _postgres_run(dsn, TS_SCHEMA, 0)
        fill_postgres(dsn, TS_SCHEMA, due)
        empty, _ = _postgres_run(dsn, TS_SCHEMA, due)
        fill_postgres(dsn, TS_SCHEMA, due, finished, future)
        big, big_http = _postgres_run(dsn, TS_SCHEMA, due)
    return [
        _claim_result("PostgreSQL", "p", config, big, empty),
        _http_result("PostgreSQL", "p", config, big_http, small_http),
    ]
