"""Rate limits on named queues: at most N claims in any period, a sliding window over the
claims' times, kept by the store (``docs/flow-control.md``)."""

from __future__ import annotations

import datetime as dt

import pytest

from ...job import ItemState, RateLimit, SettleKind, Settlement
from ...queues import WorkQueue
from ...queues._ports import Capability, RateLimitStore
from ._clock import START, ManualClock
from ._support import needs


def _limits(queue: WorkQueue) -> RateLimitStore:
    assert isinstance(queue, RateLimitStore)
    return queue


class RateLimitContract:
    """A rate-limited queue's claims take no more than the window lets start: never more than
    ``limit`` in any interval of ``period``; held-back items stay queued, ``next_due_at`` says
    when the window frees; other queues are not touched; ``list_queues`` shows the limit."""

    @needs(Capability.RATE_LIMITS)
    async def test_a_claim_takes_no_more_than_the_window_lets_start(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """3 per 10 s: a claim of 10 takes 3; until 10 s after them, none; then 3 more."""
        await _limits(queue).set_rate_limit("mail", RateLimit(3, 10))
        for n in range(8):
            await queue.enqueue("spec", item_id=f"m{n}", queue="mail")
        first = await queue.claim_due(["spec"], "w", 60, 10, queue="mail")
        assert [item.id for item in first] == ["m0", "m1", "m2"]
        clock.advance(9.9)
        assert await queue.claim_due(["spec"], "w", 60, 10, queue="mail") == []
        clock.advance(0.1)
        second = await queue.claim_due(["spec"], "w", 60, 10, queue="mail")
        assert [item.id for item in second] == ["m3", "m4", "m5"]
        assert (await queue.get("m6")).state is ItemState.QUEUED

    @needs(Capability.RATE_LIMITS)
    async def test_the_window_slides_over_each_start(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Starts spread over the period free their slots one by one, each a period after it
        (a sliding window: no burst of twice the limit across a window's edge)."""
        await _limits(queue).set_rate_limit("mail", RateLimit(2, 10))
        for n in range(6):
            await queue.enqueue("spec", item_id=f"m{n}", queue="mail")
        assert len(await queue.claim_due(["spec"], "w", 60, 1, queue="mail")) == 1  # at 0
        clock.advance(6)
        assert len(await queue.claim_due(["spec"], "w", 60, 5, queue="mail")) == 1  # at 6
        clock.advance(4)  # 10: the first start's slot is free, the second's is not
        assert len(await queue.claim_due(["spec"], "w", 60, 5, queue="mail")) == 1
        clock.advance(5.9)  # 15.9: still the starts of 6 and 10
        assert await queue.claim_due(["spec"], "w", 60, 5, queue="mail") == []
        clock.advance(0.1)
        assert len(await queue.claim_due(["spec"], "w", 60, 5, queue="mail")) == 1

    @needs(Capability.RATE_LIMITS)
    async def test_held_back_items_are_due_when_the_window_frees(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """``next_due_at`` of a full window's queue is when its oldest counted start leaves
        the window; another queue's items are due as ever; ``list_queues`` shows both."""
        await _limits(queue).set_rate_limit("mail", RateLimit(2, 30))
        await queue.enqueue("spec", item_id="a", queue="mail")
        await queue.enqueue("spec", item_id="b", queue="mail")
        await queue.enqueue("spec", item_id="c", queue="mail")
        assert len(await queue.claim_due(["spec"], "w", 60, 5, queue="mail")) == 2
        assert await queue.next_due_at(["spec"], queues=["mail"]) == START + dt.timedelta(
            seconds=30
        )
        await queue.enqueue("spec", item_id="free", queue="other")
        assert await queue.next_due_at(["spec"]) == START
        assert [item.id for item in await queue.claim_due(["spec"], "w", 60, 5, queue="other")] == [
            "free"
        ]
        by_name = {info.name: info for info in await queue.list_queues()}
        assert by_name["mail"].rate_limit == RateLimit(2, 30)
        assert by_name["mail"].throttled_until == START + dt.timedelta(seconds=30)
        assert by_name["other"].rate_limit is None
        assert by_name["other"].throttled_until is None

    @needs(Capability.RATE_LIMITS)
    async def test_a_rescue_and_a_settle_and_claim_count_as_starts(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """An expired lease claimed again is a start; a claim after a settlement too."""
        await _limits(queue).set_rate_limit("mail", RateLimit(2, 100))
        await queue.enqueue("spec", item_id="a", queue="mail")
        await queue.enqueue("spec", item_id="b", queue="mail")
        assert len(await queue.claim_due(["spec"], "w", 5, 1, queue="mail")) == 1
        clock.advance(6)  # a's lease expired
        [rescued] = await queue.claim_due(["spec"], "w", 5, 5, queue="mail")
        assert rescued.id == "a"
        await queue.settle_many(
            [Settlement(item_id="a", lease_version=rescued.lease_version, kind=SettleKind.COMPLETE)]
        )
        assert await queue.claim_due(["spec"], "w", 5, 5, queue="mail") == []
        assert (await queue.get("b")).state is ItemState.QUEUED

    @needs(Capability.RATE_LIMITS)
    async def test_a_limit_is_changed_and_lifted(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A new limit counts the starts recorded so far; None lifts it (a queue without
        one is claimed as ever, and no longer listed for it)."""
        limits = _limits(queue)
        await limits.set_rate_limit("mail", RateLimit(1, 60))
        for n in range(5):
            await queue.enqueue("spec", item_id=f"m{n}", queue="mail")
        assert len(await queue.claim_due(["spec"], "w", 60, 5, queue="mail")) == 1
        await limits.set_rate_limit("mail", RateLimit(2, 60))
        assert len(await queue.claim_due(["spec"], "w", 60, 5, queue="mail")) == 1
        assert await queue.claim_due(["spec"], "w", 60, 5, queue="mail") == []
        await limits.set_rate_limit("mail", None)
        assert len(await queue.claim_due(["spec"], "w", 60, 5, queue="mail")) == 3
        assert all(info.rate_limit is None for info in await queue.list_queues())

    @needs(Capability.RATE_LIMITS)
    async def test_bad_limits_are_refused_naming_the_rule(self, queue: WorkQueue) -> None:
        """A rate that is not ``N/PERIOD`` or out of range is a ValueError saying so."""
        limits = _limits(queue)
        with pytest.raises(ValueError, match="rate must be N/PERIOD"):
            await limits.set_rate_limit("mail", "fast")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="rate limit must be an integer from 1"):
            await limits.set_rate_limit("mail", "0/1s")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="queue must be a non-empty string"):
            await limits.set_rate_limit("", RateLimit(1, 1))
        assert await queue.list_queues() == []
