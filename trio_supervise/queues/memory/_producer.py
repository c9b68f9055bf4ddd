"""The memory queue's producer side (:class:`ProducerSide`): enqueueing, idempotency keys and the
items that hold them, a parent's children written in, and why ``enqueue_on`` is not offered.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import trio

from ..._errors import DuplicateItem, ItemNotFound
from ...job import (
    SCOPE_PERIOD,
    SCOPE_UNFINISHED,
    Enqueued,
    ItemState,
    NewItem,
    WorkItem,
    check_entries,
    created_item,
    new_item_ids,
    plan_batch,
    repeated_id,
    replace_item,
)
from .._ports import EnqueueFront
from ._state import MemoryState, _own, _set

__all__ = ["ProducerSide"]


def _lapsed(holder: WorkItem, now: dt.datetime) -> bool:
    """True when *holder*'s uniqueness scope no longer holds its key (see ``UniqueScope``)."""
    if holder.unique_scope == SCOPE_UNFINISHED:
        return holder.state.finished
    if holder.unique_scope == SCOPE_PERIOD:
        return holder.unique_until is not None and holder.unique_until <= now
    return False


_NO_TRANSACTIONS = (
    "MemoryQueue has no transactions: {method} needs a SQLite or PostgreSQL queue in the "
    "database conn is connected to; with a memory queue, `await queue.{async_}(...)` after "
    "your own commit"
)


class ProducerSide(MemoryState, EnqueueFront):
    """What enqueues work (:class:`ProducerStore`); ``enqueue`` is :class:`EnqueueFront`'s."""

    __slots__ = ()

    def enqueue_on(self, conn: Any, spec_id: str, **kwargs: Any) -> WorkItem:
        """Not offered: a memory queue has no transactions to join. Raises
        :class:`NotImplementedError`; use :meth:`enqueue` (SQL backends: see
        :meth:`SQLiteQueue.enqueue_on <trio_supervise.queues.SQLiteQueue.enqueue_on>`)."""
        raise NotImplementedError(_NO_TRANSACTIONS.format(method="enqueue_on", async_="enqueue"))

    def enqueue_many_on(self, conn: Any, entries: Sequence[NewItem]) -> list[Enqueued]:
        """Not offered either: see :meth:`enqueue_on`."""
        raise NotImplementedError(
            _NO_TRANSACTIONS.format(method="enqueue_many_on", async_="enqueue_many")
        )

    def _holder(self, key: str, now: dt.datetime) -> WorkItem | None:
        """The item holding *key*, unless its scope has lapsed (then the key is free)."""
        holder_id = self._keys.get(key)
        if holder_id is None:
            return None
        holder = self._items.get(holder_id)
        if holder is None or _lapsed(holder, now):
            return None
        return holder

    def _release(self, key: str) -> None:
        """Move *key* from its lapsed holder to the holder's ``released_key``."""
        holder_id = self._keys.pop(key, None)
        holder = None if holder_id is None else self._items.get(holder_id)
        if holder is None:
            return
        # Not a change of state: updated_at (which retention reads) stays as it was, and the
        # item stays where it is indexed.
        _set(holder, "idempotency_key", None)
        _set(holder, "released_key", key)
        self._released.setdefault(key, []).append(holder.id)

    async def enqueue_many(self, entries: Sequence[NewItem]) -> list[Enqueued]:
        await trio.lowlevel.checkpoint()
        return self._enqueue_many(entries)

    def _enqueue_many(self, entries: Sequence[NewItem]) -> list[Enqueued]:
        checked = check_entries(entries)
        sent, repeats = plan_batch(checked)
        now = self._now()
        # Plan every write first, so a refused entry leaves the queue as it was.
        existing: dict[int, WorkItem] = {}
        for index in sent:
            key = checked[index].idempotency_key
            if key is not None and (holder := self._holder(key, now)) is not None:
                if checked[index].debounce and holder.state is ItemState.RUNNING:
                    continue  # never replaced: a new item takes the key (released below)
                existing[index] = holder
        written = [checked[index].item_id for index in sent if index not in existing]
        twice = repeated_id(written)
        if twice is not None:
            raise DuplicateItem(twice)
        for explicit in written:
            if explicit is not None and explicit in self._items:
                raise DuplicateItem(explicit)
        results: dict[int, Enqueued] = {}
        ids = iter(new_item_ids(now, len(sent)))
        for index in sent:
            if index in existing:
                results[index] = self._debounced(checked[index], existing[index], now)
                continue
            entry = checked[index]
            item = _own(
                created_item(entry, next(ids) if entry.item_id is None else entry.item_id, now)
            )
            if entry.idempotency_key is not None:
                if entry.idempotency_key in self._keys:
                    self._release(entry.idempotency_key)
                self._keys[entry.idempotency_key] = item.id
            self._store(item)
            self._log("enqueue", item.id, at=now, spec_id=item.spec_id)
            results[index] = Enqueued(item=self._out(item), created=True)
        for index, first in repeats.items():
            results[index] = Enqueued(item=results[first].item, created=False)
        if any(done.created or done.replaced for done in results.values()):
            self._changed()
        return [results[index] for index in range(len(checked))]

    def _debounced(self, entry: NewItem, holder: WorkItem, now: dt.datetime) -> Enqueued:
        """What *entry* does to the existing *holder* of its key: nothing, or with
        ``debounce``, when the holder is queued (and not waiting for children), give it the
        entry's config and due time."""
        if not entry.debounce or holder.state is not ItemState.QUEUED or holder.waiting_children:
            return Enqueued(item=self._out(holder), created=False)
        item = self._requeue(
            holder,
            now if entry.due_at is None else entry.due_at,
            now,
            config={} if entry.config is None else entry.config,
        )
        self._log("debounce", item.id, at=now)
        return Enqueued(item=self._out(item), created=False, replaced=True)

    def _insert_child(self, child: NewItem, now: dt.datetime, parent_id: str) -> WorkItem | None:
        """Store *child* (checked, with its id) as *parent_id*'s; None if its id exists or its
        key is held (nothing written then)."""
        key = child.idempotency_key
        if child.item_id in self._items or (key is not None and self._holder(key, now)):
            return None
        item = _own(
            replace_item(created_item(child, child.item_id or "", now), parent_id=parent_id)
        )
        if key is not None:
            if key in self._keys:
                self._release(key)
            self._keys[key] = item.id
        self._store(item)
        self._children_of.setdefault(parent_id, []).append(item.id)
        self._log("enqueue", item.id, at=now, spec_id=item.spec_id, parent_id=parent_id)
        return item

    async def get_by_key(self, idempotency_key: str) -> WorkItem:
        await trio.lowlevel.checkpoint()
        holder_id = self._keys.get(idempotency_key)
        if holder_id is not None and holder_id in self._items:
            return self._out(self._items[holder_id])
        released = [
            self._items[each]
            for each in self._released.get(idempotency_key, ())
            if each in self._items and self._items[each].released_key == idempotency_key
        ]
        if not released:
            raise ItemNotFound(idempotency_key, "idempotency key")
        return self._out(max(released, key=lambda item: (item.created_at, item.id)))
