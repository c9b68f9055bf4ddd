"""The WorkQueue contract, run against every backend (memory, SQLite, PostgreSQL).

"Now" is a ManualClock the tests advance, so leases expire without any real sleep.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest
import trio

from ... import LeaseLost
from ...job import ItemState, Lease, LeaseStatus, NewItem, SettleKind, Settlement, WorkItem
from ...queues import WorkQueue
from ._clock import START, ManualClock
from ._support import SEED_WRITES, S, claim_one, needs, seed_writes, settle_then_claim

StaleWrite = Callable[[WorkQueue, WorkItem], Awaitable[object]]

STALE_WRITES: dict[str, StaleWrite] = {
    "complete": lambda q, i: seed_writes(q).complete(i.id, i.lease_version),
    "release": lambda q, i: seed_writes(q).release(i.id, i.lease_version, 0),
    "reschedule": lambda q, i: seed_writes(q).reschedule(i.id, i.lease_version, START, {"x": 1}),
    "mark_error": lambda q, i: seed_writes(q).mark_error(i.id, i.lease_version, "boom"),
    "renew": lambda q, i: seed_writes(q).renew(i.id, i.lease_owner or "", i.lease_version, 10),
}


def _fields(item: WorkItem) -> dict[str, Any]:
    import attrs

    return attrs.asdict(item, recurse=False)


class ClaimingContract:
    """Claims under a lease, renewals, fencing by lease version, attempts."""

    # -- claiming
    async def test_claim_orders_by_due_time_then_id(self, queue: WorkQueue) -> None:
        """Claims come in due-time order, ties broken by id, and stop at the limit."""
        for item_id, offset in [("c", 0), ("b", -5), ("a", 0), ("d", -5), ("e", -9)]:
            await queue.enqueue("spec", item_id=item_id, due_at=START + offset * S)
        first = await queue.claim_due(["spec"], "w", 30, 3)
        assert [i.id for i in first] == ["e", "b", "d"]
        rest = await queue.claim_due(["spec"], "w", 30, 10)
        assert [i.id for i in rest] == ["a", "c"]
        assert await queue.claim_due(["spec"], "w", 30, 10) == []

    async def test_changing_a_returned_item_in_place_changes_nothing_stored(
        self, queue: WorkQueue
    ) -> None:
        """Every item a queue hands out (enqueue's, a claim's, a settle-and-claim's, a read's, a
        listing's) holds its own config and result: a driver or caller that changes them in place (a
        nested list, a key added) changes nothing stored, as a durable backend, which decodes each
        row afresh, never could. Nor does changing the config given to enqueue after the call."""
        config: dict[str, Any] = {"steps": [1, {"n": 2}], "flat": "x"}
        [done] = await queue.enqueue_many([NewItem(spec_id="spec", item_id="a", config=config)])
        config["steps"].append("caller")
        config["new"] = True
        assert done.item is not None
        done.item.config["steps"][1]["n"] = "enqueue"
        original = {"steps": [1, {"n": 2}], "flat": "x"}
        [claimed] = await queue.claim_due(["spec"], "w", 30, 1)
        assert claimed.config == original
        claimed.config["steps"].append("driver")
        claimed.config["flat"] = "driver"
        assert (await queue.get("a")).config == original
        read = await queue.get("a")
        read.config["steps"][1]["n"] = "reader"
        [listed] = await queue.list_items(spec_ids=["spec"])
        listed.config.clear()
        assert (await queue.get("a")).config == original
        await queue.settle_many(
            [
                Settlement(
                    item_id="a",
                    lease_version=claimed.lease_version,
                    kind=SettleKind.COMPLETE,
                    result={"sent": [1]},
                )
            ]
        )
        finished = await queue.get("a")
        finished.result["sent"].append(2)
        assert (await queue.get("a")).result == {"sent": [1]}
        await queue.retry("a")
        _, [again] = await settle_then_claim(queue)([], ["spec"], "w", 30, 1)
        again.config["steps"].append("again")
        again.result["sent"].append("again")
        stored = await queue.get("a")
        assert (stored.config, stored.result) == (original, {"sent": [1]})

    async def test_a_runner_s_settlement_is_stored_as_is_and_a_changed_copy_checked_again(
        self,
        queue: WorkQueue,
    ) -> None:
        """A runner's own settlement (its config and result checked and copied once, by the runner)
        is stored as given on every backend; one evolved from it (a wrapper changing the config or
        result) is checked like any hand-built one: an unstorable value makes that entry dead,
        saying why, and the batch goes on."""
        from ... import Reschedule, Stop
        from ...job import outcome_settlement

        for item_id in ("kept", "done", "bad-config", "bad-result"):
            await queue.enqueue("spec", item_id=item_id, config={"n": 0})
        items = {item.id: item for item in await queue.claim_due(["spec"], "w", 30, 4)}
        at = START + dt.timedelta(days=1)

        def settled(outcome: object, item_id: str) -> Settlement:
            return outcome_settlement(outcome, items[item_id], driver_name="d", requeue_delay=1.0)

        batch = [
            settled(Reschedule(at, {"n": 1, "deep": [{"x": "ü"}]}), "kept"),
            settled(Stop({"sent": [1, 2]}), "done"),
            attrs.evolve(settled(Reschedule(at, {"n": 1}), "bad-config"), config={"x": "\udcff"}),
            attrs.evolve(settled(Stop({"ok": True}), "bad-result"), result={"x": "\x00"}),
        ]
        assert await queue.settle_many(batch) == [True, True, True, True]
        kept = await queue.get("kept")
        assert (kept.state, kept.config, kept.due_at) == (
            ItemState.QUEUED,
            {"n": 1, "deep": [{"x": "ü"}]},
            at,
        )
        assert (await queue.get("done")).result == {"sent": [1, 2]}
        for item_id, kind in (("bad-config", "reschedule"), ("bad-result", "complete")):
            bad = await queue.get(item_id)
            assert bad.state is ItemState.DEAD, item_id
            assert bad.last_error is not None
            assert bad.last_error.startswith(f"the {kind} outcome could not be stored"), (
                bad.last_error
            )

    async def test_a_claimed_item_is_the_stored_item(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A claim returns every field as stored (the same item a read returns after it), however
        it is claimed: a plain claim, a settle-and-claim, the keyed path; with a rich config, an
        error history, a result, a uniqueness period and a timeout (the claims' decoders read
        their rows their own way)."""
        config = {"a": [1, 2.5, None, True, {"deep": ["ü", "\u2603", 10**15]}], "b": "", "c": {}}
        await queue.enqueue(
            "spec",
            item_id="rich",
            config=config,
            tenant_id="t",
            subject_id="s",
            idempotency_key="k",
            unique=dt.timedelta(hours=1),
            priority=-2,
            queue="named",
            evaluation_timeout=2.5,
        )
        await queue.enqueue("spec", item_id="keyed", concurrency_key="ck", concurrency_limit=2)
        await queue.enqueue("spec", item_id="empty", config=[])
        await queue.enqueue("spec", item_id="list", config=["x", {}])
        [claimed] = await queue.claim_due(["spec"], "w1", 30, 5, queue="named")
        assert claimed == await queue.get("rich")
        assert (claimed.config, claimed.timeout, claimed.priority) == (config, 2.5, -2)
        assert claimed.unique_until == START + dt.timedelta(hours=1)
        assert claimed.lease_expires_at == START + 30 * S
        # An error history and a result, then claimed again (a retried completed item keeps it).
        await queue.settle_many(
            [
                Settlement(
                    item_id="rich",
                    lease_version=claimed.lease_version,
                    kind=SettleKind.RETRY,
                    error="boom\nline 2",
                )
            ]
        )
        [again] = await queue.claim_due(["spec"], "w2", 30, 5, queue="named")
        assert again == await queue.get("rich")
        assert (again.error_count, again.last_error) == (1, "boom\nline 2")
        assert [e.error for e in again.errors] == ["boom\nline 2"]
        await queue.settle_many(
            [
                Settlement(
                    item_id="rich",
                    lease_version=again.lease_version,
                    kind=SettleKind.COMPLETE,
                    result={"r": [1, "ü"]},
                )
            ]
        )
        clock.advance(1)
        await queue.retry("rich")
        # The default queue's items, through settle_and_claim and the keyed path.
        _, claimed_named = await settle_then_claim(queue)([], ["spec"], "w3", 30, 5, queue="named")
        assert claimed_named == [await queue.get("rich")]
        assert claimed_named[0].result == {"r": [1, "ü"]}
        assert len(claimed_named[0].errors) == 1
        first = await queue.claim_due(["spec"], "w4", 30, 1)
        [settled], rest = await settle_then_claim(queue)(
            [
                Settlement(
                    item_id=first[0].id,
                    lease_version=first[0].lease_version,
                    kind=SettleKind.RELEASE,
                )
            ],
            ["spec"],
            "w4",
            30,
            5,
        )
        assert settled
        claimed_all = first[1:] + rest
        assert sorted(item.id for item in claimed_all) == ["empty", "keyed", "list"]
        for item in claimed_all:
            assert item == await queue.get(item.id)
        by_id = {item.id: item for item in claimed_all}
        assert by_id["empty"].config == []
        assert by_id["list"].config == ["x", {}]
        assert (by_id["keyed"].concurrency_key, by_id["keyed"].concurrency_limit) == ("ck", 2)

    async def test_claim_waits_for_due_time(self, queue: WorkQueue, clock: ManualClock) -> None:
        """An item is claimable from its due time on, and not a microsecond before."""
        await queue.enqueue("spec", due_at=START + 10 * S)
        clock.advance(10 - 1e-6)
        assert await queue.claim_due(["spec"], "w", 30, 1) == []
        clock.advance(1e-6)
        assert len(await queue.claim_due(["spec"], "w", 30, 1)) == 1

    async def test_claim_filters_by_spec(self, queue: WorkQueue) -> None:
        """Only items of the named specs are claimed; no specs claims nothing."""
        await queue.enqueue("a", item_id="1")
        await queue.enqueue("b", item_id="2")
        await queue.enqueue("c", item_id="3")
        assert await queue.claim_due([], "w", 30, 10) == []
        assert [i.id for i in await queue.claim_due(["a", "c"], "w", 30, 10)] == ["1", "3"]
        assert [i.id for i in await queue.claim_due(["a", "b", "c"], "w", 30, 10)] == ["2"]

    async def test_claim_limits_and_arguments(self, queue: WorkQueue) -> None:
        """A zero limit claims nothing; a negative limit or a lease that is not positive is
        refused."""
        await queue.enqueue("spec")
        assert await queue.claim_due(["spec"], "w", 30, 0) == []
        with pytest.raises(ValueError, match="limit"):
            await queue.claim_due(["spec"], "w", 30, -1)
        for lease in (0, -1, float("inf"), float("nan")):
            with pytest.raises(ValueError, match="lease"):
                await queue.claim_due(["spec"], "w", lease, 1)
        assert (await queue.list_items())[0].state is ItemState.QUEUED

    async def test_claim_takes_a_lease(self, queue: WorkQueue) -> None:
        """A claim sets the owner, the expiry (now + lease) and a strictly larger version."""
        item = await queue.enqueue("spec")
        claimed = await claim_one(queue, "w1", 12.5)
        assert claimed.id == item.id
        assert claimed.state is ItemState.RUNNING
        assert claimed.lease_owner == "w1"
        assert claimed.lease_expires_at == START + 12.5 * S
        assert claimed.lease_version > item.lease_version
        assert claimed.lease == Lease(item.id, claimed.lease_version, "w1")
        assert await queue.get(item.id) == claimed

    async def test_lease_expiry_and_rescue(self, queue: WorkQueue, clock: ManualClock) -> None:
        """A running item is claimable again once its lease expires, under a new version."""
        await queue.enqueue("spec")
        old = await claim_one(queue, "w1", 10)
        clock.advance(9.999)
        assert await queue.claim_due(["spec"], "w2", 10, 5) == []
        clock.advance(0.001)
        new = await claim_one(queue, "w2", 10)
        assert new.id == old.id
        assert new.lease_owner == "w2"
        assert new.lease_version > old.lease_version
        assert new.lease_expires_at == START + 20 * S
        with pytest.raises(LeaseLost):
            await seed_writes(queue).complete(old.id, old.lease_version)
        with pytest.raises(LeaseLost):
            await seed_writes(queue).renew(old.id, "w1", old.lease_version, 10)
        assert await queue.get(new.id) == new

    async def test_an_expired_lease_can_still_be_renewed_until_rescued(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Expiry alone takes nothing away: the owner may renew until someone else claims."""
        await queue.enqueue("spec")
        item = await claim_one(queue, "w1", 10)
        clock.advance(15)
        assert (
            await seed_writes(queue).renew(item.id, "w1", item.lease_version, 10)
            is LeaseStatus.HELD
        )
        assert (await queue.get(item.id)).lease_expires_at == START + 25 * S
        assert await queue.claim_due(["spec"], "w2", 10, 1) == []

    async def test_concurrent_claimers_never_share_an_item(self, queue: WorkQueue) -> None:
        """Many claimers at once receive disjoint sets of items, and together all of them."""
        ids = {f"item-{n:03}" for n in range(60)}
        for item_id in sorted(ids):
            await queue.enqueue("spec", item_id=item_id)
        claims: dict[str, list[str]] = {}

        async def claimer(worker: str) -> None:
            mine = claims.setdefault(worker, [])
            while True:
                got = await queue.claim_due(["spec"], worker, 60, 3)
                if not got:
                    return
                mine.extend(item.id for item in got)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for n in range(12):
                    nursery.start_soon(claimer, f"w{n}")
        everything = [item_id for mine in claims.values() for item_id in mine]
        assert len(everything) == len(set(everything)) == 60
        assert set(everything) == ids
        for worker, mine in claims.items():
            for item_id in mine:
                assert (await queue.get(item_id)).lease_owner == worker

    # -- renewing
    async def test_renew_extends_the_lease(self, queue: WorkQueue, clock: ManualClock) -> None:
        """Renewal sets the expiry to now + lease and says the lease is held."""
        await queue.enqueue("spec")
        item = await claim_one(queue, "w1", 10)
        clock.advance(8)
        assert (
            await seed_writes(queue).renew(item.id, "w1", item.lease_version, 20)
            is LeaseStatus.HELD
        )
        got = await queue.get(item.id)
        assert got.lease_expires_at == START + 28 * S
        assert got.lease_version == item.lease_version
        clock.advance(19)
        assert await queue.claim_due(["spec"], "w2", 10, 1) == []

    async def test_renew_checks_owner_and_version(self, queue: WorkQueue) -> None:
        """Renewal by another owner, an old version, or of an unknown item is refused."""
        await queue.enqueue("spec")
        item = await claim_one(queue, "w1", 10)
        with pytest.raises(LeaseLost):
            await seed_writes(queue).renew(item.id, "w2", item.lease_version, 10)
        with pytest.raises(LeaseLost):
            await seed_writes(queue).renew(item.id, "w1", item.lease_version + 1, 10)
        with pytest.raises(LeaseLost):
            await seed_writes(queue).renew("nope", "w1", 1, 10)
        with pytest.raises(ValueError, match="lease"):
            await seed_writes(queue).renew(item.id, "w1", item.lease_version, 0)
        assert await queue.get(item.id) == item

    async def test_renew_many_mixed(self, queue: WorkQueue, clock: ManualClock) -> None:
        """renew_many renews the fresh leases and reports stale ones as LOST, changing nothing."""
        for n in range(4):
            await queue.enqueue("spec", item_id=f"i{n}")
        items = await queue.claim_due(["spec"], "w1", 10, 4)
        await queue.request_cancel("i2")
        await seed_writes(queue).complete("i3", items[3].lease_version)
        stale_i3 = await queue.get("i3")
        clock.advance(5)
        statuses = await queue.renew_many(
            [
                items[0].lease,
                Lease("i1", items[1].lease_version, "intruder"),
                items[2].lease,
                items[3].lease,
                Lease("missing", 1, "w1"),
            ],
            30,
        )
        assert statuses == {
            "i0": LeaseStatus.HELD,
            "i1": LeaseStatus.LOST,
            "i2": LeaseStatus.CANCEL_REQUESTED,
            "i3": LeaseStatus.LOST,
            "missing": LeaseStatus.LOST,
        }
        assert (await queue.get("i0")).lease_expires_at == START + 35 * S
        assert (await queue.get("i1")).lease_expires_at == START + 10 * S
        assert (await queue.get("i2")).lease_expires_at == START + 35 * S
        assert await queue.get("i3") == stale_i3
        assert await queue.renew_many([], 30) == {}

    # -- fencing
    @needs(SEED_WRITES, when={"write": "mark_error"})
    @pytest.mark.parametrize("write", sorted(STALE_WRITES))
    @pytest.mark.parametrize("how", ["rescued", "settled", "wrong-version"])
    async def test_every_stale_write_is_refused(
        self, queue: WorkQueue, clock: ManualClock, write: str, how: str
    ) -> None:
        """A write under a lease that is not current raises LeaseLost and changes nothing."""
        await queue.enqueue("spec", item_id="x")
        held = await claim_one(queue, "w1", 10)
        stale = held
        if how == "rescued":
            clock.advance(10)
            await claim_one(queue, "w2", 10)
        elif how == "settled":
            await seed_writes(queue).release("x", held.lease_version, 0)
        else:
            stale = WorkItem(**{**_fields(held), "lease_version": held.lease_version + 1000})
        before = await queue.get("x")
        with pytest.raises(LeaseLost) as info:
            await STALE_WRITES[write](queue, stale)
        assert info.value.item_id == "x"
        assert info.value.lease_version == stale.lease_version
        assert await queue.get("x") == before
        assert await queue.settle_many(
            [
                Settlement(
                    item_id="x", lease_version=stale.lease_version, kind=kind, error="e", at=START
                )
                for kind in SettleKind
            ]
        ) == [False] * len(SettleKind)
        assert await queue.get("x") == before

    @needs(SEED_WRITES)
    async def test_writes_to_unknown_items_are_refused(self, queue: WorkQueue) -> None:
        """Fenced writes naming an item that does not exist raise LeaseLost."""
        with pytest.raises(LeaseLost):
            await seed_writes(queue).complete("nope", 1)
        with pytest.raises(LeaseLost):
            await seed_writes(queue).mark_error("nope", 1, "e")
        assert await queue.counts() == {}

    # -- attempts (class 2)
    @needs(SEED_WRITES)
    async def test_the_claim_counts_attempts(self, queue: WorkQueue, clock: ManualClock) -> None:
        """Every claim adds one (a rescue too); a successful evaluation or retry sets it to zero."""
        item = await queue.enqueue("spec", item_id="x")
        assert item.attempt == 0
        first = await claim_one(queue, lease=5)
        assert first.attempt == 1
        clock.advance(6)
        second = await claim_one(queue, "w2")  # rescued: its worker died, no error written
        assert second.attempt == 2
        assert (await queue.get("x")).attempt == 2
        await seed_writes(queue).release(
            "x", second.lease_version, 0
        )  # handed back at shutdown: not counted
        assert (await queue.get("x")).attempt == 1
        third = await claim_one(queue)
        await seed_writes(queue).mark_error("x", third.lease_version, "boom")
        [ok] = await queue.settle_many(
            [
                Settlement(
                    item_id="x", lease_version=third.lease_version, kind=SettleKind.RETRY, error="e"
                )
            ]
        )
        assert ok
        assert (await queue.get("x")).attempt == 2
        fourth = await claim_one(queue)
        assert fourth.attempt == 3
        await queue.settle_many(
            [Settlement(item_id="x", lease_version=fourth.lease_version, kind=SettleKind.CONTINUE)]
        )
        assert (await queue.get("x")).attempt == 0
        fifth = await claim_one(queue)
        await queue.settle_many(
            [
                Settlement(
                    item_id="x", lease_version=fifth.lease_version, kind=SettleKind.DEAD, error="e"
                )
            ]
        )
        assert (await queue.get("x")).attempt == 1
        assert (await queue.retry("x")).attempt == 0
