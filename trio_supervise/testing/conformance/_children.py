"""Child items and fan-in, on every backend: children are written with their parent's fenced
settlement, and a waiting parent is due again when its last child finishes."""

from __future__ import annotations

import pytest

from ...job import (
    MAX_ID_LENGTH,
    WAITING_DUE_AT,
    ItemState,
    NewItem,
    SettleKind,
    Settlement,
    WorkItem,
    child_item_id,
)
from ...queues import WorkQueue
from ._clock import START, ManualClock


async def claim(queue: WorkQueue, spec: str = "parent", limit: int = 1) -> list[WorkItem]:
    return await queue.claim_due([spec], "w1", 30, limit)


async def fan_out(
    queue: WorkQueue, n: int, *, wait: bool = True, kind: SettleKind = SettleKind.CONTINUE
) -> WorkItem:
    """Enqueue a parent, claim it and settle it with *n* children; the parent as claimed."""
    await queue.enqueue("parent", item_id="p")
    [parent] = await claim(queue)
    settlement = Settlement(
        item_id="p",
        lease_version=parent.lease_version,
        kind=kind,
        result={"done": True} if kind is SettleKind.COMPLETE else None,
        children=[NewItem(spec_id="child", config={"n": index}) for index in range(n)],
        wait_for_children=wait,
    )
    assert await queue.settle_many([settlement]) == [True]
    return parent


async def finish(queue: WorkQueue, child: WorkItem, kind: SettleKind) -> None:
    error = "boom" if kind is SettleKind.DEAD else None
    settlement = Settlement(
        item_id=child.id, lease_version=child.lease_version, kind=kind, error=error
    )
    assert await queue.settle_many([settlement]) == [True]


# -- the CLI ---------------------------------------------------------------------------------


class ChildrenContract:
    """Child items, fan-out and fan-in."""

    async def test_children_are_written_with_the_parent_settlement(self, queue: WorkQueue) -> None:
        """The children exist, queued and due now, each recording its parent, with ids
        deterministic per (parent, lease version, index), in their order."""
        parent = await fan_out(queue, 3, wait=False)
        children = await queue.list_children("p")
        assert [child.id for child in children] == [
            child_item_id("p", parent.lease_version, index) for index in range(3)
        ]
        assert [child.config for child in children] == [{"n": 0}, {"n": 1}, {"n": 2}]
        for child in children:
            assert child.parent_id == "p"
            assert child.state is ItemState.QUEUED
            assert child.due_at == START
        stored = await queue.get("p")
        assert (stored.state, stored.waiting_children, stored.due_at) == (
            ItemState.QUEUED,
            0,
            START,
        )

    async def test_a_child_deleted_and_created_again_is_listed_once(self, queue: WorkQueue) -> None:
        """A parent's child of an explicit id, deleted and then created again by the parent's
        next settlement: ``list_children`` lists it once, the one that exists."""
        await queue.enqueue("parent", item_id="p")
        for round_ in range(2):
            [parent] = await claim(queue)
            settlement = Settlement(
                item_id="p",
                lease_version=parent.lease_version,
                kind=SettleKind.CONTINUE,
                children=[NewItem(spec_id="child", item_id="c1", config={"round": round_})],
            )
            assert await queue.settle_many([settlement]) == [True]
            if round_ == 0:
                await queue.delete("c1")
        [child] = await queue.list_children("p")
        assert (child.id, child.config) == ("c1", {"round": 1})

    async def test_a_stale_parent_creates_nothing(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A parent whose lease moved on (expired, claimed again) is refused and writes no child."""
        await queue.enqueue("parent", item_id="p")
        [stale] = await claim(queue)
        clock.advance(31)
        [fresh] = await claim(queue)
        assert fresh.lease_version > stale.lease_version
        settlement = Settlement(
            item_id="p",
            lease_version=stale.lease_version,
            kind=SettleKind.CONTINUE,
            children=[NewItem(spec_id="child")],
            wait_for_children=True,
        )
        assert await queue.settle_many([settlement]) == [False]
        assert await queue.list_children("p") == []
        assert (await queue.get("p")).state is ItemState.RUNNING

    async def test_a_waiting_parent_is_not_due_until_its_last_child_finishes(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Completed, cancelled and dead children all count; the last one makes the parent due
        now."""
        await fan_out(queue, 3)
        waiting = await queue.get("p")
        assert (waiting.state, waiting.waiting_children) == (ItemState.QUEUED, 3)
        assert waiting.due_at == WAITING_DUE_AT
        assert waiting.waiting
        assert await queue.next_due_at(["parent"]) == WAITING_DUE_AT
        children = await claim(queue, "child", 3)
        for kind, child in zip(
            (SettleKind.COMPLETE, SettleKind.DEAD, SettleKind.CANCEL), children, strict=True
        ):
            clock.advance(5)
            assert await claim(queue) == []
            await finish(queue, child, kind)
        parent = await queue.get("p")
        assert (parent.waiting_children, parent.due_at) == (0, clock.current)
        [claimed] = await claim(queue)
        assert claimed.id == "p"
        states = {child.id: child.state for child in await queue.list_children("p")}
        assert sorted(states.values()) == sorted(
            [ItemState.COMPLETED, ItemState.DEAD, ItemState.CANCELLED]
        )

    async def test_the_parent_reads_its_childrens_results(self, queue: WorkQueue) -> None:
        """list_children shows each child's state and stored result."""
        await fan_out(queue, 2)
        for child in await claim(queue, "child", 2):
            settlement = Settlement(
                item_id=child.id,
                lease_version=child.lease_version,
                kind=SettleKind.COMPLETE,
                result={"square": child.config["n"] ** 2},
            )
            assert await queue.settle_many([settlement]) == [True]
        results = [child.result for child in await queue.list_children("p")]
        assert results == [{"square": 0}, {"square": 1}]

    async def test_cancelling_a_queued_child_counts_toward_the_fan_in(
        self, queue: WorkQueue
    ) -> None:
        """request_cancel of a queued child finishes it: the parent waits for one less."""
        await fan_out(queue, 2)
        first, second = await queue.list_children("p")
        await queue.request_cancel(first.id)
        assert (await queue.get("p")).waiting_children == 1
        await queue.request_cancel(first.id)  # again: counted once
        assert (await queue.get("p")).waiting_children == 1
        await queue.request_cancel(second.id)
        parent = await queue.get("p")
        assert (parent.waiting_children, parent.due_at) == (0, START)

    async def test_waiting_with_no_children_is_due_at_once(self, queue: WorkQueue) -> None:
        """Continue(wait_for_children=True) with no children: the fan-in of nothing is now."""
        await fan_out(queue, 0)
        parent = await queue.get("p")
        assert (parent.state, parent.waiting_children, parent.due_at) == (
            ItemState.QUEUED,
            0,
            START,
        )

    async def test_an_existing_key_is_not_created_nor_waited_for(self, queue: WorkQueue) -> None:
        """A child whose idempotency key (or id) exists already is skipped: the parent waits only
        for the children its outcome created."""
        await queue.enqueue("child", idempotency_key="k", item_id="other")
        await queue.enqueue("parent", item_id="p")
        [parent] = await claim(queue)
        settlement = Settlement(
            item_id="p",
            lease_version=parent.lease_version,
            kind=SettleKind.CONTINUE,
            children=[
                NewItem(spec_id="child", idempotency_key="k"),
                NewItem(spec_id="child", item_id="other"),
                NewItem(spec_id="child", item_id="mine"),
            ],
            wait_for_children=True,
        )
        assert await queue.settle_many([settlement]) == [True]
        assert [child.id for child in await queue.list_children("p")] == ["mine"]
        assert (await queue.get("other")).parent_id is None
        assert (await queue.get("p")).waiting_children == 1

    async def test_a_fire_and_forget_child_does_not_count_toward_a_later_wait(
        self,
        queue: WorkQueue,
    ) -> None:
        """Only children created with the wait count: an earlier one finishing changes nothing."""
        await queue.enqueue("parent", item_id="p")
        [parent] = await claim(queue)
        early = Settlement(
            item_id="p",
            lease_version=parent.lease_version,
            kind=SettleKind.CONTINUE,
            children=[NewItem(spec_id="early")],
        )
        assert await queue.settle_many([early]) == [True]
        [parent] = await claim(queue)
        waited = Settlement(
            item_id="p",
            lease_version=parent.lease_version,
            kind=SettleKind.CONTINUE,
            children=[NewItem(spec_id="child")],
            wait_for_children=True,
        )
        assert await queue.settle_many([waited]) == [True]
        [child] = await claim(queue, "early")
        await finish(queue, child, SettleKind.COMPLETE)
        assert (await queue.get("p")).waiting_children == 1

    async def test_a_retried_child_does_not_rearm_its_parent(self, queue: WorkQueue) -> None:
        """``retry`` of a finished child runs it again on its own: the parent's fan-in counted it
        once, and does not count it again."""
        await fan_out(queue, 2)
        first, _ = await claim(queue, "child", 2)
        await finish(queue, first, SettleKind.DEAD)
        assert (await queue.get("p")).waiting_children == 1
        await queue.retry(first.id)
        assert (await queue.get("p")).waiting_children == 1
        [again] = await claim(queue, "child")
        assert again.id == first.id
        await finish(queue, again, SettleKind.COMPLETE)
        assert (await queue.get("p")).waiting_children == 1

    async def test_retrying_a_waiting_parent_ends_its_wait(self, queue: WorkQueue) -> None:
        """An operator's retry of a waiting parent makes it due now; its children no longer
        count it down (it was claimed at a new lease version)."""
        await fan_out(queue, 1)
        retried = await queue.retry("p")
        assert (retried.waiting_children, retried.due_at) == (0, START)
        [parent] = await claim(queue)
        [child] = await claim(queue, "child")
        await finish(queue, child, SettleKind.COMPLETE)
        stored = await queue.get("p")
        assert (stored.state, stored.lease_version) == (ItemState.RUNNING, parent.lease_version)

    async def test_a_completed_parent_may_create_children(self, queue: WorkQueue) -> None:
        """Stop with children: the parent completes and its follow-ups are queued."""
        await fan_out(queue, 2, wait=False, kind=SettleKind.COMPLETE)
        parent = await queue.get("p")
        assert (parent.state, parent.result) == (ItemState.COMPLETED, {"done": True})
        assert len(await queue.list_children("p")) == 2

    async def test_an_unstorable_child_makes_the_parent_dead_and_creates_nothing(
        self,
        queue: WorkQueue,
    ) -> None:
        """A child the backend cannot store fails its parent's entry alone (dead, saying why); the
        batch-mate settles as asked and nothing of the bad entry is written."""
        await queue.enqueue("parent", item_id="p")
        await queue.enqueue("parent", item_id="q")
        first, second = await queue.claim_due(["parent"], "w1", 30, 2)
        bad = Settlement(
            item_id=first.id,
            lease_version=first.lease_version,
            kind=SettleKind.CONTINUE,
            children=[
                NewItem(spec_id="child"),
                NewItem(spec_id="child", config={"text": "nul\x00"}),
            ],
            wait_for_children=True,
        )
        good = Settlement(
            item_id=second.id,
            lease_version=second.lease_version,
            kind=SettleKind.CONTINUE,
            children=[NewItem(spec_id="child")],
        )
        assert await queue.settle_many([bad, good]) == [True, True]
        dead = await queue.get(first.id)
        assert dead.state is ItemState.DEAD
        assert dead.last_error is not None
        assert "children[1]" in dead.last_error
        assert await queue.list_children(first.id) == []
        assert len(await queue.list_children(second.id)) == 1

    async def test_a_default_child_id_past_the_limit_makes_the_parent_dead(
        self, queue: WorkQueue
    ) -> None:
        """A child's default id is its parent's plus a suffix: from a parent id near the limit it
        is too long, and the parent's outcome fails alone (dead, naming the child and the rule) on
        every backend, rather than being written again and again."""
        parent_id = "p" * (MAX_ID_LENGTH - 2)
        await queue.enqueue("parent", item_id=parent_id)
        [parent] = await claim(queue)
        settlement = Settlement(
            item_id=parent.id,
            lease_version=parent.lease_version,
            kind=SettleKind.CONTINUE,
            children=[NewItem(spec_id="child")],
        )
        assert await queue.settle_many([settlement]) == [True]
        dead = await queue.get(parent_id)
        assert dead.state is ItemState.DEAD
        assert dead.last_error is not None
        assert f"children[0]: item_id must be a non-empty string of at most {MAX_ID_LENGTH}" in (
            dead.last_error
        )
        assert await queue.list_children(parent_id) == []

    async def test_a_nested_fan_in(self, queue: WorkQueue) -> None:
        """A child may wait for children of its own; each level fans in on its own."""
        await fan_out(queue, 1)
        [child] = await claim(queue, "child")
        settlement = Settlement(
            item_id=child.id,
            lease_version=child.lease_version,
            kind=SettleKind.CONTINUE,
            children=[NewItem(spec_id="grandchild")],
            wait_for_children=True,
        )
        assert await queue.settle_many([settlement]) == [True]
        [grandchild] = await claim(queue, "grandchild")
        await finish(queue, grandchild, SettleKind.COMPLETE)
        assert (await queue.get("p")).waiting_children == 1
        [child] = await claim(queue, "child")
        await finish(queue, child, SettleKind.COMPLETE)
        assert (await queue.get("p")).waiting_children == 0

    async def test_deleting_a_waited_for_child_is_refused_until_it_is_cancelled(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Deleting a queued child its parent waits for would leave the parent waiting for ever: it
        is refused; cancelled first, the child counts toward the fan-in and may then be deleted."""
        from ... import ItemStateError

        await fan_out(queue, 1)
        [child] = await queue.list_children("p")
        with pytest.raises(ItemStateError, match="cancel it first"):
            await queue.delete(child.id)
        with pytest.raises(ItemStateError, match="waiting for its children"):
            await queue.delete("p")
        await queue.request_cancel(child.id)
        assert (await queue.get("p")).waiting_children == 0
        await queue.delete(child.id)
        assert await queue.list_children("p") == []
