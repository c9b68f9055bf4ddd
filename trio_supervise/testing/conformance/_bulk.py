"""Bulk enqueue (``enqueue_many``), run against every backend (memory, SQLite, PostgreSQL)."""

from __future__ import annotations

import datetime as dt

import pytest
import trio

from ... import ConfigError, DuplicateItem
from ...job import Enqueued, ItemState, NewItem
from ...queues import WorkQueue
from ._clock import START
from ._support import S


class BulkEnqueueContract:
    """``enqueue_many``: many items in one call, all or nothing."""

    async def test_enqueue_many_creates_every_entry_in_order(self, queue: WorkQueue) -> None:
        """Each entry becomes an item, reported in order with created=True, every field stored."""
        entries = [
            NewItem(spec_id="spec", config={"n": n}, priority=n, due_at=START + n * S)
            for n in range(5)
        ]
        done = await queue.enqueue_many(entries)
        assert [each.created for each in done] == [True] * 5
        assert [each.item.config for each in done] == [{"n": n} for n in range(5)]
        assert [each.item.due_at for each in done] == [START + n * S for n in range(5)]
        for each in done:
            assert await queue.get(each.item.id) == each.item
        assert await queue.counts() == {("spec", ItemState.QUEUED): 5}

    async def test_enqueue_many_of_nothing(self, queue: WorkQueue) -> None:
        """An empty batch writes nothing and returns an empty list."""
        assert await queue.enqueue_many([]) == []
        assert await queue.counts() == {}

    async def test_enqueue_is_enqueue_many_of_one(self, queue: WorkQueue) -> None:
        """``enqueue`` returns the item ``enqueue_many`` reports, new or existing."""
        item = await queue.enqueue("spec", idempotency_key="k", item_id="a")
        [again] = await queue.enqueue_many([NewItem(spec_id="spec", idempotency_key="k")])
        assert again == Enqueued(item=item, created=False)
        assert await queue.enqueue("spec", idempotency_key="k") == item

    async def test_keys_in_one_batch_first_wins(self, queue: WorkQueue) -> None:
        """Entries repeating a key within the batch report the first entry's item, not created."""
        done = await queue.enqueue_many(
            [
                NewItem(spec_id="spec", idempotency_key="k", config={"v": 1}),
                NewItem(spec_id="spec", idempotency_key="other"),
                NewItem(spec_id="spec", idempotency_key="k", config={"v": 2}),
            ]
        )
        assert [each.created for each in done] == [True, True, False]
        assert done[2].item == done[0].item
        assert done[0].item.config == {"v": 1}
        assert await queue.counts() == {("spec", ItemState.QUEUED): 2}

    async def test_existing_keys_are_reported_not_written(self, queue: WorkQueue) -> None:
        """An entry whose key an existing item holds reports that item; the others are created."""
        held = await queue.enqueue("spec", idempotency_key="k", config={"v": 1})
        done = await queue.enqueue_many(
            [
                NewItem(spec_id="spec", config={"v": 2}),
                NewItem(spec_id="spec", idempotency_key="k", config={"v": 3}),
            ]
        )
        assert [each.created for each in done] == [True, False]
        assert done[1].item == held
        assert (await queue.get(held.id)).config == {"v": 1}

    async def test_an_existing_item_id_refuses_the_whole_batch(self, queue: WorkQueue) -> None:
        """An explicit id that exists raises DuplicateItem naming it; nothing of the batch is
        written."""
        await queue.enqueue("spec", item_id="taken")
        with pytest.raises(DuplicateItem, match="taken"):
            await queue.enqueue_many(
                [
                    NewItem(spec_id="spec", item_id="fresh"),
                    NewItem(spec_id="spec", item_id="taken"),
                ]
            )
        assert await queue.counts() == {("spec", ItemState.QUEUED): 1}

    async def test_an_item_id_twice_in_a_batch_is_refused(self, queue: WorkQueue) -> None:
        """Two entries with one explicit id raise DuplicateItem; nothing is written."""
        with pytest.raises(DuplicateItem, match="twice"):
            await queue.enqueue_many(
                [NewItem(spec_id="spec", item_id="twice"), NewItem(spec_id="spec", item_id="twice")]
            )
        assert await queue.counts() == {}

    async def test_a_key_match_wins_over_an_existing_id(self, queue: WorkQueue) -> None:
        """An entry whose key is held reports the holder, even if its explicit id exists too."""
        held = await queue.enqueue("spec", item_id="a", idempotency_key="k")
        [done] = await queue.enqueue_many(
            [NewItem(spec_id="spec", item_id="a", idempotency_key="k")]
        )
        assert done == Enqueued(item=held, created=False)

    @pytest.mark.parametrize(
        ("bad", "field"),
        [
            (NewItem(spec_id=""), "spec_id"),
            (NewItem(spec_id="spec", config={"x": object()}), "config"),
            (NewItem(spec_id="spec", priority=1000), "priority"),
            (NewItem(spec_id="spec", queue=""), "queue"),
            (NewItem(spec_id="spec", due_at=dt.datetime(2030, 1, 1)), "due_at"),
            (NewItem(spec_id="spec", evaluation_timeout=-1), "timeout"),
            (NewItem(spec_id="spec", unique="sometimes", idempotency_key="k"), "unique"),  # type: ignore[arg-type]
            (NewItem(spec_id="spec", unique="unfinished"), "unique"),
            (NewItem(spec_id="spec", tenant_id="\x00"), "tenant_id"),
        ],
    )
    async def test_a_bad_entry_names_its_index_and_field(
        self, queue: WorkQueue, bad: NewItem, field: str
    ) -> None:
        """A bad entry raises ValueError (ConfigError for a config) naming its index and field;
        nothing of the batch is written."""
        with pytest.raises(ValueError, match=rf"^entry 2: .*{field}") as caught:
            await queue.enqueue_many(
                [NewItem(spec_id="spec"), NewItem(spec_id="spec", idempotency_key="k"), bad]
            )
        if field == "config":
            assert isinstance(caught.value, ConfigError)
        assert await queue.counts() == {}

    async def test_not_a_new_item_is_a_type_error(self, queue: WorkQueue) -> None:
        """An entry that is not a NewItem raises TypeError naming its index."""
        with pytest.raises(TypeError, match="entry 1"):
            await queue.enqueue_many([NewItem(spec_id="spec"), {"spec_id": "spec"}])  # type: ignore[list-item]
        assert await queue.counts() == {}

    async def test_one_batch_wakes_a_waiter(self, queue: WorkQueue) -> None:
        """A waiter for a spec wakes when a batch makes one of its items due."""
        woke = trio.Event()

        async def waiter() -> None:
            await queue.wait_for_work(["wanted"])
            woke.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.sleep(0.05)
            await queue.enqueue_many([NewItem(spec_id="other"), NewItem(spec_id="wanted")])
            with trio.fail_after(10):
                await woke.wait()

    async def test_a_big_batch(self, queue: WorkQueue) -> None:
        """Thousands of entries in one call, with keys and ids, all land."""
        entries = [
            NewItem(spec_id="spec", item_id=f"id-{n:05}", idempotency_key=f"k-{n % 2500}")
            for n in range(3000)
        ]
        done = await queue.enqueue_many(entries)
        assert sum(each.created for each in done) == 2500
        assert done[2500].item.id == "id-00000"
        assert await queue.counts() == {("spec", ItemState.QUEUED): 2500}

    async def test_awkward_values_are_stored_as_given(self, queue: WorkQueue) -> None:
        """Texts with quotes, backslashes, control characters and non-ASCII, nested configs, whole
        and fractional timeouts, keys, periods and concurrency limits come back from the store as
        the batch's result reports them (SQLite writes a batch as one JSON array, and a batch with
        a fractional timeout another way)."""
        texts = ['a"b\\c', "\x01\x1f\n\t\r", "é日本😀", "\u2028\U0010ffff", "'; --"]
        for timeouts in ([None, 30.0, 2.0, None, 7.0], [None, 0.1, 2.5, 1e-3, 7.0]):
            entries = [
                NewItem(
                    spec_id=f"spec{text}",
                    config={"text": text, "nested": [1, 2.5, None, {"x": text}], "big": 2**53 + 1},
                    tenant_id=text,
                    subject_id=text * 2,
                    idempotency_key=f"{timeouts[1]}{text}",
                    evaluation_timeout=timeout,
                    unique=dt.timedelta(seconds=90) if n % 2 else "unfinished",
                    concurrency_key=text if n % 2 else None,
                    concurrency_limit=3 if n % 2 else None,
                    priority=n - 2,
                    queue=f"q{text}",
                )
                for n, (text, timeout) in enumerate(zip(texts, timeouts, strict=True))
            ]
            done = await queue.enqueue_many(entries)
            assert [each.created for each in done] == [True] * len(entries)
            for entry, each in zip(entries, done, strict=True):
                stored = await queue.get(each.item.id)
                assert stored == each.item
                assert stored.config == entry.config
                assert (stored.tenant_id, stored.subject_id) == (entry.tenant_id, entry.subject_id)
                assert stored.timeout == entry.evaluation_timeout
                assert stored.idempotency_key == entry.idempotency_key
                assert stored.concurrency_key == entry.concurrency_key

    async def test_columns_with_one_value_are_stored_in_every_row(self, queue: WorkQueue) -> None:
        """A batch whose entries share every value but the id stores each of them in every item
        (PostgreSQL sends such a column once), and a one-entry batch is one item."""
        entry = NewItem(
            spec_id="same",
            config={"a": [1, 2]},
            tenant_id="t",
            subject_id="s",
            due_at=START + 5 * S,
            priority=3,
            queue="q",
            evaluation_timeout=0.1,
            concurrency_key="c",
            concurrency_limit=2,
        )
        for size in (4, 1):
            done = await queue.enqueue_many([entry] * size)
            assert len({each.item.id for each in done}) == size
            for each in done:
                stored = await queue.get(each.item.id)
                assert stored == each.item
                assert (stored.spec_id, stored.config, stored.tenant_id, stored.subject_id) == (
                    "same",
                    {"a": [1, 2]},
                    "t",
                    "s",
                )
                assert (stored.due_at, stored.priority, stored.queue, stored.timeout) == (
                    START + 5 * S,
                    3,
                    "q",
                    0.1,
                )
                assert (stored.concurrency_key, stored.concurrency_limit) == ("c", 2)
        assert await queue.counts() == {("same", ItemState.QUEUED): 5}
