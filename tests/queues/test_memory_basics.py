"""The in-memory queue's own behaviour (the conformance suite covers the protocol)."""

from __future__ import annotations

import datetime as dt
import gc

import attrs
import pytest
import trio

from trio_supervise import ItemState, LeaseLost, MemoryQueue, Reschedule, Stop
from trio_supervise.job import outcome_settlement
from trio_supervise.queues import (
    Lease,
    NewItem,
    QueueEvent,
    SettleKind,
    Settlement,
    WorkItem,
)
from trio_supervise.queues.memory import _events


async def test_claim_follows_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    """An item due in a day is claimable exactly a day later in virtual time."""
    queue = MemoryQueue()
    item = await queue.enqueue("spec", due_at=queue.clock.now() + dt.timedelta(days=1))
    assert await queue.claim_due(["spec"], "w", 30, 10) == []
    with trio.fail_after(10 * 86_400):
        await queue.wait_for_work(["spec"])
    assert trio.current_time() == pytest.approx(86_400)
    [claimed] = await queue.claim_due(["spec"], "w", 30, 10)
    assert claimed.id == item.id
    assert claimed.state is ItemState.RUNNING


async def test_events_record_refused_writes(autojump_clock: trio.testing.MockClock) -> None:
    """The write log keeps stale writes too, marked as not applied."""
    queue = MemoryQueue()
    item = await queue.enqueue("spec")
    [claimed] = await queue.claim_due(["spec"], "w", 30, 1)
    with pytest.raises(LeaseLost):
        await queue.complete(item.id, claimed.lease_version + 1)
    assert [(e.op, e.applied) for e in queue.events] == [
        ("enqueue", True),
        ("claim", True),
        ("settle:complete", False),
    ]
    queue.reset()
    assert queue.items == {}
    assert queue.events == []


async def test_events_read_as_written(autojump_clock: trio.testing.MockClock) -> None:
    """The log is a list of QueueEvent to its readers, whatever it keeps them as; an event a
    test appends reads back equal."""
    queue = MemoryQueue()
    item = await queue.enqueue("spec")
    [claimed] = await queue.claim_due(["spec"], "w", 30, 1)
    await queue.renew(item.id, "w", claimed.lease_version, 30)
    await queue.complete(item.id, claimed.lease_version)
    events = queue.events
    assert all(isinstance(event, QueueEvent) for event in events)
    assert len(events) == 4
    claim, renew, settle = events[1], events[-2], events[-1]
    assert (claim.op, claim.item_id, claim.lease_version) == ("claim", item.id, 1)
    assert claim.detail == {"worker_id": "w"}
    assert (renew.op, renew.detail, renew.applied) == ("renew", {}, True)
    assert settle.detail == {"delay": 0.0, "error": None}
    assert events[1:] == [claim, renew, settle]
    assert next(reversed(events)) == settle
    assert claim in events
    assert events.index(renew) == 2
    mine = QueueEvent(claim.at, "note", "x", None, {"by": ["a test"]}, False)
    events.append(mine)
    assert events[-1] == mine
    assert events.pop() == mine
    assert len(events) == 4
    # Kept as plain values, nine an event, none an object of the log's own that the garbage
    # collector tracks (issue 17): the datetimes, strings and numbers are untracked, and the
    # markers of the detail slots are the module's.
    assert list.__len__(events) == 9 * len(events)
    markers = {id(_events._SHARED), id(_events._PAIRS), id(_events._NO_PAIR)}
    assert all(id(value) in markers or not gc.is_tracked(value) for value in list.__iter__(events))


async def test_logging_writes_allocates_nothing_the_collector_keeps(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Thousands of logged claims, renewals and settlements leave no object behind per event
    that the collector counts: a long run under time travel is not slowed by young collections
    driven by its own history, nor by full ones walking it (issue 17's P4)."""
    queue = MemoryQueue()
    for _ in range(64):
        await queue.enqueue("spec", config={"n": 0})
    claimed = await queue.claim_due(["spec"], "w", 30, 64)
    leases = [Lease(item.id, item.lease_version, "w") for item in claimed]
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    logged = len(queue.events)
    gc.collect()
    gc.callbacks.append(count)
    try:
        for _ in range(100):
            await queue.renew_many(leases, 30)
    finally:
        gc.callbacks.remove(count)
    assert len(queue.events) == logged + 6_400
    assert collections == []


async def _claimed(queue: MemoryQueue, *item_ids: str) -> list[WorkItem]:
    for item_id in item_ids:
        await queue.enqueue("spec", item_id=item_id, config={"n": 0})
    return await queue.claim_due(["spec"], "w", 30, len(item_ids))


def _settled(outcome: object, item: WorkItem) -> Settlement:
    """The settlement a runner writes for a driver's *outcome*."""
    return outcome_settlement(outcome, item, driver_name="d", requeue_delay=1.0)


async def test_a_runner_s_settlement_equals_one_built_by_hand(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The mark that lets the queue skip checking a runner's config again is no part of a
    settlement's value: equal, same hash and repr, not kept by ``attrs.evolve``, not set by
    the constructor."""
    rescheduled, completed = await _claimed(MemoryQueue(), "a", "b")
    at = dt.datetime(2031, 1, 1, tzinfo=dt.UTC)
    runner_s = _settled(Reschedule(at, {"n": 1}), rescheduled)
    by_hand = Settlement(
        item_id="a",
        lease_version=rescheduled.lease_version,
        kind=SettleKind.RESCHEDULE,
        at=at,
        config={"n": 1},
    )
    assert runner_s == by_hand
    assert repr(runner_s) == repr(by_hand)
    assert runner_s._checked
    assert not by_hand._checked
    assert not attrs.evolve(runner_s)._checked
    stop = _settled(Stop(), completed)
    assert stop._checked
    assert hash(stop) == hash(
        Settlement(item_id="b", lease_version=completed.lease_version, kind=SettleKind.COMPLETE)
    )


async def test_a_changed_copy_of_a_runner_s_settlement_is_checked_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A settlement evolved from a runner's (a wrapper changing its config or result) is
    checked by the queue like any other: an unstorable value makes the entry dead, saying why."""
    queue = MemoryQueue()
    config, result = await _claimed(queue, "config", "result")
    at = dt.datetime(2031, 1, 1, tzinfo=dt.UTC)
    changed = [
        attrs.evolve(_settled(Reschedule(at, {"n": 1}), config), config={"x": "\udcff"}),
        attrs.evolve(_settled(Stop({"ok": True}), result), result={"x": "\x00"}),
    ]
    assert await queue.settle_many(changed) == [True, True]
    got = queue.items
    assert got["config"].state is ItemState.DEAD
    assert got["config"].last_error is not None
    assert got["config"].last_error.startswith("the reschedule outcome could not be stored")
    assert got["config"].config == {"n": 0}
    assert got["result"].state is ItemState.DEAD
    assert got["result"].last_error is not None
    assert got["result"].last_error.startswith("the complete outcome could not be stored")


async def test_a_stored_config_or_result_is_the_queue_s_own(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """What a driver returned, or a caller settled with, can change afterwards without changing
    what the queue stored: the runner's settlement holds its own copy, a hand-built one is
    copied by the queue."""
    queue = MemoryQueue()
    items = {item.id: item for item in await _claimed(queue, "runner", "done", "by-hand")}
    at = dt.datetime(2031, 1, 1, tzinfo=dt.UTC)
    config, result, by_hand = {"n": 1}, {"r": [1]}, {"n": 2}
    assert await queue.settle_many(
        [
            _settled(Reschedule(at, config), items["runner"]),
            _settled(Stop(result), items["done"]),
            Settlement(
                item_id="by-hand",
                lease_version=items["by-hand"].lease_version,
                kind=SettleKind.RESCHEDULE,
                at=at,
                config=by_hand,
            ),
        ]
    ) == [True, True, True]
    config["n"] = result["r"][0] = by_hand["n"] = 99
    got = queue.items
    assert got["runner"].config == {"n": 1}
    assert got["runner"].state is ItemState.QUEUED
    assert got["done"].result == {"r": [1]}
    assert got["by-hand"].config == {"n": 2}


async def test_handed_out_items_are_frozen_work_items_of_their_own() -> None:
    """A claimed or listed item is a plain frozen WorkItem (the copy is built through a twin
    class, then given WorkItem's class), equal to the stored one and sharing no JSON with it."""
    queue = MemoryQueue()
    item = await queue.enqueue("spec", config={"n": [1, {"deep": True}]})
    [claimed] = await queue.claim_due(["spec"], "w", 30, 1)
    again = queue.items[item.id]
    for each in (item, claimed, again):
        assert type(each) is WorkItem
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            each.state = ItemState.QUEUED  # type: ignore[misc]
    assert claimed == again
    claimed.config["n"][1]["deep"] = False
    assert queue.items[item.id].config == {"n": [1, {"deep": True}]}


async def test_no_reader_hands_out_a_stored_item(autojump_clock: trio.testing.MockClock) -> None:
    """The queue changes its stored items in place by plain stores (they are a twin class
    without the frozen ``__setattr__``): every method that returns an item returns a frozen
    ``WorkItem`` of its own, never the stored object."""
    queue = MemoryQueue()
    out: list[WorkItem] = [
        await queue.enqueue("spec", item_id="a", idempotency_key="k", config={"n": 0}),
        await queue.enqueue("spec", item_id="b"),
        *[
            done.item
            for done in await queue.enqueue_many([NewItem(spec_id="spec", idempotency_key="k")])
        ],
    ]
    claimed = await queue.claim_due(["spec"], "w", 30, 2)
    out += claimed
    by_id = {item.id: item for item in claimed}
    child = NewItem(spec_id="spec", item_id="child")
    assert await queue.settle_many(
        [
            Settlement(
                item_id="a",
                lease_version=by_id["a"].lease_version,
                kind=SettleKind.CONTINUE,
                delay=0.0,
                children=(child,),
            )
        ]
    ) == [True]
    _, claimed_too = await queue.settle_and_claim([], ["spec"], "w", 30, 1)
    out += claimed_too
    out += [
        await queue.get("a"),
        await queue.get_by_key("k"),
        *await queue.list_items(),
        *await queue.list_children("a"),
        *queue.items.values(),
        await queue.edit_config("child", {"m": 1}),
        await queue.request_cancel("b"),
        await queue.delete("child"),
    ]
    stored = {id(item) for item in queue._items.values()}
    for item in out:
        assert type(item) is WorkItem
        assert id(item) not in stored
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            item.state = ItemState.DEAD  # type: ignore[misc]
    # What a reader holds does not change when the stored item does.
    [again] = claimed_too
    before = await queue.get(again.id)
    await queue.complete(again.id, again.lease_version)
    assert before.state is ItemState.RUNNING
    assert (await queue.get(again.id)).state is ItemState.COMPLETED
