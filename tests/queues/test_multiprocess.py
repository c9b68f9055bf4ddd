"""Several OS processes share one queue and finish a batch: every item completed exactly once."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from trio_supervise.queues import ItemState, PostgresQueue, SQLiteQueue, WorkQueue

from .conftest import pg_schema

WORKER = Path(__file__).with_name("_mp_worker.py")
PROCESSES = 3
ITEMS = 150

pytestmark = pytest.mark.slow


async def _fill(queue: WorkQueue) -> set[str]:
    ids = {f"job-{n:04}" for n in range(ITEMS)}
    async with queue:
        for item_id in sorted(ids):
            await queue.enqueue("job", item_id=item_id)
    return ids


async def _all_completed(queue: WorkQueue) -> dict[tuple[str, ItemState], int]:
    async with queue:
        return dict(await queue.counts())


@contextlib.contextmanager
def started_workers(
    worker: Path, args: list[str], out_dir: Path, count: int
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """*count* processes of *worker* (ids ``w0``...), each ready, then told to go (OUT_DIR/go);
    any still running when the block ends is killed."""
    procs = [
        # The checkout under test, not whatever trio_supervise the interpreter finds first.
        subprocess.Popen(
            [sys.executable, str(worker), *args, f"w{n}", str(out_dir)],
            env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])),
        )
        for n in range(count)
    ]
    try:
        deadline = time.monotonic() + 60
        while len(list(out_dir.glob("ready-*"))) < count:
            assert time.monotonic() < deadline, "workers did not start"
            assert all(p.poll() is None for p in procs), "a worker died while starting"
            time.sleep(0.02)
        (out_dir / "go").touch()
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def run_until_done(
    worker: Path,
    args: list[str],
    out_dir: Path,
    count: int,
    done: Callable[[], bool],
    *,
    timeout: float = 60,
) -> None:
    """*count* processes of *worker* (a runner each, see ``_mp_runner``) until *done*, then
    stopped (OUT_DIR/stop); each must exit 0."""
    with started_workers(worker, args, out_dir, count) as procs:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, "the items were not all completed in time"
            assert all(p.poll() is None for p in procs), "a worker died"
            time.sleep(0.1)
        (out_dir / "stop").touch()
        for proc in procs:
            assert proc.wait(timeout=30) == 0


def _run_workers(args: list[str], out_dir: Path) -> Counter[str]:
    with started_workers(WORKER, args, out_dir, PROCESSES) as procs:
        for proc in procs:
            assert proc.wait(timeout=60) == 0
    done: Counter[str] = Counter()
    for path in out_dir.glob("done-*"):
        done.update(path.read_text().split())
    return done


def test_processes_share_one_sqlite_file(tmp_path: Path) -> None:
    """Three processes drain one SQLite file; each item is completed once, by one of them."""
    db = tmp_path / "q.db"
    ids = trio.run(_fill, trio.run(SQLiteQueue.connect, db))
    done = _run_workers(["sqlite", str(db)], tmp_path)
    assert set(done) == ids
    assert set(done.values()) == {1}
    counts = trio.run(_all_completed, trio.run(SQLiteQueue.connect, db))
    assert counts == {("job", ItemState.COMPLETED): ITEMS}


@pytest.mark.postgres
def test_processes_share_one_postgres_database(tmp_path: Path) -> None:
    """Three processes drain one PostgreSQL queue; each item is completed once."""

    async def connect(dsn: str, schema: str, migrate: bool) -> PostgresQueue:
        return await PostgresQueue.connect(dsn, schema=schema, migrate=migrate)

    with pg_schema() as (dsn, schema):
        ids = trio.run(_fill, trio.run(connect, dsn, schema, True))
        done = _run_workers(["postgres", dsn, schema], tmp_path)
        assert set(done) == ids
        assert set(done.values()) == {1}
        counts = trio.run(_all_completed, trio.run(connect, dsn, schema, False))
        assert counts == {("job", ItemState.COMPLETED): ITEMS}
