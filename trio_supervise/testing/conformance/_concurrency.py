"""Fleet-wide concurrency keys, on every backend: at most N running items per key, in the claim.

"Now" is the test's ManualClock, so leases expire without sleeping.
"""

from __future__ import annotations

import pytest
import trio

from ... import ConfigError
from ...job import ItemState, LeaseStatus
from ...queues import WorkQueue
from ._clock import START, ManualClock
from ._support import S, seed_writes


async def claim_ids(queue: WorkQueue, limit: int = 10, **kwargs: str) -> list[str]:
    return [i.id for i in await queue.claim_due(["spec"], "w", 30, limit, **kwargs)]


class ConcurrencyKeysContract:
    """Concurrency keys: no more running items of a key than its limit."""

    async def test_enqueue_stores_the_key_and_its_limit(self, queue: WorkQueue) -> None:
        """Key and limit come back as given; a key alone gets limit 1; no key, no limit."""
        item = await queue.enqueue("spec", item_id="a", concurrency_key="acme", concurrency_limit=3)
        assert (item.concurrency_key, item.concurrency_limit) == ("acme", 3)
        stored = await queue.get("a")
        assert (stored.concurrency_key, stored.concurrency_limit) == ("acme", 3)
        alone = await queue.enqueue("spec", item_id="b", concurrency_key="acme")
        assert (alone.concurrency_key, alone.concurrency_limit) == ("acme", 1)
        plain = await queue.enqueue("spec", item_id="c")
        assert (plain.concurrency_key, plain.concurrency_limit) == (None, None)
        [claimed] = await queue.claim_due(["spec"], "w", 30, 1)
        assert (claimed.concurrency_key, claimed.concurrency_limit) == ("acme", 3)

    async def test_bad_keys_and_limits_are_refused(self, queue: WorkQueue) -> None:
        """An empty or non-string key, a limit below 1 or not an int, or a limit without a key is
        refused naming the rule, and nothing is written."""
        for bad_key in ("", 5, "x" * 201):
            with pytest.raises(ValueError, match="concurrency_key must be a non-empty string"):
                await queue.enqueue("spec", concurrency_key=bad_key)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="concurrency_key must not contain NUL"):
            await queue.enqueue("spec", concurrency_key="a\x00b")
        for bad_limit in (0, -1, 1.5, True, "2", 10**7):
            with pytest.raises(ValueError, match="concurrency_limit must be an integer from 1"):
                await queue.enqueue("spec", concurrency_key="k", concurrency_limit=bad_limit)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="concurrency_limit needs a concurrency_key"):
            await queue.enqueue("spec", concurrency_limit=2)
        assert await queue.list_items() == []

    async def test_one_claim_takes_no_more_of_a_key_than_its_limit(self, queue: WorkQueue) -> None:
        """Of five due items of one key with limit 2, one claim takes the first two, then none."""
        for n in range(5):
            await queue.enqueue("spec", item_id=f"k{n}", concurrency_key="k", concurrency_limit=2)
        assert await claim_ids(queue) == ["k0", "k1"]
        assert await claim_ids(queue) == []
        [item] = [i for i in await queue.list_items(states=[ItemState.QUEUED]) if i.id == "k2"]
        assert item.state is ItemState.QUEUED

    async def test_a_claim_counts_the_running_items_of_a_key(self, queue: WorkQueue) -> None:
        """With one of a key's two slots taken, a claim of its three due items takes just one."""
        await queue.enqueue("spec", item_id="k0", concurrency_key="k", concurrency_limit=2)
        assert await claim_ids(queue) == ["k0"]
        for n in range(1, 4):
            await queue.enqueue("spec", item_id=f"k{n}", concurrency_key="k", concurrency_limit=2)
        assert await claim_ids(queue) == ["k1"]
        assert await claim_ids(queue) == []

    async def test_blocked_keys_never_starve_the_items_behind_them(self, queue: WorkQueue) -> None:
        """A queue head full of items whose key is at its limit does not hide the items after it:
        the claim's window leaves the blocked key out, so unkeyed and other keys' items are
        claimed."""
        await queue.enqueue("spec", item_id="first", concurrency_key="busy", priority=-10)
        assert await claim_ids(queue, 1) == ["first"]
        for n in range(20):
            await queue.enqueue("spec", item_id=f"busy-{n:02}", concurrency_key="busy", priority=-5)
        await queue.enqueue("spec", item_id="other", concurrency_key="calm", priority=0)
        await queue.enqueue("spec", item_id="plain", priority=1)
        # Only two slots asked for, and twenty blocked items at the head: the two behind them come.
        assert await claim_ids(queue, 2) == ["other", "plain"]

    async def test_a_window_past_a_keys_slots_is_filled_by_the_next_claim(
        self, queue: WorkQueue
    ) -> None:
        """Where the window holds more of a key than its free slots, the claim returns fewer than
        asked; the next claim, with that key now full, reaches the items behind."""
        for n in range(3):
            await queue.enqueue("spec", item_id=f"k{n}", concurrency_key="k", priority=-1)
        for n in range(3):
            await queue.enqueue("spec", item_id=f"u{n}")
        assert await claim_ids(queue, 4) == ["k0", "u0"]
        assert await claim_ids(queue, 4) == ["u1", "u2"]

    async def test_keys_are_independent_and_fleet_wide(self, queue: WorkQueue) -> None:
        """Each key has its own slots; a key's running items in another queue or spec count too."""
        await queue.enqueue("other-spec", item_id="elsewhere", concurrency_key="a", queue="mail")
        [running] = await queue.claim_due(["other-spec"], "w9", 30, 1, queue="mail")
        assert running.id == "elsewhere"
        await queue.enqueue("spec", item_id="a1", concurrency_key="a")
        await queue.enqueue("spec", item_id="b1", concurrency_key="b")
        await queue.enqueue("spec", item_id="b2", concurrency_key="b")
        assert await claim_ids(queue) == ["b1"]
        await seed_writes(queue).complete("elsewhere", running.lease_version)
        assert await claim_ids(queue) == ["a1"]

    async def test_each_item_is_held_to_its_own_limit(self, queue: WorkQueue) -> None:
        """Items of one key with different limits: each is claimed only while the key's running
        count is below its own limit."""
        await queue.enqueue("spec", item_id="a-wide", concurrency_key="k", concurrency_limit=3)
        await queue.enqueue("spec", item_id="b-narrow", concurrency_key="k", concurrency_limit=1)
        await queue.enqueue("spec", item_id="c-wide", concurrency_key="k", concurrency_limit=3)
        assert await claim_ids(queue, 1) == ["a-wide"]
        # One running: "narrow" (limit 1) is blocked, "c-wide" (limit 3) is not.
        assert await claim_ids(queue) == ["c-wide"]

    async def test_a_settled_item_frees_its_slot(self, queue: WorkQueue) -> None:
        """Completing, releasing or failing a keyed item lets the next of its key be claimed."""
        for n in range(3):
            await queue.enqueue("spec", item_id=f"k{n}", concurrency_key="k")
        [first] = await queue.claim_due(["spec"], "w", 30, 10)
        assert await claim_ids(queue) == []
        await seed_writes(queue).complete(first.id, first.lease_version)
        [second] = await queue.claim_due(["spec"], "w", 30, 10)
        assert second.id == "k1"
        await seed_writes(queue).release(second.id, second.lease_version, 100)
        assert await claim_ids(queue) == ["k2"]

    async def test_an_expired_lease_frees_its_slot_and_is_rescued_under_the_key(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A running item whose lease expired no longer counts; rescuing it takes the key's slot
        like any claim, and it is not rescued while another item of its key holds a live lease."""
        await queue.enqueue("spec", item_id="stuck", concurrency_key="k")
        await queue.claim_due(["spec"], "w1", 5, 1)
        await queue.enqueue("spec", item_id="next", concurrency_key="k", priority=-1)
        assert await claim_ids(queue) == []
        clock.advance(6)
        # "stuck" no longer counts; "next" comes first (priority) and takes the one slot.
        [after] = await queue.claim_due(["spec"], "w", 30, 10)
        assert after.id == "next"
        assert await claim_ids(queue) == []  # "stuck" is expired, but its key is full
        await seed_writes(queue).complete("next", after.lease_version)
        [rescued] = await queue.claim_due(["spec"], "w2", 30, 1)
        assert (rescued.id, rescued.lease_owner, rescued.attempt) == ("stuck", "w2", 2)

    async def test_next_due_at_waits_for_a_blocked_key_to_free(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A blocked keyed item is next due when its key's lease expires (no write in between), and
        wait_for_work does not return for it before then."""
        await queue.enqueue("spec", item_id="k0", concurrency_key="k")
        [running] = await queue.claim_due(["spec"], "w", 30, 1)
        await queue.enqueue("spec", item_id="k1", concurrency_key="k")
        assert await queue.next_due_at(["spec"]) == START + 30 * S
        with trio.move_on_after(0.2) as scope:
            await queue.wait_for_work(["spec"])
        assert scope.cancelled_caught
        await seed_writes(queue).renew("k0", "w", running.lease_version, 60)
        assert await queue.next_due_at(["spec"]) == START + 60 * S
        await queue.enqueue("spec", item_id="free", concurrency_key="other")
        assert await queue.next_due_at(["spec"]) == START
        await queue.claim_due(["spec"], "w", 30, 10)
        await seed_writes(queue).complete("k0", running.lease_version)
        assert await queue.next_due_at(["spec"]) == START
        with trio.fail_after(5):
            await queue.wait_for_work(["spec"])

    async def test_a_waiter_wakes_when_a_blocked_key_frees(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A waiter already waiting for a blocked keyed item (next due when the key's lease
        expires, 30 s away) returns when the key's holder completes, not at that expiry: the
        completion frees the slot (a completion wakes nobody else)."""
        await queue.enqueue("spec", item_id="k0", concurrency_key="k")
        [running] = await queue.claim_due(["spec"], "w", 30, 1)
        await queue.enqueue("spec", item_id="k1", concurrency_key="k")
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:

                async def complete_soon() -> None:
                    await trio.sleep(0.1)
                    await seed_writes(queue).complete("k0", running.lease_version)

                nursery.start_soon(complete_soon)
                await queue.wait_for_work(["spec"])
        [freed] = await queue.claim_due(["spec"], "w", 30, 1)
        assert freed.id == "k1"

    async def test_a_blocked_key_with_a_higher_limit_frees_at_its_nth_lease(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """With limit 2 and two live leases, the next item of the key is due when the earlier of
        them expires (the 2nd latest); with limit 1 and the same two, only when both have."""
        await queue.enqueue("spec", item_id="a", concurrency_key="k", concurrency_limit=2)
        await queue.claim_due(["spec"], "w", 10, 1)
        await queue.enqueue("spec", item_id="b", concurrency_key="k", concurrency_limit=2)
        await queue.claim_due(["spec"], "w", 40, 1)
        await queue.enqueue("spec3", item_id="wide", concurrency_key="k", concurrency_limit=2)
        assert await queue.next_due_at(["spec3"]) == START + 10 * S
        await queue.enqueue("spec2", item_id="b-narrow", concurrency_key="k", concurrency_limit=1)
        assert await queue.next_due_at(["spec2"]) == START + 40 * S

    async def test_an_expired_keyed_lease_is_not_renewed(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Once a keyed item's lease has expired its slot is free, so a late renewal is refused
        (LOST) even before another claim takes the slot; an unkeyed item's late renewal holds."""
        await queue.enqueue("spec", item_id="keyed", concurrency_key="k")
        await queue.enqueue("spec", item_id="plain")
        keyed, plain = await queue.claim_due(["spec"], "w", 5, 2)
        clock.advance(4)
        assert (
            await seed_writes(queue).renew("keyed", "w", keyed.lease_version, 5) is LeaseStatus.HELD
        )
        clock.advance(6)
        statuses = await queue.renew_many([keyed.lease, plain.lease], 30)
        assert statuses == {"keyed": LeaseStatus.LOST, "plain": LeaseStatus.HELD}
        # Still running under that version (nobody rescued it): its owner may still settle it.
        await seed_writes(queue).release("keyed", keyed.lease_version, 0)
        assert (await queue.get("keyed")).state is ItemState.QUEUED
