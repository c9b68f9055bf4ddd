"""Regression tests for what the chaos runs found (``python -m benchmarks.chaos``).

- PostgreSQL connections terminated while idle in the pool (``pg_terminate_backend``, a server
  restart) made every call fail once per dead connection, so under repeated terminations the
  runner's claim failures piled up until it gave up and its process exited. Now a dead
  connection makes the pool check the rest and the call runs once more on a fresh one.
- While claims failed, ``/healthz`` still showed the runner ``running``: nothing told an operator
  that the queue was unreachable. Now the runner's row says ``backing-off``.
- A :class:`Service` had no way to observe its runner's events (the chaos workers log every
  settlement through it): ``Service(on_event=...)``.
- A 30 s ``BEGIN EXCLUSIVE`` lock held by another connection (or a full disk) made every finished
  item's write fail once, and the runner gave the write up: 5 of 5 finished items ran again.
  Now a transient write failure is written again while the lease is valid.
- A driver blocking the event loop (``time.sleep``) let another worker take its item; the stale
  write was refused, but only a log line said so. Now it is counted
  (``trio_supervise_settlements_refused_total``), kept in the recent errors (status page) and
  the loop-lag watchdog warns, naming the items whose leases were at risk.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import re
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import httpx
import pytest
import trio

from trio_supervise import (
    MemoryQueue,
    Outcome,
    Reschedule,
    RunnerEvent,
    RunnerEventKind,
    RunnerSettings,
    Stop,
)
from trio_supervise._errors import QueueUnavailable
from trio_supervise._service import Service
from trio_supervise._settings import HttpSettings, Settings
from trio_supervise.queues import (
    ItemState,
    Lease,
    LeaseStatus,
    PostgresQueue,
    SettleKind,
    Settlement,
    SQLiteQueue,
    WorkItem,
)
from trio_supervise.supervision import WorkerState

from .queues.conftest import pg_schema

# -- SQLite: another connection holding the write lock, a driver blocking the loop ----------------


@attrs.define
class Counting:
    """Counts evaluations per item; sleeps ``sleep`` seconds, then blocks the thread for
    ``block`` seconds (``time.sleep``: the loop stops) and runs ``after_block`` if set."""

    sleep: float = 0.5
    block: float = 0.0
    after_block: Callable[[WorkItem], None] | None = None
    blob: int = 0
    """With a size, reschedule far ahead with a config that big (a write that needs new pages)."""
    evaluations: collections.Counter[str] = attrs.field(factory=collections.Counter)
    started: trio.Event = attrs.field(factory=trio.Event)
    name: str = "counting"
    spec_ids: Sequence[str] = ("job",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: object, item: WorkItem) -> Outcome:
        self.evaluations[item.id] += 1
        self.started.set()
        await trio.sleep(self.sleep)
        if self.block:
            time.sleep(self.block)  # noqa: ASYNC251 - the point: a driver blocking the loop
            if self.after_block is not None:
                self.after_block(item)
        if self.blob:
            return Reschedule(dt.datetime(2100, 1, 1, tzinfo=dt.UTC), {"blob": "x" * self.blob})
        return Stop()


def _hold_exclusive_lock(path: str, seconds: float, held: trio.Event) -> None:
    """In a thread: take SQLite's write lock on *path* with another connection for *seconds*."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        trio.from_thread.run_sync(held.set)
        time.sleep(seconds)
        conn.execute("COMMIT")
    finally:
        conn.close()


async def _disk_full(queue: SQLiteQueue) -> None:
    """Make SQLite find the disk full: no page beyond the file's current size (until undone)."""

    def limit(conn: sqlite3.Connection) -> None:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count={pages}")

    await queue._call(limit)


async def _disk_freed(queue: SQLiteQueue, after: float) -> None:
    await trio.sleep(after)
    await queue._call(lambda conn: conn.execute("PRAGMA max_page_count=1073741823"))


@pytest.mark.parametrize("fault", ["exclusive-lock", "disk-full"])
async def test_writes_failing_transiently_on_sqlite_are_retried_not_re_run(
    tmp_path: Path, fault: str
) -> None:
    """Another connection holds SQLite's write lock (or the disk is full) for 3 s, longer than
    the 2 s renewal interval and shorter than the 6 s lease, as five items finish: their writes
    fail, are written again once the fault is gone, and no item runs twice."""
    from trio_supervise import DriverRegistry, WorkflowRunner

    path = str(tmp_path / "faulty.db")
    queue = await SQLiteQueue.connect(path, busy_timeout=0.1)
    events: list[RunnerEvent] = []
    driver = Counting(sleep=0.5, blob=20_000 if fault == "disk-full" else 0)
    async with queue:
        for n in range(5):
            await queue.enqueue("job", item_id=f"i{n}")
        runner: WorkflowRunner[None] = WorkflowRunner(
            queue=queue,
            registry=DriverRegistry[None]().register(driver),
            settings=RunnerSettings(worker_id="w", lease=6, poll_interval=0.1),
            build_context=_no_context,
            on_event=events.append,
        )
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(runner.run)
                await driver.started.wait()
                if fault == "exclusive-lock":
                    held = trio.Event()
                    nursery.start_soon(
                        trio.to_thread.run_sync, _hold_exclusive_lock, path, 3.0, held
                    )
                    await held.wait()
                else:
                    await _disk_full(queue)
                    nursery.start_soon(_disk_freed, queue, 3.0)
                while sum(e.kind is RunnerEventKind.SETTLED for e in events) < 5:  # noqa: ASYNC110
                    await trio.sleep(0.1)
                runner.shutdown.begin("test")
    assert dict(driver.evaluations) == {f"i{n}": 1 for n in range(5)}
    failures = [e.detail for e in events if e.kind is RunnerEventKind.SETTLE_FAILED]
    assert failures  # the fault did bite
    assert ("locked" if fault == "exclusive-lock" else "disk is full") in failures[0]
    assert (
        runner.metrics.registry.get_sample_value(
            "trio_supervise_settlements_abandoned_total", {"spec": "job"}
        )
        is None
    )


async def test_a_driver_blocking_the_loop_makes_the_duplicate_visible(tmp_path: Path) -> None:
    """A driver blocks the thread past a third of the lease while another worker takes its
    item: the refused write is counted on /metrics, shown on the status page, and the watchdog
    names the item whose lease was at risk."""
    path = str(tmp_path / "blocked.db")

    def steal(item: WorkItem) -> None:  # what another worker's claim does to the row
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute(
                "UPDATE trio_supervise_items SET lease_version = lease_version + 1, "
                "lease_owner = 'other' WHERE id = ?",
                [item.id],
            )

    queue = await SQLiteQueue.connect(path)
    driver = Counting(sleep=0.1, block=1.5, after_block=steal)
    settings = attrs.evolve(
        _settings(), runner=RunnerSettings(worker_id="w", lease=3, poll_interval=0.05)
    )
    async with queue:
        await queue.enqueue("job", item_id="stolen")
        service = Service(drivers=[driver], settings=settings, queue=queue, handle_signals=False)
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                await nursery.start(service.run)
                base = f"http://127.0.0.1:{service.http_port}"
                async with httpx.AsyncClient() as client:
                    metric = 'trio_supervise_settlements_refused_total{spec="job"} 1.0'
                    while metric not in (metrics := (await client.get(f"{base}/metrics")).text):  # noqa: ASYNC110
                        await trio.sleep(0.05)
                    page = (await client.get(f"{base}/")).text
                service.stop()
    assert "complete refused: the lease was lost" in page
    # Blocked 1.5 s; the watchdog's check (every 0.25 s) was due up to 0.25 s into the block.
    blocked = r"event loop blocked for 1\.[2-5]\d* s \(lease 3 s\): leases at risk: &#39;stolen"
    assert re.search(blocked, page)
    assert "trio_supervise_event_loop_lag_seconds_count" in metrics


@attrs.frozen
class Finisher:
    name: str = "finisher"
    spec_ids: Sequence[str] = ("job",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: object, item: WorkItem) -> Outcome:
        await trio.lowlevel.checkpoint()
        return Stop()


@attrs.define
class FlakyQueue(MemoryQueue):
    """A memory queue whose claims fail while ``down`` is set, as if the database were gone."""

    down: bool = False

    @property
    def exact_wakeups(self) -> bool:
        return False  # the outage starts without a write: the runner must poll to notice it

    async def claim_due(
        self, spec_ids: Sequence[str], worker_id: str, lease: float, limit: int
    ) -> list[WorkItem]:
        if self.down:
            await trio.lowlevel.checkpoint()
            raise QueueUnavailable("queue at test://flaky is unavailable: connection refused")
        return await super().claim_due(spec_ids, worker_id, lease, limit)

    writes_down: bool = False

    async def settle_many(self, settlements: Sequence[Settlement]) -> list[bool]:
        if self.writes_down:
            await trio.lowlevel.checkpoint()
            raise QueueUnavailable("queue at test://flaky is unavailable: connection reset")
        return await super().settle_many(settlements)


def _settings() -> Settings:
    return Settings(
        http=HttpSettings(port=0),
        runner=RunnerSettings(worker_id="w", poll_interval=0.05, shutdown_grace=1.0),
    )


async def test_healthz_shows_the_runner_backing_off_while_claims_fail() -> None:
    """While the queue is unreachable /healthz lists the runner as backing-off, then running."""
    queue = FlakyQueue()
    service = Service(drivers=[Finisher()], settings=_settings(), queue=queue, handle_signals=False)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            url = f"http://127.0.0.1:{service.http_port}/healthz"
            async with httpx.AsyncClient() as client:

                async def runner_row() -> dict[str, object]:
                    document = (await client.get(url)).json()
                    [row] = [w for w in document["workers"] if w["worker"] == "runner"]
                    assert document["healthy"] is True  # a queue outage is not a dead process
                    return dict(row)

                assert (await runner_row())["state"] == "running"
                queue.down = True
                while (row := await runner_row())["state"] != "backing-off":  # noqa: ASYNC110
                    await trio.sleep(0.02)
                assert "connection refused" in str(row["last_error"])
                queue.down = False
                item = await queue.enqueue("job")
                while (await runner_row())["state"] != "running":  # noqa: ASYNC110
                    await trio.sleep(0.05)
                while (await queue.get(item.id)).state is not ItemState.COMPLETED:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            assert [w.state for w in service.workers_status() if w.worker == "runner"] == [
                WorkerState.RUNNING
            ]
            service.stop()


async def test_a_write_that_finds_the_queue_unreachable_shows_backing_off(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A settlement failing for an unreachable queue turns the runner backing-off until the
    next queue call succeeds (the chaos R2 run saw claims block while writes failed)."""
    from trio_supervise import DriverRegistry, RunnerState, WorkflowRunner

    queue = FlakyQueue(writes_down=True)
    events: list[RunnerEvent] = []
    first = await queue.enqueue("job")
    runner: WorkflowRunner[None] = WorkflowRunner(
        queue=queue,
        registry=DriverRegistry[None]().register(Finisher()),
        settings=RunnerSettings(worker_id="w", lease=30),
        build_context=_no_context,
        on_event=events.append,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        while not any(e.kind is RunnerEventKind.SETTLE_FAILED for e in events):  # noqa: ASYNC110
            await trio.sleep(0.1)
        assert runner.state is RunnerState.BACKING_OFF
        assert runner.claim_failures == 0
        queue.writes_down = False
        while (await queue.get(first.id)).state is not ItemState.COMPLETED:  # noqa: ASYNC110
            await trio.sleep(0.1)  # claimed again once its lease expired, then written
        assert runner.state is RunnerState.RUNNING
        runner.shutdown.begin("test")


async def test_service_passes_on_event_to_its_runner() -> None:
    """Service(on_event=...) sees the runner's claims, outcomes and settlements."""
    queue = MemoryQueue()
    events: list[RunnerEvent] = []
    item = await queue.enqueue("job")
    settings = attrs.evolve(_settings(), http=HttpSettings(enabled=False))
    service = Service(
        drivers=[Finisher()],
        settings=settings,
        queue=queue,
        handle_signals=False,
        on_event=events.append,
    )
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            while (await queue.get(item.id)).state is not ItemState.COMPLETED:  # noqa: ASYNC110
                await trio.sleep(0.02)
            service.stop()
    kinds = [event.kind for event in events if event.item_id == item.id]
    assert kinds[:1] == [RunnerEventKind.CLAIMED]
    assert RunnerEventKind.OUTCOME in kinds
    assert RunnerEventKind.SETTLED in kinds


# -- PostgreSQL: terminated connections ------------------------------------------------------------


def _terminate(dsn: str, app: str) -> int:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s",
            [app],
        ).fetchone()
    assert row is not None
    return int(row[0])


async def _fill_pool(queue: PostgresQueue, calls: int) -> None:
    """Make the pool open several connections, so that several sit idle afterwards."""

    async def slow(_: int) -> None:
        await queue._run(lambda conn: conn.execute("SELECT pg_sleep(0.05)").fetchall())

    async with trio.open_nursery() as nursery:
        for n in range(calls):
            nursery.start_soon(slow, n)


@pytest.mark.postgres
async def test_every_worker_call_survives_its_connections_being_terminated() -> None:
    """Claim, renew, settle and read right after every pooled connection was terminated."""
    from psycopg.conninfo import make_conninfo

    with pg_schema() as (dsn, schema):
        app = f"ts-test-{uuid.uuid4().hex[:8]}"
        queue = await PostgresQueue.connect(
            make_conninfo(dsn, application_name=app),
            schema=schema,
            migrate=True,
            pool_size=4,
            listen=False,
        )
        async with queue:
            await queue.enqueue("job", item_id="a")
            await _fill_pool(queue, 4)
            assert _terminate(dsn, app) >= 2
            [item] = await queue.claim_due(["job"], "w", 30, 1)

            await _fill_pool(queue, 4)
            assert _terminate(dsn, app) >= 2
            lease = Lease("a", item.lease_version, "w")
            assert await queue.renew_many([lease], 30) == {"a": LeaseStatus.HELD}

            assert _terminate(dsn, app) >= 1
            done = Settlement(
                item_id="a", lease_version=item.lease_version, kind=SettleKind.COMPLETE
            )
            assert await queue.settle_many([done]) == [True]

            assert _terminate(dsn, app) >= 1
            assert dict(await queue.counts()) == {("job", ItemState.COMPLETED): 1}


@pytest.mark.postgres
async def test_enqueue_is_not_retried_after_a_terminated_connection() -> None:
    """An enqueue might have committed before its connection died: it reports, never repeats."""
    from psycopg.conninfo import make_conninfo

    with pg_schema() as (dsn, schema):
        app = f"ts-test-{uuid.uuid4().hex[:8]}"
        queue = await PostgresQueue.connect(
            make_conninfo(dsn, application_name=app, password="s3cret-sentinel"),
            schema=schema,
            migrate=True,
            pool_size=1,
            listen=False,
        )
        async with queue:
            await queue.counts()
            # The pool's one connection, and the read pool's (status reads have their own).
            assert _terminate(dsn, app) == 2
            with pytest.raises(QueueUnavailable) as caught:
                await queue.enqueue("job", item_id="b")
            assert "s3cret-sentinel" not in str(caught.value)
            # Nothing was written, and the pool replaced the dead connection.
            await queue.enqueue("job", item_id="b")
            assert dict(await queue.counts()) == {("job", ItemState.QUEUED): 1}


@attrs.frozen
class NulRaiser:
    """Completes items, except 'bad', whose evaluation raises with a NUL in its message."""

    name: str = "nul"
    spec_ids: Sequence[str] = ("job",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: object, item: WorkItem) -> Outcome:
        await trio.lowlevel.checkpoint()
        if item.id == "bad":
            raise ValueError("binary\x00garbage")
        return Stop()


@pytest.mark.postgres
async def test_an_error_text_with_a_nul_is_stored_and_its_batch_settles() -> None:
    """PostgreSQL text cannot hold NUL: the error is spelled out, not a failed batch of writes."""
    from trio_supervise import DriverRegistry, WorkflowRunner

    with pg_schema() as (dsn, schema):
        queue = await PostgresQueue.connect(dsn, schema=schema, migrate=True, pool_size=2)
        async with queue:
            for item_id in ("bad", "a", "b", "c"):
                await queue.enqueue("job", item_id=item_id)
            runner: WorkflowRunner[None] = WorkflowRunner(
                queue=queue,
                registry=DriverRegistry[None]().register(NulRaiser()),
                settings=RunnerSettings(worker_id="w", requeue_delay=60, poll_interval=0.05),
                build_context=_no_context,
            )
            with trio.fail_after(20):
                async with trio.open_nursery() as nursery:
                    await nursery.start(runner.run)
                    while (await queue.get("bad")).error_count == 0:  # noqa: ASYNC110
                        await trio.sleep(0.02)
                    runner.shutdown.begin("test")
            bad = await queue.get("bad")
            assert bad.last_error is not None
            assert "binary\\x00garbage" in bad.last_error
            for item_id in ("a", "b", "c"):
                assert (await queue.get(item_id)).state is ItemState.COMPLETED


async def _no_context() -> None:
    return None
