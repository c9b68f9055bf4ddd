"""The memory queue's durable side (:class:`DurableSide`): each item's journal and the events
sent to it (:class:`~trio_supervise.queues.DurableJournal`), kept beside the item and dropped
with it, so an item id used again starts with neither.
"""

from __future__ import annotations

import trio

from ..._clock import utc
from ..._errors import ItemNotFound, ItemStateError
from ...job import (
    EntryKind,
    ItemEvent,
    ItemState,
    Journal,
    JournalEntry,
    JSONValue,
    check_entry,
    check_event,
    copy_json,
)
from ._state import MemoryState

__all__ = ["DurableSide"]


def _copied(entry: JournalEntry) -> JournalEntry:
    return JournalEntry(
        position=entry.position,
        kind=entry.kind,
        name=entry.name,
        result=copy_json(entry.result),
        attempts=entry.attempts,
        started_at=entry.started_at,
        finished_at=entry.finished_at,
        wake_at=entry.wake_at,
    )


class DurableSide(MemoryState):
    """What a durable workflow uses (:class:`DurableJournal`)."""

    __slots__ = ()

    async def read_journal(self, item_id: str) -> Journal:
        await trio.lowlevel.checkpoint()
        if item_id not in self._items:
            raise ItemNotFound(item_id)
        entries = self._journals.get(item_id, {})
        events = self._item_events.get(item_id, [])
        return Journal(
            entries=tuple(_copied(entries[p]) for p in sorted(entries)),
            events=tuple(
                ItemEvent(name=e.name, payload=copy_json(e.payload), sent_at=e.sent_at)
                for e in events
            ),
        )

    async def record_entry(self, item_id: str, lease_version: int, entry: JournalEntry) -> None:
        await trio.lowlevel.checkpoint()
        entry = check_entry(entry)
        self._fenced("record_entry", item_id, lease_version)
        journal = self._journals.setdefault(item_id, {})
        there = journal.get(entry.position)
        if there is not None and not (there.kind is EntryKind.WAIT and there.pending):
            self._log("record_entry", item_id, lease_version, applied=False)
            raise ItemStateError(
                f"item {item_id!r}: journal position {entry.position} is recorded already "
                f"({there.kind} {there.name!r})"
            )
        journal[entry.position] = entry
        self._log("record_entry", item_id, lease_version, position=entry.position)

    async def send_event(self, item_id: str, name: str, payload: JSONValue = None) -> None:
        await trio.lowlevel.checkpoint()
        payload = check_event(name, payload)
        item = self._items.get(item_id)
        if item is None:
            raise ItemNotFound(item_id)
        if item.state.finished:
            raise ItemStateError(f"item {item_id!r} is {item.state}: it takes no more events")
        now = self._now()
        self._item_events.setdefault(item_id, []).append(
            ItemEvent(name=name, payload=payload, sent_at=utc(now))
        )
        waiting = any(
            entry.kind is EntryKind.WAIT and entry.pending and entry.name == name
            for entry in self._journals.get(item_id, {}).values()
        )
        if item.state is ItemState.RUNNING:
            self._woken.add(item_id)  # its evaluation may have looked already: see _apply
        queued = item.state is ItemState.QUEUED and not item.waiting_children
        if waiting and queued and item.due_at > now:
            self._put(item, now, due_at=now)
        self._log("send_event", item_id, name=name)
        self._changed()
