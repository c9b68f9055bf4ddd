"""The runner's side of issue 12's queue classes: attempts bound every re-run, and a permanent
queue fault (:class:`QueueFailed`) stops the runner at once instead of backing off."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

import trio_supervise as ts
from trio_supervise.queues import WorkItem


@attrs.define
class Counter:
    """A driver that counts its evaluations and returns Continue (a long-lived workflow)."""

    name: str = "counter"
    spec_ids: Sequence[str] = ("job",)
    evaluations: int = 0

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        await trio.lowlevel.checkpoint()
        self.evaluations += 1
        return ts.Continue()


async def no_context() -> None:
    return None


def runner(queue: ts.WorkQueue, driver: Counter, **changes: object) -> ts.WorkflowRunner[None]:
    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    registry.register(driver)
    values: dict[str, object] = {"worker_id": "w", "lease": 30, "poll_interval": 60}
    return ts.WorkflowRunner(
        queue=queue,
        registry=registry,
        settings=ts.RunnerSettings(**{**values, **changes}),  # type: ignore[arg-type]
        build_context=no_context,
        jitter=ts.Jitter(seed=1),
    )


def test_attempts_and_errors_are_bounded_by_default() -> None:
    """max_attempts and max_errors default to 20: no loop re-runs an item for ever."""
    settings = ts.RunnerSettings(worker_id="w")
    assert (settings.max_attempts, settings.max_errors) == (20, 20)
    with pytest.raises(ValueError, match="max_attempts must be >= 1"):
        ts.RunnerSettings(worker_id="w", max_attempts=0)


async def test_an_item_whose_worker_dies_every_time_goes_dead(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Claimed past max_attempts with no error ever written: dead, saying so, never evaluated."""
    queue = ts.MemoryQueue()
    await queue.enqueue("job", item_id="x")
    for _ in range(20):  # a worker that is killed mid-evaluation: its lease just expires
        [claimed] = await queue.claim_due(["job"], "doomed", 5, 1)
        await trio.sleep(6)
    assert (claimed.attempt, claimed.error_count) == (20, 0)
    driver = Counter()
    worker = runner(queue, driver)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run)
        while (await queue.get("x")).state is not ts.ItemState.DEAD:  # noqa: ASYNC110
            await trio.sleep(0.1)
        worker.shutdown.begin()
    item = await queue.get("x")
    assert (item.last_error, item.attempt, driver.evaluations) == (
        "exceeded max_attempts (20)",
        21,
        0,
    )
    assert "exceeded max_attempts (20)" in worker.recent_errors[-1].error


async def test_the_due_pass_bounds_attempts_too(autojump_clock: trio.testing.MockClock) -> None:
    """run_due_pass settles an item claimed past max_attempts as dead, without evaluating it."""
    queue = ts.MemoryQueue()
    await queue.enqueue("job", item_id="x")
    for _ in range(3):
        await queue.claim_due(["job"], "doomed", 5, 1)
        await trio.sleep(6)
    driver = Counter()
    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    registry.register(driver)
    settings = ts.RunnerSettings(worker_id="w", max_attempts=3)
    stats = await ts.run_due_pass(queue, registry, settings, no_context)
    assert (stats.claimed, stats.failed, driver.evaluations) == (1, 1, 0)
    item = await queue.get("x")
    assert (item.state, item.last_error) == (ts.ItemState.DEAD, "exceeded max_attempts (3)")


async def test_a_long_lived_workflow_is_not_killed_by_attempts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each successful evaluation resets the attempt count: 60 Continues stay alive."""
    queue = ts.MemoryQueue()
    await queue.enqueue("job", item_id="x")
    driver = Counter()
    worker = runner(queue, driver, requeue_delay=1.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run)
        while driver.evaluations < 60:  # noqa: ASYNC110
            await trio.sleep(0.5)
        worker.shutdown.begin()
    item = await queue.get("x")
    assert item.state is ts.ItemState.QUEUED
    assert item.attempt <= 1


@attrs.define(eq=False)
class BrokenQueue(ts.MemoryQueue):
    """A memory queue whose claims fail permanently, like a read-only database."""

    claims: int = attrs.field(init=False, default=0)

    async def claim_due(
        self, spec_ids: Sequence[str], worker_id: str, lease: float, limit: int
    ) -> list[WorkItem]:
        self.claims += 1
        await trio.lowlevel.checkpoint()
        raise ts.QueueFailed("attempt to write a readonly database")


async def test_a_permanent_queue_fault_stops_the_runner_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """QueueFailed from a claim is raised at once: one claim, no backoff, state failed."""
    queue = BrokenQueue()
    worker = runner(queue, Counter())
    with pytest.raises(ts.QueueFailed, match="readonly"):
        await worker.run()
    assert (queue.claims, trio.current_time(), worker.state) == (1, 0, ts.RunnerState.FAILED)


def test_queue_failed_is_the_permanent_class() -> None:
    """SchemaError is a QueueFailed; QueueUnavailable (transient) is not."""
    assert issubclass(ts.SchemaError, ts.QueueFailed)
    assert issubclass(ts.QueueFailed, ts.QueueError)
    assert not issubclass(ts.QueueUnavailable, ts.QueueFailed)


# -- a service on a read-only SQLite file ------------------------------------------------------


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """Make *path* read-only for this process (root ignores modes: the immutable flag then)."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        try:
            yield
        finally:
            path.chmod(0o644)
        return
    if shutil.which("chattr") is None:
        pytest.skip("running as root without chattr: cannot make a file read-only")
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not permitted here")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@attrs.frozen
class Finisher:
    name: str = "finisher"
    spec_ids: Sequence[str] = ("job",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        await trio.lowlevel.checkpoint()
        return ts.Stop()


async def test_a_service_on_a_read_only_database_fails_fast(tmp_path: Path) -> None:
    """A read-only SQLite file makes the service unhealthy within seconds and exit 1, not 200."""
    path = tmp_path / "q.db"
    await ts.migrate(f"sqlite:///{path}")
    with read_only(path):
        service = ts.Service(
            drivers=[Finisher()],
            settings=ts.Settings(
                database_url=f"sqlite:///{path}",
                http=ts.HttpSettings(port=0),
                runner=ts.RunnerSettings(worker_id="w", poll_interval=0.05),
            ),
            handle_signals=False,
        )
        started = trio.current_time()
        with trio.fail_after(60):  # backing off instead would take minutes
            code = await service.run()
        elapsed = trio.current_time() - started
    assert code == 1
    assert not service.healthy
    assert elapsed < 30, f"took {elapsed:.1f} s to give up"


async def test_a_service_whose_database_is_deleted_fails_fast(tmp_path: Path) -> None:
    """Deleting the SQLite file under a running service makes it unhealthy and exit 1, at once."""
    path = tmp_path / "q.db"
    service = ts.Service(
        drivers=[Finisher()],
        settings=ts.Settings(
            database_url=f"sqlite:///{path}",
            http=ts.HttpSettings(port=0),
            runner=ts.RunnerSettings(worker_id="w", poll_interval=0.05),
        ),
        handle_signals=False,
    )
    codes: list[int] = []

    async def run() -> None:
        codes.append(await service.run())

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            while not path.exists() or service.runner is None:  # noqa: ASYNC110
                await trio.sleep(0.02)
            await trio.sleep(0.2)
            assert service.healthy
            path.unlink()
            started = trio.current_time()
    assert codes == [1]
    assert not service.healthy
    assert trio.current_time() - started < 30
    assert any("is gone" in error.error for error in service.runner.recent_errors)
