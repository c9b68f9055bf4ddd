"""The runner's settle-and-claim: the settler claims the slots its batch frees in the same queue
call as the batch's write, reserving them so the claim loop does not claim them too."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import trio
import trio.testing

import trio_supervise as ts
from trio_supervise import QueueUnavailable
from trio_supervise.queues import DEFAULT_QUEUE, Settlement, WorkItem
from trio_supervise.queues._ports import combines

from .test_runner import Recorder, make_runner, running


@attrs.define(eq=False)
class OneTripQueue(ts.MemoryQueue):
    """The memory queue a round trip away, with a combined call costing one round trip.

    It records each call: claims and plain writes as (start, items), combined calls as (start,
    settled, limit, claimed), and at each write's start how many items the runner holds.
    """

    latency: float = 1.0
    failures: int = 0
    """How many combined calls fail (before writing anything) from now on."""
    runner: ts.WorkflowRunner[None] | None = None
    claims: list[tuple[float, int]] = attrs.field(init=False, factory=list)
    writes: list[tuple[float, int]] = attrs.field(init=False, factory=list)
    combined: list[tuple[float, int, int, int]] = attrs.field(init=False, factory=list)
    held: list[int] = attrs.field(init=False, factory=list)

    def _hold(self) -> None:
        assert self.runner is not None
        self.held.append(len(self.runner.in_flight))

    async def claim_due(
        self,
        spec_ids: Sequence[str],
        worker_id: str,
        lease: float,
        limit: int,
        *,
        queue: str = DEFAULT_QUEUE,
    ) -> list[WorkItem]:
        started = trio.current_time()
        await trio.sleep(self.latency)
        items = await super().claim_due(spec_ids, worker_id, lease, limit, queue=queue)
        self.claims.append((started, len(items)))
        return items

    async def settle_many(self, settlements: Sequence[Settlement]) -> list[bool]:
        started = trio.current_time()
        self._hold()
        await trio.sleep(self.latency)
        results = await super().settle_many(settlements)
        self.writes.append((started, len(settlements)))
        return results

    async def settle_and_claim(
        self,
        settlements: Sequence[Settlement],
        spec_ids: Sequence[str],
        worker_id: str,
        lease: float,
        limit: int,
        *,
        queue: str = DEFAULT_QUEUE,
    ) -> tuple[list[bool], list[WorkItem]]:
        started = trio.current_time()
        self._hold()
        await trio.sleep(self.latency)
        if self.failures:
            self.failures -= 1
            raise QueueUnavailable("the queue is down")
        results = await ts.MemoryQueue.settle_many(self, settlements)
        items = await ts.MemoryQueue.claim_due(self, spec_ids, worker_id, lease, limit, queue=queue)
        self.combined.append((started, len(settlements), limit, len(items)))
        return results, items


async def fill(queue: ts.WorkQueue, n: int, **options: Any) -> None:
    for index in range(n):
        await queue.enqueue("job", item_id=f"i{index:02}", **options)


def completed(queue: ts.MemoryQueue) -> bool:
    return {item.state for item in queue.items.values()} == {ts.ItemState.COMPLETED}


async def test_each_write_claims_the_slots_its_batch_frees(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """After the first claim, every batch's write claims the next batch in the same call: one
    call per batch instead of a write and a claim, and the claim loop claims nothing beside it
    (the slots are reserved). The last, short claim gives its slots back."""
    queue = OneTripQueue()
    driver = Recorder()
    await fill(queue, 12)
    runner = queue.runner = make_runner(queue, driver, concurrency=3, claim_batch=3, settle_batch=3)
    async with running(runner):
        await trio.sleep(5.5)
        assert len(driver.ends) == 12
        assert driver.peak <= 3
        assert [claim for claim in queue.claims if claim[1]] == [(0.0, 3)]
        assert queue.combined == [
            (1.0, 3, 3, 3),
            (2.0, 3, 3, 3),
            (3.0, 3, 3, 3),
            (4.0, 3, 3, 0),
        ]
        assert queue.writes == []
        assert max(queue.held) <= 3 + 3
        assert completed(queue)
        # The short claim gave its slots back: the claim loop looked again, then waits.
        # New work is claimed by the claim loop, as after any short claim.
        await queue.enqueue("job", item_id="late")
        await trio.sleep(10)
        assert "late" in driver.ends
        # The short claim gave its slots back: the claim loop looked again at once.
        assert [start for start, _ in queue.claims][:2] == [0.0, 5.0]
    assert completed(queue)


async def test_the_claim_loop_uses_slots_the_write_does_not_reserve(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A write reserves at most ``claim_batch`` slots; the claim loop claims the rest beside it,
    and the two together never hold more than the concurrency."""
    queue = OneTripQueue()
    driver = Recorder()
    await fill(queue, 8, config={"sleep": 0.5})
    runner = queue.runner = make_runner(queue, driver, concurrency=4, claim_batch=2, settle_batch=4)
    async with running(runner):
        await trio.sleep(20)
    assert len(driver.ends) == 8
    assert driver.peak <= 4
    assert all(limit <= 2 for _, _, limit, _ in queue.combined)
    assert sum(n for _, _, _, n in queue.combined) + sum(n for _, n in queue.claims) == 8
    assert max(queue.held) <= 4 + 4
    assert completed(queue)


async def test_no_claim_beside_a_write_during_shutdown(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Once shutdown begins, the outcomes are written alone: nothing more is claimed."""
    queue = OneTripQueue()
    driver = Recorder()
    await fill(queue, 4, config={"sleep": 1})
    runner = queue.runner = make_runner(queue, driver, concurrency=2, claim_batch=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await trio.sleep(3.5)  # claimed at 1 (i00, i01), written with a claim at 2 (i02, i03)
        assert queue.combined == [(2.0, 2, 2, 2)]
        await queue.enqueue("job", item_id="late")
        runner.shutdown.begin()
    assert queue.combined == [(2.0, 2, 2, 2)]
    assert queue.writes == [(4.0, 2)]
    assert set(driver.ends) == {"i00", "i01", "i02", "i03"}
    assert queue.items["late"].state is ts.ItemState.QUEUED


async def test_items_claimed_by_a_write_as_shutdown_begins_are_handed_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Shutdown begins while a write's claim is in flight: the runner waits for it, and the
    items it claimed are handed back unevaluated, as any claimed during shutdown."""
    queue = OneTripQueue()
    driver = Recorder()
    await fill(queue, 4, config={"sleep": 1})
    runner = queue.runner = make_runner(queue, driver, concurrency=2, claim_batch=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await trio.sleep(2.5)  # i00 and i01 written at 2, with a claim (i02, i03) until 3
        runner.shutdown.begin()
    assert queue.combined == [(2.0, 2, 2, 2)]
    assert set(driver.starts) == {"i00", "i01"}
    assert queue.writes == [(3.0, 2)]
    for item_id in ("i02", "i03"):
        item = queue.items[item_id]
        assert (item.state, item.lease_owner, item.attempt) == (ts.ItemState.QUEUED, None, 0)
    assert runner.in_flight == []


async def test_a_failed_write_claims_nothing_and_is_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A combined call that fails claimed nothing: the outcomes are written again (holding
    their slots meanwhile), and every item runs once."""
    queue = OneTripQueue(failures=1)
    driver = Recorder()
    await fill(queue, 6)
    runner = queue.runner = make_runner(queue, driver, concurrency=2, claim_batch=2)
    async with running(runner):
        await trio.sleep(30)
        assert completed(queue)
    assert all(len(starts) == 1 for starts in driver.starts.values())
    assert len(driver.ends) == 6
    assert driver.peak <= 2
    assert queue.combined[0][0] > 2.0  # the retry, after the failed call at 1.0
    assert sum(n for _, _, _, n in queue.combined) + sum(n for _, n in queue.claims) == 6


@attrs.define
class QueueRecorder(Recorder):
    """:class:`Recorder`, also counting each queue's evaluations at once and their peak."""

    now: dict[str, int] = attrs.Factory(dict)
    peaks: dict[str, int] = attrs.Factory(dict)

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        self.now[item.queue] = self.now.get(item.queue, 0) + 1
        self.peaks[item.queue] = max(self.peaks.get(item.queue, 0), self.now[item.queue])
        try:
            return await super().evaluate(context, item)
        finally:
            self.now[item.queue] -= 1


async def test_several_served_queues_write_with_the_claim_of_the_most_free_slots(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A runner serving several queues writes each batch together with a claim for the queue
    with the most free slots (one call, not a write and a claim); every queue keeps its own
    limit, and each item is evaluated once."""
    queue = OneTripQueue()
    driver = QueueRecorder()
    await fill(queue, 6, config={"sleep": 0.5})
    for index in range(3):
        await queue.enqueue("job", item_id=f"o{index}", queue="other", config={"sleep": 0.5})
    runner = queue.runner = make_runner(queue, driver, queues={"default": 2, "other": 1})
    async with running(runner):
        await trio.sleep(20)
    assert len(driver.ends) == 9
    assert all(len(starts) == 1 for starts in driver.starts.values())
    assert driver.peaks == {"default": 2, "other": 1}
    assert queue.combined
    assert sum(n for *_, n in queue.combined) + sum(n for _, n in queue.claims) == 9
    assert completed(queue)


async def test_a_queue_with_parallel_writes_claims_beside_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A queue whose calls run in parallel (``serial_writes`` False, as PostgreSQL's pool)
    keeps its claims beside the writes: the write alone, the claim loop claiming meanwhile."""
    queue = OneTripQueue()
    queue.serial_writes = False  # type: ignore[misc]
    driver = Recorder()
    await fill(queue, 12)
    runner = queue.runner = make_runner(queue, driver, concurrency=3, claim_batch=3, settle_batch=3)
    async with running(runner):
        await trio.sleep(5.5)
    assert len(driver.ends) == 12
    assert queue.combined == []
    assert [start for start, n in queue.claims if n] == [0.0, 1.0, 2.0, 3.0]
    assert [start for start, _ in queue.writes] == [1.0, 2.0, 3.0, 4.0]


def test_a_subclass_changing_a_half_is_not_combined() -> None:
    """A queue whose settle_many or claim_due is more specific than its settle_and_claim (a
    double adding faults or latency) gets them called separately."""

    class Faulty(ts.MemoryQueue):
        async def settle_many(self, settlements: Sequence[Settlement]) -> list[bool]:
            return await super().settle_many(settlements)

    assert combines(type(ts.MemoryQueue()))
    assert combines(type(OneTripQueue()))
    assert not combines(type(Faulty()))
    assert not combines(type(object()))
