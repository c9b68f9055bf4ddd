"""The durable journal (:class:`~trio_supervise.queues.DurableJournal`, issue 31): each item
incarnation's journal, written fenced by the lease version, and the events sent to items."""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
import pytest
import trio

from ... import ItemNotFound, ItemStateError, LeaseLost
from ...job import EntryKind, ItemState, JournalEntry, SettleKind, Settlement, WorkItem
from ...queues import Capability, WorkQueue
from ._clock import START, ManualClock
from ._support import claim_one, needs


def entry(position: int, kind: EntryKind = EntryKind.STEP, name: str = "s", **more: Any) -> Any:
    """A journal entry at *position*, finished at the suite's start unless told otherwise."""
    fields: dict[str, Any] = {"started_at": START, "finished_at": START}
    fields.update(more)
    return JournalEntry(position=position, kind=kind, name=name, **fields)


def journal(queue: WorkQueue) -> Any:
    """*queue* as its durable journal port (the tests here need the capability)."""
    return queue


async def running(queue: WorkQueue, item_id: str = "wf") -> WorkItem:
    """Enqueue *item_id* (spec ``spec``) and claim it."""
    await queue.enqueue("spec", item_id=item_id)
    return await claim_one(queue)


async def settle(queue: WorkQueue, item: WorkItem, kind: SettleKind, **more: Any) -> None:
    """Settle *item*, as claimed, as *kind* (with *more* of the settlement's fields)."""
    written = await queue.settle_many(
        [Settlement(item_id=item.id, lease_version=item.lease_version, kind=kind, **more)]
    )
    assert written == [True]


class DurableJournalContract:
    """Journal entries are written only under the current lease, once per position (a pending
    wait excepted), read back in order for the current incarnation alone; events are kept for
    unfinished items and wake a queued item waiting for them; both go with their item."""

    @needs(Capability.DURABLE_JOURNAL)
    async def test_entries_come_back_in_order_with_their_fields(self, queue: WorkQueue) -> None:
        """Recorded entries are read back by position, results, times and attempts intact."""
        item = await running(queue)
        later = START + dt.timedelta(days=3)
        await journal(queue).record_entry(
            "wf", item.lease_version, entry(1, EntryKind.SLEEP, "nap", wake_at=later)
        )
        await journal(queue).record_entry(
            "wf", item.lease_version, entry(0, result={"user": [1, "a"]}, attempts=3)
        )
        read = await journal(queue).read_journal("wf")
        assert [(e.position, e.kind, e.name) for e in read.entries] == [
            (0, EntryKind.STEP, "s"),
            (1, EntryKind.SLEEP, "nap"),
        ]
        assert read.entries[0].result == {"user": [1, "a"]}
        assert read.entries[0].attempts == 3
        assert read.entries[0].finished_at == START
        assert read.entries[1].wake_at == later
        assert read.events == ()

    @needs(Capability.DURABLE_JOURNAL)
    async def test_a_stale_owner_records_nothing(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """After the lease expired and another worker claimed the item, the first owner's
        write raises LeaseLost and the journal stays as the new owner left it."""
        first = await running(queue)
        clock.advance(31)
        second = await claim_one(queue, "w2")
        assert second.lease_version != first.lease_version
        with pytest.raises(LeaseLost):
            await journal(queue).record_entry("wf", first.lease_version, entry(0, name="old"))
        await journal(queue).record_entry("wf", second.lease_version, entry(0, name="new"))
        [only] = (await journal(queue).read_journal("wf")).entries
        assert only.name == "new"

    @needs(Capability.DURABLE_JOURNAL)
    async def test_nothing_is_recorded_for_an_item_that_is_not_running(
        self, queue: WorkQueue
    ) -> None:
        """A queued or unknown item takes no entry (LeaseLost), whatever version is named."""
        item = await queue.enqueue("spec", item_id="wf")
        with pytest.raises(LeaseLost):
            await journal(queue).record_entry("wf", item.lease_version, entry(0))
        with pytest.raises(LeaseLost):
            await journal(queue).record_entry("nobody", 1, entry(0))
        assert (await journal(queue).read_journal("wf")).entries == ()

    @needs(Capability.DURABLE_JOURNAL)
    async def test_a_position_is_written_once_but_a_pending_wait_is_resolved(
        self, queue: WorkQueue
    ) -> None:
        """A second write at a recorded position is refused (ItemStateError naming what is
        there); a pending wait is replaced by its resolution, then fixed too."""
        item = await running(queue)
        version = item.lease_version
        await journal(queue).record_entry("wf", version, entry(0, name="first"))
        with pytest.raises(ItemStateError, match="step 'first'"):
            await journal(queue).record_entry("wf", version, entry(0, name="again"))
        pending = entry(1, EntryKind.WAIT, "approved", finished_at=None)
        await journal(queue).record_entry("wf", version, pending)
        assert (await journal(queue).read_journal("wf")).entries[1].pending
        resolved = entry(1, EntryKind.WAIT, "approved", result={"ok": True})
        await journal(queue).record_entry("wf", version, resolved)
        with pytest.raises(ItemStateError):
            await journal(queue).record_entry("wf", version, resolved)
        assert (await journal(queue).read_journal("wf")).entries[1].result == {"ok": True}

    @needs(Capability.DURABLE_JOURNAL)
    async def test_the_journal_survives_a_retry_and_goes_with_its_item(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """``retry`` keeps the journal (the same incarnation); a delete drops it, and the item
        id used again starts with an empty journal and no events."""
        item = await running(queue)
        await journal(queue).record_entry("wf", item.lease_version, entry(0))
        await journal(queue).send_event("wf", "hello", 1)
        await settle(queue, item, SettleKind.DEAD, error="boom")
        await queue.retry("wf")
        kept = await journal(queue).read_journal("wf")
        assert [e.name for e in kept.entries] == ["s"]
        assert [e.name for e in kept.events] == ["hello"]
        await queue.request_cancel("wf")
        await queue.delete("wf")
        with pytest.raises(ItemNotFound):
            await journal(queue).read_journal("wf")
        await queue.enqueue("spec", item_id="wf")
        fresh = await journal(queue).read_journal("wf")
        assert (fresh.entries, fresh.events) == ((), ())

    @needs(Capability.DURABLE_JOURNAL)
    async def test_pruning_an_item_drops_its_journal(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """An item pruned takes its journal and events with it: the id used again sees none."""
        item = await running(queue)
        await journal(queue).record_entry("wf", item.lease_version, entry(0))
        await journal(queue).send_event("wf", "hello", None)
        await settle(queue, item, SettleKind.COMPLETE)
        clock.advance(3600)
        assert (await queue.prune({ItemState.COMPLETED: 60}))[ItemState.COMPLETED] == 1
        await queue.enqueue("spec", item_id="wf")
        fresh = await journal(queue).read_journal("wf")
        assert (fresh.entries, fresh.events) == ((), ())

    @needs(Capability.DURABLE_JOURNAL)
    async def test_events_are_kept_in_order_for_unfinished_items_only(
        self, queue: WorkQueue
    ) -> None:
        """Events sent to a queued or running item are kept in order with their payloads; an
        unknown item raises ItemNotFound, a finished one ItemStateError, and nothing is kept."""
        await queue.enqueue("spec", item_id="wf")
        await journal(queue).send_event("wf", "a", {"n": 1})
        await claim_one(queue)
        await journal(queue).send_event("wf", "b", [None, "x"])
        events = (await journal(queue).read_journal("wf")).events
        assert [(e.name, e.payload) for e in events] == [("a", {"n": 1}), ("b", [None, "x"])]
        assert events[0].sent_at == START
        with pytest.raises(ItemNotFound):
            await journal(queue).send_event("nobody", "a", 1)
        await queue.enqueue("done", item_id="done")
        await queue.request_cancel("done")
        with pytest.raises(ItemStateError, match="cancelled"):
            await journal(queue).send_event("done", "a", 1)
        assert (await journal(queue).read_journal("done")).events == ()

    @needs(Capability.DURABLE_JOURNAL)
    async def test_an_event_makes_an_item_waiting_for_it_due_at_once(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A queued item with a pending wait for the event's name is due at once; one waiting
        for another name, or not waiting, keeps its due time."""
        item = await running(queue)
        week = START + dt.timedelta(days=7)
        waiting = entry(0, EntryKind.WAIT, "approved", finished_at=None, wake_at=week)
        await journal(queue).record_entry("wf", item.lease_version, waiting)
        await settle(queue, item, SettleKind.RESCHEDULE, at=week, config={})
        await journal(queue).send_event("wf", "other", None)
        assert (await queue.get("wf")).due_at == week
        assert await queue.claim_due(["spec"], "w", 30, 1) == []
        clock.advance(5)
        await journal(queue).send_event("wf", "approved", {"by": "ann"})
        assert (await queue.get("wf")).due_at == START + dt.timedelta(seconds=5)
        [again] = await queue.claim_due(["spec"], "w", 30, 1)
        assert again.id == "wf"

    @needs(Capability.DURABLE_JOURNAL)
    async def test_an_event_sent_while_the_item_runs_makes_its_reschedule_due_at_once(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """The evaluation may have looked for the event just before it came: its reschedule
        is due at once instead of at its time; the next reschedule is as asked again."""
        item = await running(queue)
        week = START + dt.timedelta(days=7)
        clock.advance(5)
        await journal(queue).send_event("wf", "approved", None)
        await settle(queue, item, SettleKind.RESCHEDULE, at=week, config={})
        assert (await queue.get("wf")).due_at == START + dt.timedelta(seconds=5)
        [again] = await queue.claim_due(["spec"], "w", 30, 1)
        await settle(queue, again, SettleKind.RESCHEDULE, at=week, config={})
        assert (await queue.get("wf")).due_at == week

    @needs(Capability.DURABLE_JOURNAL)
    async def test_entries_written_at_once_each_get_their_own_outcome(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Entries recorded concurrently (workflows evaluated side by side) are fenced and
        checked one by one, however a store groups them: the fresh ones recorded, a stale
        owner's refused with LeaseLost, a taken position with ItemStateError."""
        await queue.enqueue("spec", item_id="stale")
        [old] = await queue.claim_due(["spec"], "w1", 30, 1)
        clock.advance(31)
        [new] = await queue.claim_due(["spec"], "w2", 30, 1)
        assert (old.id, new.id) == ("stale", "stale")
        for n in range(4):
            await queue.enqueue("spec", item_id=f"wf{n}")
        claimed = {item.id: item for item in await queue.claim_due(["spec"], "w1", 30, 10)}
        taken = claimed["wf3"]
        await journal(queue).record_entry("wf3", taken.lease_version, entry(0, name="first"))
        outcomes: dict[str, str] = {}

        async def record(item_id: str, version: int, position: int) -> None:
            try:
                await journal(queue).record_entry(item_id, version, entry(position))
            except (LeaseLost, ItemStateError) as error:
                outcomes[f"{item_id}@{position}"] = type(error).__name__
            else:
                outcomes[f"{item_id}@{position}"] = "recorded"

        async with trio.open_nursery() as nursery:
            for item_id, item in sorted(claimed.items()):
                nursery.start_soon(record, item_id, item.lease_version, 0)
            nursery.start_soon(record, "wf0", claimed["wf0"].lease_version, 1)
            nursery.start_soon(record, "stale", old.lease_version, 0)
        assert outcomes == {
            "wf0@0": "recorded",
            "wf0@1": "recorded",
            "wf1@0": "recorded",
            "wf2@0": "recorded",
            "wf3@0": "ItemStateError",
            "stale@0": "LeaseLost",
        }
        assert [e.position for e in (await journal(queue).read_journal("wf0")).entries] == [0, 1]
        assert (await journal(queue).read_journal("stale")).entries == ()

    @needs(Capability.DURABLE_JOURNAL)
    async def test_reads_and_writes_made_at_once_each_get_their_own_answer(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Journals read while entries are recorded (workflows starting beside workflows that
        record) see their own item's entries and events; a read of an unknown item is
        ItemNotFound alone; two owners writing one position at once: the stale one refused."""
        await queue.enqueue("spec", item_id="both")
        [old] = await queue.claim_due(["spec"], "w1", 30, 1)
        clock.advance(31)
        [new] = await queue.claim_due(["spec"], "w2", 30, 1)
        for n in range(3):
            await queue.enqueue("spec", item_id=f"r{n}")
        readers = {item.id: item for item in await queue.claim_due(["spec"], "w1", 30, 10)}
        await journal(queue).record_entry("r0", readers["r0"].lease_version, entry(0, result=7))
        await journal(queue).send_event("r1", "go", {"n": 1})
        answers: dict[str, object] = {}

        async def read(item_id: str) -> None:
            try:
                got = await journal(queue).read_journal(item_id)
            except ItemNotFound:
                answers[item_id] = "ItemNotFound"
            else:
                answers[item_id] = (
                    [(e.position, e.result) for e in got.entries],
                    [(e.name, e.payload) for e in got.events],
                )

        async def record(key: str, item: WorkItem) -> None:
            try:
                await journal(queue).record_entry(item.id, item.lease_version, entry(0))
            except LeaseLost:
                answers[key] = "LeaseLost"
            else:
                answers[key] = "recorded"

        async with trio.open_nursery() as nursery:
            # The first write may go alone (a store that groups writes then groups the rest).
            nursery.start_soon(record, "r0@1", attrs.evolve(readers["r0"], lease_version=-1))
            nursery.start_soon(record, "old", old)
            nursery.start_soon(record, "new", new)
            for item_id in ("r0", "r1", "r2", "nobody"):
                nursery.start_soon(read, item_id)
            nursery.start_soon(record, "r2@0", readers["r2"])
        assert answers.pop("r2") in (([], []), ([(0, None)], []))
        assert answers == {
            "r0@1": "LeaseLost",
            "old": "LeaseLost",
            "new": "recorded",
            "r0": ([(0, 7)], []),
            "r1": ([], [("go", {"n": 1})]),
            "nobody": "ItemNotFound",
            "r2@0": "recorded",
        }

    @needs(Capability.DURABLE_JOURNAL)
    async def test_entries_written_at_once_keep_their_results_and_times(
        self, queue: WorkQueue
    ) -> None:
        """Entries recorded together come back as each was written: results of any JSON
        (quotes, backslashes, braces, text that reads as NULL), attempts, times, kinds."""
        results: list[Any] = [
            {"q": 'a "quoted", {braced} \\ text', "n": [1, 2.5, None, True]},
            "NULL",
            ["é ☃", {}, []],
            None,
        ]
        items = {}
        for n in range(len(results)):
            items[n] = await running(queue, f"j{n}")
        later = START + dt.timedelta(hours=1)

        async def record(n: int) -> None:
            await journal(queue).record_entry(
                f"j{n}",
                items[n].lease_version,
                entry(0, name=f'step "{n}" \\ ,{{}}', result=results[n], attempts=n + 1),
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(  # the first may go alone; the rest wait and go together
                journal(queue).record_entry,
                "j0",
                items[0].lease_version,
                entry(1, EntryKind.SLEEP, "nap", wake_at=later, finished_at=later),
            )
            for n in range(len(results)):
                nursery.start_soon(record, n)
        for n, result in enumerate(results):
            got = {e.position: e for e in (await journal(queue).read_journal(f"j{n}")).entries}
            assert got[0].result == result
            assert (got[0].name, got[0].attempts) == (f'step "{n}" \\ ,{{}}', n + 1)
            assert (got[0].started_at, got[0].finished_at, got[0].wake_at) == (START, START, None)
        sleep = (await journal(queue).read_journal("j0")).entries[1]
        assert (sleep.kind, sleep.wake_at, sleep.finished_at) == (EntryKind.SLEEP, later, later)
