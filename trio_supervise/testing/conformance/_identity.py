"""An item id used again names a new incarnation, on every backend (issue 29, class 2): no
relation of an incarnation that ended (its children, their fan-in, its lease versions, its
errors and result, its key, its schedule fires) ever touches the new one.

The relations, one test each: children listed, child ids, fan-in count-down, fencing, the
item's own history, the idempotency key, schedule fires; and delete and prune agree on what
they may remove.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from ...job import ItemState, NewItem, SettleKind, Settlement, WorkItem
from ...queues import WorkQueue
from ._clock import START, ManualClock


async def claim(queue: WorkQueue, spec: str, limit: int = 10) -> list[WorkItem]:
    return await queue.claim_due([spec], "w", 30, limit)


async def settle(queue: WorkQueue, settlement: Settlement) -> None:
    assert await queue.settle_many([settlement]) == [True]


async def finish(queue: WorkQueue, item: WorkItem, kind: SettleKind, **more: Any) -> None:
    """Settle *item* (as claimed) as *kind*, with *more* of the settlement's fields."""
    await settle(
        queue, Settlement(item_id=item.id, lease_version=item.lease_version, kind=kind, **more)
    )


async def fan_out(queue: WorkQueue, n: int, *, wait: bool) -> WorkItem:
    """Enqueue parent ``p``, claim it and settle it with *n* children; the parent as claimed."""
    await queue.enqueue("parent", item_id="p")
    [parent] = await claim(queue, "parent")
    await finish(
        queue,
        parent,
        SettleKind.CONTINUE,
        children=[NewItem(spec_id="child", config={"n": i}) for i in range(n)],
        wait_for_children=wait,
    )
    return parent


async def end_parent(queue: WorkQueue, how: str, clock: ManualClock) -> None:
    """Take parent ``p`` out of the way as *how* says: cancelled then deleted, or pruned."""
    await queue.request_cancel("p")
    if how == "delete":
        await queue.delete("p")
    else:
        clock.advance(3600)
        assert (await queue.prune({ItemState.CANCELLED: 60}))[ItemState.CANCELLED] == 1
    with pytest.raises(Exception, match="p"):
        await queue.get("p")


class IdentityContract:
    """Lease versions never repeat for an item id; children belong to one incarnation."""

    @pytest.mark.parametrize("how", ["delete", "prune"])
    async def test_a_new_incarnation_lists_only_its_own_children(
        self, queue: WorkQueue, clock: ManualClock, how: str
    ) -> None:
        """Children of an earlier item with the parent's id are not the new item's: the documented
        "if not children: fan out" driver fans out again, and then lists only the new children."""
        await fan_out(queue, 2, wait=True)
        old = [child.id for child in await queue.list_children("p")]
        assert len(old) == 2
        await end_parent(queue, how, clock)
        assert await queue.list_children("p") == []  # an unknown id has none
        await queue.enqueue("parent", item_id="p")
        assert await queue.list_children("p") == []
        [parent] = await claim(queue, "parent")
        await finish(
            queue,
            parent,
            SettleKind.CONTINUE,
            children=[NewItem(spec_id="child", config={"new": True})],
        )
        children = await queue.list_children("p")
        assert [child.config for child in children] == [{"new": True}]
        assert children[0].id not in old
        for child_id in old:  # the old children are still there, untouched
            assert (await queue.get(child_id)).parent_id == "p"

    async def test_default_child_ids_never_repeat_an_earlier_incarnation_s(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A new incarnation's lease versions never repeat its predecessor's, so its children's
        default ids (parent, version, index) are new and the children are created, not skipped."""
        for _ in range(3):  # three incarnations of "p", each claimed once
            await queue.enqueue("parent", item_id="p")
            [parent] = await claim(queue, "parent")
            await finish(
                queue,
                parent,
                SettleKind.COMPLETE,
                children=[NewItem(spec_id="child"), NewItem(spec_id="child")],
            )
            assert len(await queue.list_children("p")) == 2
            await queue.delete("p")
        children = await queue.list_items(spec_ids=["child"])
        assert len(children) == 6
        assert len({child.id for child in children}) == 6

    @pytest.mark.parametrize("how", ["delete", "prune"])
    async def test_an_earlier_incarnation_s_child_never_counts_down_the_new_one(
        self, queue: WorkQueue, clock: ManualClock, how: str
    ) -> None:
        """A child an earlier parent waited for finishes after that parent was cancelled and
        removed and its id used again: the new parent, waiting for its own child, still waits;
        its own child's finish makes it due."""
        await fan_out(queue, 1, wait=True)
        await end_parent(queue, how, clock)
        await queue.enqueue("parent", item_id="p")
        [parent] = await claim(queue, "parent")
        await finish(
            queue,
            parent,
            SettleKind.CONTINUE,
            children=[NewItem(spec_id="own")],
            wait_for_children=True,
        )
        [old_child] = await claim(queue, "child")
        await finish(queue, old_child, SettleKind.COMPLETE)
        waiting = await queue.get("p")
        assert (waiting.state, waiting.waiting_children) == (ItemState.QUEUED, 1)
        assert await claim(queue, "parent") == []
        [own] = await claim(queue, "own")
        await finish(queue, own, SettleKind.COMPLETE)
        assert (await queue.get("p")).waiting_children == 0
        assert [item.id for item in await claim(queue, "parent")] == ["p"]

    async def test_a_stale_owner_of_an_earlier_incarnation_writes_nothing(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """An owner whose lease was taken over, the item then finished, removed and enqueued again
        under its id: the late owner's write names a version the new item never has, and is
        refused (the new item's lease versions never repeat an earlier one's)."""
        await queue.enqueue("job", item_id="x")
        [stale] = await claim(queue, "job")
        clock.advance(31)
        [rescued] = await claim(queue, "job")
        await finish(queue, rescued, SettleKind.COMPLETE)
        await queue.delete("x")
        versions = set()
        for _ in range(3):  # a new incarnation, claimed again and again
            await queue.enqueue("job", item_id="x")
            [fresh] = await claim(queue, "job")
            versions.add(fresh.lease_version)
            late = Settlement(
                item_id="x", lease_version=stale.lease_version, kind=SettleKind.COMPLETE
            )
            assert await queue.settle_many([late]) == [False]
            assert (await queue.get("x")).state is ItemState.RUNNING
            await finish(queue, fresh, SettleKind.COMPLETE)
            await queue.delete("x")
        assert not versions & {stale.lease_version, rescued.lease_version}

    async def test_a_new_incarnation_starts_without_its_predecessor_s_history(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Errors, result, attempts and key of an earlier item with the id are not the new one's."""
        await queue.enqueue("job", item_id="x", idempotency_key="k")
        [item] = await claim(queue, "job")
        await finish(queue, item, SettleKind.RETRY, error="boom")
        [item] = await claim(queue, "job")
        await finish(queue, item, SettleKind.COMPLETE, result={"old": 1})
        await queue.delete("x")
        again = await queue.enqueue("job", item_id="x", idempotency_key="k")
        assert (again.errors, again.error_count, again.last_error, again.result) == (
            (),
            0,
            None,
            None,
        )
        assert (again.attempt, again.idempotency_key) == (0, "k")
        assert (await queue.get_by_key("k")).id == "x"
        stored = await queue.get("x")
        assert (stored.errors, stored.result, stored.attempt) == ((), None, 0)

    async def test_a_fire_is_never_enqueued_again_once_its_item_is_pruned(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A schedule's fire is recorded with its item: once the item is completed and pruned, the
        same fire (another scheduler late, or a catch-up) is refused, and an earlier one too; the
        next fire is enqueued."""
        fire = START + dt.timedelta(hours=1)
        key = f"schedule:daily:{fire.isoformat()}"
        entry = NewItem(spec_id="report", due_at=fire, item_id=key, idempotency_key=key)
        first = await queue.fire_schedule("daily", fire, entry)
        assert first is not None
        assert first.created
        assert await queue.last_fires(["daily", "other"]) == {"daily": fire}
        clock.advance(2 * 3600)
        [item] = await claim(queue, "report")
        await finish(queue, item, SettleKind.COMPLETE)
        clock.advance(3600)
        assert (await queue.prune({ItemState.COMPLETED: 60}))[ItemState.COMPLETED] == 1
        assert await queue.fire_schedule("daily", fire, entry) is None
        earlier = fire - dt.timedelta(days=1)
        assert await queue.fire_schedule("daily", earlier, entry) is None
        assert await queue.list_items() == []
        later = fire + dt.timedelta(days=1)
        next_key = f"schedule:daily:{later.isoformat()}"
        done = await queue.fire_schedule(
            "daily",
            later,
            NewItem(spec_id="report", due_at=later, item_id=next_key, idempotency_key=next_key),
        )
        assert done is not None
        assert done.item.id == next_key
        assert await queue.last_fires(["daily"]) == {"daily": later}

    async def test_delete_and_prune_agree_on_a_cancelled_parent_and_its_children(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A parent cancelled while it waits for children waits no more: items delete removes it,
        as prune does; its child, no longer waited for, may be deleted too."""
        await fan_out(queue, 1, wait=True)
        [child] = await queue.list_children("p")
        with pytest.raises(Exception, match="waits for"):
            await queue.delete(child.id)
        cancelled = await queue.request_cancel("p")
        assert (cancelled.state, cancelled.waiting_children) == (ItemState.CANCELLED, 0)
        await queue.delete(child.id)
        await queue.delete("p")
