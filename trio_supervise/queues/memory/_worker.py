"""The memory queue's worker side (:class:`WorkerSide`): claims and their window, renewals,
settlements with their children, the seed's single writes, and waiting for work.
"""

from __future__ import annotations

import datetime as dt
import heapq
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import trio

from ..._errors import LeaseLost
from ...job import (
    DEFAULT_QUEUE,
    WAITING_DUE_AT,
    ErrorEntry,
    ItemState,
    Lease,
    LeaseStatus,
    NewItem,
    SettleKind,
    Settlement,
    WorkItem,
    admitted,
    append_error,
    cap_of,
    check_child,
    check_json,
    key_caps,
    key_logs_after,
    recorded,
    storable_text,
    unstorable_outcome,
)
from .._ports import SingleWrites
from ._events import _NO_PAIR, _SHARED
from ._state import _RUNNING, MemoryState, _copy

__all__ = ["WorkerSide"]

# As _state's: module names for the members the hot paths test for.
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


def _with_error(item: WorkItem, now: dt.datetime, error: str | None) -> tuple[ErrorEntry, ...]:
    """*item*'s error history with *error* appended, by its current lease owner and attempt."""
    entry = ErrorEntry(
        at=now, worker=item.lease_owner or "", attempt=item.attempt, error=error or ""
    )
    return append_error(item.errors, entry)


def _other_than(generation: int) -> Callable[[int], bool]:
    return lambda value: value != generation


def _check_duration(name: str, value: float, *, positive: bool = False) -> float:
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if positive and value == 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return value


class WorkerSide(MemoryState, SingleWrites):
    """What a runner uses (:class:`WorkerStore`), and the seed's single-item writes."""

    __slots__ = ()

    if TYPE_CHECKING:  # the producer side's, called here

        def _insert_child(
            self, child: NewItem, now: dt.datetime, parent_id: str
        ) -> WorkItem | None: ...

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
        rated = self._rates.get(queue)
        if rated is None:
            return self._claim_window(spec_ids, worker_id, lease, limit, queue, now)
        # A rate-limited queue (see docs/flow-control.md): no more than its window lets start.
        rate, starts = rated
        kept, now, free = admitted(starts, rate, now)
        claimed = self._claim_window(spec_ids, worker_id, lease, min(limit, free), queue, now)
        if claimed:  # as the SQL backends: the log is written when items started
            starts[:] = recorded(kept, now, len(claimed), rate)
        return claimed

    def _claim_window(
        self,
        spec_ids: Sequence[str],
        worker_id: str,
        lease: float,
        limit: int,
        queue: str,
        now: dt.datetime,
    ) -> list[WorkItem]:
        lease_now = self._lease_now(now, 2 * lease)
        wanted = set(spec_ids)
        # Running items whose lease has expired (rescue), in (priority, due_at, id) order.
        expired: list[WorkItem] = []
        for spec_id in sorted(wanted):
            heap = self._leased.get((spec_id, queue))
            while (entry := self._top(heap)) is not None and entry[0] <= lease_now:
                assert heap is not None
                expired.append(heapq.heappop(heap)[3])
        expired.sort(key=lambda item: (item.priority, item.due_at, item.id), reverse=True)
        # Live leases per concurrency key, counted once, before this claim takes any; and,
        # with key rate limits, what each key's window lets start (see job/_key_rates.py).
        live: dict[str, int] = {}
        caps: dict[str, Any] = {}
        rules = self._key_rules

        def blocked(key: str | None, key_limit: int | None) -> bool:
            if key is None or key_limit is None:
                return False
            if key not in live:
                live[key] = len(self._live(key, lease_now))
                if rules:
                    caps.update(key_caps([key], rules, self._key_starts, now))
            return live[key] >= key_limit or cap_of(caps, key) <= 0

        # A heap's items share a key and limit: a heap blocked by its key is left out whole
        # (judged when its head would be taken next, so a claim with many keys waiting judges
        # only the keys it reaches).
        queued = [
            (key, heap)
            for key, heap in self._queued.items()
            if key[0] in wanted and key[1] == queue and heap
        ]
        # The window: the first `limit` claimable items not blocked by their key, in
        # (priority, due_at, id) order (see docs/queues.md, "Concurrency keys").
        window: list[tuple[WorkItem, Any]] = []
        put_back: list[WorkItem] = []
        top = self._top
        if not expired and len(queued) == 1 and queued[0][0][3] is None:
            # One heap, no key, nothing to rescue (a busy queue of one kind): the window is
            # that heap's due items, in order, without comparing heads per item.
            [(heap_key, heap)] = queued
            while len(window) < limit:
                entry = top(heap)
                if entry is None or entry[0] > now:
                    break
                window.append((heapq.heappop(heap)[3], heap_key))
        else:
            # The heaps' due heads merged in order: each heap's next head goes back in when its
            # head is taken, so a claim costs its window, not the heaps waiting times the window.
            heads: list[tuple[tuple[int, dt.datetime, str], int]] = []
            for n, (heap_key, heap) in enumerate(queued):
                entry = top(heap)
                if entry is not None and entry[0] <= now:
                    heads.append(((heap_key[2], entry[0], entry[1]), n))
            heapq.heapify(heads)
            while len(window) < limit:
                while expired and blocked(
                    expired[-1].concurrency_key, expired[-1].concurrency_limit
                ):
                    put_back.append(expired.pop())
                while heads and blocked(queued[heads[0][1]][0][3], queued[heads[0][1]][0][4]):
                    heapq.heappop(heads)  # its key is at its limit or its rate: all of it waits
                rescue = expired[-1] if expired else None
                if heads and (
                    rescue is None or heads[0][0] < (rescue.priority, rescue.due_at, rescue.id)
                ):
                    n = heads[0][1]
                    heap_key, heap = queued[n]
                    window.append((heapq.heappop(heap)[3], heap_key))
                    entry = top(heap)
                    if entry is None or entry[0] > now:
                        heapq.heappop(heads)
                    else:
                        heapq.heapreplace(heads, ((heap_key[2], entry[0], entry[1]), n))
                elif rescue is not None:
                    window.append((expired.pop(), None))
                else:
                    break
        claimed: list[WorkItem] = []
        record = self._record
        expires = now + dt.timedelta(seconds=lease)
        ranks: dict[str, int] = {}
        for item, home in window:
            ckey = item.concurrency_key
            if ckey is not None:
                assert item.concurrency_limit is not None
                ranks[ckey] = rank = ranks.get(ckey, 0) + 1
                if rank > min(item.concurrency_limit - live[ckey], cap_of(caps, ckey)):
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
        if caps:  # as the SQL backends: a key's log is written when its items started
            self._record_key_starts(caps, claimed)
        for item in (*expired, *put_back):
            # Not claimed this time (the limit, or its key): back in its heap, still claimable.
            assert item.lease_expires_at is not None
            self._push(self._leased, (item.spec_id, item.queue), item.lease_expires_at, item)
        return claimed

    def _record_key_starts(self, caps: dict[str, Any], claimed: Sequence[WorkItem]) -> None:
        self._key_starts.update(key_logs_after(caps, claimed))

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

    async def renew_many(self, leases: Sequence[Lease], lease: float) -> dict[str, LeaseStatus]:
        await trio.lowlevel.checkpoint()
        lease = _check_duration("lease", lease, positive=True)
        now = self._now()
        expires = now + dt.timedelta(seconds=lease)
        renew = self._renew_one
        return {each.item_id: renew(each, now, expires) for each in leases}

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
                and item.lease_expires_at <= self._lease_now(now)
            )
        ):
            self._record(
                (now, "renew", lease.item_id, lease.version, False, _SHARED, None, None, None)
            )
            return LeaseStatus.LOST
        # In place, nothing pushed when the lease is extended (see MemoryState); a shorter
        # lease than the last one needs an entry at its earlier expiry.
        extended = item.lease_expires_at is not None and expires >= item.lease_expires_at
        renewed: Any = item  # an UnfrozenItem: plain stores
        renewed.updated_at = now
        renewed.lease_expires_at = expires
        if not extended:
            self._push(self._leased, (item.spec_id, item.queue), expires, item)
        self._record((now, "renew", lease.item_id, lease.version, True, _SHARED, None, None, None))
        return LeaseStatus.CANCEL_REQUESTED if item.cancel_requested else LeaseStatus.HELD

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
        woken = self._woken
        if woken and s.item_id in woken:
            # An event came while it ran (send_event): a reschedule is due at once.
            woken.discard(s.item_id)
            at = now if kind == _RESCHEDULE else s.at
        else:
            at = s.at
        if kind == _RESCHEDULE:
            assert at is not None
            # The runner's settlements carry their config checked and copied already.
            stored: Any = item  # an UnfrozenItem: plain stores
            stored.config = s.config if s._checked else check_json(s.config)
            self._requeue_evaluated(item, at, now)
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

    async def _settle_one(self, settlement: Settlement) -> None:
        await trio.lowlevel.checkpoint()
        self._apply(settlement)
        self._changed()

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

    async def next_due_at(
        self, spec_ids: Sequence[str], *, queues: Sequence[str] | None = None
    ) -> dt.datetime | None:
        await trio.lowlevel.checkpoint()
        return self._next_due_at(set(spec_ids), None if queues is None else set(queues))

    def _next_due_at(self, wanted: set[str], queues: set[str] | None) -> dt.datetime | None:
        times = []
        wall = self._now()  # judges rate limits' windows
        now = self._lease_now(wall)  # judges leases only: when a key frees
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
                # A heap's items share a key: blocked, none is claimable before it frees; nor
                # before their queue's rate limit lets a start in.
                until = self._blocked_until(heap_key[3], heap_key[4], now)
                when = entry[0] if until is None else max(entry[0], until)
                if self._rates and (throttled := self._throttled(queue, wall)) is not None:
                    when = max(when, throttled)
                if self._key_rules and (held := self._key_throttled(heap_key[3], wall)):
                    when = max(when, held)  # nor before its key's rate limit lets one in
                times.append(when)
        for (spec_id, queue), heap in self._leased.items():
            if (
                spec_id not in wanted
                or (queues is not None and queue not in queues)
                or queue in self._paused
            ):
                continue
            if (entry := self._top(heap)) is None:
                continue
            # Nor before the queue's rate limit lets a start in (the same for all of them).
            throttled = self._throttled(queue, wall) if self._rates else None
            if not self._running_keyed:
                times.append(entry[0] if throttled is None else max(entry[0], throttled))
                continue
            # A keyed expired lease may be blocked by its key: look at each (few run at once).
            live = self._entries
            for _, item_id, push, item in heap:
                if live.get(item_id) == push:
                    at = item.lease_expires_at
                    assert at is not None
                    until = self._blocked_until(item.concurrency_key, item.concurrency_limit, now)
                    held = self._key_throttled(item.concurrency_key, wall)
                    times.append(max(at, until or at, throttled or at, held or at))
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
