"""The long-running WorkflowRunner, on the in-memory queue under virtual time."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import prometheus_client
import pytest
import trio
import trio.testing

import trio_supervise as ts
from trio_supervise.job import first_line
from trio_supervise.queues import Lease, LeaseStatus, Settlement, WorkItem

EPOCH = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
Kind = ts.RunnerEventKind

ERRORS: dict[str, Callable[[], BaseException]] = {
    "value": lambda: ValueError("bad"),
    "supervise": lambda: ts.LeaseLost("x", 1),
    "group": lambda: ExceptionGroup("many", [ValueError(1), KeyError(2)]),
    "interrupt": KeyboardInterrupt,
    "exit": lambda: SystemExit(3),
}


@attrs.define
class Recorder:
    """A driver that sleeps, raises or returns what the item's config says, and records when."""

    name: str = "recorder"
    spec_ids: Sequence[str] = ("job",)
    starts: dict[str, list[float]] = attrs.Factory(dict)
    ends: dict[str, float] = attrs.Factory(dict)
    cancelled: dict[str, float] = attrs.Factory(dict)
    running: int = 0
    peak: int = 0

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        self.starts.setdefault(item.id, []).append(trio.current_time())
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await trio.sleep(item.config.get("sleep", 0))
        except trio.Cancelled:
            self.cancelled[item.id] = trio.current_time()
            raise
        finally:
            self.running -= 1
        self.ends[item.id] = trio.current_time()
        if "raise" in item.config:
            raise ERRORS[item.config["raise"]]()
        outcome = item.config.get("outcome", "stop")
        if outcome == "continue":
            return ts.Continue()
        return ts.Stop()


@attrs.define(eq=False)
class FaultyQueue(ts.MemoryQueue):
    """The memory queue, with calls recorded and faults to switch on."""

    renew_calls: list[tuple[float, int]] = attrs.field(init=False, factory=list)
    settle_calls: list[tuple[float, int]] = attrs.field(init=False, factory=list)
    deaf: bool = attrs.field(init=False, default=False)
    renew_failures: int = attrs.field(init=False, default=0)
    claim_failures: int = attrs.field(init=False, default=0)
    renew_latency: float = attrs.field(init=False, default=0.0)
    settle_failures: int = attrs.field(init=False, default=0)
    settle_error: Callable[[], Exception] = attrs.field(
        init=False, default=lambda: ts.QueueUnavailable("database is locked")
    )

    async def renew_many(self, leases: Sequence[Lease], lease: float) -> dict[str, LeaseStatus]:
        self.renew_calls.append((trio.current_time(), len(leases)))
        await trio.sleep(self.renew_latency)  # a round trip to a distant database
        if self.renew_failures:
            self.renew_failures -= 1
            raise ts.QueueUnavailable("down")
        if self.deaf:  # a partitioned worker: it believes its renewals, which never land
            return {each.item_id: LeaseStatus.HELD for each in leases}
        return await super().renew_many(leases, lease)

    async def settle_many(self, settlements: Sequence[Settlement]) -> list[bool]:
        self.settle_calls.append((trio.current_time(), len(settlements)))
        if self.settle_failures:
            self.settle_failures -= 1
            await trio.lowlevel.checkpoint()
            raise self.settle_error()
        return await super().settle_many(settlements)

    async def claim_due(
        self, spec_ids: Sequence[str], worker_id: str, lease: float, limit: int
    ) -> list[WorkItem]:
        if self.claim_failures:
            self.claim_failures -= 1
            raise ts.QueueUnavailable("down")
        return await super().claim_due(spec_ids, worker_id, lease, limit)


async def no_context() -> None:
    return None


def make_runner(
    queue: ts.WorkQueue,
    *drivers: Any,
    events: list[ts.RunnerEvent] | None = None,
    **changes: Any,
) -> ts.WorkflowRunner[None]:
    values: dict[str, Any] = {
        "worker_id": "a",
        "lease": 30,
        "concurrency": 4,
        "poll_interval": 60,
        "shutdown_grace": 5,
    }
    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    for driver in drivers or (Recorder(),):
        registry.register(driver)
    return ts.WorkflowRunner(
        queue=queue,
        registry=registry,
        settings=ts.RunnerSettings(**{**values, **changes}),
        build_context=no_context,
        jitter=ts.Jitter(seed=1),
        on_event=None if events is None else events.append,
    )


@asynccontextmanager
async def running(runner: ts.WorkflowRunner[None]) -> AsyncIterator[None]:
    """Run *runner* for the body, then shut it down and wait for it to return."""
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        yield
        runner.shutdown.begin()


def sample(runner: ts.WorkflowRunner[None], name: str, spec: str = "job") -> float | None:
    return runner.metrics.registry.get_sample_value(name, {"spec": spec})


# -- keeping slots busy -----------------------------------------------------------------------


async def test_a_slow_item_does_not_hold_back_the_others(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each freed slot is refilled at once: the quick items run back to back beside a slow one."""
    queue = ts.MemoryQueue()
    driver = Recorder()
    await queue.enqueue("job", item_id="a-slow", config={"sleep": 10})
    for n in range(1, 5):
        await queue.enqueue("job", item_id=f"b{n}", config={"sleep": 1})
    async with running(make_runner(queue, driver, concurrency=2)):
        await trio.sleep(11)
    assert {item_id: times[0] for item_id, times in driver.starts.items()} == {
        "a-slow": 0.0,
        "b1": 0.0,
        "b2": 1.0,
        "b3": 2.0,
        "b4": 3.0,
    }
    assert driver.ends["b4"] == 4.0
    assert driver.ends["a-slow"] == 10.0
    assert driver.peak == 2


async def test_an_idle_runner_wakes_for_new_and_newly_due_work(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An idle runner starts new work at once and due-later work at its due time, not at a poll."""
    queue = ts.MemoryQueue()
    driver = Recorder()
    async with running(make_runner(queue, driver, poll_interval=60)):
        await trio.sleep(5)
        await queue.enqueue("job", item_id="now")
        await queue.enqueue(
            "job", item_id="soon", due_at=queue.clock.now() + dt.timedelta(seconds=2)
        )
        await trio.sleep(10)
    assert driver.starts == {"now": [5.0], "soon": [7.0]}


@attrs.define(eq=False)
class CountingQueue(ts.MemoryQueue):
    """The memory queue, counting claims; ``exact`` overrides its ``exact_wakeups``."""

    exact: bool | None = None
    claims: int = attrs.field(init=False, default=0)

    @property
    def exact_wakeups(self) -> bool:
        return super().exact_wakeups if self.exact is None else self.exact

    async def claim_due(
        self, spec_ids: Sequence[str], worker_id: str, lease: float, limit: int
    ) -> list[WorkItem]:
        self.claims += 1
        return await super().claim_due(spec_ids, worker_id, lease, limit)


@pytest.mark.parametrize(("exact", "claims"), [(None, 2), (False, 1 + 86_400 // 60)])
async def test_a_queue_with_exact_wakeups_is_not_polled(
    autojump_clock: trio.testing.MockClock, exact: bool | None, claims: int
) -> None:
    """With exact wake-ups (the memory queue on Trio's clock) an idle day costs no polls."""
    queue = CountingQueue(exact=exact)
    assert queue.exact_wakeups is (exact is None)
    driver = Recorder()
    await queue.enqueue("job", item_id="tomorrow", due_at=EPOCH + dt.timedelta(days=1))
    async with running(make_runner(queue, driver, poll_interval=60)):
        await trio.sleep(86_400 + 1)
    assert driver.starts == {"tomorrow": [86_400.0]}
    # Exact: the first claim and the one at the due time. Polled: one claim a minute as well.
    assert queue.claims == claims


class Moments(trio.abc.Instrument):
    """The times (Trio's clock) at which any task ran: where an autojump clock stopped."""

    def __init__(self) -> None:
        self.times: set[float] = set()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.times.add(trio.current_time())


@attrs.define(eq=False)
class Daily:
    """One step a day, *days* times."""

    days: int
    name: str = "daily"
    spec_ids: tuple[str, ...] = ("daily",)
    at: list[float] = attrs.Factory(list)
    done: trio.Event = attrs.Factory(trio.Event)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        self.at.append(trio.current_time())
        if len(self.at) >= self.days:
            self.done.set()
            return ts.Stop()
        return ts.Reschedule(at=item.due_at + dt.timedelta(days=1), config=item.config)


async def test_a_simulated_day_wakes_the_runner_only_at_its_due_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Under an autojump clock a day of one daily workflow is one jump: the renewal loop and
    the loop-lag watchdog stop sleeping once nothing is in flight, instead of waking (2.5 s
    and 10 s after each step, a jump each) to find nothing to do."""
    queue = ts.MemoryQueue()
    await queue.enqueue("daily", item_id="w", due_at=queue.clock.now())
    driver = Daily(days=10)
    moments = Moments()
    trio.lowlevel.add_instrument(moments)
    try:
        async with running(make_runner(queue, driver, lease=30)):
            await driver.done.wait()
    finally:
        trio.lowlevel.remove_instrument(moments)
    days = [day * 86_400.0 for day in range(10)]
    assert driver.at == days
    assert sorted(moments.times) == days


async def test_renewals_go_in_one_call_per_round(autojump_clock: trio.testing.MockClock) -> None:
    """Every in-flight lease is renewed in one renew_many call every lease / 3 seconds."""
    queue = FaultyQueue()
    await queue.enqueue("job", item_id="one", config={"sleep": 25})
    await queue.enqueue("job", item_id="two", config={"sleep": 25})
    events: list[ts.RunnerEvent] = []
    async with running(make_runner(queue, events=events, lease=30)):
        await trio.sleep(40)
    assert queue.renew_calls == [(10.0, 2), (20.0, 2)]
    renewed = [(e.at, e.item_id, e.detail) for e in events if e.kind is Kind.RENEWED]
    assert sorted(renewed) == [
        (10.0, "one", "held"),
        (10.0, "two", "held"),
        (20.0, "one", "held"),
        (20.0, "two", "held"),
    ]
    assert (await queue.get("one")).state is ts.ItemState.COMPLETED


async def test_outcomes_that_finish_together_are_written_together(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Outcomes ready at the same instant go to the queue in one settle_many call."""
    queue = FaultyQueue()
    for n in range(5):
        await queue.enqueue("job", item_id=f"i{n}", config={"sleep": 1})
    async with running(make_runner(queue, concurrency=5)):
        await trio.sleep(2)
    assert queue.settle_calls == [(1.0, 5)]
    assert {item.state for item in queue.items.values()} == {ts.ItemState.COMPLETED}


@attrs.define(eq=False)
class DistantQueue(ts.MemoryQueue):
    """The memory queue one round trip away: claims and writes take ``latency`` seconds each.

    It records each call's span and, at each write's start, how many items the runner holds.
    """

    latency: float = 1.0
    write_latency: float | None = None
    """A write's latency, when not ``latency``."""
    runner: ts.WorkflowRunner[None] | None = None
    claims: list[tuple[float, float, int]] = attrs.field(init=False, factory=list)
    writes: list[tuple[float, float, int]] = attrs.field(init=False, factory=list)
    held: list[int] = attrs.field(init=False, factory=list)
    renewals: list[float] = attrs.field(init=False, factory=list)

    async def renew_many(self, leases: Sequence[Lease], lease: float) -> dict[str, LeaseStatus]:
        self.renewals.append(trio.current_time())
        return await super().renew_many(leases, lease)

    async def claim_due(
        self, spec_ids: Sequence[str], worker_id: str, lease: float, limit: int
    ) -> list[WorkItem]:
        started = trio.current_time()
        await trio.sleep(self.latency)
        items = await super().claim_due(spec_ids, worker_id, lease, limit)
        self.claims.append((started, trio.current_time(), len(items)))
        return items

    async def settle_many(self, settlements: Sequence[Settlement]) -> list[bool]:
        started = trio.current_time()
        assert self.runner is not None
        self.held.append(len(self.runner.in_flight))
        await trio.sleep(self.latency if self.write_latency is None else self.write_latency)
        results = await super().settle_many(settlements)
        self.writes.append((started, trio.current_time(), len(settlements)))
        return results


async def test_the_next_claim_runs_beside_the_last_batchs_write(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A slot frees once its outcome is taken for a write, not when the write answers: claims
    and writes overlap, yet no more than ``concurrency`` items are evaluated at once and the
    runner holds at most one settle batch more than that."""
    queue = DistantQueue()
    driver = Recorder()
    for n in range(12):
        await queue.enqueue("job", item_id=f"i{n:02}")
    runner = queue.runner = make_runner(queue, driver, concurrency=3, claim_batch=3, settle_batch=3)
    async with running(runner):
        await trio.sleep(5.5)
    assert len(driver.ends) == 12
    assert driver.peak <= 3
    # Claims start at 0, 1, 2, 3 (each beside the write of the batch before), not every 2 s.
    assert [start for start, _, n in queue.claims if n] == [0.0, 1.0, 2.0, 3.0]
    assert [(start, n) for start, _, n in queue.writes] == [(1.0, 3), (2.0, 3), (3.0, 3), (4.0, 3)]
    assert max(queue.held) <= 3 + 3
    assert {item.state for item in queue.items.values()} == {ts.ItemState.COMPLETED}


async def test_twice_the_claim_batch_claims_one_batch_ahead_within_the_concurrency(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """At a concurrency of two claim batches the next claim starts as soon as the last one
    returns, while its batch is evaluated (P8 runs so), and at every checkpoint the items
    claimed and not yet taken for a write stay within the concurrency, the evaluations too,
    and the leases held within the concurrency plus one settle batch."""
    queue = DistantQueue()
    driver = Recorder()
    for n in range(8):
        await queue.enqueue("job", item_id=f"i{n:02}", config={"sleep": 1.5})
    runner = queue.runner = make_runner(queue, driver, concurrency=4, claim_batch=2, settle_batch=4)
    seen: list[tuple[int, int, int]] = []

    class Bound(trio.abc.Instrument):
        def after_task_step(self, task: trio.lowlevel.Task) -> None:
            held = sum(
                1
                for item in queue.items.values()
                if item.state is ts.ItemState.RUNNING and item.lease_owner == "a"
            )
            # The runner's slots: claimed (or being claimed) and not yet taken for a write.
            slots = sum(busy.value for busy in runner._flights.busy.values())
            seen.append((slots, driver.running, held))

    bound = Bound()
    trio.lowlevel.add_instrument(bound)
    try:
        async with running(runner):
            await trio.sleep(9)
    finally:
        trio.lowlevel.remove_instrument(bound)
    assert len(driver.ends) == 8
    # The second claim starts at 1, as the first returns, not once its batch is evaluated
    # (2.5); its items start while the first batch's still run.
    assert [start for start, _, n in queue.claims if n][:2] == [0.0, 1.0]
    assert driver.starts["i02"] == [2.0]
    assert driver.ends["i00"] == 2.5
    assert driver.peak == 4
    assert seen
    assert max(slots for slots, _, _ in seen) == 4
    assert max(evaluating for _, evaluating, _ in seen) <= 4
    assert max(held for _, _, held in seen) <= 4 + 4
    assert {item.state for item in queue.items.values()} == {ts.ItemState.COMPLETED}


async def test_an_item_being_written_stays_in_flight_renewed_and_drained(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Its slot is free, but an item whose write outlasts the lease keeps it renewed, a cancel
    request then changes nothing, and shutdown waits for the write's answer."""
    queue = DistantQueue(latency=0.0, write_latency=45.0)
    driver = Recorder()
    await queue.enqueue("job", item_id="slow-write")
    runner = queue.runner = make_runner(queue, driver, concurrency=1, lease=30, shutdown_grace=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await trio.sleep(12)
        assert [item.id for item in runner.in_flight] == ["slow-write"]
        await queue.request_cancel("slow-write")
        runner.shutdown.begin()
    assert trio.current_time() == 45.0  # longer than the lease: renewed meanwhile
    assert queue.renewals == [10.0, 20.0, 30.0, 40.0]
    assert driver.starts == {"slow-write": [0.0]}
    assert driver.cancelled == {}
    item = await queue.get("slow-write")
    assert item.state is ts.ItemState.COMPLETED
    assert runner.in_flight == []


async def test_a_failing_write_takes_a_slot_again_while_it_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Outcomes waiting to be written again hold their slots: while writes fail, the runner
    claims no more than its concurrency plus one batch being written."""
    queue = FaultyQueue()
    queue.settle_failures = 1000
    for n in range(20):
        await queue.enqueue("job", item_id=f"i{n:02}")
    runner = make_runner(queue, concurrency=2, claim_batch=2, settle_batch=2, lease=60)
    peak = 0
    async with running(runner):
        for _ in range(100):
            await trio.sleep(0.25)
            peak = max(peak, len(runner.in_flight))
        queue.settle_failures = 0
        await trio.sleep(1)
    assert 2 <= peak <= 2 + 2


# -- shutdown ---------------------------------------------------------------------------------


async def test_shutdown_drains_then_releases_stragglers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """On shutdown nothing new is claimed, quick items finish, stragglers are released at once."""
    queue = ts.MemoryQueue()
    driver = Recorder()
    await queue.enqueue("job", item_id="quick", config={"sleep": 2})
    await queue.enqueue("job", item_id="straggler", config={"sleep": 100})
    runner = make_runner(queue, driver, shutdown_grace=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await trio.sleep(1)
        runner.shutdown.begin()
        await trio.sleep(0.5)
        assert runner.state is ts.RunnerState.DRAINING
        await queue.enqueue("job", item_id="late")
    assert trio.current_time() == 6.0
    assert runner.state is ts.RunnerState.STOPPED
    assert (await queue.get("quick")).state is ts.ItemState.COMPLETED
    assert driver.cancelled == {"straggler": 6.0}
    assert "late" not in driver.starts
    straggler = await queue.get("straggler")
    assert (straggler.state, straggler.lease_owner, straggler.error_count) == (
        ts.ItemState.QUEUED,
        None,
        0,
    )
    assert straggler.due_at == EPOCH + dt.timedelta(seconds=6)
    taken = await queue.claim_due(["job"], "b", lease=30, limit=10)
    assert [item.id for item in taken] == ["late", "straggler"]
    assert sample(runner, "trio_supervise_items_released_total") == 1


async def test_shutdown_returns_as_soon_as_the_last_item_finishes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Draining takes only as long as the in-flight items need, not the whole grace period."""
    queue = ts.MemoryQueue()
    await queue.enqueue("job", item_id="quick", config={"sleep": 2})
    runner = make_runner(queue, shutdown_grace=30)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await trio.sleep(1)
        runner.shutdown.begin()
    assert trio.current_time() == 2.0
    assert (await queue.get("quick")).state is ts.ItemState.COMPLETED


# -- cancellation from outside -----------------------------------------------------------------


@attrs.define
class TaskRecorder(Recorder):
    """A :class:`Recorder` that also notes which task evaluated each item."""

    tasks: dict[str, trio.lowlevel.Task] = attrs.Factory(dict)

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        self.tasks[item.id] = trio.lowlevel.current_task()
        return await super().evaluate(context, item)


async def test_items_are_evaluated_by_a_pool_no_larger_than_the_concurrency(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Evaluators are long-lived tasks reused from item to item: at most one per slot."""
    queue = ts.MemoryQueue()
    driver = TaskRecorder()
    for n in range(40):
        await queue.enqueue("job", item_id=f"i{n:02}", config={"sleep": 1 + n % 3})
    async with running(make_runner(queue, driver, concurrency=4)):
        await trio.sleep(60)
    assert len(driver.ends) == 40
    assert len(set(driver.tasks.values())) <= 4
    assert driver.peak == 4


async def test_a_stopped_item_does_not_cancel_the_next_one_its_evaluator_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Cancelling one evaluation (a cancel request) leaves its evaluator fit for the next item."""
    queue = ts.MemoryQueue()
    driver = TaskRecorder()
    await queue.enqueue("job", item_id="a-long", config={"sleep": 100})
    await queue.enqueue("job", item_id="b-next", config={"sleep": 30})
    async with running(make_runner(queue, driver, concurrency=1, lease=30)):
        await trio.sleep(3)
        await queue.request_cancel("a-long")
        await trio.sleep(60)
    assert driver.cancelled == {"a-long": 10.0}
    assert driver.starts["b-next"] == [10.0]
    assert driver.ends["b-next"] == 40.0
    assert driver.tasks["a-long"] is driver.tasks["b-next"]
    assert (await queue.get("a-long")).state is ts.ItemState.CANCELLED
    assert (await queue.get("b-next")).state is ts.ItemState.COMPLETED


async def test_a_big_round_renews_in_chunks(autojump_clock: trio.testing.MockClock) -> None:
    """A round over more leases than RENEWAL_CHUNK renews them in several calls, all at once."""
    from trio_supervise.run import RENEWAL_CHUNK

    queue = FaultyQueue()
    count = RENEWAL_CHUNK + 5
    for n in range(count):
        await queue.enqueue("job", item_id=f"i{n}", config={"sleep": 15})
    runner = make_runner(queue, lease=30, concurrency=count, claim_batch=count)
    async with running(runner):
        await trio.sleep(20)
    assert queue.renew_calls == [(10.0, RENEWAL_CHUNK), (10.0, 5)]
    assert {item.state for item in queue.items.values()} == {ts.ItemState.COMPLETED}


async def test_a_failed_chunk_counts_the_rest_of_its_round_as_failed(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """When a chunk's call fails the round stops there: one warning, every lease counted failed,
    evaluations going on while their leases last."""
    from trio_supervise.run import RENEWAL_CHUNK

    queue = FaultyQueue()
    queue.renew_failures = 1
    count = RENEWAL_CHUNK + 5
    for n in range(count):
        await queue.enqueue("job", item_id=f"i{n}", config={"sleep": 15})
    runner = make_runner(queue, lease=30, concurrency=count, claim_batch=count)
    async with running(runner):
        await trio.sleep(20)
    assert queue.renew_calls == [(10.0, RENEWAL_CHUNK)]
    warnings = [r.getMessage() for r in caplog.records if "leases failed" in r.getMessage()]
    assert warnings == [
        f"renewing {count} leases failed: down; evaluations go on while their leases "
        "last, renewing again in 10 s"
    ]
    assert sample(runner, "trio_supervise_lease_renewals_failed_total") == count
    assert {item.state for item in queue.items.values()} == {ts.ItemState.COMPLETED}


async def test_a_cancel_request_cancels_the_evaluation_at_the_next_renewal(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """request_cancel on a running item cancels its evaluation at the next renewal; not an error."""
    queue = ts.MemoryQueue()
    driver = Recorder()
    events: list[ts.RunnerEvent] = []
    await queue.enqueue("job", item_id="long", config={"sleep": 100})
    runner = make_runner(queue, driver, events=events, lease=30)
    async with running(runner):
        await trio.sleep(3)
        await queue.request_cancel("long")
        await trio.sleep(10)
    assert driver.cancelled == {"long": 10.0}
    long = await queue.get("long")
    assert (long.state, long.error_count, long.last_error) == (ts.ItemState.CANCELLED, 0, None)
    outcomes = [(e.at, e.detail) for e in events if e.kind is Kind.OUTCOME]
    assert outcomes == [(10.0, "cancel")]
    assert any(e.kind is Kind.CANCEL_REQUESTED and e.at == 10.0 for e in events)
    assert sample(runner, "trio_supervise_items_cancelled_total") == 1
    assert sample(runner, "trio_supervise_items_failed_total") is None
    assert runner.recent_errors == []


async def test_an_item_claimed_with_a_cancel_request_is_not_evaluated(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An item whose owner died after a cancel request is cancelled without evaluation."""
    queue = ts.MemoryQueue()
    driver = Recorder()
    await queue.enqueue("job", item_id="orphan")
    await queue.claim_due(["job"], "dead-worker", lease=3, limit=1)
    await queue.request_cancel("orphan")
    async with running(make_runner(queue, driver)):
        await trio.sleep(5)
    orphan = await queue.get("orphan")
    assert orphan.state is ts.ItemState.CANCELLED
    assert orphan.updated_at == EPOCH + dt.timedelta(seconds=3)
    assert driver.starts == {}


# -- item errors: typed configs, retries, dead items, exceptions --------------------------------


@attrs.frozen
class Digest:
    """A typed driver config."""

    days: int


@attrs.define
class DigestDriver:
    """Reschedules itself a day later with one more day counted."""

    name: str = "digest-driver"
    spec_ids: Sequence[str] = ("digest",)
    config_type: type[Digest] = Digest
    seen: list[Any] = attrs.Factory(list)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        self.seen.append(item.config)
        return ts.Reschedule(EPOCH + dt.timedelta(days=1), Digest(item.config.days + 1))


async def test_a_config_that_does_not_fit_is_an_item_error_not_a_crash(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A bad typed config fails that item with a message naming spec and field; others go on."""
    queue = ts.MemoryQueue()
    driver = DigestDriver()
    await queue.enqueue("digest", item_id="bad", config={"days": "seven"})
    await queue.enqueue("digest", item_id="good", config={"days": 1})
    runner = make_runner(queue, driver)
    async with running(runner):
        await trio.sleep(1)
        assert runner.state is ts.RunnerState.RUNNING
    message = "invalid config for spec 'digest': days: expected int, got str"
    bad = await queue.get("bad")
    assert (bad.error_count, bad.last_error) == (1, message)
    assert [(e.item_id, e.spec_id, e.error) for e in runner.recent_errors] == [
        ("bad", "digest", message)
    ]
    good = await queue.get("good")
    assert driver.seen == [Digest(1)]
    assert (good.config, good.due_at) == ({"days": 2}, EPOCH + dt.timedelta(days=1))


async def test_failed_items_back_off_then_die(autojump_clock: trio.testing.MockClock) -> None:
    """Errors are retried after the policy's backoff; after max_errors the item is dead."""
    queue = ts.MemoryQueue()
    driver = Recorder()
    await queue.enqueue("job", item_id="flaky", config={"raise": "value"})
    policy = ts.RestartPolicy(2, 60, jitter=ts.JitterMode.NONE)
    runner = make_runner(queue, driver, retry=policy, max_errors=4)
    async with running(runner):
        await trio.sleep(100)
        dead = await queue.get("flaky")
        assert (dead.state, dead.error_count, first_line(dead.last_error)) == (
            ts.ItemState.DEAD,
            4,
            "ValueError: bad",
        )
        await queue.retry("flaky")
        await trio.sleep(1)
    assert driver.starts["flaky"] == [0.0, 2.0, 6.0, 14.0, 100.0]
    assert sample(runner, "trio_supervise_items_failed_total") == 5
    assert sample(runner, "trio_supervise_items_dead_total") == 1


async def test_retry_backoff_is_jittered_by_item_and_error_count(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With jitter, each retry waits exactly policy.backoff(errors + 1, key=item id)."""
    queue = ts.MemoryQueue()
    driver = Recorder()
    await queue.enqueue("job", item_id="flaky", config={"raise": "value"})
    policy = ts.RestartPolicy(2, 60)
    async with running(make_runner(queue, driver, retry=policy)):
        await trio.sleep(30)
    jitter = ts.Jitter(seed=1)
    expected = [0.0]
    for attempt in range(1, 4):
        expected.append(expected[-1] + policy.backoff(attempt, key="flaky", jitter=jitter))
    assert driver.starts["flaky"][:4] == pytest.approx(expected, abs=1e-5)


async def test_without_a_retry_policy_errors_wait_the_requeue_delay(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The seed's fixed requeue delay is the default retry, and Continue uses it too."""
    queue = ts.MemoryQueue()
    driver = Recorder()
    await queue.enqueue("job", item_id="flaky", config={"raise": "value"})
    await queue.enqueue("job", item_id="loop", config={"outcome": "continue"})
    async with running(make_runner(queue, driver, requeue_delay=5)):
        await trio.sleep(11)
    assert driver.starts["flaky"] == [0.0, 5.0, 10.0]
    assert driver.starts["loop"] == [0.0, 5.0, 10.0]
    assert (await queue.get("flaky")).error_count == 3


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        ("value", "ValueError: bad"),
        ("supervise", "lease lost on item 'x' (version 1)"),
        ("group", "ExceptionGroup: many (2 sub-exceptions)"),
    ],
)
async def test_a_driver_exception_is_an_item_error(
    autojump_clock: trio.testing.MockClock, kind: str, text: str
) -> None:
    """Any Exception from a driver fails that item only; the runner keeps going."""
    queue = ts.MemoryQueue()
    driver = Recorder()
    await queue.enqueue("job", item_id="bad", config={"raise": kind})
    await queue.enqueue("job", item_id="next", config={"sleep": 1})
    runner = make_runner(queue, driver, requeue_delay=100)
    async with running(runner):
        await trio.sleep(2)
        assert runner.state is ts.RunnerState.RUNNING
    assert first_line((await queue.get("bad")).last_error) == text
    assert (await queue.get("next")).state is ts.ItemState.COMPLETED


@pytest.mark.parametrize(
    ("kind", "error"), [("interrupt", KeyboardInterrupt), ("exit", SystemExit)]
)
async def test_a_driver_base_exception_propagates(
    autojump_clock: trio.testing.MockClock, kind: str, error: type[BaseException]
) -> None:
    """KeyboardInterrupt or SystemExit from a driver leaves run() as itself and settles nothing."""
    queue = ts.MemoryQueue()
    await queue.enqueue("job", item_id="boom", config={"raise": kind, "sleep": 1})
    runner = make_runner(queue)
    with pytest.raises(error):
        await runner.run()
    assert trio.current_time() == 1.0
    assert (await queue.get("boom")).state is ts.ItemState.RUNNING


async def test_outside_cancellation_propagates_through_the_driver(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Cancelling run() from outside cancels the drivers too; nothing is settled."""
    queue = ts.MemoryQueue()
    driver = Recorder()
    await queue.enqueue("job", item_id="long", config={"sleep": 100})
    runner = make_runner(queue, driver)
    with trio.move_on_after(5):
        await runner.run()
    assert driver.cancelled == {"long": 5.0}
    assert (await queue.get("long")).state is ts.ItemState.RUNNING
    assert runner.state is ts.RunnerState.STOPPED


# -- leases -----------------------------------------------------------------------------------


async def test_a_stale_worker_cannot_overwrite_the_new_owner(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """After another worker re-claims an expired lease, the old worker's outcome is refused,
    and the refusal (the item may run twice) is counted per spec and kept in recent errors."""
    queue = FaultyQueue()
    driver = Recorder()
    events: list[ts.RunnerEvent] = []
    await queue.enqueue("job", item_id="shared", config={"sleep": 10})
    queue.deaf = True
    runner = make_runner(queue, driver, events=events, lease=3, concurrency=1)
    async with running(runner):
        await trio.sleep(3)
        [taken] = await queue.claim_due(["job"], "b", lease=30, limit=1)
        await trio.sleep(8)
    assert driver.ends == {"shared": 10.0}
    shared = await queue.get("shared")
    assert (shared.state, shared.lease_owner, shared.lease_version) == (
        ts.ItemState.RUNNING,
        "b",
        taken.lease_version,
    )
    refused = [e for e in queue.events if e.op == "settle:complete"]
    assert [(e.lease_version, e.applied) for e in refused] == [(taken.lease_version - 1, False)]
    assert [e.detail for e in events if e.kind is Kind.SETTLE_REFUSED] == ["complete"]
    assert sample(runner, "trio_supervise_items_completed_total") is None
    assert sample(runner, "trio_supervise_settlements_refused_total") == 1
    assert [(e.item_id, e.spec_id, e.error) for e in runner.recent_errors] == [
        ("shared", "job", "complete refused: the lease was lost (another worker may run the item)")
    ]
    await queue.complete("shared", taken.lease_version)
    assert (await queue.get("shared")).state is ts.ItemState.COMPLETED


async def test_a_lost_lease_cancels_the_evaluation_at_the_renewal(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """When a renewal finds the lease lost, the evaluation is cancelled then and nothing written."""
    queue = FaultyQueue()
    driver = Recorder()
    events: list[ts.RunnerEvent] = []
    await queue.enqueue("job", item_id="shared", config={"sleep": 10})
    queue.deaf = True
    runner = make_runner(queue, driver, events=events, lease=3, concurrency=1)
    async with running(runner):
        await trio.sleep(3.5)  # between renewal rounds, after the lease expired at 3 s
        [taken] = await queue.claim_due(["job"], "b", lease=30, limit=1)
        queue.deaf = False
        await trio.sleep(1.5)
    assert driver.cancelled == {"shared": 4.0}
    assert [(e.at, e.detail) for e in events if e.kind is Kind.LEASE_LOST] == [
        (4.0, "renewal refused")
    ]
    assert [e.detail for e in events if e.kind is Kind.OUTCOME] == ["lease-lost"]
    shared = await queue.get("shared")
    assert (shared.lease_owner, shared.lease_version, shared.error_count) == (
        "b",
        taken.lease_version,
        0,
    )
    assert sample(runner, "trio_supervise_lease_renewals_failed_total") == 1
    assert runner.recent_errors[0].error == "lease lost: renewal refused"


async def test_one_failed_renewal_is_survived(autojump_clock: trio.testing.MockClock) -> None:
    """A single failed renewal round leaves the evaluation running; the lease still has time."""
    queue = FaultyQueue()
    driver = Recorder()
    await queue.enqueue("job", item_id="long", config={"sleep": 25})
    queue.renew_failures = 1
    async with running(make_runner(queue, driver, lease=30)):
        await trio.sleep(30)
    assert driver.ends == {"long": 25.0}
    assert (await queue.get("long")).state is ts.ItemState.COMPLETED


async def test_renewals_failing_until_the_lease_runs_short_stop_the_evaluation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Once failed renewals leave less than one interval of lease, the evaluation is stopped."""
    queue = FaultyQueue()
    driver = Recorder()
    await queue.enqueue("job", item_id="long", config={"sleep": 100})
    queue.renew_failures = 2
    runner = make_runner(queue, driver, lease=30)
    async with running(runner):
        await trio.sleep(21)
    assert driver.cancelled == {"long": 20.0}
    long = await queue.get("long")
    assert (long.error_count, long.last_error) == (1, "lease renewal failed: down")
    assert sample(runner, "trio_supervise_lease_renewals_failed_total") == 2


# -- claims, start-up, observability ------------------------------------------------------------


async def test_failed_claims_back_off_then_recover(autojump_clock: trio.testing.MockClock) -> None:
    """A failing claim is retried after the claim backoff, visible as backing-off, then recovers."""
    queue = FaultyQueue()
    driver = Recorder()
    await queue.enqueue("job", item_id="waiting")
    queue.claim_failures = 3
    policy = ts.RestartPolicy(1, 30, jitter=ts.JitterMode.NONE)
    runner = make_runner(queue, driver, claim_retry=policy)
    async with running(runner):
        await trio.sleep(0.5)
        assert (runner.state, runner.claim_failures) == (ts.RunnerState.BACKING_OFF, 1)
        await trio.sleep(7)
        assert (runner.state, runner.claim_failures) == (ts.RunnerState.RUNNING, 0)
    assert driver.starts == {"waiting": [7.0]}
    assert [e.error for e in runner.recent_errors] == ["claim failed: down"] * 3


async def test_claims_failing_for_good_make_run_raise(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Past claim_retry.max_restarts consecutive failures, run() drains and raises the error."""
    queue = FaultyQueue()
    queue.claim_failures = 100
    policy = ts.RestartPolicy(1, 30, max_restarts=2, jitter=ts.JitterMode.NONE)
    runner = make_runner(queue, claim_retry=policy)
    with pytest.raises(ts.QueueUnavailable, match="down"):
        await runner.run()
    assert trio.current_time() == 3.0
    assert runner.state is ts.RunnerState.FAILED


async def test_run_refuses_an_empty_or_invalid_registry(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """run() raises DriverError before readiness when there is nothing valid to run."""
    empty = ts.WorkflowRunner(
        queue=ts.MemoryQueue(),
        registry=ts.DriverRegistry(),
        settings=ts.RunnerSettings(worker_id="a"),
        build_context=no_context,
    )
    with pytest.raises(ts.DriverError, match="no drivers"):
        await empty.run()

    class Invalid(Recorder):
        def validate_specs(self) -> None:
            raise ValueError("spec 'job' has no schedule")

    runner = make_runner(ts.MemoryQueue(), Invalid())
    async with trio.open_nursery() as nursery:
        with pytest.raises(ts.DriverError, match="driver 'recorder': ValueError: spec 'job'"):
            await nursery.start(runner.run)


async def test_metrics_and_events_record_an_item_s_life(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Claim, outcome and settlement show up as events and as metrics on the runner's registry."""
    queue = ts.MemoryQueue()
    events: list[ts.RunnerEvent] = []
    item = await queue.enqueue("job", item_id="one", config={"sleep": 2})
    runner = make_runner(queue, events=events)
    async with running(runner):
        await trio.sleep(3)
    mine = [(e.kind, e.at, e.detail) for e in events if e.item_id == item.id]
    assert mine == [
        (Kind.CLAIMED, 0.0, ""),
        (Kind.OUTCOME, 2.0, "complete"),
        (Kind.SETTLED, 2.0, "complete"),
    ]
    assert [e.kind for e in events if e.item_id is None] == [
        Kind.STARTED,
        Kind.DRAINING,
        Kind.STOPPED,
    ]
    assert sample(runner, "trio_supervise_items_claimed_total") == 1
    assert sample(runner, "trio_supervise_items_completed_total") == 1
    assert sample(runner, "trio_supervise_evaluation_seconds_sum") == 2.0
    global_value = prometheus_client.REGISTRY.get_sample_value(
        "trio_supervise_items_claimed_total", {"spec": "job"}
    )
    assert global_value is None


def test_evaluation_durations_follow_each_run_s_own_clock() -> None:
    """A runner run again under another ``trio.run`` times its evaluations by that run's clock
    (it reads the running clock directly, never one from an earlier run)."""
    queue = ts.MemoryQueue()
    runner = make_runner(queue)

    async def once(item_id: str, sleep: float) -> None:
        await queue.enqueue("job", item_id=item_id, config={"sleep": sleep})
        with trio.move_on_after(sleep + 1):  # cancelled, not shut down: it may run again
            await runner.run()

    trio.run(once, "first", 2, clock=trio.testing.MockClock(autojump_threshold=0))
    later = trio.testing.MockClock(autojump_threshold=0)
    later.jump(1000)
    trio.run(once, "second", 3, clock=later)
    assert queue.items["second"].state is ts.ItemState.COMPLETED
    assert sample(runner, "trio_supervise_evaluation_seconds_count") == 2
    assert sample(runner, "trio_supervise_evaluation_seconds_sum") == 5.0


async def test_a_broken_event_callback_does_not_stop_the_runner(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """An exception from on_event is logged and the work goes on."""
    queue = ts.MemoryQueue()
    await queue.enqueue("job", item_id="one")

    def broken(event: ts.RunnerEvent) -> None:
        raise RuntimeError("observer bug")

    runner = make_runner(queue)
    runner = attrs.evolve(runner, on_event=broken)
    with caplog.at_level(logging.ERROR, logger="trio_supervise.runner"):
        async with running(runner):
            await trio.sleep(1)
    assert (await queue.get("one")).state is ts.ItemState.COMPLETED
    assert "on_event callback failed" in caplog.text


async def test_a_runner_can_run_again_after_it_returns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A supervisor may restart a runner: run() works again after it returned."""
    queue = ts.MemoryQueue()
    driver = Recorder()
    shutdown = ts.Shutdown()
    runner = make_runner(queue, driver)
    async with running(runner):
        await queue.enqueue("job", item_id="first")
    runner = attrs.evolve(runner, shutdown=shutdown)
    async with running(runner):
        await queue.enqueue("job", item_id="second")
        await trio.sleep(1)
    assert set(driver.starts) == {"first", "second"}


async def test_a_renewal_racing_a_settlement_is_not_a_lost_lease(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Items that finish just as their renewal round runs are not reported as lost leases."""
    queue = FaultyQueue()
    events: list[ts.RunnerEvent] = []
    queue.renew_latency = 0.5
    for n in range(8):
        await queue.enqueue("job", item_id=f"i{n}", config={"sleep": 10})
    runner = make_runner(queue, events=events, lease=30, concurrency=8)
    async with running(runner):
        await trio.sleep(11)
    assert [e for e in events if e.kind is Kind.LEASE_LOST] == []
    assert sample(runner, "trio_supervise_lease_renewals_failed_total") is None
    assert sample(runner, "trio_supervise_items_completed_total") == 8


async def test_a_context_that_fails_to_build_fails_the_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """run() raises build_context's error before readiness, and the state says failed."""

    async def broken() -> None:
        raise ConnectionError("no database")

    runner = attrs.evolve(make_runner(ts.MemoryQueue()), build_context=broken)
    async with trio.open_nursery() as nursery:
        with pytest.raises(ConnectionError, match="no database"):
            await nursery.start(runner.run)
    assert runner.state is ts.RunnerState.FAILED


# -- writes that fail, writes that are refused, a blocked loop ---------------------------------

NO_JITTER = ts.RestartPolicy(1, 30, jitter=ts.JitterMode.NONE)


TRANSIENT: dict[str, Callable[[], Exception]] = {
    "locked": lambda: ts.QueueUnavailable("SQLite queue at q.db: database is locked"),
    "disk-full": lambda: ts.QueueUnavailable("SQLite queue at q.db: database or disk is full"),
    "connection-lost": lambda: ts.QueueUnavailable("PostgreSQL queue at db is unavailable"),
    "unclassified": lambda: ts.QueueError("PostgreSQL queue at db: could not extend file"),
}


@pytest.mark.parametrize("error", TRANSIENT.values(), ids=TRANSIENT.keys())
async def test_a_write_failing_transiently_is_written_again_not_re_run(
    autojump_clock: trio.testing.MockClock, error: Callable[[], Exception]
) -> None:
    """An outcome whose write fails transiently (locked, disk full, connection lost, or an
    unclassified queue error) is written again after a backoff while the lease holds: the item
    completes once and is never evaluated twice."""
    queue = FaultyQueue()
    driver = Recorder()
    events: list[ts.RunnerEvent] = []
    await queue.enqueue("job", item_id="one")
    queue.settle_failures = 3
    queue.settle_error = error
    runner = make_runner(queue, driver, events=events, lease=30, claim_retry=NO_JITTER)
    async with running(runner):
        await trio.sleep(70)  # past two lease periods: an abandoned write would re-run it
    assert driver.starts == {"one": [0.0]}
    assert [at for at, _ in queue.settle_calls] == [0.0, 1.0, 3.0, 7.0]
    assert [e.kind for e in events if e.item_id == "one"] == [
        Kind.CLAIMED,
        Kind.OUTCOME,
        *[Kind.SETTLE_FAILED] * 3,
        Kind.SETTLED,
    ]
    one = await queue.get("one")
    assert (one.state, one.lease_version) == (ts.ItemState.COMPLETED, 1)
    assert sample(runner, "trio_supervise_items_completed_total") == 1
    assert sample(runner, "trio_supervise_settlements_abandoned_total") is None
    assert runner.state is ts.RunnerState.STOPPED


async def test_renewals_go_on_while_a_write_is_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A write failing for longer than the lease is retried as long as renewals keep the lease."""
    queue = FaultyQueue()
    driver = Recorder()
    await queue.enqueue("job", item_id="one")
    queue.settle_failures = 7  # retried every 0.5 s (half the 1 s renewal interval): 3.5 s
    runner = make_runner(queue, driver, lease=3, claim_retry=NO_JITTER)
    async with running(runner):
        await trio.sleep(10)
    assert driver.starts == {"one": [0.0]}
    assert [at for at, _ in queue.settle_calls] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    assert [at for at, n in queue.renew_calls] == [1.0, 2.0, 3.0]
    assert sample(runner, "trio_supervise_settlements_abandoned_total") is None
    assert (await queue.get("one")).state is ts.ItemState.COMPLETED


async def test_a_write_is_abandoned_once_the_lease_runs_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """When renewals fail too, the write is retried until the lease expires, then given up:
    counted, logged and kept in the recent errors."""
    queue = FaultyQueue()
    driver = Recorder()
    await queue.enqueue("job", item_id="one")
    queue.settle_failures = 100
    queue.renew_failures = 100
    runner = make_runner(queue, driver, lease=3, concurrency=1, claim_retry=NO_JITTER)
    async with running(runner):
        await trio.sleep(3.1)
        # Given up at 3.0, as the lease expired; claimed again (and failing again) at once.
        assert [at for at, _ in queue.settle_calls[:7]] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
        assert sample(runner, "trio_supervise_settlements_abandoned_total") == 1
        assert [e.error for e in runner.recent_errors if "attempts" in e.error] == [
            "writing complete failed: database is locked (7 attempts)"
        ]
        queue.settle_failures = queue.renew_failures = 0
        await trio.sleep(5)
    assert driver.starts == {"one": [0.0, 3.0]}  # the lease was gone: running it again is right
    assert (await queue.get("one")).state is ts.ItemState.COMPLETED


async def test_a_permanent_write_error_is_not_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A write failing for a reason no retry fixes (the schema is missing) is given up at once."""
    queue = FaultyQueue()
    await queue.enqueue("job", item_id="one")
    queue.settle_failures = 1
    queue.settle_error = lambda: ts.SchemaError("no queue schema")
    runner = make_runner(queue, lease=30)
    async with running(runner):
        await trio.sleep(1)
    assert [at for at, _ in queue.settle_calls] == [0.0]
    assert sample(runner, "trio_supervise_settlements_abandoned_total") == 1
    assert runner.recent_errors[-1].error == "writing complete failed: no queue schema"


def test_transient_errors_are_the_queue_errors_a_retry_may_fix() -> None:
    """QueueUnavailable and unclassified QueueErrors are retried; SchemaError and bugs are not."""
    from trio_supervise.run import is_transient

    assert is_transient(ts.QueueUnavailable("database is locked"))
    assert is_transient(ts.QueueError("database or disk is full"))
    assert not is_transient(ts.SchemaError("no queue schema"))
    assert not is_transient(UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates"))


@attrs.define
class Blocker:
    """A driver that moves the mock clock by ``config["block"]`` seconds without yielding: to the
    rest of the program, the event loop was blocked that long (a ``time.sleep`` in a driver)."""

    clock: trio.testing.MockClock
    name: str = "blocker"
    spec_ids: Sequence[str] = ("job",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        await trio.sleep(item.config.get("sleep", 0))
        self.clock.jump(item.config.get("block", 0))
        await trio.sleep(1)
        return ts.Stop()


async def test_the_watchdog_measures_loop_lag_and_names_items_at_risk(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A loop blocked past a third of the lease is measured, warned about with the items in
    flight and their leases, and kept in the recent errors; short blocks are only measured."""
    queue = ts.MemoryQueue()
    await queue.enqueue("job", item_id="blocks", config={"sleep": 0.1, "block": 5})
    await queue.enqueue("job", item_id="bystander", config={"sleep": 3})
    await queue.enqueue("job", item_id="brief", config={"sleep": 8.3, "block": 0.5})
    runner = make_runner(ts.MemoryQueue(), Blocker(autojump_clock), lease=6)
    runner = attrs.evolve(runner, queue=queue)
    with caplog.at_level(logging.WARNING, logger="trio_supervise.runner"):
        async with running(runner):
            await trio.sleep(12)

    # Renewal interval 2 s, so the watchdog checks every 0.5 s: the 5 s block from t=0.1 woke
    # the check due at 0.5 at 5.1 (4.6 s late); the 0.5 s block from 8.3 the one due at 8.6 at
    # 8.8 (0.2 s late, under a third of the lease: measured, not warned about).
    def lag(name: str, **labels: str) -> float | None:
        return runner.metrics.registry.get_sample_value(
            f"trio_supervise_event_loop_lag_seconds_{name}", labels
        )

    checks = lag("count")
    assert checks is not None
    assert lag("sum") == pytest.approx(4.8)
    assert (lag("bucket", le="0.1"), lag("bucket", le="0.25"), lag("bucket", le="5.0")) == (
        checks - 2,
        checks - 1,
        checks,
    )
    warnings = [e.error for e in runner.recent_errors if e.item_id is None]
    assert warnings == [
        "event loop blocked for 4.6 s (lease 6 s): leases at risk: 'blocks' (0.9 s left), "
        "'brief' (0.9 s left), 'bystander' (0.9 s left); a driver is blocking the thread "
        "(use trio.to_thread for blocking calls)"
    ]
    assert warnings[0] in caplog.text


def test_lease_risk_warns_past_a_third_of_the_lease_and_says_what_is_left() -> None:
    """The watchdog's arithmetic: under a third of the lease is harmless; past it, every item in
    flight is named with the lease it had left when the loop woke (or how long ago it expired)."""
    from trio_supervise.run import lease_risk

    entries = [("a", 100.0), ("b", 104.5)]
    assert lease_risk(entries, woke=110.0, lag=2.0, lease=6.0) is None
    text = lease_risk(entries, woke=110.0, lag=2.5, lease=6.0)
    assert text is not None
    assert text.startswith(
        "event loop blocked for 2.5 s (lease 6 s): leases at risk: 'a' (expired 4 s ago), "
        "'b' (0.5 s left); "
    )
    many = [(f"i{n}", 109.0) for n in range(12)]
    text = lease_risk(many, woke=110.0, lag=3.0, lease=6.0)
    assert text is not None
    assert "'i9' (5 s left), and 2 more;" in text
    assert lease_risk([], woke=110.0, lag=3.0, lease=6.0) is not None


@attrs.define(eq=False)
class SyncBlocker:
    """A driver that moves the mock clock by ``config["block"]`` seconds and returns at once,
    awaiting nothing: consecutive items run back to back in one evaluator."""

    clock: trio.testing.MockClock
    name: str = "sync-blocker"
    spec_ids: Sequence[str] = ("job",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        self.clock.jump(item.config["block"])
        return ts.Stop()


async def test_back_to_back_evaluations_are_each_timed_by_their_own_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Evaluations one evaluator runs one after the other without awaiting (each starting when
    the previous one ended) are each observed for exactly as long as their own driver ran."""
    blocks = [0.25, 0.0, 2.0, 0.75, 0.0, 4.0, 0.5, 1.0]
    queue = ts.MemoryQueue()
    for n, block in enumerate(blocks):
        await queue.enqueue("job", item_id=f"b{n}", config={"block": block})
    runner = make_runner(queue, SyncBlocker(autojump_clock), concurrency=8, claim_batch=8)
    async with running(runner):
        await trio.sleep(30)
    assert sample(runner, "trio_supervise_items_completed_total") == len(blocks)
    assert sample(runner, "trio_supervise_evaluation_seconds_count") == len(blocks)
    assert sample(runner, "trio_supervise_evaluation_seconds_sum") == sum(blocks)
    for le in (0.01, 0.5, 1, 5):
        observed = runner.metrics.registry.get_sample_value(
            "trio_supervise_evaluation_seconds_bucket", {"spec": "job", "le": str(float(le))}
        )
        assert observed == sum(1 for block in blocks if block <= le)
