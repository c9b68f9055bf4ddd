"""Uniqueness scopes of idempotency keys, run against every backend (memory, SQLite,
PostgreSQL), and concurrent enqueuers of one key on the durable ones."""

from __future__ import annotations

import datetime as dt

import pytest

from ... import ItemNotFound
from ...job import Enqueued, ItemState, NewItem, SettleKind, Settlement, WorkItem
from ...queues import WorkQueue
from ._clock import START, ManualClock
from ._support import S


async def finish(queue: WorkQueue, item: WorkItem, how: str = "complete") -> None:
    """Claim *item* (the only due one of its spec) and finish it as *how*."""
    [claimed] = await queue.claim_due([item.spec_id], "w", 30, 1)
    assert claimed.id == item.id
    kind = {"complete": SettleKind.COMPLETE, "cancel": SettleKind.CANCEL}.get(how, SettleKind.DEAD)
    error = "x" if kind is SettleKind.DEAD else None
    settlement = Settlement(
        item_id=claimed.id, lease_version=claimed.lease_version, kind=kind, error=error
    )
    assert await queue.settle_many([settlement]) == [True]


# -- forever (the default) --------------------------------------------------------------------


# -- unfinished -------------------------------------------------------------------------------


# -- period -----------------------------------------------------------------------------------


# -- in one batch -----------------------------------------------------------------------------


class UniquenessContract:
    """Idempotency keys and their uniqueness scopes."""

    async def test_forever_holds_after_the_item_finished(self, queue: WorkQueue) -> None:
        """By default a key holds for as long as its item exists: a finished one is returned."""
        first = await queue.enqueue("spec", idempotency_key="k")
        assert first.unique_scope == "forever"
        await finish(queue, first)
        [again] = await queue.enqueue_many([NewItem(spec_id="spec", idempotency_key="k")])
        assert (again.created, again.item.id, again.item.state) == (
            False,
            first.id,
            ItemState.COMPLETED,
        )

    async def test_unfinished_holds_while_queued_or_running(self, queue: WorkQueue) -> None:
        """An 'unfinished' key returns its item while it is queued, and while it runs."""
        first = await queue.enqueue("spec", idempotency_key="k", unique="unfinished")
        assert first.unique_scope == "unfinished"
        assert (
            await queue.enqueue("spec", idempotency_key="k", unique="unfinished")
        ).id == first.id
        await queue.claim_due(["spec"], "w", 30, 1)
        [again] = await queue.enqueue_many([NewItem(spec_id="spec", idempotency_key="k")])
        assert (again.created, again.item.id) == (False, first.id)

    @pytest.mark.parametrize("how", ["complete", "cancel", "dead"])
    async def test_unfinished_frees_the_key_once_finished(self, queue: WorkQueue, how: str) -> None:
        """Once an 'unfinished' item is completed, cancelled or dead, the key makes a new item;
        the old one keeps the key as its released_key."""
        first = await queue.enqueue("spec", idempotency_key="k", unique="unfinished")
        await finish(queue, first, how)
        assert (await queue.get_by_key("k")).id == first.id  # released only by the next enqueue
        [new] = await queue.enqueue_many(
            [NewItem(spec_id="spec", idempotency_key="k", unique="unfinished", config={"v": 2})]
        )
        assert new.created
        assert new.item.id != first.id
        assert new.item.idempotency_key == "k"
        old = await queue.get(first.id)
        assert (old.idempotency_key, old.released_key) == (None, "k")
        assert await queue.get_by_key("k") == new.item
        assert (await queue.enqueue("spec", idempotency_key="k")).id == new.item.id

    async def test_a_cancelled_queued_item_frees_an_unfinished_key(self, queue: WorkQueue) -> None:
        """A queued 'unfinished' item cancelled from outside frees its key too."""
        first = await queue.enqueue("spec", idempotency_key="k", unique="unfinished")
        await queue.request_cancel(first.id)
        again = await queue.enqueue("spec", idempotency_key="k")
        assert again.id != first.id

    async def test_the_holders_scope_decides(self, queue: WorkQueue) -> None:
        """A 'forever' holder keeps its key even when the new entry asks for 'unfinished'; the new
        item's scope applies to the new item."""
        first = await queue.enqueue("spec", idempotency_key="k")
        await finish(queue, first)
        again = await queue.enqueue("spec", idempotency_key="k", unique="unfinished")
        assert again.id == first.id

    async def test_released_keys_stack_up_newest_first(self, queue: WorkQueue) -> None:
        """Three generations of one 'unfinished' key: get_by_key finds the holder, then, once
        nothing holds it, the newest released item."""
        made = []
        for _ in range(3):
            item = await queue.enqueue("spec", idempotency_key="k", unique="unfinished")
            made.append(item)
            await finish(queue, item)
        assert len({item.id for item in made}) == 3
        assert (await queue.get_by_key("k")).id == made[2].id
        assert [(await queue.get(i.id)).released_key for i in made] == ["k", "k", None]

    async def test_get_by_key_of_an_unknown_key(self, queue: WorkQueue) -> None:
        """get_by_key of a key nothing ever held raises ItemNotFound naming the key."""
        with pytest.raises(ItemNotFound, match="idempotency key 'nope'"):
            await queue.get_by_key("nope")

    @pytest.mark.parametrize("period", [dt.timedelta(seconds=60), 60, 60.0])
    async def test_a_period_holds_from_creation(
        self, queue: WorkQueue, clock: ManualClock, period: dt.timedelta | float
    ) -> None:
        """A key with a period holds for that long after its item was created (whatever its state),
        then the next enqueue makes a new item."""
        first = await queue.enqueue("spec", idempotency_key="k", unique=period)
        assert (first.unique_scope, first.unique_until) == ("period", START + 60 * S)
        await finish(queue, first)
        clock.advance(59)
        assert (await queue.enqueue("spec", idempotency_key="k")).id == first.id
        clock.advance(1)
        [new] = await queue.enqueue_many([NewItem(spec_id="spec", idempotency_key="k")])
        assert new.created
        assert new.item.unique_scope == "forever"
        assert (await queue.get(first.id)).released_key == "k"

    async def test_a_period_lapses_while_queued(self, queue: WorkQueue, clock: ManualClock) -> None:
        """A period counts from creation even if the item never ran."""
        first = await queue.enqueue("spec", idempotency_key="k", unique=10)
        clock.advance(10)
        second = await queue.enqueue("spec", idempotency_key="k", unique=10)
        assert second.id != first.id
        assert await queue.counts() == {("spec", ItemState.QUEUED): 2}

    async def test_a_batch_releases_and_repeats(self, queue: WorkQueue) -> None:
        """In one batch, a lapsed holder's key goes to the first entry with it; later entries with
        the same key report that new item."""
        first = await queue.enqueue("spec", idempotency_key="k", unique="unfinished")
        await finish(queue, first)
        done = await queue.enqueue_many(
            [NewItem(spec_id="spec", idempotency_key="k", unique="unfinished") for _ in range(3)]
        )
        assert [each.created for each in done] == [True, False, False]
        assert done[1] == done[2] == Enqueued(item=done[0].item, created=False)
