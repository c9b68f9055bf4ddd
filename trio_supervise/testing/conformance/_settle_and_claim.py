"""``settle_and_claim`` on every backend: the same as ``settle_many`` then ``claim_due``, in one
call (one transaction on SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from ...job import WAITING_DUE_AT, ItemState, NewItem, SettleKind, Settlement, WorkItem
from ...queues import Capability, WorkQueue
from ._clock import START, ManualClock
from ._producing import SURROGATE
from ._support import S, needs, settle_and_claim

Combined = Callable[..., Awaitable[tuple[list[bool], list[WorkItem]]]]


def combined(queue: WorkQueue) -> Combined:
    """The queue's ``settle_and_claim``; skipped for a store that does not declare it."""
    return settle_and_claim(queue)


def done(item: WorkItem, kind: SettleKind = SettleKind.COMPLETE, **changes: Any) -> Settlement:
    return Settlement(item_id=item.id, lease_version=item.lease_version, kind=kind, **changes)


async def enqueue(q: WorkQueue, *ids: str, **options: Any) -> None:
    for item_id in ids:
        await q.enqueue("spec", item_id=item_id, **options)


async def claim(queue: WorkQueue, limit: int, worker: str = "w1") -> list[WorkItem]:
    return await queue.claim_due(["spec"], worker, 30, limit)


async def states(queue: WorkQueue, ids: Sequence[str]) -> list[ItemState]:
    return [(await queue.get(item_id)).state for item_id in ids]


class SettleAndClaimContract:
    """``settle_and_claim``: the same as ``settle_many`` then ``claim_due``."""

    @needs(Capability.SETTLE_AND_CLAIM)
    async def test_settles_then_claims_in_order(self, queue: WorkQueue) -> None:
        """The settlements are applied and the next items claimed, as claim_due claims them."""
        await enqueue(queue, "a", "b", "c", "d")
        [a] = await claim(queue, 1)
        results, items = await combined(queue)([done(a)], ["spec"], "w2", 30, 2)
        assert results == [True]
        assert [item.id for item in items] == ["b", "c"]
        for item in items:
            assert item == await queue.get(item.id)
            assert (item.state, item.lease_owner, item.attempt) == (ItemState.RUNNING, "w2", 1)
            assert item.lease_expires_at == START + 30 * S
        assert await states(queue, ["a", "d"]) == [ItemState.COMPLETED, ItemState.QUEUED]

    @needs(Capability.SETTLE_AND_CLAIM)
    async def test_an_item_due_again_is_claimed_in_the_same_call(self, queue: WorkQueue) -> None:
        """Settled first, claimed second: an item released with no delay comes back at once."""
        await enqueue(queue, "x")
        [x] = await claim(queue, 1)
        results, items = await combined(queue)(
            [done(x, SettleKind.RELEASE, delay=0)], ["spec"], "w1", 30, 5
        )
        assert results == [True]
        [again] = items
        assert (again.id, again.attempt) == ("x", 1)
        assert again.lease_version > x.lease_version

    @needs(Capability.SETTLE_AND_CLAIM)
    async def test_a_stale_settlement_is_refused_and_the_claim_goes_on(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        await enqueue(queue, "x", "y")
        [x] = await claim(queue, 1)
        clock.advance(31)
        rescued = await claim(queue, 1, worker="w2")
        assert [item.id for item in rescued] == ["x"]
        results, items = await combined(queue)([done(x)], ["spec"], "w1", 30, 5)
        assert results == [False]
        assert [item.id for item in items] == ["y"]
        assert (await queue.get("x")).lease_owner == "w2"

    @needs(Capability.SETTLE_AND_CLAIM)
    async def test_repeated_settlements_apply_once(self, queue: WorkQueue) -> None:
        """As in settle_many: only the first entry of an (id, version) pair applies."""
        await enqueue(queue, "x")
        [x] = await claim(queue, 1)
        results, items = await combined(queue)(
            [done(x), done(x, SettleKind.DEAD, error="e")], ["spec"], "w1", 30, 5
        )
        assert (results, items) == ([True, False], [])
        assert await states(queue, ["x"]) == [ItemState.COMPLETED]

    @needs(Capability.SETTLE_AND_CLAIM)
    async def test_nothing_to_settle_or_nothing_to_claim(self, queue: WorkQueue) -> None:
        """No settlements: a plain claim. A limit of 0 or no spec ids: a plain settle_many."""
        await enqueue(queue, "a", "b", "c")
        results, items = await combined(queue)([], ["spec"], "w1", 30, 1)
        assert (results, [item.id for item in items]) == ([], ["a"])
        [a] = items
        assert await combined(queue)([done(a)], ["spec"], "w1", 30, 0) == ([True], [])
        [b] = await claim(queue, 1)
        assert await combined(queue)([done(b)], [], "w1", 30, 5) == ([True], [])
        assert await states(queue, ["a", "b", "c"]) == [
            ItemState.COMPLETED,
            ItemState.COMPLETED,
            ItemState.QUEUED,
        ]

    @needs(Capability.SETTLE_AND_CLAIM)
    async def test_bad_claim_arguments_write_nothing(self, queue: WorkQueue) -> None:
        """The claim's arguments are checked before anything is written."""
        await enqueue(queue, "x")
        [x] = await claim(queue, 1)
        for lease, limit in ((0, 1), (-1, 1), (30, -1)):
            with pytest.raises(ValueError, match=r"lease|limit"):
                await combined(queue)([done(x)], ["spec"], "w1", lease, limit)
        assert await states(queue, ["x"]) == [ItemState.RUNNING]

    @needs(Capability.SETTLE_AND_CLAIM)
    async def test_a_paused_queue_is_settled_not_claimed(self, queue: WorkQueue) -> None:
        await enqueue(queue, "a", "b")
        await enqueue(queue, "n", queue="named")
        [a] = await claim(queue, 1)
        assert await queue.pause_queue("default")
        assert await combined(queue)([done(a)], ["spec"], "w1", 30, 5) == ([True], [])
        # Another queue is claimed by name.
        [n] = await queue.claim_due(["spec"], "w1", 30, 1, queue="named")
        [b_settled], items = await combined(queue)([done(n)], ["spec"], "w1", 30, 5, queue="named")
        assert (b_settled, items) == (True, [])
        assert await queue.resume_queue("default")
        _, items = await combined(queue)([], ["spec"], "w1", 30, 5)
        assert [item.id for item in items] == ["b"]

    @needs(Capability.SETTLE_AND_CLAIM)
    async def test_a_concurrency_key_slot_freed_by_the_settlement_is_claimed(
        self,
        queue: WorkQueue,
    ) -> None:
        """The claim counts the key's live leases after the settlement: the slot it frees is
        taken in the same call, and no more than the limit is ever running."""
        for item_id in ("k1", "k2", "k3"):
            await queue.enqueue("spec", item_id=item_id, concurrency_key="k", concurrency_limit=1)
        await enqueue(queue, "u")
        first = await claim(queue, 5)
        assert sorted(item.id for item in first) == ["k1", "u"]
        k1 = next(item for item in first if item.id == "k1")
        results, items = await combined(queue)([done(k1)], ["spec"], "w1", 30, 5)
        assert results == [True]
        assert [item.id for item in items] == ["k2"]
        assert await states(queue, ["k1", "k2", "k3"]) == [
            ItemState.COMPLETED,
            ItemState.RUNNING,
            ItemState.QUEUED,
        ]

    @needs(Capability.SETTLE_AND_CLAIM)
    async def test_children_are_written_and_claimable_in_the_same_call(
        self, queue: WorkQueue
    ) -> None:
        """A parent's children go with its settlement; being due now, the claim takes them; the
        last child's settlement makes the waiting parent due, and the same call claims it."""
        await queue.enqueue("spec", item_id="p")
        [p] = await claim(queue, 1)
        fan_out = done(
            p,
            SettleKind.CONTINUE,
            children=[NewItem(spec_id="spec", config={"n": n}) for n in range(2)],
            wait_for_children=True,
        )
        results, children = await combined(queue)([fan_out], ["spec"], "w1", 30, 5)
        assert results == [True]
        assert [child.parent_id for child in children] == ["p", "p"]
        parent = await queue.get("p")
        assert (parent.state, parent.waiting_children, parent.due_at) == (
            ItemState.QUEUED,
            2,
            WAITING_DUE_AT,
        )
        first, second = children
        results, items = await combined(queue)([done(first)], ["spec"], "w1", 30, 5)
        assert (results, items) == ([True], [])
        assert (await queue.get("p")).waiting_children == 1
        results, items = await combined(queue)([done(second)], ["spec"], "w1", 30, 5)
        assert results == [True]
        [again] = items
        assert (again.id, again.state) == ("p", ItemState.RUNNING)
        assert again.lease_version > p.lease_version

    @needs(Capability.SETTLE_AND_CLAIM)
    async def test_a_poisoned_entry_never_takes_its_batch_or_the_claim_down(
        self,
        queue: WorkQueue,
    ) -> None:
        """As in settle_many, an unstorable entry alone goes dead; the claim still runs."""
        await enqueue(queue, "i0", "i1", "i2", "next")
        v = {item.id: item for item in await claim(queue, 3)}
        results, items = await combined(queue)(
            [
                done(v["i0"]),
                done(v["i1"], SettleKind.RESCHEDULE, at=START, config={"x": SURROGATE}),
                done(v["i2"], SettleKind.COMPLETE, result={"x": "\x00"}),
            ],
            ["spec"],
            "w1",
            30,
            5,
        )
        assert results == [True, True, True]
        assert await states(queue, ["i0", "i1", "i2"]) == [
            ItemState.COMPLETED,
            ItemState.DEAD,
            ItemState.DEAD,
        ]
        assert [item.id for item in items] == ["next"]
