"""Debounce: a keyed enqueue whose pending (queued) holder takes the newest config and due time;
a running holder is never changed, the newest enqueue after it started is kept as a new item."""

from __future__ import annotations

import datetime as dt

import pytest

from ...job import ItemState, NewItem, SettleKind, Settlement
from ...queues import WorkQueue
from ._clock import START, ManualClock


def _entry(n: int, *, due: float = 0.0) -> NewItem:
    return NewItem(
        spec_id="spec",
        idempotency_key="doc-7",
        unique="unfinished",
        config={"v": n},
        due_at=START + dt.timedelta(seconds=due),
        debounce=True,
    )


class DebounceContract:
    """``debounce=True`` with an idempotency key: the queued holder takes the entry's config
    and due time (``replaced``); a running holder keeps its own and gives the key to a new
    item; without a key it is refused."""

    async def test_the_pending_item_takes_the_newest_config_and_due_time(
        self, queue: WorkQueue
    ) -> None:
        """Three debounced enqueues, "30 s after the last change": one item, the last config,
        due 30 s after the last; the others report it, replaced."""
        first = await queue.enqueue(
            "spec",
            idempotency_key="doc-7",
            unique="unfinished",
            config={"v": 1},
            due_at=START + dt.timedelta(seconds=30),
            debounce=True,
        )
        assert first.config == {"v": 1}
        [second] = await queue.enqueue_many([_entry(2, due=40)])
        [third] = await queue.enqueue_many([_entry(3, due=50)])
        assert (second.created, second.replaced, third.created, third.replaced) == (
            False,
            True,
            False,
            True,
        )
        assert third.item.id == second.item.id == first.id
        stored = await queue.get(first.id)
        assert (stored.config, stored.due_at) == ({"v": 3}, START + dt.timedelta(seconds=50))
        assert [i.id for i in await queue.list_items()] == [first.id]
        plain = await queue.enqueue_many([NewItem(spec_id="spec", idempotency_key="doc-7")])
        assert (plain[0].created, plain[0].replaced, plain[0].item.config) == (
            False,
            False,
            {"v": 3},
        )

    async def test_a_running_item_is_never_replaced(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Once the holder runs, a debounced enqueue leaves it as it is and makes a new item
        holding the key, which the next debounced enqueue replaces; the running one settles
        as ever."""
        [old] = await queue.enqueue_many([_entry(1)])
        [running] = await queue.claim_due(["spec"], "w", 60, 1)
        [new] = await queue.enqueue_many([_entry(2, due=10)])
        assert (new.created, new.replaced) == (True, False)
        assert new.item.id != old.item.id
        held = await queue.get(old.item.id)
        assert (held.state, held.config, held.released_key) == (
            ItemState.RUNNING,
            {"v": 1},
            "doc-7",
        )
        [newer] = await queue.enqueue_many([_entry(3, due=20)])
        assert (newer.item.id, newer.replaced, newer.item.config) == (new.item.id, True, {"v": 3})
        settled = Settlement(
            item_id=running.id, lease_version=running.lease_version, kind=SettleKind.COMPLETE
        )
        assert await queue.settle_many([settled]) == [True]
        assert (await queue.get_by_key("doc-7")).id == new.item.id

    async def test_debounce_needs_a_key(self, queue: WorkQueue) -> None:
        """Without an idempotency key there is nothing to replace: a ValueError saying so."""
        with pytest.raises(ValueError, match="debounce needs an idempotency_key"):
            await queue.enqueue("spec", debounce=True)
        assert await queue.list_items() == []
