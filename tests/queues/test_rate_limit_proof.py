"""The rate-limit proof: four OS processes, a queue limited to 10 starts per 0.5 s.

Each process runs a real :class:`WorkflowRunner` (claims of 4, poll interval 1 s: the waits
for the window come from ``next_due_at``, not polling) on one SQLite file, or one PostgreSQL
schema, serving the limited queue (60 items) and a free one (40 items). A trigger the test adds
to the items table records every claim's time as the claim wrote it (the time the rate limit
counts). From that audit: no interval of 0.5 s holds more than 10 starts of the limited queue
(a sliding window, exact across the processes); every item was claimed once and completed;
the limited queue ran close to its rate (nothing starved), and the free one was not held back.

The same for rate limits per key: two tenants' keys under one template (10 starts per 0.5 s
each), 40 items each, in one queue: neither key ever above its rate, neither starved.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import trio

from trio_supervise.queues import PostgresQueue, RateLimit, SQLiteQueue, WorkQueue

from .conftest import pg_schema
from .test_multiprocess import run_until_done

WORKER = Path(__file__).with_name("_mp_rate_worker.py")
PROCESSES = 4
LIMIT, PERIOD_US = 10, 500_000
RATED, FREE = 60, 40
KEYED = 40
"""Items per tenant key in the key-rate proof."""

pytestmark = pytest.mark.slow

_AUDIT_SQLITE = """
CREATE TABLE rate_audit (id TEXT NOT NULL, queue TEXT NOT NULL, at INTEGER NOT NULL);
CREATE TRIGGER rate_audit_claim AFTER UPDATE ON trio_supervise_items
WHEN NEW.state = 'running' AND NEW.lease_version <> OLD.lease_version
BEGIN
    INSERT INTO rate_audit (id, queue, at) VALUES (NEW.id, NEW.queue, NEW.updated_at);
END;
"""

_AUDIT_POSTGRES = """
CREATE TABLE rate_audit (id text NOT NULL, queue text NOT NULL, at bigint NOT NULL);
CREATE FUNCTION rate_audit_fn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rate_audit (id, queue, at)
    VALUES (NEW.id, NEW.queue, (extract(epoch FROM NEW.updated_at) * 1000000)::bigint);
    RETURN NULL;
END
$$;
CREATE TRIGGER rate_audit_trg AFTER UPDATE ON trio_supervise_items FOR EACH ROW
WHEN (NEW.state = 'running' AND NEW.lease_version <> OLD.lease_version)
EXECUTE FUNCTION rate_audit_fn();
"""

_COMPLETED = "SELECT count(*) FROM trio_supervise_items WHERE state = 'completed'"
_AUDIT = "SELECT id, queue, at FROM rate_audit"


async def _fill(queue: WorkQueue) -> None:
    async with queue:
        assert isinstance(queue, SQLiteQueue | PostgresQueue)
        await queue.set_rate_limit("rated", RateLimit(LIMIT, PERIOD_US / 1e6))
        for n in range(RATED):
            await queue.enqueue("quick", item_id=f"r-{n:03}", queue="rated")
        for n in range(FREE):
            await queue.enqueue("quick", item_id=f"f-{n:03}", queue="free")


async def _fill_keys(queue: WorkQueue) -> None:
    async with queue:
        assert isinstance(queue, SQLiteQueue | PostgresQueue)
        await queue.set_key_rate_limit("tenant:{tenant}", RateLimit(LIMIT, PERIOD_US / 1e6))
        for n in range(KEYED):
            for tenant in ("a", "b"):
                await queue.enqueue(
                    "quick",
                    item_id=f"{tenant}-{n:03}",
                    queue="keyed",
                    concurrency_key=f"tenant:{tenant}",
                    concurrency_limit=1000,
                )


def _check_key_audit(rows: Sequence[tuple[str, str, int]]) -> None:
    """Per key, never more than LIMIT starts in any PERIOD; each item claimed once; each key
    kept close to its rate from the first moment (neither starves the other)."""
    claims = Counter(item_id for item_id, _, _ in rows)
    assert len(claims) == 2 * KEYED
    assert set(claims.values()) == {1}, "an item was claimed twice (no lease should expire)"
    first = min(at for _, _, at in rows)
    for tenant in ("a", "b"):
        starts = sorted(at for item_id, _, at in rows if item_id.startswith(f"{tenant}-"))
        for one, other in zip(starts, starts[LIMIT:], strict=False):
            assert other - one >= PERIOD_US, f"{tenant}: {LIMIT + 1} starts in {other - one} us"
        # 40 starts at 10 per 0.5 s need 1.5 s at the least after the first.
        assert starts[0] - first < 500_000, f"{tenant} waited behind the other key"
        span = (starts[-1] - starts[0]) / 1e6
        assert 1.5 <= span < 3.0, (tenant, span)


def _run_workers(args: list[str], out_dir: Path, done: Callable[[], bool]) -> None:
    run_until_done(WORKER, args, out_dir, PROCESSES, done)


def _check_audit(rows: Sequence[tuple[str, str, int]]) -> None:
    """Never more than LIMIT starts of the limited queue in any PERIOD; each item claimed
    once; the limited queue kept close to its rate; the free one ran from the first moment."""
    claims = Counter(item_id for item_id, _, _ in rows)
    assert len(claims) == RATED + FREE
    assert set(claims.values()) == {1}, "an item was claimed twice (no lease should expire)"
    rated = sorted(at for _, queue, at in rows if queue == "rated")
    for first, last in zip(rated, rated[LIMIT:], strict=False):
        assert last - first >= PERIOD_US, f"{LIMIT + 1} starts within {last - first} us"
    # 60 starts at 10 per 0.5 s need 2.5 s at the least; a starved window would add 0.5 s each.
    span = (rated[-1] - rated[0]) / 1e6
    assert 2.5 <= span < 4.0, span
    free = sorted(at for _, queue, at in rows if queue == "free")
    assert free[-1] - rated[0] < 2_000_000, "the free queue waited behind the limited one"


def test_sqlite_processes_never_start_more_than_the_rate(tmp_path: Path) -> None:
    """Four processes on one SQLite file: at most 10 starts in any 0.5 s; all completed."""
    db = tmp_path / "q.db"
    trio.run(_fill, trio.run(SQLiteQueue.connect, db))  # creates and migrates it too
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.executescript(_AUDIT_SQLITE)  # before any claim, so it sees every one

    def done() -> bool:
        with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn:
            [(n,)] = conn.execute(_COMPLETED).fetchall()
        return bool(n == RATED + FREE)

    _run_workers(["sqlite", str(db)], tmp_path, done)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        _check_audit(conn.execute(_AUDIT).fetchall())


@pytest.mark.postgres
def test_postgres_processes_never_start_more_than_the_rate(tmp_path: Path) -> None:
    """Four processes on one PostgreSQL schema (the database's clock): at most 10 starts in
    any 0.5 s; all completed."""
    import psycopg
    from psycopg import sql

    async def connect(dsn: str, schema: str) -> PostgresQueue:
        return await PostgresQueue.connect(dsn, schema=schema, migrate=True, listen=False)

    with pg_schema() as (dsn, schema):
        trio.run(_fill, trio.run(connect, dsn, schema))

        def run(statement: str) -> list[tuple[object, ...]]:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
                cur = conn.execute(statement.encode())
                return cur.fetchall() if cur.description else []

        run(_AUDIT_POSTGRES)
        _run_workers(
            ["postgres", dsn, schema], tmp_path, lambda: run(_COMPLETED)[0][0] == RATED + FREE
        )
        _check_audit(run(_AUDIT))  # type: ignore[arg-type]


def test_sqlite_processes_never_start_more_than_a_keys_rate(tmp_path: Path) -> None:
    """Four processes on one SQLite file: each tenant's key at most 10 starts in any 0.5 s,
    both at their rate; all completed."""
    db = tmp_path / "q.db"
    trio.run(_fill_keys, trio.run(SQLiteQueue.connect, db))
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.executescript(_AUDIT_SQLITE)

    def done() -> bool:
        with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn:
            [(n,)] = conn.execute(_COMPLETED).fetchall()
        return bool(n == 2 * KEYED)

    _run_workers(["sqlite", str(db)], tmp_path, done)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        _check_key_audit(conn.execute(_AUDIT).fetchall())


@pytest.mark.postgres
def test_postgres_processes_never_start_more_than_a_keys_rate(tmp_path: Path) -> None:
    """Four processes on one PostgreSQL schema: each tenant's key at most 10 starts in any
    0.5 s, both at their rate; all completed."""
    import psycopg
    from psycopg import sql

    async def connect(dsn: str, schema: str) -> PostgresQueue:
        return await PostgresQueue.connect(dsn, schema=schema, migrate=True, listen=False)

    with pg_schema() as (dsn, schema):
        trio.run(_fill_keys, trio.run(connect, dsn, schema))

        def run(statement: str) -> list[tuple[object, ...]]:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
                cur = conn.execute(statement.encode())
                return cur.fetchall() if cur.description else []

        run(_AUDIT_POSTGRES)
        _run_workers(
            ["postgres", dsn, schema], tmp_path, lambda: run(_COMPLETED)[0][0] == 2 * KEYED
        )
        _check_key_audit(run(_AUDIT))  # type: ignore[arg-type]
