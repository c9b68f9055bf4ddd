"""What every part of the memory queue shares: the stored items, the heaps that serve claims and
due times, the key and fan-in indexes, and the helpers that keep them in step with each write
(:class:`MemoryState`). The ports' parts (``_worker``, ``_producer``, ``_operator``,
``_maintenance``) are written over it.
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
from collections.abc import Callable
from typing import Any

import attrs
import trio_util

from ..._audit import AuditEntry
from ..._clock import Clock, StepGuard, TrioClock, WallClock, utc
from ..._errors import LeaseLost
from ...job import (
    ItemEvent,
    ItemState,
    JournalEntry,
    RateLimit,
    UnfrozenItem,
    WorkItem,
    copy_item,
    rule_for,
    throttled_until,
)
from ._events import QueueEvent, _detail_slots, _EventLog, _RawEvent, raw_appender

__all__ = ["MemoryState"]

# The members the hot paths test for, as module names: in Python 3.11 reading an enum member
# off its class costs about 45 ns, a module name next to nothing (issue 17).
_QUEUED = ItemState.QUEUED
_RUNNING = ItemState.RUNNING

_Entry = tuple[dt.datetime, str, int, WorkItem]
"""A heap entry: (time, item id, push sequence number, the stored item)."""

_set = object.__setattr__


_copy = copy_item
"""A copy of a stored item for a caller (one per claimed item): generated from WorkItem's fields."""


def _own(item: WorkItem) -> WorkItem:
    """*item*, new and about to be stored, as a stored item is: an :class:`UnfrozenItem`, which the
    hot paths change by plain stores. Done where items are created (an enqueue, a child), not
    per write."""
    _set(item, "__class__", UnfrozenItem)
    return item


_SWEEP_MIN = 256


class _Heap(list[_Entry]):
    """A heap of entries (``heapq``), and the length at which its stale entries are swept out."""

    __slots__ = ("sweep_at",)

    def __init__(self) -> None:
        super().__init__()
        self.sweep_at = _SWEEP_MIN


@attrs.define(eq=False)
class MemoryState:
    """The memory queue's state, and how a write keeps it indexed.

    Everything happens in the Trio thread with no await in the middle of a write, so each method
    of the queue is atomic. Claims, and the next due time, are served by heaps, so they cost
    ``O(log n)`` per item rather than a scan of every item ever enqueued: queued items by
    ``(due_at, id)``, one heap per ``(spec id, queue, priority, concurrency key, concurrency
    limit)``, and running items by lease expiry, one heap per ``(spec id, queue)``.

    The stored :class:`WorkItem` objects are the queue's own and never leave it: a write changes
    the stored item in place (frozen classes are set with ``object.__setattr__``), and every
    method that returns an item returns a copy made then (:meth:`_out`), so what a caller holds
    never changes under it. A write that changes where an item belongs pushes a fresh heap entry
    and records that entry's push number as the item's live one; an entry whose number is no
    longer its item's is stale and is dropped when it reaches the top of its heap, or earlier,
    when its heap has doubled since it was last swept (:meth:`_sweep`). A renewal that extends a
    lease pushes nothing: the entry keeps the older expiry (never later than the item's), and
    :meth:`_top` moves it to the item's current expiry when it reaches the top.

    Concurrency keys: a key at its limit blocks whole queued heaps (they are split by key and
    limit), and each key's running items are kept by id, so counting a key's live leases costs
    the items it runs, not the queue.
    """

    _clock: Clock = attrs.field(factory=TrioClock, alias="clock")
    _guard: StepGuard | None = attrs.field(init=False)
    """Judges leases when the clock is a stepped wall clock (see StepGuard); None: *now* does."""
    _items: dict[str, WorkItem] = attrs.field(init=False, factory=dict)
    _keys: dict[str, str] = attrs.field(init=False, factory=dict)
    """Idempotency key -> the id of the item holding it."""
    _released: dict[str, list[str]] = attrs.field(init=False, factory=dict)
    """Idempotency key -> the ids of the items that held it until their scope lapsed."""
    _versions: itertools.count[int] = attrs.field(init=False, factory=lambda: itertools.count(1))
    _queued: dict[tuple[str, str, int, str | None, int | None], _Heap] = attrs.field(
        init=False, factory=dict
    )
    """Per ``(spec id, queue, priority, concurrency key, concurrency limit)``, queued items by
    ``(due_at, id)`` (with stale entries; see the class doc). Every item of one heap is
    blocked by its key, or none is."""
    _running_keyed: dict[str, dict[str, WorkItem]] = attrs.field(init=False, factory=dict)
    """Per concurrency key, its running items by id (live leases or not)."""
    _leased: dict[tuple[str, str], _Heap] = attrs.field(init=False, factory=dict)
    """Per ``(spec id, queue)``, running items by ``(lease_expires_at, id)``."""
    _paused: dict[str, dt.datetime] = attrs.field(init=False, factory=dict)
    """Paused queues, with when they were paused."""
    _rates: dict[str, tuple[RateLimit, list[dt.datetime]]] = attrs.field(init=False, factory=dict)
    """Rate-limited queues: each one's limit and its latest starts, oldest first."""
    _key_rules: dict[str, RateLimit] = attrs.field(init=False, factory=dict)
    """Rate limits per concurrency key, by key or template (see ``job/_key_rates.py``)."""
    _key_starts: dict[str, list[dt.datetime]] = attrs.field(init=False, factory=dict)
    """Per concurrency key a rule holds, its latest starts, oldest first."""
    _last_fires: dict[str, dt.datetime] = attrs.field(init=False, factory=dict)
    _audit: list[AuditEntry] = attrs.field(init=False, factory=list)
    """The console's audit trail, in the order recorded (see ``_audit.py``)."""
    """Each schedule's last enqueued fire (see :meth:`fire_schedule`)."""
    _fan_in: dict[str, tuple[str, int]] = attrs.field(init=False, factory=dict)
    """Per waited-for child not yet finished: its parent's id and lease version (the SQL
    backends' ``parent_version`` column)."""
    _children_of: dict[str, list[str]] = attrs.field(init=False, factory=dict)
    """Per parent id, its children's ids in creation order (the SQL backends' parent index)."""
    _journals: dict[str, dict[int, JournalEntry]] = attrs.field(init=False, factory=dict)
    """Per item id, its journal by position (one incarnation: dropped with the item)."""
    _item_events: dict[str, list[ItemEvent]] = attrs.field(init=False, factory=dict)
    """Per item id, the events sent to it, in order (dropped with the item)."""
    _woken: set[str] = attrs.field(init=False, factory=set)
    """Running items an event was sent to: their next reschedule is due at once (the SQL
    backends' ``event_woken``); every settlement clears it."""
    _pushes: itertools.count[int] = attrs.field(init=False, factory=itertools.count)
    _entries: dict[str, int] = attrs.field(init=False, factory=dict)
    """Per queued or running item, the push number of its one live heap entry."""
    _changes: trio_util.AsyncValue[int] = attrs.field(
        init=False, factory=lambda: trio_util.AsyncValue(0)
    )
    events: list[QueueEvent] = attrs.field(init=False, factory=_EventLog)
    _record: Callable[[_RawEvent], None] = attrs.field(init=False, repr=False)
    """Appends an event's ``_WIDTH`` values to :attr:`events`: the log's own ``list.extend``,
    which takes them as they are (see :class:`_EventLog`); every call passes exactly that
    many."""
    closed: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        events = self.events
        assert isinstance(events, _EventLog)
        self._record = raw_appender(events)

    # -- inspection helpers (not part of the protocol) ---------------------------------------

    @property
    def items(self) -> dict[str, WorkItem]:
        """A snapshot of every item by id."""
        out = self._out
        return {item_id: out(item) for item_id, item in self._items.items()}

    def reset(self) -> None:
        """Forget every item and event."""
        self._items.clear()
        self._keys.clear()
        self._released.clear()
        self._queued.clear()
        self._leased.clear()
        self._running_keyed.clear()
        self._paused.clear()
        self._rates.clear()
        self._key_rules.clear()
        self._key_starts.clear()
        self._fan_in.clear()
        self._children_of.clear()
        self._entries.clear()
        self._audit.clear()
        self._journals.clear()
        self._item_events.clear()
        self._woken.clear()
        self.events.clear()
        self._changed()

    # -- internals ---------------------------------------------------------------------------

    @_guard.default
    def _new_guard(self) -> StepGuard | None:
        return StepGuard(self._clock) if isinstance(self._clock, WallClock) else None

    def _now(self) -> dt.datetime:
        now = self._clock.now()
        return now if now.tzinfo is dt.UTC else utc(now)

    def _lease_now(self, now: dt.datetime, hold: float | None = None) -> dt.datetime:
        """The time that judges whether a lease has expired: *now*, unless the clock is a wall
        clock that a step could make run ahead of its owners' renewals (see StepGuard)."""
        guard = self._guard
        return now if guard is None else utc(guard.now(hold))

    def _throttled(self, queue: str, now: dt.datetime) -> dt.datetime | None:
        """When *queue*'s rate limit lets a start in again, while it holds them back now."""
        rated = self._rates.get(queue)
        if rated is None:
            return None
        until = throttled_until(rated[1], rated[0])
        return until if until is not None and until > now else None

    def _key_throttled(self, key: str | None, now: dt.datetime) -> dt.datetime | None:
        """When *key*'s rate limit lets a start in again, while it holds them back now."""
        if key is None or not self._key_rules:
            return None
        rule = rule_for(key, sorted(self._key_rules))
        if rule is None:
            return None
        until = throttled_until(self._key_starts.get(key, []), self._key_rules[rule])
        return until if until is not None and until > now else None

    def _changed(self) -> None:
        self._changes.value += 1

    def _log(
        self,
        op: str,
        item_id: str,
        version: int | None = None,
        *,
        applied: bool = True,
        at: dt.datetime | None = None,
        **detail: Any,
    ) -> None:
        at = self._now() if at is None else at
        self._record((at, op, item_id, version, applied, *_detail_slots(detail)))

    def _fenced(self, op: str, item_id: str, lease_version: int) -> WorkItem:
        item = self._items.get(item_id)
        if item is None:
            self._log(op, item_id, lease_version, applied=False)
            raise LeaseLost(item_id, lease_version, "no such item")
        if item.state is not _RUNNING or item.lease_version != lease_version:
            self._log(op, item_id, lease_version, applied=False)
            raise LeaseLost(
                item_id,
                lease_version,
                f"item is {item.state} at version {item.lease_version}",
            )
        return item

    @staticmethod
    def _out(item: WorkItem) -> WorkItem:
        """A copy of the stored *item* for a caller (the stored one changes in place)."""
        return _copy(item)

    def _put(self, item: WorkItem, now: dt.datetime | None = None, **changes: Any) -> WorkItem:
        """Change the stored *item* in place and index it again; returns it (not a copy).

        Every value here is the queue's own or checked (see ``replace_trusted``), and "now" is
        UTC, so no converter runs.
        """
        _set(item, "updated_at", self._now() if now is None else now)
        for name, value in changes.items():
            _set(item, name, value)
        self._store(item)
        return item

    def _store(self, item: WorkItem) -> None:
        """Store *item* (replacing any older copy) and index it if it can be claimed. A new
        item is made the queue's own first (:func:`_own`)."""
        self._items[item.id] = item
        key = item.concurrency_key
        if key is not None:
            running = self._running_keyed.get(key)
            if item.state is _RUNNING:
                if running is None:
                    running = self._running_keyed[key] = {}
                running[item.id] = item
            elif running is not None and running.pop(item.id, None) is not None and not running:
                del self._running_keyed[key]
        if item.state is _QUEUED:
            self._push(
                self._queued,
                (item.spec_id, item.queue, item.priority, key, item.concurrency_limit),
                item.due_at,
                item,
            )
        elif item.state is _RUNNING:
            assert item.lease_expires_at is not None
            self._push(self._leased, (item.spec_id, item.queue), item.lease_expires_at, item)
        else:
            self._entries.pop(item.id, None)

    def _push(self, heaps: dict[Any, _Heap], key: Any, at: dt.datetime, item: WorkItem) -> None:
        heap = heaps.get(key)
        if heap is None:
            heap = heaps[key] = _Heap()
        self._entries[item.id] = push = next(self._pushes)
        heapq.heappush(heap, (at, item.id, push, item))
        if len(heap) >= heap.sweep_at:
            self._sweep(heap)

    def _sweep(self, heap: _Heap) -> None:
        """Drop *heap*'s stale entries, which :meth:`_top` would skip anyway.

        A settled item's lease entry stays in its heap until its old expiry reaches the top, so
        without this a busy queue keeps a stale copy of every item it ran in the last lease
        period (and the garbage collector walks them all). Sweeping when the heap has doubled
        since the last sweep costs O(1) per push, amortised. Entries are totally ordered (the
        push number breaks ties), so the heap pops in the same order after ``heapify``.
        """
        live = self._entries
        heap[:] = [entry for entry in heap if live.get(entry[1]) == entry[2]]
        heapq.heapify(heap)
        heap.sweep_at = max(_SWEEP_MIN, 2 * len(heap))

    def _top(self, heap: list[_Entry] | None) -> _Entry | None:
        """The first live entry of *heap* (its time the item's own), or None.

        A running item's entry may carry an expiry its renewals have since extended: it is
        moved to the current expiry first (entries are never later than their item's time, so
        the first entry left is the earliest item).
        """
        live = self._entries
        while heap:
            entry = heap[0]
            if live.get(entry[1]) != entry[2]:
                heapq.heappop(heap)
                continue
            item = entry[3]
            expires = item.lease_expires_at
            if item.state is _RUNNING and expires != entry[0]:
                assert expires is not None
                live[item.id] = push = next(self._pushes)
                heapq.heapreplace(heap, (expires, item.id, push, item))
                continue
            return entry
        return None

    def _requeue(
        self, item: WorkItem, due_at: dt.datetime, now: dt.datetime, **changes: Any
    ) -> WorkItem:
        return self._put(
            item,
            now,
            state=ItemState.QUEUED,
            due_at=due_at,
            lease_owner=None,
            lease_expires_at=None,
            **changes,
        )

    def _requeue_evaluated(self, item: WorkItem, due_at: dt.datetime, now: dt.datetime) -> None:
        """``_requeue(item, due_at, now, error_count=0, attempt=0)``, spelled out: an item
        evaluated fine and due again (a continued or rescheduled step) is a settlement's hot
        path too."""
        stored: Any = item  # an UnfrozenItem: plain stores
        stored.updated_at = now
        stored.state = _QUEUED
        stored.due_at = due_at
        stored.lease_owner = None
        stored.lease_expires_at = None
        stored.error_count = 0
        stored.attempt = 0
        if item.concurrency_key is not None:
            self._store(item)
            return
        # As _store for an unkeyed queued item stored already (it changed in place), and
        # _push spelled out.
        heap_key = (item.spec_id, item.queue, item.priority, None, item.concurrency_limit)
        heap = self._queued.get(heap_key)
        if heap is None:
            heap = self._queued[heap_key] = _Heap()
        item_id = item.id
        self._entries[item_id] = push = next(self._pushes)
        heapq.heappush(heap, (due_at, item_id, push, item))
        if len(heap) >= heap.sweep_at:
            self._sweep(heap)

    def _remove(self, item: WorkItem) -> None:
        """Forget *item* (its heap entries go stale and are dropped as usual). Its children
        stay, no longer listed under its id: an item created with that id later is another
        incarnation, with children of its own (the SQL backends' ``parent_incarnation``)."""
        del self._items[item.id]
        self._entries.pop(item.id, None)
        self._children_of.pop(item.id, None)
        self._journals.pop(item.id, None)
        self._item_events.pop(item.id, None)
        self._woken.discard(item.id)
        if item.idempotency_key is not None and self._keys.get(item.idempotency_key) == item.id:
            del self._keys[item.idempotency_key]

    def _waited_for(self, item_id: str) -> bool:
        """Whether *item_id* is a child whose parent still waits for it."""
        waited = self._fan_in.get(item_id)
        if waited is None:
            return False
        parent = self._items.get(waited[0])
        return (
            parent is not None
            and parent.state is ItemState.QUEUED
            and parent.lease_version == waited[1]
            and parent.waiting_children > 0
        )

    def _child_finished(self, item_id: str, now: dt.datetime) -> None:
        """*item_id* finished: if its parent waits for it, one less to wait for (once)."""
        waited = self._fan_in.pop(item_id, None)
        if waited is None:
            return
        parent = self._items.get(waited[0])
        if (
            parent is None
            or parent.state is not ItemState.QUEUED
            or parent.lease_version != waited[1]
            or parent.waiting_children <= 0
        ):
            return
        left = parent.waiting_children - 1
        self._put(parent, now, waiting_children=left, due_at=parent.due_at if left else now)
        self._log("fan_in", parent.id, parent.lease_version, at=now, child=item_id, left=left)
