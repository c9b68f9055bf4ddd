"""The concurrency-key proof: four OS processes, 400 items over 5 keys with limit 1.

Each process runs a real :class:`WorkflowRunner` (three slots, batches of two) on one SQLite
file, or one PostgreSQL schema. A trigger the test adds to the items table appends every
transition into and out of ``running`` to an audit table, in the database's own order (SQLite:
the single writer's rowid; PostgreSQL: a sequence drawn inside the writing transaction, so a
claim that saw a completion draws a later number than that completion did). From the audit,
no two items of one key were ever running at once; from the drivers' own logs (system-wide
monotonic time), no two evaluations of one key overlapped; and every item completed, once.
"""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
import trio

from trio_supervise.queues import PostgresQueue, SQLiteQueue, WorkQueue

from .conftest import pg_schema
from .test_multiprocess import run_until_done

WORKER = Path(__file__).with_name("_mp_keys_worker.py")
PROCESSES = 4
ITEMS = 400
KEYS = 5

pytestmark = pytest.mark.slow

_AUDIT_SQLITE = """
CREATE TABLE keys_audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, key TEXT, event TEXT NOT NULL
);
CREATE TRIGGER keys_audit_claim AFTER UPDATE ON trio_supervise_items
WHEN NEW.state = 'running' AND NEW.lease_version <> OLD.lease_version
BEGIN
    INSERT INTO keys_audit (id, key, event)
    SELECT NEW.id, NEW.concurrency_key, 'end' WHERE OLD.state = 'running';
    INSERT INTO keys_audit (id, key, event) VALUES (NEW.id, NEW.concurrency_key, 'start');
END;
CREATE TRIGGER keys_audit_settle AFTER UPDATE ON trio_supervise_items
WHEN OLD.state = 'running' AND NEW.state <> 'running'
BEGIN
    INSERT INTO keys_audit (id, key, event) VALUES (NEW.id, NEW.concurrency_key, 'end');
END;
"""

_AUDIT_POSTGRES = """
CREATE TABLE keys_audit (
    seq bigserial PRIMARY KEY, id text NOT NULL, key text, event text NOT NULL
);
CREATE FUNCTION keys_audit_fn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state = 'running' THEN
        INSERT INTO keys_audit (id, key, event) VALUES (NEW.id, NEW.concurrency_key, 'end');
    END IF;
    IF NEW.state = 'running' THEN
        INSERT INTO keys_audit (id, key, event) VALUES (NEW.id, NEW.concurrency_key, 'start');
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER keys_audit_trg AFTER UPDATE ON trio_supervise_items FOR EACH ROW
WHEN ((NEW.state = 'running' AND NEW.lease_version <> OLD.lease_version)
      OR (OLD.state = 'running' AND NEW.state <> 'running'))
EXECUTE FUNCTION keys_audit_fn();
"""


async def _fill(queue: WorkQueue) -> None:
    async with queue:
        for n in range(ITEMS):
            await queue.enqueue("keyed", item_id=f"job-{n:04}", concurrency_key=f"key-{n % KEYS}")


_COMPLETED = "SELECT count(*) FROM trio_supervise_items WHERE state = 'completed'"


def _run_workers(
    args: list[str], out_dir: Path, done: Callable[[], bool], *, timeout: float = 60
) -> None:
    run_until_done(WORKER, args, out_dir, PROCESSES, done, timeout=timeout)


def _check_audit(rows: Iterable[tuple[str, str, str]]) -> None:
    """Replay the audit in order: never two running items of one key; every item ran once."""
    running: dict[str, set[str]] = {}
    starts: Counter[str] = Counter()
    most = 0
    for item_id, key, event in rows:
        now = running.setdefault(key, set())
        if event == "start":
            assert not now, f"{item_id} started while {sorted(now)} of {key} were running"
            now.add(item_id)
            starts[item_id] += 1
        else:
            now.discard(item_id)
        most = max(most, sum(1 for ids in running.values() if ids))
    assert len(starts) == ITEMS
    assert set(starts.values()) == {1}, "an item was claimed twice (no lease should expire)"
    assert most > 1, "the keys never ran side by side: the test proved nothing"


def _check_evaluations(out_dir: Path) -> None:
    """The drivers' own intervals: per key, each evaluation ends before the next one starts."""
    per_key: dict[str, list[tuple[int, int, str]]] = {}
    seen: Counter[str] = Counter()
    for path in out_dir.glob("evals-*"):
        for line in path.read_text().split("\n"):
            if line:
                item_id, key, start, end = line.split()
                per_key.setdefault(key, []).append((int(start), int(end), item_id))
                seen[item_id] += 1
    assert len(seen) == ITEMS
    assert set(seen.values()) == {1}
    assert len(per_key) == KEYS
    for key, spans in per_key.items():
        spans.sort()
        for (_, end, before), (start, _, after) in itertools.pairwise(spans):
            assert end < start, f"{before} and {after} of {key} overlapped"


def test_sqlite_processes_never_run_two_items_of_one_key(tmp_path: Path) -> None:
    """Four processes on one SQLite file: per key, one item at a time; all 400 completed."""
    db = tmp_path / "q.db"
    trio.run(_fill, trio.run(SQLiteQueue.connect, db))  # creates and migrates it too
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.executescript(_AUDIT_SQLITE)  # before any claim, so it sees every one

    def done() -> bool:
        with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn:
            [(n,)] = conn.execute(_COMPLETED).fetchall()
        return bool(n == ITEMS)

    _run_workers(["sqlite", str(db)], tmp_path, done)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT id, key, event FROM keys_audit ORDER BY seq").fetchall()
    _check_audit(rows)
    _check_evaluations(tmp_path)


@pytest.mark.postgres
def test_postgres_processes_never_run_two_items_of_one_key(tmp_path: Path) -> None:
    """Four processes on one PostgreSQL schema: per key, one item at a time; all completed."""
    import psycopg
    from psycopg import sql

    async def connect(dsn: str, schema: str, migrate: bool) -> PostgresQueue:
        return await PostgresQueue.connect(dsn, schema=schema, migrate=migrate, listen=False)

    with pg_schema() as (dsn, schema):
        trio.run(_fill, trio.run(connect, dsn, schema, True))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            conn.execute(_AUDIT_POSTGRES.encode())

        def done() -> bool:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
                row = conn.execute(_COMPLETED.encode()).fetchone()
            return row is not None and row[0] == ITEMS

        _run_workers(["postgres", dsn, schema], tmp_path, done)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            rows = conn.execute("SELECT id, key, event FROM keys_audit ORDER BY seq").fetchall()
        _check_audit(rows)
        _check_evaluations(tmp_path)
