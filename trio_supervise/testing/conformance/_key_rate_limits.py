"""Rate limits per concurrency key: at most N claims of each key in any period, a sliding window
over each key's claims, kept by the store (``docs/flow-control.md``)."""

from __future__ import annotations

import datetime as dt

import pytest

from ...job import RateLimit
from ...queues import WorkQueue
from ...queues._ports import Capability, KeyRateLimitStore
from ._clock import START, ManualClock
from ._support import needs


def _limits(queue: WorkQueue) -> KeyRateLimitStore:
    assert isinstance(queue, KeyRateLimitStore)
    return queue


async def _keyed(queue: WorkQueue, key: str, count: int, *, prefix: str) -> None:
    for n in range(count):
        await queue.enqueue(
            "spec", item_id=f"{prefix}{n}", concurrency_key=key, concurrency_limit=1000
        )


class KeyRateLimitContract:
    """Each key a rule holds starts no more than its window lets: a template gives each key it
    renders a window of its own; a key at its rate never holds back other keys' items behind it
    in the queue; held-back items are due when their key's window frees."""

    @needs(Capability.KEY_RATE_LIMITS)
    async def test_each_key_of_a_template_has_its_own_window(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """2 per 10 s per tenant: acme's first 5 items at the head of the queue take 2 starts,
        globex's items behind them still start, unkeyed ones too; 10 s later 2 more each."""
        await _limits(queue).set_key_rate_limit("partner:{tenant}", RateLimit(2, 10))
        await _keyed(queue, "partner:acme", 5, prefix="a")
        await _keyed(queue, "partner:globex", 3, prefix="g")
        await queue.enqueue("spec", item_id="plain")
        first = await queue.claim_due(["spec"], "w", 60, 10)
        assert sorted(item.id for item in first) == ["a0", "a1", "g0", "g1", "plain"]
        clock.advance(9.9)
        assert await queue.claim_due(["spec"], "w", 60, 10) == []
        clock.advance(0.1)
        second = await queue.claim_due(["spec"], "w", 60, 10)
        assert sorted(item.id for item in second) == ["a2", "a3", "g2"]

    @needs(Capability.KEY_RATE_LIMITS)
    async def test_a_throttled_key_never_blocks_the_keys_behind_it(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A claim of 3 whose window would be all of a throttled key reaches past it."""
        await _limits(queue).set_key_rate_limit("tenant:acme", RateLimit(1, 60))
        await _keyed(queue, "tenant:acme", 6, prefix="a")
        await _keyed(queue, "tenant:globex", 2, prefix="g")
        [first] = await queue.claim_due(["spec"], "w", 60, 1)
        assert first.id == "a0"
        behind = await queue.claim_due(["spec"], "w", 60, 3)
        assert [item.id for item in behind] == ["g0", "g1"]  # no rule holds globex

    @needs(Capability.KEY_RATE_LIMITS)
    async def test_held_back_items_are_due_when_their_key_frees(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """``next_due_at`` of a throttled key's items is when its window lets one in;
        ``throttled_keys`` names the key until then; lifting the rule frees its items."""
        limits = _limits(queue)
        await limits.set_key_rate_limit("{tenant}", RateLimit(1, 30))
        await _keyed(queue, "acme", 2, prefix="a")
        assert len(await queue.claim_due(["spec"], "w", 60, 10)) == 1
        assert await queue.next_due_at(["spec"]) == START + dt.timedelta(seconds=30)
        assert await limits.throttled_keys() == {"acme": START + dt.timedelta(seconds=30)}
        assert await limits.key_rate_limits() == {"{tenant}": RateLimit(1, 30)}
        await limits.set_key_rate_limit("{tenant}", None)
        assert await limits.throttled_keys() == {}
        assert await queue.next_due_at(["spec"]) == START
        assert len(await queue.claim_due(["spec"], "w", 60, 10)) == 1

    @needs(Capability.KEY_RATE_LIMITS)
    async def test_the_key_itself_wins_over_a_template(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A rule naming a key holds it, not a template that also renders it."""
        limits = _limits(queue)
        await limits.set_key_rate_limit("partner:{tenant}", RateLimit(1, 10))
        await limits.set_key_rate_limit("partner:acme", RateLimit(3, 10))
        await _keyed(queue, "partner:acme", 5, prefix="a")
        await _keyed(queue, "partner:globex", 5, prefix="g")
        claimed = await queue.claim_due(["spec"], "w", 60, 10)
        assert sorted(item.id for item in claimed) == ["a0", "a1", "a2", "g0"]

    @needs(Capability.KEY_RATE_LIMITS)
    async def test_many_keys_each_start_within_their_window(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """120 keys under one template at 1 per 60 s and 40 keys no rule holds, two items each,
        the keys interleaved (every key's first item before any second one): claims of 10 start
        each ruled key once and every unruled item, however far behind the head they wait, and
        never a ruled key twice; a minute later its second items start. (A claim reads only the
        keys it may take, not every key waiting: still exact.)"""
        await _limits(queue).set_key_rate_limit("t:{tenant}", RateLimit(1, 60))
        keys = [f"t:{n}" if n % 4 else f"u:{n}" for n in range(160)]
        for round_ in range(2):
            for key in keys:
                await queue.enqueue(
                    "spec",
                    item_id=f"{key}/{round_}",
                    tenant_id=key[2:],
                    concurrency_key=key,
                    concurrency_limit=1000,
                )
        started: list[str] = []
        while claimed := await queue.claim_due(["spec"], "w", 3600, 10):
            assert len(claimed) <= 10
            started += [item.id for item in claimed]
        ruled = [key for key in keys if key.startswith("t:")]
        unruled = [key for key in keys if key.startswith("u:")]
        assert sorted(started) == sorted(
            [f"{key}/0" for key in ruled] + [f"{key}/{r}" for key in unruled for r in (0, 1)]
        )
        clock.advance(60)
        later: list[str] = []
        while claimed := await queue.claim_due(["spec"], "w", 3600, 10):
            later += [item.id for item in claimed]
        assert sorted(later) == sorted(f"{key}/1" for key in ruled)

    @needs(Capability.KEY_RATE_LIMITS)
    async def test_logs_no_window_counts_are_forgotten(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """``prune_key_logs`` forgets a key's log once its latest start is older than the
        longest rule's period, never sooner, a batch at a time; a forgotten key starts as one
        never seen; a bad limit is refused."""
        limits = _limits(queue)
        await limits.set_key_rate_limit("{tenant}", RateLimit(1, 30))
        await limits.set_key_rate_limit("slow:{tenant}", RateLimit(1, 60))
        for key in ("a", "b", "c"):
            await _keyed(queue, key, 2, prefix=key)
        assert len(await queue.claim_due(["spec"], "w", 3600, 10)) == 3
        clock.advance(30)
        await _keyed(queue, "slow:d", 1, prefix="d")
        assert len(await queue.claim_due(["spec"], "w", 3600, 10)) == 4  # a1, b1, c1, d0
        clock.advance(59)  # the latest starts 59 s old: a window of 60 s still counts them
        assert await limits.prune_key_logs() == 0
        clock.advance(2)  # 61 s old: no window counts them (a, b, c's rule is 30 s)
        assert await limits.prune_key_logs(limit=3) == 3
        assert await limits.prune_key_logs(limit=3) == 1
        assert await limits.prune_key_logs() == 0
        assert await limits.throttled_keys() == {}
        await _keyed(queue, "a", 1, prefix="again-a")
        assert [item.id for item in await queue.claim_due(["spec"], "w", 3600, 10)] == ["again-a0"]
        with pytest.raises(ValueError, match="limit must be"):
            await limits.prune_key_logs(limit=0)

    @needs(Capability.KEY_RATE_LIMITS)
    async def test_a_bad_rule_is_refused_naming_it(self, queue: WorkQueue) -> None:
        """A template naming another field, or a bad rate, is a ValueError saying the rule."""
        limits = _limits(queue)
        with pytest.raises(ValueError, match=r"only \{tenant\} and \{subject\}"):
            await limits.set_key_rate_limit("partner:{user}", RateLimit(1, 10))
        with pytest.raises(ValueError, match="rate must be"):
            await limits.set_key_rate_limit("partner:{tenant}", "often")  # type: ignore[arg-type]
