"""The WorkQueue contract, run against every backend (memory, SQLite, PostgreSQL).

"Now" is a ManualClock the tests advance, so leases expire without any real sleep.
"""

from __future__ import annotations

import datetime as dt

import attrs
import pytest
import trio

from ... import (
    ConfigError,
    ItemNotFound,
    ItemStateError,
    LeaseLost,
)
from ...job import (
    MAX_ERRORS,
    ErrorEntry,
    ItemState,
    Lease,
    LeaseStatus,
    NewItem,
    SettleKind,
    Settlement,
    WorkItem,
    storable_text,
)
from ...queues import WorkQueue
from ._clock import START, ManualClock
from ._support import SEED_WRITES, S, claim_one, needs, seed_writes

_AWKWARD_IDS = ['q"uote', "back\\slash", 'a","b', "com,ma", "{brace}", " spaced ", "NULL", "ü☃"]


class SettlingContract:
    """Settlements: kinds, fencing of batches, error histories."""

    # -- settling
    @needs(SEED_WRITES)
    async def test_release_keeps_the_error_count(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """release hands the item back due after the delay, lease cleared, errors untouched."""
        await queue.enqueue("spec", item_id="x")
        item = await claim_one(queue)
        await seed_writes(queue).mark_error("x", item.lease_version, "boom")
        clock.advance(3)
        await seed_writes(queue).release("x", item.lease_version, 7.5)
        got = await queue.get("x")
        assert got.state is ItemState.QUEUED
        assert got.due_at == START + 10.5 * S
        assert (got.lease_owner, got.lease_expires_at) == (None, None)
        assert (got.error_count, got.last_error) == (1, "boom")
        assert got.lease_version == item.lease_version
        with pytest.raises(ValueError, match="delay"):
            await seed_writes(queue).release("x", item.lease_version, -1)

    @needs(SEED_WRITES)
    async def test_mark_error_keeps_the_lease(self, queue: WorkQueue) -> None:
        """mark_error counts the error and records it; the lease stays held."""
        await queue.enqueue("spec", item_id="x")
        item = await claim_one(queue)
        await seed_writes(queue).mark_error("x", item.lease_version, "one")
        await seed_writes(queue).mark_error("x", item.lease_version, "two")
        got = await queue.get("x")
        assert (got.state, got.error_count, got.last_error) == (ItemState.RUNNING, 2, "two")
        assert got.lease_expires_at == item.lease_expires_at
        assert await seed_writes(queue).renew("x", "w1", item.lease_version, 30) is LeaseStatus.HELD

    @needs(SEED_WRITES)
    async def test_reschedule_sets_due_time_and_config_together(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """reschedule writes the next due time and the new config in one write and clears errors."""
        await queue.enqueue("spec", item_id="x", config={"run": 0})
        item = await claim_one(queue)
        await seed_writes(queue).mark_error("x", item.lease_version, "flaky")
        clock.advance(1)
        await seed_writes(queue).reschedule(
            "x", item.lease_version, START + dt.timedelta(days=1), {"run": 1}
        )
        got = await queue.get("x")
        assert (got.state, got.due_at, got.config) == (
            ItemState.QUEUED,
            START + dt.timedelta(days=1),
            {"run": 1},
        )
        assert (got.error_count, got.last_error) == (0, "flaky")
        assert (got.lease_owner, got.lease_expires_at) == (None, None)
        with pytest.raises(LeaseLost):
            await seed_writes(queue).reschedule("x", item.lease_version, START, {"run": 2})
        assert await queue.get("x") == got

    async def test_reschedule_refuses_a_non_json_config(self, queue: WorkQueue) -> None:
        """A reschedule with a config that is not JSON raises ConfigError and changes nothing."""
        await queue.enqueue("spec", item_id="x")
        item = await claim_one(queue)
        with pytest.raises(ConfigError):
            await seed_writes(queue).reschedule("x", item.lease_version, START, {"bad": {1, 2}})
        assert await queue.get("x") == item

    async def test_complete_finishes_for_good(self, queue: WorkQueue, clock: ManualClock) -> None:
        """A completed item keeps its due time, loses its lease and is never claimed again."""
        await queue.enqueue("spec", item_id="x", due_at=START - S)
        item = await claim_one(queue)
        await seed_writes(queue).complete("x", item.lease_version)
        got = await queue.get("x")
        assert (got.state, got.due_at, got.lease_owner, got.lease_expires_at) == (
            ItemState.COMPLETED,
            START - S,
            None,
            None,
        )
        clock.advance(86_400)
        assert await queue.claim_due(["spec"], "w", 30, 10) == []
        assert await queue.next_due_at(["spec"]) is None

    async def test_error_count_semantics(self, queue: WorkQueue, clock: ManualClock) -> None:
        """retry and dead add one; continue and reschedule reset; release leaves the count alone."""

        async def settle(kind: SettleKind, **extra: object) -> WorkItem:
            item = await claim_one(queue)
            assert await queue.settle_many(
                [Settlement(item_id="x", lease_version=item.lease_version, kind=kind, **extra)]  # type: ignore[arg-type]
            ) == [True]
            return await queue.get("x")

        await queue.enqueue("spec", item_id="x")
        got = await settle(SettleKind.RETRY, error="e1", delay=2)
        assert (got.state, got.error_count, got.last_error) == (ItemState.QUEUED, 1, "e1")
        assert got.due_at == START + 2 * S
        clock.advance(2)
        got = await settle(SettleKind.RETRY, error="e2")
        assert (got.error_count, got.last_error, got.due_at) == (2, "e2", START + 2 * S)
        got = await settle(SettleKind.RELEASE)
        assert (got.error_count, got.last_error) == (2, "e2")
        got = await settle(SettleKind.CONTINUE, delay=1)
        assert (got.error_count, got.last_error, got.due_at) == (0, "e2", START + 3 * S)
        clock.advance(1)
        got = await settle(SettleKind.RETRY, error="e3")
        got = await settle(SettleKind.RESCHEDULE, at=START, config={"k": 1})
        assert (got.error_count, got.config, got.due_at) == (0, {"k": 1}, START)
        got = await settle(SettleKind.RETRY, error="e4")
        got = await settle(SettleKind.DEAD, error="last")
        assert (got.state, got.error_count, got.last_error) == (ItemState.DEAD, 2, "last")
        assert await queue.claim_due(["spec"], "w", 30, 1) == []

    @needs(SEED_WRITES)
    async def test_error_history_is_appended_in_order(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """mark_error, retry and dead each append {at, worker, attempt, error}; other outcomes
        don't."""
        await queue.enqueue("spec", item_id="x")
        item = await claim_one(queue, "w1")
        await seed_writes(queue).mark_error("x", item.lease_version, "marked")
        clock.advance(1)
        assert await queue.settle_many(
            [
                Settlement(
                    item_id="x", lease_version=item.lease_version, kind=SettleKind.RETRY, error="e1"
                )
            ]
        ) == [True]
        item = await claim_one(queue, "w2")
        assert await queue.settle_many(
            [Settlement(item_id="x", lease_version=item.lease_version, kind=SettleKind.CONTINUE)]
        ) == [True]
        item = await claim_one(queue, "w3")
        clock.advance(1)
        assert await queue.settle_many(
            [
                Settlement(
                    item_id="x", lease_version=item.lease_version, kind=SettleKind.DEAD, error="e2"
                )
            ]
        ) == [True]
        got = await queue.get("x")
        assert got.errors == (
            ErrorEntry(at=START, worker="w1", attempt=1, error="marked"),
            ErrorEntry(at=START + S, worker="w1", attempt=1, error="e1"),
            ErrorEntry(at=START + 2 * S, worker="w3", attempt=1, error="e2"),
        )
        assert [each.error for each in (await queue.list_items())[0].errors] == [
            "marked",
            "e1",
            "e2",
        ]

    @needs(SEED_WRITES)
    async def test_error_history_is_bounded(self, queue: WorkQueue, clock: ManualClock) -> None:
        """Past MAX_ERRORS errors the oldest are dropped; the newest MAX_ERRORS stay, in order."""
        await queue.enqueue("spec", item_id="x")
        item = await claim_one(queue)
        for n in range(MAX_ERRORS + 3):
            await seed_writes(queue).mark_error("x", item.lease_version, f"e{n}")
        got = await queue.get("x")
        assert [each.error for each in got.errors] == [f"e{n}" for n in range(3, MAX_ERRORS + 3)]
        assert got.error_count == MAX_ERRORS + 3

    @needs(SEED_WRITES)
    async def test_error_history_is_kept_across_retry(self, queue: WorkQueue) -> None:
        """retry() puts a dead item back with its error history: it is history, not state."""
        await queue.enqueue("spec", item_id="x")
        item = await claim_one(queue)
        await queue.settle_many(
            [
                Settlement(
                    item_id="x",
                    lease_version=item.lease_version,
                    kind=SettleKind.DEAD,
                    error="gone",
                )
            ]
        )
        got = await queue.retry("x")
        assert [each.error for each in got.errors] == ["gone"]
        item = await claim_one(queue, "w2")
        await seed_writes(queue).mark_error("x", item.lease_version, "again")
        assert [(e.worker, e.error) for e in (await queue.get("x")).errors] == [
            ("w1", "gone"),
            ("w2", "again"),
        ]

    @needs(SEED_WRITES)
    async def test_error_history_stores_unstorable_text_escaped(self, queue: WorkQueue) -> None:
        """An error with a NUL or a lone surrogate is kept in the history escaped, like
        last_error."""
        await queue.enqueue("spec", item_id="x")
        item = await claim_one(queue)
        await seed_writes(queue).mark_error("x", item.lease_version, "nul \x00 and \udcff")
        got = await queue.get("x")
        assert got.errors[0].error == got.last_error == storable_text("nul \x00 and \udcff")

    async def test_settle_many_mixed(self, queue: WorkQueue, clock: ManualClock) -> None:
        """settle_many applies fresh entries and reports stale ones, each on its own, in order."""
        for n in range(5):
            await queue.enqueue("spec", item_id=f"i{n}")
        items = {i.id: i for i in await queue.claim_due(["spec"], "w1", 10, 5)}
        await seed_writes(queue).complete("i4", items["i4"].lease_version)
        clock.advance(1)
        v = {item_id: item.lease_version for item_id, item in items.items()}
        results = await queue.settle_many(
            [
                Settlement(item_id="i0", lease_version=v["i0"], kind=SettleKind.COMPLETE),
                Settlement(item_id="i1", lease_version=v["i1"] + 7, kind=SettleKind.COMPLETE),
                Settlement(
                    item_id="i1", lease_version=v["i1"], kind=SettleKind.RETRY, error="x", delay=4
                ),
                Settlement(item_id="i1", lease_version=v["i1"], kind=SettleKind.COMPLETE),
                Settlement(item_id="i2", lease_version=v["i2"], kind=SettleKind.CANCEL),
                Settlement(
                    item_id="i3",
                    lease_version=v["i3"],
                    kind=SettleKind.RESCHEDULE,
                    at=START + 60 * S,
                    config=[1, "two"],
                ),
                Settlement(item_id="i4", lease_version=v["i4"], kind=SettleKind.RELEASE),
                Settlement(item_id="ghost", lease_version=1, kind=SettleKind.COMPLETE),
            ]
        )
        assert results == [True, False, True, False, True, True, False, False]
        got = {i.id: i for i in await queue.list_items()}
        assert got["i0"].state is ItemState.COMPLETED
        assert (got["i1"].state, got["i1"].error_count, got["i1"].due_at) == (
            ItemState.QUEUED,
            1,
            START + 5 * S,
        )
        assert got["i2"].state is ItemState.CANCELLED
        assert (got["i3"].due_at, got["i3"].config) == (START + 60 * S, [1, "two"])
        assert got["i4"].state is ItemState.COMPLETED
        assert await queue.settle_many([]) == []

    async def test_settle_many_takes_ids_of_any_text(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Item ids holding quotes, backslashes, commas, braces, spaces, the word NULL or non-ASCII
        text are settled in one batch, each as asked (a backend may write a batch as text it builds
        itself, and must quote every one right)."""
        for item_id in _AWKWARD_IDS:
            await queue.enqueue("spec", item_id=item_id)
        items = await queue.claim_due(["spec"], "w1", 30, len(_AWKWARD_IDS))
        assert sorted(item.id for item in items) == sorted(_AWKWARD_IDS)
        kinds = [SettleKind.COMPLETE, SettleKind.CONTINUE, SettleKind.CANCEL]
        settlements = [
            Settlement(item_id=item.id, lease_version=item.lease_version, kind=kinds[n % 3])
            for n, item in enumerate(items)
        ]
        stale = Settlement(item_id='q"uote', lease_version=999, kind=SettleKind.COMPLETE)
        assert await queue.settle_many([*settlements, stale]) == [True] * len(items) + [False]
        expected = {
            SettleKind.COMPLETE: ItemState.COMPLETED,
            SettleKind.CONTINUE: ItemState.QUEUED,
            SettleKind.CANCEL: ItemState.CANCELLED,
        }
        for settlement in settlements:
            assert (await queue.get(settlement.item_id)).state is expected[settlement.kind]

    async def test_settle_many_a_large_batch(self, queue: WorkQueue, clock: ManualClock) -> None:
        """A batch of 150 mixed outcomes (more than one statement takes), with stale and repeated
        entries among them, gives every entry what it would get on its own."""
        n = 150
        for k in range(n):
            await queue.enqueue("spec", item_id=f"i{k:03d}", config={"k": k})
        items = await queue.claim_due(["spec"], "w1", 30, n)
        assert len(items) == n
        v = {item.id: item.lease_version for item in items}
        clock.advance(1)
        kinds = [
            SettleKind.COMPLETE,
            SettleKind.RETRY,
            SettleKind.CONTINUE,
            SettleKind.RESCHEDULE,
            SettleKind.DEAD,
            SettleKind.CANCEL,
            SettleKind.RELEASE,
        ]
        batch: list[Settlement] = []
        expected: list[bool] = []
        for k in range(n):
            item_id, kind = f"i{k:03d}", kinds[k % len(kinds)]
            fresh = Settlement(
                item_id=item_id,
                lease_version=v[item_id],
                kind=kind,
                delay=k % 3,
                at=START + (100 + k) * S if kind is SettleKind.RESCHEDULE else None,
                config={"next": k} if kind is SettleKind.RESCHEDULE else None,
                result={"done": k} if kind is SettleKind.COMPLETE else None,
                error=f"e{k}" if kind in (SettleKind.RETRY, SettleKind.DEAD) else None,
            )
            if k % 11 == 5:  # a stale version first: refused, the fresh one after it applies
                batch.append(attrs.evolve(fresh, lease_version=v[item_id] + 1))
                expected.append(False)
            batch.append(fresh)
            expected.append(True)
            if k % 13 == 7:  # the same (id, version) again: applied once, the repeat refused
                batch.append(batch[-1])
                expected.append(False)
        batch.append(Settlement(item_id="ghost", lease_version=1, kind=SettleKind.COMPLETE))
        expected.append(False)
        assert await queue.settle_many(batch) == expected
        got = {i.id: i for i in await queue.list_items(limit=1000)}
        for k in range(n):
            item, kind = got[f"i{k:03d}"], kinds[k % len(kinds)]
            assert (item.lease_owner, item.lease_expires_at) == (None, None)
            if kind is SettleKind.COMPLETE:
                assert (item.state, item.result) == (ItemState.COMPLETED, {"done": k})
            elif kind is SettleKind.RETRY:
                assert (item.state, item.due_at, item.error_count, item.last_error) == (
                    ItemState.QUEUED,
                    START + (1 + k % 3) * S,
                    1,
                    f"e{k}",
                )
                assert [e.error for e in item.errors] == [f"e{k}"]
            elif kind is SettleKind.CONTINUE:
                assert (item.state, item.due_at, item.attempt) == (
                    ItemState.QUEUED,
                    START + (1 + k % 3) * S,
                    0,
                )
            elif kind is SettleKind.RESCHEDULE:
                assert (item.state, item.due_at, item.config) == (
                    ItemState.QUEUED,
                    START + (100 + k) * S,
                    {"next": k},
                )
            elif kind is SettleKind.DEAD:
                assert (item.state, item.error_count, item.last_error) == (
                    ItemState.DEAD,
                    1,
                    f"e{k}",
                )
            elif kind is SettleKind.CANCEL:
                assert item.state is ItemState.CANCELLED
            else:
                assert (item.state, item.due_at, item.attempt) == (
                    ItemState.QUEUED,
                    START + (1 + k % 3) * S,
                    0,
                )

    async def test_renew_many_a_large_batch(self, queue: WorkQueue, clock: ManualClock) -> None:
        """600 leases in one renew_many (more than one statement takes), some stale, some named
        twice: the fresh ones are renewed, the rest reported LOST."""
        n = 600
        await queue.enqueue_many([NewItem(spec_id="spec", item_id=f"i{k:03d}") for k in range(n)])
        items = await queue.claim_due(["spec"], "w1", 10, n)
        assert len(items) == n
        clock.advance(5)
        leases = []
        for k, item in enumerate(items):
            if k % 7 == 3:
                leases.append(Lease(item.id, item.lease_version, "intruder"))
            else:
                leases.append(item.lease)
            if k % 50 == 0:
                leases.append(leases[-1])
        statuses = await queue.renew_many(leases, 30)
        assert len(statuses) == n
        for k, item in enumerate(items):
            stale = k % 7 == 3
            assert statuses[item.id] is (LeaseStatus.LOST if stale else LeaseStatus.HELD)
            got = await queue.get(item.id)
            assert got.lease_expires_at == START + (10 if stale else 35) * S


class CancellationContract:
    """Cancellation, retry and waiting for work."""

    # -- cancellation and retry
    async def test_cancel_a_queued_item_at_once(self, queue: WorkQueue) -> None:
        """Cancelling a queued item finishes it as cancelled straight away."""
        await queue.enqueue("spec", item_id="x")
        got = await queue.request_cancel("x")
        assert (got.state, got.cancel_requested) == (ItemState.CANCELLED, True)
        assert await queue.get("x") == got
        assert await queue.claim_due(["spec"], "w", 30, 1) == []

    async def test_cancel_a_running_item_flags_it(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Cancelling a running item flags it; the owner hears it on renewal and settles it."""
        await queue.enqueue("spec", item_id="x")
        item = await claim_one(queue)
        got = await queue.request_cancel("x")
        assert (got.state, got.cancel_requested) == (ItemState.RUNNING, True)
        assert got.lease_version == item.lease_version
        assert (
            await seed_writes(queue).renew("x", "w1", item.lease_version, 30)
            is LeaseStatus.CANCEL_REQUESTED
        )
        assert await queue.request_cancel("x") == await queue.get("x")
        await queue.settle_many(
            [Settlement(item_id="x", lease_version=item.lease_version, kind=SettleKind.CANCEL)]
        )
        assert (await queue.get("x")).state is ItemState.CANCELLED

    async def test_a_flagged_item_is_claimed_with_its_flag(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """When the owner of a flagged item dies, the rescuer sees the flag on the claimed item."""
        await queue.enqueue("spec", item_id="x")
        await claim_one(queue, "w1", 10)
        await queue.request_cancel("x")
        clock.advance(10)
        rescued = await claim_one(queue, "w2", 10)
        assert rescued.cancel_requested

    async def test_cancel_leaves_finished_items_alone(self, queue: WorkQueue) -> None:
        """Cancelling a finished item changes nothing; an unknown one raises ItemNotFound."""
        await queue.enqueue("spec", item_id="x")
        item = await claim_one(queue)
        await seed_writes(queue).complete("x", item.lease_version)
        done = await queue.get("x")
        assert await queue.request_cancel("x") == done
        with pytest.raises(ItemNotFound):
            await queue.request_cancel("nope")

    async def test_retry_puts_a_finished_item_back(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """retry requeues a dead or cancelled item with no errors and no cancel flag."""
        await queue.enqueue("spec", item_id="x")
        item = await claim_one(queue)
        await queue.settle_many(
            [
                Settlement(
                    item_id="x", lease_version=item.lease_version, kind=SettleKind.DEAD, error="e"
                )
            ]
        )
        clock.advance(5)
        got = await queue.retry("x")
        assert (got.state, got.due_at, got.error_count, got.cancel_requested) == (
            ItemState.QUEUED,
            START + 5 * S,
            0,
            False,
        )
        assert await queue.get("x") == got
        await queue.request_cancel("x")
        got = await queue.retry("x", at=START + 60 * S)
        assert (got.state, got.due_at, got.cancel_requested) == (
            ItemState.QUEUED,
            START + 60 * S,
            False,
        )
        got = await queue.retry("x")
        assert got.due_at == START + 5 * S

    async def test_retry_refuses_running_and_unknown_items(self, queue: WorkQueue) -> None:
        """A running item cannot be retried; an unknown one raises ItemNotFound."""
        await queue.enqueue("spec", item_id="x")
        item = await claim_one(queue)
        with pytest.raises(ItemStateError):
            await queue.retry("x")
        assert await queue.get("x") == item
        with pytest.raises(ItemNotFound):
            await queue.retry("nope")

    # -- waiting
    async def test_next_due_at(self, queue: WorkQueue, clock: ManualClock) -> None:
        """The earliest due time of queued items or lease expiry of running ones, per spec."""
        assert await queue.next_due_at(["spec"]) is None
        await queue.enqueue("spec", item_id="late", due_at=START + 100 * S)
        await queue.enqueue("other", item_id="o", due_at=START + 1 * S)
        assert await queue.next_due_at(["spec"]) == START + 100 * S
        assert await queue.next_due_at(["spec", "other"]) == START + 1 * S
        await queue.enqueue("spec", item_id="now")
        assert await queue.next_due_at(["spec"]) == START
        await claim_one(queue, "w", 40)
        assert await queue.next_due_at(["spec"]) == START + 40 * S
        assert await queue.next_due_at([]) is None

    async def test_wait_for_work_returns_when_work_is_due(self, queue: WorkQueue) -> None:
        """wait_for_work returns at once when something is due already."""
        await queue.enqueue("spec")
        with trio.fail_after(5):
            await queue.wait_for_work(["spec"])

    async def test_wait_for_work_wakes_on_enqueue(self, queue: WorkQueue) -> None:
        """A waiter wakes when this process enqueues due work, long before its poll bound."""
        woke = trio.Event()

        async def waiter() -> None:
            await queue.wait_for_work(["spec"])
            woke.set()

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                await trio.sleep(0.2)
                assert not woke.is_set()
                await queue.enqueue("other")
                await queue.enqueue("spec", due_at=START + 3600 * S)
                await trio.sleep(0.2)
                assert not woke.is_set()
                await queue.enqueue("spec")
                await woke.wait()

    async def test_wait_for_work_wakes_on_release(self, queue: WorkQueue) -> None:
        """A waiter wakes when a running item is handed back due now."""
        await queue.enqueue("spec", item_id="x")
        item = await claim_one(queue, "w1", 3600)
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:

                async def release_soon() -> None:
                    await trio.sleep(0.1)
                    await seed_writes(queue).release("x", item.lease_version, 0)

                nursery.start_soon(release_soon)
                await queue.wait_for_work(["spec"])
        assert (await queue.get("x")).state is ItemState.QUEUED

    async def test_aclose_is_idempotent(self, queue: WorkQueue) -> None:
        """Closing twice is fine."""
        await queue.aclose()
        await queue.aclose()
