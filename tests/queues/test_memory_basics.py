"""The in-memory queue's own behaviour (the conformance suite covers the protocol)."""

from __future__ import annotations

import datetime as dt
import gc

import pytest
import trio

from trio_supervise import ItemState, LeaseLost, MemoryQueue
from trio_supervise.queues import QueueEvent


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
    # Kept as tuples of atoms, which the garbage collector stops tracking (issue 17).
    gc.collect()
    assert not any(gc.is_tracked(raw) for raw in list.__iter__(events))
