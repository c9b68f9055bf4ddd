"""The in-memory queue's own behaviour (the conformance suite covers the protocol)."""

from __future__ import annotations

import datetime as dt

import pytest
import trio

from trio_supervise import ItemState, LeaseLost, MemoryQueue


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
