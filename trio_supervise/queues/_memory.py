"""The in-memory queue: the reference implementation of the protocol, and the one for tests.

Everything happens in the Trio thread with no await in the middle of a write, so each method is
atomic. "Now" comes from an injectable clock; the default, :class:`TrioClock`, follows Trio's
clock, so under ``autojump_clock`` due times and lease expiries follow virtual time.

Claims, and the next due time, are served by heaps, so they cost ``O(log n)`` per item rather
than a scan of every item ever enqueued: queued items by ``(due_at, id)``, one heap per
``(spec id, queue, priority, concurrency key, concurrency limit)``, and running items by lease
expiry, one heap per ``(spec id, queue)``.

The stored :class:`WorkItem` objects are the queue's own and never leave it: a write changes
the stored item in place (frozen classes are set with ``object.__setattr__``), and every method
that returns an item returns a copy made then (:meth:`MemoryQueue._out`), so what a caller
holds never changes under it. That saves the copy a settlement or a renewal used to make (with
10,000 leases in flight a renewal round was mostly copies). A write that changes where an item
belongs pushes a fresh heap entry and records that entry's push number as the item's live
one; an entry whose number is no longer its item's is stale and is dropped when it reaches the
top of its heap, or earlier, when its heap has doubled since it was last swept
(:meth:`MemoryQueue._sweep`). A renewal that extends a lease pushes nothing: the entry keeps
the older expiry (never later than the item's), and :meth:`MemoryQueue._top` moves it to the
item's current expiry when it reaches the top.

Concurrency keys: a key at its limit blocks whole queued heaps (they are split by key and
limit), and each key's running items are kept by id, so counting a key's live leases costs the
items it runs, not the queue.
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import attrs
import trio
import trio_util

from .._clock import Clock, TrioClock, utc
from .._errors import DuplicateItem, ItemNotFound, ItemStateError, LeaseLost
from ..job import (
    DEFAULT_QUEUE,
    SCOPE_PERIOD,
    SCOPE_UNFINISHED,
    WAITING_DUE_AT,
    Enqueued,
    ErrorEntry,
    ItemState,
    JSONValue,
    Lease,
    LeaseStatus,
    NewItem,
    QueueInfo,
    SettleKind,
    Settlement,
    UnfrozenItem,
    WorkItem,
    append_error,
    check_child,
    check_config,
    check_entries,
    check_json,
    check_name,
    check_prune,
    check_queue_name,
    copy_item,
    created_item,
    new_item_ids,
    plan_batch,
    repeated_id,
    replace_item,
    storable_text,
    unstorable_outcome,
)
from ._ports import Capability, EnqueueFront, SingleWrites, declared
from .memory._events import (
    _NO_PAIR,
    _SHARED,
    QueueEvent,
    _detail_slots,
    _EventLog,
    _RawEvent,
    raw_appender,
)

__all__ = ["MemoryQueue", "QueueEvent"]


# The members the hot paths test for, as module names: in Python 3.11 reading an enum member
# off its class costs about 45 ns, a module name next to nothing (issue 17).
_QUEUED = ItemState.QUEUED
_RUNNING = ItemState.RUNNING
_RESCHEDULE = SettleKind.RESCHEDULE
_CONTINUE = SettleKind.CONTINUE
_COMPLETE = SettleKind.COMPLETE
_DEAD = SettleKind.DEAD
_RETRY = SettleKind.RETRY
_RELEASE = SettleKind.RELEASE

_FINISHED = {
    SettleKind.COMPLETE: ItemState.COMPLETED,
    SettleKind.CANCEL: ItemState.CANCELLED,
    SettleKind.DEAD: ItemState.DEAD,
}

_SETTLE_OPS = {kind: f"settle:{kind}" for kind in SettleKind}
"""Each settlement kind's event name, formatted once."""

_Entry = tuple[dt.datetime, str, int, WorkItem]
"""A heap entry: (time, item id, push sequence number, the stored item)."""

_set = object.__setattr__
_new_object = object.__new__


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


def _with_error(item: WorkItem, now: dt.datetime, error: str | None) -> tuple[ErrorEntry, ...]:
    """*item*'s error history with *error* appended, by its current lease owner and attempt."""
    entry = ErrorEntry(
        at=now, worker=item.lease_owner or "", attempt=item.attempt, error=error or ""
    )
    return append_error(item.errors, entry)


def _lapsed(holder: WorkItem, now: dt.datetime) -> bool:
    """True when *holder*'s uniqueness scope no longer holds its key (see ``UniqueScope``)."""
    if holder.unique_scope == SCOPE_UNFINISHED:
        return holder.state.finished
    if holder.unique_scope == SCOPE_PERIOD:
        return holder.unique_until is not None and holder.unique_until <= now
    return False


def _other_than(generation: int) -> Callable[[int], bool]:
    return lambda value: value != generation


def _check_duration(name: str, value: float, *, positive: bool = False) -> float:
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if positive and value == 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return value


_NO_TRANSACTIONS = (
    "MemoryQueue has no transactions: {method} needs a SQLite or PostgreSQL queue in the "
    "database conn is connected to; with a memory queue, `await queue.{async_}(...)` after "
    "your own commit"
)


@attrs.define(eq=False)
class MemoryQueue(EnqueueFront, SingleWrites):
    """The whole :class:`WorkQueue` protocol in memory; inspectable and resettable.

    :ivar events: every write in order (``claim``, ``renew``, ``settle:<kind>``, ...), including
        refused stale ones (``applied=False``). A list of :class:`QueueEvent` to its readers,
        kept as plain values in the list itself, so that logging a write allocates nothing the
        garbage collector counts: each read builds the events anew (equal, not the same
        objects).
    """

    _clock: Clock = attrs.field(factory=TrioClock, alias="clock")
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
    ``(due_at, id)`` (with stale entries; see the module doc). Every item of one heap is
    blocked by its key, or none is."""
    _running_keyed: dict[str, dict[str, WorkItem]] = attrs.field(init=False, factory=dict)
    """Per concurrency key, its running items by id (live leases or not)."""
    _leased: dict[tuple[str, str], _Heap] = attrs.field(init=False, factory=dict)
    """Per ``(spec id, queue)``, running items by ``(lease_expires_at, id)``."""
    _paused: dict[str, dt.datetime] = attrs.field(init=False, factory=dict)
    """Paused queues, with when they were paused."""
    _last_fires: dict[str, dt.datetime] = attrs.field(init=False, factory=dict)
    """Each schedule's last enqueued fire (see :meth:`fire_schedule`)."""
    _fan_in: dict[str, tuple[str, int]] = attrs.field(init=False, factory=dict)
    """Per waited-for child not yet finished: its parent's id and lease version (the SQL
    backends' ``parent_version`` column)."""
    _children_of: dict[str, list[str]] = attrs.field(init=False, factory=dict)
    """Per parent id, its children's ids in creation order (the SQL backends' parent index)."""
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

    @property
    def clock(self) -> Clock:
        return self._clock

    serial_writes: ClassVar[bool] = True
    """Every call runs in this process, one at a time: a claim beside a write gains nothing."""

    @property
    def capabilities(self) -> frozenset[Capability]:
        """``SETTLE_AND_CLAIM``; ``SERIAL_WRITES`` while :attr:`serial_writes` (a runner then
        settles and claims in one :meth:`settle_and_claim`); ``EXACT_WAKEUPS`` while
        :attr:`exact_wakeups`."""
        found = {Capability.SETTLE_AND_CLAIM}
        if self.serial_writes:
            found.add(Capability.SERIAL_WRITES)
        if self.exact_wakeups:
            found.add(Capability.EXACT_WAKEUPS)
        return declared(type(self), frozenset(found))

    @property
    def exact_wakeups(self) -> bool:
        """True with a :class:`TrioClock`: :meth:`wait_for_work` then wakes exactly when needed.

        Every write happens in this process and wakes the waiters; due times are reached on
        Trio's clock. With another clock (say one a test moves by hand), due times can arrive
        without Trio noticing, so a runner keeps polling.
        """
        return isinstance(self._clock, TrioClock)

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
        self._fan_in.clear()
        self._children_of.clear()
        self._entries.clear()
        self.events.clear()
        self._changed()

    # -- internals ---------------------------------------------------------------------------

    def _now(self) -> dt.datetime:
        now = self._clock.now()
        return now if now.tzinfo is dt.UTC else utc(now)

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

    def _item(self, item_id: str) -> WorkItem:
        try:
            return self._items[item_id]
        except KeyError:
            raise ItemNotFound(item_id) from None

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

    def _live(self, key: str, now: dt.datetime) -> list[dt.datetime]:
        """The lease expiries of *key*'s running items whose lease is live at *now*."""
        running = self._running_keyed.get(key)
        if not running:
            return []
        return [
            item.lease_expires_at
            for item in running.values()
            if item.lease_expires_at is not None and item.lease_expires_at > now
        ]

    def _blocked_until(
        self, key: str | None, limit: int | None, now: dt.datetime
    ) -> dt.datetime | None:
        """When an item of *key* with *limit* stops being blocked by its key's running items
        (no write in between): the *limit*-th latest live lease expiry; None if it is not
        blocked now (or has no key)."""
        if key is None or limit is None:
            return None
        live = self._live(key, now)
        if len(live) < limit:
            return None
        live.sort(reverse=True)
        return live[limit - 1]

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

    def _apply(self, s: Settlement, now: dt.datetime | None = None) -> None:
        op = _SETTLE_OPS[s.kind]
        item = self._fenced(op, s.item_id, s.lease_version)
        now = self._now() if now is None else now
        # Checked before anything changes: an unfit child refuses the whole entry. (Every
        # check comes before the first change: the stored item changes in place.)
        children = (
            [
                check_child(child, what=f"children[{index}]")
                for index, child in enumerate(s.children)
            ]
            if s.children
            else ()
        )
        # The most common kinds first: each test is a comparison.
        kind = s.kind
        if kind == _RESCHEDULE:
            assert s.at is not None
            # The runner's settlements carry their config checked and copied already.
            stored: Any = item  # an UnfrozenItem: plain stores
            stored.config = s.config if s._checked else check_json(s.config)
            self._requeue_evaluated(item, s.at, now)
        elif kind == _CONTINUE:
            self._requeue_evaluated(item, now + dt.timedelta(seconds=s.delay), now)
        elif kind in _FINISHED:
            # As _put, spelled out: a completion is the settlement's hot path.
            finished: Any = item  # an UnfrozenItem: plain stores
            if kind is _COMPLETE:
                # As the SQL backends: a completion stores its result, None included (a
                # retried item completed again without one keeps none of its old one).
                result = s.result
                if result is not None and not s._checked:
                    result = check_json(result, what="result")
                finished.result = result
            elif kind is _DEAD:
                errors = _with_error(item, now, s.error)
                finished.error_count = item.error_count + 1
                finished.last_error = s.error
                finished.errors = errors
            finished.updated_at = now
            finished.state = _FINISHED[kind]
            finished.lease_owner = None
            finished.lease_expires_at = None
            self._store(item)
            if self._fan_in:  # _child_finished's own first test, without the call
                self._child_finished(s.item_id, now)
        elif kind == _RETRY:
            self._requeue(
                item,
                now + dt.timedelta(seconds=s.delay),
                now,
                error_count=item.error_count + 1,
                last_error=s.error,
                errors=_with_error(item, now, s.error),
            )
        elif kind == _RELEASE:
            if s.error is None:
                self._requeue(
                    item,
                    now + dt.timedelta(seconds=s.delay),
                    now,
                    attempt=max(item.attempt - 1, 0),
                )
            else:  # handed back with an error that is not the item's own: recorded, never dead
                self._requeue(
                    item,
                    now + dt.timedelta(seconds=s.delay),
                    now,
                    attempt=max(item.attempt - 1, 0),
                    error_count=item.error_count + 1,
                    last_error=s.error,
                    errors=_with_error(item, now, s.error),
                )
        if children or s.wait_for_children:
            self._create_children(s, children, now)
        # As _log, spelled out.
        self._record(
            (now, op, s.item_id, s.lease_version, True, "delay", s.delay, "error", s.error)
        )

    def _create_children(
        self, s: Settlement, children: Sequence[NewItem], now: dt.datetime
    ) -> None:
        """Write *s*'s checked children (a repeated or existing id, a held key: skipped), then
        the wait."""
        created = 0
        seen: set[str] = set()
        for child in children:
            assert child.item_id is not None
            if child.item_id in seen:
                continue  # an id an earlier child of this outcome has: left out, as on SQL
            seen.add(child.item_id)
            if self._insert_child(child, now, s.item_id) is None:
                continue
            created += 1
            if s.wait_for_children:
                self._fan_in[child.item_id] = (s.item_id, s.lease_version)
        if s.wait_for_children:
            parent = self._items[s.item_id]
            self._put(
                parent,
                now,
                waiting_children=created,
                due_at=WAITING_DUE_AT if created else now,
            )

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

    # -- producing and inspecting ------------------------------------------------------------

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
                results[index] = Enqueued(item=self._out(existing[index]), created=False)
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
        if any(done.created for done in results.values()):
            self._changed()
        return [results[index] for index in range(len(checked))]

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

    async def get(self, item_id: str) -> WorkItem:
        await trio.lowlevel.checkpoint()
        return self._out(self._item(item_id))

    async def list_items(
        self,
        *,
        states: Sequence[ItemState] | None = None,
        spec_ids: Sequence[str] | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[WorkItem]:
        await trio.lowlevel.checkpoint()
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        cursor = None if after is None else self._item(after)
        found = [
            item
            for item in self._items.values()
            if (states is None or item.state in states)
            and (spec_ids is None or item.spec_id in spec_ids)
            and (cursor is None or (item.due_at, item.id) > (cursor.due_at, cursor.id))
        ]
        found.sort(key=lambda item: (item.due_at, item.id))
        out = self._out
        return [out(item) for item in found[:limit]]

    async def counts(self) -> Mapping[tuple[str, ItemState], int]:
        await trio.lowlevel.checkpoint()
        totals: dict[tuple[str, ItemState], int] = {}
        for item in self._items.values():
            key = (item.spec_id, item.state)
            totals[key] = totals.get(key, 0) + 1
        return totals

    async def list_children(self, parent_id: str, *, limit: int = 1000) -> list[WorkItem]:
        await trio.lowlevel.checkpoint()
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        # An id deleted since (or taken again by another item) is no longer this parent's child.
        found = [
            child
            for child_id in self._children_of.get(parent_id, ())
            if (child := self._items.get(child_id)) is not None and child.parent_id == parent_id
        ]
        found.sort(key=lambda item: (item.created_at, item.id))
        out = self._out
        return [out(item) for item in found[:limit]]

    async def request_cancel(self, item_id: str) -> WorkItem:
        await trio.lowlevel.checkpoint()
        item = self._item(item_id)
        if item.state is ItemState.QUEUED:
            now = self._now()
            # A parent cancelled while it waits for children waits no more.
            item = self._put(
                item, now, state=ItemState.CANCELLED, cancel_requested=True, waiting_children=0
            )
            self._child_finished(item_id, now)
        elif item.state is ItemState.RUNNING and not item.cancel_requested:
            item = self._put(item, cancel_requested=True)
        self._log("request_cancel", item_id, state=str(item.state))
        self._changed()
        return self._out(item)

    async def retry(self, item_id: str, *, at: dt.datetime | None = None) -> WorkItem:
        await trio.lowlevel.checkpoint()
        item = self._item(item_id)
        if item.state is ItemState.RUNNING:
            raise ItemStateError(f"item {item_id!r} is running; cancel it first")
        now = self._now()
        item = self._requeue(
            item,
            now if at is None else utc(at),
            now,
            error_count=0,
            attempt=0,
            cancel_requested=False,
            waiting_children=0,
        )
        self._log("retry", item_id)
        self._changed()
        return self._out(item)

    # -- retention and editing ---------------------------------------------------------------

    async def prune(
        self,
        older_than: Mapping[ItemState, float],
        *,
        limit: int | None = None,
        dry_run: bool = False,
    ) -> dict[ItemState, int]:
        await trio.lowlevel.checkpoint()
        ages = check_prune(older_than, limit)
        now = self._now()
        found: dict[ItemState, list[WorkItem]] = {state: [] for state in ages}
        cutoffs = {state: now - dt.timedelta(seconds=age) for state, age in ages.items()}
        for item in self._items.values():
            cutoff = cutoffs.get(item.state)
            if cutoff is not None and item.updated_at <= cutoff:
                found[item.state].append(item)
        counts: dict[ItemState, int] = {}
        for state, items in found.items():
            items.sort(key=lambda item: (item.updated_at, item.id))
            chosen = items if limit is None else items[:limit]
            counts[state] = len(chosen)
            if not dry_run:
                for item in chosen:
                    self._remove(item)
        if not dry_run and any(counts.values()):
            self._log("prune", "", counts={str(k): v for k, v in counts.items()})
            self._changed()
        return counts

    def _remove(self, item: WorkItem) -> None:
        """Forget *item* (its heap entries go stale and are dropped as usual). Its children
        stay, no longer listed under its id: an item created with that id later is another
        incarnation, with children of its own (the SQL backends' ``parent_incarnation``)."""
        del self._items[item.id]
        self._entries.pop(item.id, None)
        self._children_of.pop(item.id, None)
        if item.idempotency_key is not None and self._keys.get(item.idempotency_key) == item.id:
            del self._keys[item.idempotency_key]

    async def delete(self, item_id: str) -> WorkItem:
        await trio.lowlevel.checkpoint()
        item = self._item(item_id)
        if item.state is ItemState.RUNNING:
            raise ItemStateError(f"item {item_id!r} is running; cancel it first")
        if getattr(item, "waiting_children", 0):
            raise ItemStateError(f"item {item_id!r} is waiting for its children")
        if self._waited_for(item_id):
            raise ItemStateError(
                f"item {item_id!r} is a child its parent waits for; cancel it first (the parent "
                "counts it), then delete it"
            )
        self._remove(item)
        self._log("delete", item_id)
        self._changed()
        return self._out(item)

    async def edit_config(self, item_id: str, config: JSONValue) -> WorkItem:
        await trio.lowlevel.checkpoint()
        config = check_config(config)
        item = self._item(item_id)
        if item.state is ItemState.RUNNING:
            raise ItemStateError(
                f"item {item_id!r} is running; its config can change once it is not"
            )
        item = self._put(item, config=config)
        self._log("edit_config", item_id)
        return self._out(item)

    # -- the worker side ---------------------------------------------------------------------

    async def claim_due(
        self,
        spec_ids: Sequence[str],
        worker_id: str,
        lease: float,
        limit: int,
        *,
        queue: str = DEFAULT_QUEUE,
    ) -> list[WorkItem]:
        await trio.lowlevel.checkpoint()
        return self._claim_due(spec_ids, worker_id, lease, limit, queue)

    def _claim_due(
        self, spec_ids: Sequence[str], worker_id: str, lease: float, limit: int, queue: str
    ) -> list[WorkItem]:
        lease = _check_duration("lease", lease, positive=True)
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        if queue in self._paused:
            return []
        now = self._now()
        wanted = set(spec_ids)
        # Running items whose lease has expired (rescue), in (priority, due_at, id) order.
        expired: list[WorkItem] = []
        for spec_id in sorted(wanted):
            heap = self._leased.get((spec_id, queue))
            while (entry := self._top(heap)) is not None and entry[0] <= now:
                assert heap is not None
                expired.append(heapq.heappop(heap)[3])
        expired.sort(key=lambda item: (item.priority, item.due_at, item.id), reverse=True)
        # Live leases per concurrency key, counted once, before this claim takes any.
        live: dict[str, int] = {}

        def blocked(key: str | None, key_limit: int | None) -> bool:
            if key is None or key_limit is None:
                return False
            if key not in live:
                live[key] = len(self._live(key, now))
            return live[key] >= key_limit

        # A heap's items share a key and limit: a heap blocked by its key is left out whole.
        queued = sorted(
            (
                (key, heap)
                for key, heap in self._queued.items()
                if key[0] in wanted and key[1] == queue and heap and not blocked(key[3], key[4])
            ),
            key=lambda pair: pair[0][2],
        )
        # The window: the first `limit` claimable items not blocked by their key, in
        # (priority, due_at, id) order (see the protocol's module doc).
        window: list[tuple[WorkItem, Any]] = []
        put_back: list[WorkItem] = []
        if not expired and len(queued) == 1 and queued[0][0][3] is None:
            # One heap, no key, nothing to rescue (a busy queue of one kind): the window is
            # that heap's due items, in order, without comparing heads per item.
            [(heap_key, heap)] = queued
            top = self._top
            while len(window) < limit:
                entry = top(heap)
                if entry is None or entry[0] > now:
                    break
                window.append((heapq.heappop(heap)[3], heap_key))
        while len(window) < limit:
            while expired and blocked(expired[-1].concurrency_key, expired[-1].concurrency_limit):
                put_back.append(expired.pop())
            best: tuple[int, dt.datetime, str] | None = None
            source: tuple[Any, list[_Entry]] | None = None
            if expired:
                best = (expired[-1].priority, expired[-1].due_at, expired[-1].id)
            for heap_key, heap in queued:
                entry = self._top(heap)
                if entry is None or entry[0] > now:
                    continue
                candidate = (heap_key[2], entry[0], entry[1])
                if best is None or candidate < best:
                    best, source = candidate, (heap_key, heap)
            if best is None:
                break
            if source is None:
                window.append((expired.pop(), None))
            else:
                window.append((heapq.heappop(source[1])[3], source[0]))
        claimed: list[WorkItem] = []
        record = self._record
        expires = now + dt.timedelta(seconds=lease)
        ranks: dict[str, int] = {}
        for item, home in window:
            ckey = item.concurrency_key
            if ckey is not None:
                assert item.concurrency_limit is not None
                ranks[ckey] = rank = ranks.get(ckey, 0) + 1
                if rank > item.concurrency_limit - live[ckey]:
                    # Past its key's free slots in this claim: left as it was, still claimable.
                    if home is None:
                        put_back.append(item)
                    else:
                        self._push(self._queued, home, item.due_at, item)
                    continue
            # As _put, spelled out: this is the claim's hot path.
            claimed_item: Any = item  # an UnfrozenItem: plain stores
            claimed_item.updated_at = now
            claimed_item.state = _RUNNING
            claimed_item.lease_owner = worker_id
            claimed_item.lease_expires_at = expires
            claimed_item.lease_version = next(self._versions)
            claimed_item.attempt = item.attempt + 1
            if ckey is None:
                # As _store for an unkeyed running item: stored already (a live heap entry's
                # item is the stored one, changed in place), so only its lease entry is new.
                self._push(self._leased, (item.spec_id, item.queue), expires, item)
            else:
                self._store(item)
            record(
                (
                    now,
                    "claim",
                    item.id,
                    item.lease_version,
                    True,
                    "worker_id",
                    worker_id,
                    _NO_PAIR,
                    None,
                )
            )
            claimed.append(_copy(item))
        for item in (*expired, *put_back):
            # Not claimed this time (the limit, or its key): back in its heap, still claimable.
            assert item.lease_expires_at is not None
            self._push(self._leased, (item.spec_id, item.queue), item.lease_expires_at, item)
        return claimed

    def _renew_one(self, lease: Lease, now: dt.datetime, expires: dt.datetime) -> LeaseStatus:
        # The clock is read once per call by the caller, and the event is built directly: with
        # thousands of leases in a round, three clock reads and the keyword plumbing of _put and
        # _log per lease were most of a round's cost (issue 17's P11 profile).
        item = self._items.get(lease.item_id)
        if (
            item is None
            or item.state is not _RUNNING
            or item.lease_version != lease.version
            or item.lease_owner != lease.worker_id
            or (
                # A keyed item's expired lease freed its key's slot: too late to renew it.
                item.concurrency_key is not None
                and item.lease_expires_at is not None
                and item.lease_expires_at <= self._now()
            )
        ):
            self._record(
                (now, "renew", lease.item_id, lease.version, False, _SHARED, None, None, None)
            )
            return LeaseStatus.LOST
        # In place, nothing pushed when the lease is extended (see the module doc); a shorter
        # lease than the last one needs an entry at its earlier expiry.
        extended = item.lease_expires_at is not None and expires >= item.lease_expires_at
        renewed: Any = item  # an UnfrozenItem: plain stores
        renewed.updated_at = now
        renewed.lease_expires_at = expires
        if not extended:
            self._push(self._leased, (item.spec_id, item.queue), expires, item)
        self._record((now, "renew", lease.item_id, lease.version, True, _SHARED, None, None, None))
        return LeaseStatus.CANCEL_REQUESTED if item.cancel_requested else LeaseStatus.HELD

    async def renew(
        self, item_id: str, worker_id: str, lease_version: int, lease: float
    ) -> LeaseStatus:
        await trio.lowlevel.checkpoint()
        lease = _check_duration("lease", lease, positive=True)
        now = self._now()
        expires = now + dt.timedelta(seconds=lease)
        status = self._renew_one(Lease(item_id, lease_version, worker_id), now, expires)
        if status is LeaseStatus.LOST:
            raise LeaseLost(item_id, lease_version, "renewal refused")
        return status

    async def renew_many(self, leases: Sequence[Lease], lease: float) -> dict[str, LeaseStatus]:
        await trio.lowlevel.checkpoint()
        lease = _check_duration("lease", lease, positive=True)
        now = self._now()
        expires = now + dt.timedelta(seconds=lease)
        renew = self._renew_one
        return {each.item_id: renew(each, now, expires) for each in leases}

    async def mark_error(self, item_id: str, lease_version: int, error: str) -> None:
        await trio.lowlevel.checkpoint()
        item = self._fenced("mark_error", item_id, lease_version)
        error = storable_text(error)
        now = self._now()
        self._put(
            item,
            now,
            error_count=item.error_count + 1,
            last_error=error,
            errors=_with_error(item, now, error),
        )
        self._log("mark_error", item_id, lease_version, error=error)

    async def _settle_one(self, settlement: Settlement) -> None:
        await trio.lowlevel.checkpoint()
        self._apply(settlement)
        self._changed()

    async def settle_many(self, settlements: Sequence[Settlement]) -> list[bool]:
        await trio.lowlevel.checkpoint()
        return self._settle_many(settlements)

    def _settle_many(self, settlements: Sequence[Settlement]) -> list[bool]:
        results = []
        now = self._now()
        for settlement in settlements:
            try:
                self._apply(settlement, now)
            except LeaseLost:
                results.append(False)
                continue
            except (ValueError, OverflowError) as error:
                # Unstorable (see unstorable_outcome): dead, saying why; its batch-mates go on.
                self._apply(unstorable_outcome(settlement, error), now)
            results.append(True)
        if any(results):
            self._changed()
        return results

    async def settle_and_claim(
        self,
        settlements: Sequence[Settlement],
        spec_ids: Sequence[str],
        worker_id: str,
        lease: float,
        limit: int,
        *,
        queue: str = DEFAULT_QUEUE,
    ) -> tuple[list[bool], list[WorkItem]]:
        """:meth:`settle_many`, then :meth:`claim_due`, with no checkpoint between: the
        reference the SQL backends' one transaction matches (no other task sees the settlements
        applied before the call returns). A claim that fails once the settlements are applied
        claims nothing (the next :meth:`claim_due` reports the error)."""
        await trio.lowlevel.checkpoint()
        _check_duration("lease", lease, positive=True)
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        results = self._settle_many(settlements)
        try:
            items = self._claim_due(spec_ids, worker_id, lease, limit, queue)
        except Exception:
            items = []
        return results, items

    async def next_due_at(
        self, spec_ids: Sequence[str], *, queues: Sequence[str] | None = None
    ) -> dt.datetime | None:
        await trio.lowlevel.checkpoint()
        return self._next_due_at(set(spec_ids), None if queues is None else set(queues))

    def _next_due_at(self, wanted: set[str], queues: set[str] | None) -> dt.datetime | None:
        times = []
        now = self._now()
        for heap_key, heap in self._queued.items():
            spec_id, queue = heap_key[0], heap_key[1]
            if (
                spec_id not in wanted
                or (queues is not None and queue not in queues)
                or queue in self._paused
            ):
                continue
            entry = self._top(heap)
            if entry is not None:
                # A heap's items share a key: blocked, none is claimable before it frees.
                until = self._blocked_until(heap_key[3], heap_key[4], now)
                times.append(entry[0] if until is None else max(entry[0], until))
        for (spec_id, queue), heap in self._leased.items():
            if (
                spec_id not in wanted
                or (queues is not None and queue not in queues)
                or queue in self._paused
            ):
                continue
            if (entry := self._top(heap)) is None:
                continue
            if not self._running_keyed:
                times.append(entry[0])
                continue
            # A keyed expired lease may be blocked by its key: look at each (few run at once).
            live = self._entries
            for _, item_id, push, item in heap:
                if live.get(item_id) == push:
                    at = item.lease_expires_at
                    assert at is not None
                    until = self._blocked_until(item.concurrency_key, item.concurrency_limit, now)
                    times.append(at if until is None else max(at, until))
        return min(times, default=None)

    async def wait_for_work(
        self, spec_ids: Sequence[str], *, queues: Sequence[str] | None = None
    ) -> None:
        wanted = set(spec_ids)
        served = None if queues is None else set(queues)
        while True:
            generation = self._changes.value
            next_due = self._next_due_at(wanted, served)
            if next_due is not None and next_due <= self._now():
                await trio.lowlevel.checkpoint()
                return
            wait = float("inf") if next_due is None else (next_due - self._now()).total_seconds()
            with trio.move_on_after(wait):
                await self._changes.wait_value(_other_than(generation))

    # -- schedules ---------------------------------------------------------------------------

    async def fire_schedule(self, name: str, fire: dt.datetime, entry: NewItem) -> Enqueued | None:
        await trio.lowlevel.checkpoint()
        check_name(name, "schedule name")
        fire = utc(fire)
        check_entries([entry])  # refused before anything is recorded
        last = self._last_fires.get(name)
        if last is not None and fire <= last:
            return None
        [done] = self._enqueue_many([entry])  # no checkpoint in between: one step
        self._last_fires[name] = fire
        return done

    async def last_fires(self, names: Sequence[str]) -> dict[str, dt.datetime]:
        await trio.lowlevel.checkpoint()
        return {name: self._last_fires[name] for name in names if name in self._last_fires}

    # -- queues ------------------------------------------------------------------------------

    async def pause_queue(self, queue: str) -> bool:
        await trio.lowlevel.checkpoint()
        check_queue_name(queue)
        if queue in self._paused:
            return False
        self._paused[queue] = self._now()
        self._log("pause_queue", queue)
        self._changed()
        return True

    async def resume_queue(self, queue: str) -> bool:
        await trio.lowlevel.checkpoint()
        check_queue_name(queue)
        if self._paused.pop(queue, None) is None:
            return False
        self._log("resume_queue", queue)
        self._changed()
        return True

    async def list_queues(self) -> list[QueueInfo]:
        await trio.lowlevel.checkpoint()
        counts: dict[str, dict[ItemState, int]] = {name: {} for name in self._paused}
        for item in self._items.values():
            per_state = counts.setdefault(item.queue, {})
            per_state[item.state] = per_state.get(item.state, 0) + 1
        return [
            QueueInfo(
                name=name,
                paused=name in self._paused,
                paused_at=self._paused.get(name),
                counts=counts[name],
            )
            for name in sorted(counts)
        ]

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()
        self.closed = True
