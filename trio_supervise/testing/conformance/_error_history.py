"""Recent errors across items (``Capability.ERROR_HISTORY``): the entries of the items' error
histories, newest first, paged by a keyset cursor, read in one snapshot."""

from __future__ import annotations

import pytest

from ...job import ItemError, SettleKind, Settlement
from ...queues import ErrorHistoryStore, WorkQueue
from ...queues._ports import Capability
from ._clock import START, ManualClock
from ._support import S, needs


def history_store(queue: WorkQueue) -> ErrorHistoryStore:
    """*queue* as the :class:`ErrorHistoryStore` it declares it is."""
    assert isinstance(queue, ErrorHistoryStore), "a store declaring ERROR_HISTORY is one"
    return queue


async def fail(queue: WorkQueue, item_id: str) -> None:
    """Claim the due item *item_id* (its spec id its own id) and settle it dead with the error
    ``boom <id>``."""
    [item] = await queue.claim_due([item_id], "w1", 30, 1)
    settlement = Settlement(
        item_id=item.id,
        lease_version=item.lease_version,
        kind=SettleKind.DEAD,
        error=f"boom {item_id}",
    )
    assert await queue.settle_many([settlement]) == [True]


def shown(errors: list[ItemError]) -> list[tuple[str, int]]:
    return [(error.item_id, error.position) for error in errors]


class ErrorHistoryContract:
    """Every item's recorded errors as one list: newest first by when they happened (then
    item id, then place in the history), each with its item, spec and queue; a page continues
    from the cursor of the last error of the page before, never showing one twice."""

    @needs(Capability.ERROR_HISTORY)
    async def test_errors_of_every_item_newest_first(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Errors across items and within one item's history come newest first, with what
        they are and where they belong; items without errors show none."""
        store = history_store(queue)
        assert await store.recent_errors() == []
        await queue.enqueue("a", item_id="a", queue="reports")
        await queue.enqueue("b", item_id="b")
        await queue.enqueue("quiet", item_id="quiet")
        [a] = await queue.claim_due(["a"], "w1", 30, 1, queue="reports")
        retry = Settlement(
            item_id="a", lease_version=a.lease_version, kind=SettleKind.RETRY, error="boom a"
        )
        assert await queue.settle_many([retry]) == [True]  # a's first error, at START
        clock.advance(3600)
        await fail(queue, "b")  # b's, an hour later
        clock.advance(3600)
        [a] = await queue.claim_due(["a"], "w2", 30, 1, queue="reports")
        dead = Settlement(
            item_id="a", lease_version=a.lease_version, kind=SettleKind.DEAD, error="boom a"
        )
        assert await queue.settle_many([dead]) == [True]  # a's second error, two hours later
        errors = await store.recent_errors()
        assert shown(errors) == [("a", 1), ("b", 0), ("a", 0)]
        newest = errors[0]
        assert (newest.spec_id, newest.queue) == ("a", "reports")
        assert (newest.entry.at, newest.entry.worker, newest.entry.error) == (
            START + 7200 * S,
            "w2",
            "boom a",
        )
        assert shown(await store.recent_errors(limit=2)) == [("a", 1), ("b", 0)]
        assert shown(await store.recent_errors(before=errors[0].cursor)) == [("b", 0), ("a", 0)]
        assert await store.recent_errors(before=errors[-1].cursor) == []

    @needs(Capability.ERROR_HISTORY)
    async def test_pages_cover_every_error_once_however_items_were_updated(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """An item changed after its error (retried by a person) keeps its error where it
        happened in the order; paging by the cursor shows each error once, across many
        items."""
        store = history_store(queue)
        count = 120
        for n in range(count):
            await queue.enqueue(f"i{n:03}", item_id=f"i{n:03}")
        for n in range(count):
            clock.advance(1)
            await fail(queue, f"i{n:03}")
        clock.advance(100)
        await queue.retry("i000")  # updated last; its error is the oldest
        expected = [(f"i{n:03}", 0) for n in reversed(range(count))]
        assert shown(await store.recent_errors(limit=3)) == expected[:3]
        seen: list[tuple[str, int]] = []
        before = None
        while True:
            page = await store.recent_errors(limit=50, before=before)
            seen += shown(page)
            if len(page) < 50:
                break
            before = page[-1].cursor
        assert seen == expected

    @needs(Capability.ERROR_HISTORY)
    @pytest.mark.parametrize(
        ("limit", "before", "rule"),
        [
            (0, None, "limit must be an integer from 1 to 1000"),
            (1001, None, "limit must be an integer from 1 to 1000"),
            (True, None, "limit must be an integer from 1 to 1000"),
            (10, "yesterday", "before must be the cursor of an error"),
            (10, 5, "before must be the cursor of an error"),
        ],
    )
    async def test_a_bad_page_is_refused_naming_the_argument(
        self, queue: WorkQueue, limit: int, before: str | None, rule: str
    ) -> None:
        """A limit out of range, or a cursor no error gave: ValueError naming it."""
        with pytest.raises(ValueError, match=rule):
            await history_store(queue).recent_errors(limit=limit, before=before)
