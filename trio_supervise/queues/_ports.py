"""The store, split by who uses it: one small protocol per user, and the abilities a store declares.

- :class:`WorkerStore`: what a runner uses (claims, renewals, settlements, waiting for work);
- :class:`ProducerStore`: what enqueues (one front, :class:`EnqueueFront`, over ``enqueue_many``);
- :class:`OperatorStore`: what a person or a console uses (reads, cancel, retry, delete, pause);
- :class:`MaintenanceStore`: what upkeep uses (retention, schedule fires);
- :class:`WorkQueue`: all four, what every backend of this package is;
- :class:`AuditStore`: a store that keeps the console's audit trail (declared as
  :attr:`Capability.AUDIT_TRAIL`);
- :class:`ErrorHistoryStore`: a store that reads its items' error histories as one list
  (declared as :attr:`Capability.ERROR_HISTORY`);
- :class:`SeedWrites`: the seed's single-item writes, for stores written to that interface.

A store declares what more it can do as :class:`Capability` values in ``capabilities``; callers
ask :func:`capabilities_of`. The contract each method keeps is in ``docs/queues.md``.
"""

from __future__ import annotations

import datetime as dt
import enum
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import attrs
from typing_extensions import Unpack

from .._audit import AuditTrail
from .._clock import Clock
from ..job import (
    DEFAULT_QUEUE,
    Enqueued,
    EnqueueOptions,
    ItemError,
    ItemState,
    Journal,
    JournalEntry,
    JSONValue,
    Lease,
    LeaseStatus,
    NewItem,
    QueueInfo,
    RateLimit,
    SettleKind,
    Settlement,
    WorkItem,
    check_json,
)

__all__ = [
    "AuditStore",
    "BatchWrites",
    "Capability",
    "DurableJournal",
    "EnqueueFront",
    "ErrorHistoryStore",
    "MaintenanceStore",
    "OperatorStore",
    "ProducerStore",
    "RateLimitStore",
    "SeedWrites",
    "SingleWrites",
    "WorkQueue",
    "WorkerStore",
    "audit_trail_of",
    "capabilities_of",
    "combines",
    "declared",
    "entry_signature",
]


_F = TypeVar("_F", bound=Callable[..., Any])


def entry_signature(function: _F) -> _F:
    """*function* (``f(self, [conn,] spec_id, **options)``) with the signature it is called
    with: :class:`NewItem`'s fields as keyword-only parameters with their defaults, for
    ``inspect.signature`` and the reference docs (its type is ``Unpack[EnqueueOptions]``)."""
    signature = inspect.signature(function)
    head = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    keywords = [
        inspect.Parameter(
            field.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=field.default,
            annotation=EnqueueOptions.__annotations__[field.name],
        )
        for field in attrs.fields(NewItem)
        if field.name != "spec_id"
    ]
    function.__signature__ = signature.replace(parameters=[*head, *keywords])  # type: ignore[attr-defined]
    return function


class Capability(enum.StrEnum):
    """What a store can do beyond its ports (declared in its ``capabilities``)."""

    SETTLE_AND_CLAIM = "settle-and-claim"
    """``settle_and_claim(settlements, spec_ids, worker_id, lease, limit, *, queue)``:
    ``settle_many`` then ``claim_due`` in one call, the claim seeing every effect of the
    settlements (see ``docs/queues.md``, "Settle and claim")."""
    SERIAL_WRITES = "serial-writes"
    """Its calls run one at a time anyway (one writer connection, or no I/O): a claim beside a
    write would gain nothing, so a runner writes and claims in one ``settle_and_claim``."""
    EXACT_WAKEUPS = "exact-wakeups"
    """``wait_for_work`` returns by itself whenever work may have become claimable: on every
    write that can make work due, from anywhere, and at the next due time by Trio's clock, so
    a runner waits without polling."""
    RATE_LIMITS = "rate-limits"
    """``set_rate_limit(queue, rate)`` (:class:`RateLimitStore`): at most N starts per period
    from a queue, fleet-wide, enforced in the claim (see ``docs/flow-control.md``)."""
    KEY_RATE_LIMITS = "key-rate-limits"
    """``set_key_rate_limit(key_or_template, rate)`` (:class:`KeyRateLimitStore`): at most N
    starts per period of each concurrency key, fleet-wide, enforced in the claim (see
    ``docs/flow-control.md``)."""
    TRANSACTIONAL_ENQUEUE = "transactional-enqueue"
    """``enqueue_on(conn, ...)`` / ``enqueue_many_on(conn, entries)``: enqueue inside the
    application's own open transaction."""
    AUDIT_TRAIL = "audit-trail"
    """It is an :class:`AuditStore`: ``audit``, an :class:`~trio_supervise.AuditTrail` kept
    with the items (in the database on the SQL stores, so it survives a restart), and
    ``prune_audit`` for retention."""
    ERROR_HISTORY = "error-history"
    """It is an :class:`ErrorHistoryStore`: ``recent_errors(limit=, before=)``, the entries of
    its items' error histories, newest first, in pages."""
    DURABLE_JOURNAL = "durable-journal"
    """The :class:`DurableJournal` port: each item incarnation's journal of steps, sleeps and
    waits, written fenced by the lease version, and events sent to items."""


@runtime_checkable
class WorkerStore(Protocol):
    """What a runner uses: claims under a lease, renewals, fenced settlements, waits."""

    @property
    def clock(self) -> Clock:
        """Where this store reads "now" from for due times and lease expiries."""
        ...

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What this store can do beyond its ports."""
        ...

    async def claim_due(
        self,
        spec_ids: Sequence[str],
        worker_id: str,
        lease: float,
        limit: int,
        *,
        queue: str = DEFAULT_QUEUE,
    ) -> list[WorkItem]:
        """Claim up to *limit* claimable items of *spec_ids* in *queue* for *lease* seconds,
        by ``(priority, due_at, id)``; none while *queue* is paused."""
        ...

    async def renew_many(self, leases: Sequence[Lease], lease: float) -> dict[str, LeaseStatus]:
        """Renew many leases in one round trip; stale ones come back as ``LOST``."""
        ...

    async def settle_many(self, settlements: Sequence[Settlement]) -> list[bool]:
        """Apply many outcomes in one round trip; per entry, True if applied, False if stale."""
        ...

    async def next_due_at(
        self, spec_ids: Sequence[str], *, queues: Sequence[str] | None = None
    ) -> dt.datetime | None:
        """When the next item of *spec_ids* becomes claimable (may be in the past), or None.
        Only items of *queues* (default: every queue) that are not paused count."""
        ...

    async def wait_for_work(
        self, spec_ids: Sequence[str], *, queues: Sequence[str] | None = None
    ) -> None:
        """Return when work of *spec_ids* in *queues* (default: every queue) may be claimable;
        callers bound the wait with a cancel scope (their poll interval)."""
        ...


@runtime_checkable
class ProducerStore(Protocol):
    """What enqueues work."""

    @entry_signature
    async def enqueue(self, spec_id: str, **options: Unpack[EnqueueOptions]) -> WorkItem:
        """Add an item (the options are :class:`NewItem`'s fields); see :class:`EnqueueFront`."""
        ...

    async def enqueue_many(self, entries: Sequence[NewItem]) -> list[Enqueued]:
        """Add many items at once (one transaction); per entry, in order, what it did."""
        ...

    async def get_by_key(self, idempotency_key: str) -> WorkItem:
        """The item holding *idempotency_key*; else the newest one that held it."""
        ...


@runtime_checkable
class OperatorStore(Protocol):
    """What a person (the CLI, the console) reads and does."""

    async def get(self, item_id: str) -> WorkItem:
        """The item as stored now; :class:`ItemNotFound` if there is none."""
        ...

    async def list_items(
        self,
        *,
        states: Sequence[ItemState] | None = None,
        spec_ids: Sequence[str] | None = None,
        limit: int = 100,
        after: str | None = None,
        tags: Sequence[str] | None = None,
    ) -> list[WorkItem]:
        """Items filtered by state and spec (and carrying every one of *tags*), by
        ``(due_at, id)``, after the cursor *after*; one snapshot."""
        ...

    async def counts(self) -> Mapping[tuple[str, ItemState], int]:
        """How many items there are per ``(spec_id, state)`` (pairs with none are omitted)."""
        ...

    async def list_children(self, parent_id: str, *, limit: int = 1000) -> list[WorkItem]:
        """The children of *parent_id*'s current incarnation, by ``(created_at, id)``."""
        ...

    async def list_queues(self) -> list[QueueInfo]:
        """Every queue that holds items or is paused, by name; one snapshot."""
        ...

    async def request_cancel(self, item_id: str) -> WorkItem:
        """Cancel a queued item at once, or flag a running one for its owner."""
        ...

    async def retry(self, item_id: str, *, at: dt.datetime | None = None) -> WorkItem:
        """Put a finished (or queued) item back, due at *at* (default: now)."""
        ...

    async def delete(self, item_id: str) -> WorkItem:
        """Delete one item that is not running nor waited for; return it as it was."""
        ...

    async def edit_config(self, item_id: str, config: JSONValue) -> WorkItem:
        """Replace the config of an item that is not running."""
        ...

    async def pause_queue(self, queue: str) -> bool:
        """Stop claims from *queue* across the fleet; False if it was paused already."""
        ...

    async def resume_queue(self, queue: str) -> bool:
        """Let *queue* be claimed again; False if it was not paused."""
        ...


@runtime_checkable
class RateLimitStore(Protocol):
    """Rate limits on named queues (:attr:`Capability.RATE_LIMITS`): kept by the store, so every
    process claiming from it keeps them; ``list_queues`` shows them."""

    async def set_rate_limit(self, queue: str, rate: RateLimit | None) -> None:
        """Let at most ``rate.limit`` items of *queue* start in any ``rate.period`` seconds
        (None: no limit). The starts recorded so far still count."""
        ...


@runtime_checkable
class KeyRateLimitStore(Protocol):
    """Rate limits per concurrency key (:attr:`Capability.KEY_RATE_LIMITS`): kept by the store,
    so every process claiming from it keeps them."""

    async def set_key_rate_limit(self, key: str, rate: RateLimit | None) -> None:
        """Let at most ``rate.limit`` items of a concurrency key start in any ``rate.period``
        seconds (None: no limit). *key* is a key (``"tenant:acme"``) or a template over
        ``{tenant}`` and ``{subject}`` (``"partner:{tenant}"``): each key it renders has a
        window of its own."""
        ...

    async def key_rate_limits(self) -> dict[str, RateLimit]:
        """Every key rate limit, by its key or template."""
        ...

    async def throttled_keys(self) -> dict[str, dt.datetime]:
        """The keys whose window is full now, each with when it lets a start in again."""
        ...

    async def prune_key_logs(self, *, limit: int | None = None) -> int:
        """Forget the starts logged for keys whose latest start is older than the longest
        rule's period (they can hold no claim back any more), at most *limit* keys; how many.
        A log is kept per key ever started under a rule, so retention calls this."""
        ...


@runtime_checkable
class MaintenanceStore(Protocol):
    """What upkeep uses: retention and schedule fires."""

    async def prune(
        self,
        older_than: Mapping[ItemState, float],
        *,
        limit: int | None = None,
        dry_run: bool = False,
    ) -> dict[ItemState, int]:
        """Delete finished items last updated at least ``older_than[state]`` seconds ago."""
        ...

    async def fire_schedule(self, name: str, fire: dt.datetime, entry: NewItem) -> Enqueued | None:
        """Enqueue *entry* as schedule *name*'s fire at *fire*, unless a fire at or after it
        was recorded (then None); recording and enqueueing are one transaction."""
        ...

    async def last_fires(self, names: Sequence[str]) -> dict[str, dt.datetime]:
        """The last fire recorded for each of the schedules *names* that has one."""
        ...


@runtime_checkable
class DurableJournal(Protocol):
    """What a durable workflow uses (declared as :attr:`Capability.DURABLE_JOURNAL`).

    Each item incarnation has a journal of positions 0, 1, ... (an item id used again starts
    with none); it is deleted with its item (``delete``, ``prune``) and kept by ``retry``.
    """

    @property
    def clock(self) -> Clock:
        """Where this store reads "now" from (a workflow's sleeps and deadlines)."""
        ...

    async def read_journal(self, item_id: str) -> Journal:
        """The journal of *item_id*'s current incarnation and the events sent to it, in one
        snapshot; :class:`ItemNotFound` if there is no such item."""
        ...

    async def record_entry(self, item_id: str, lease_version: int, entry: JournalEntry) -> None:
        """Write *entry* at its position, fenced: only while *lease_version* holds the running
        item (else :class:`LeaseLost`, nothing written). A position is written once, except
        a pending wait, which its resolution replaces; :class:`ItemStateError` otherwise."""
        ...

    async def send_event(self, item_id: str, name: str, payload: JSONValue = None) -> None:
        """Keep an event for *item_id*'s current incarnation. A queued item waiting for *name*
        is due at once (and runners are woken). :class:`ItemNotFound` for an unknown item,
        :class:`ItemStateError` for a finished one; nothing is kept then."""
        ...


@runtime_checkable
class WorkQueue(WorkerStore, ProducerStore, OperatorStore, MaintenanceStore, Protocol):
    """Every port: what each backend of this package is (memory, SQLite, PostgreSQL)."""

    async def aclose(self) -> None:
        """Release connections and threads. Idempotent."""
        ...


@runtime_checkable
class AuditStore(Protocol):
    """A store that keeps the console's audit trail (:attr:`Capability.AUDIT_TRAIL`)."""

    @property
    def audit(self) -> AuditTrail:
        """The trail: ``record(entry)`` and ``recent(limit)``, newest first by ``at``."""
        ...

    async def prune_audit(
        self, older_than: float, *, limit: int | None = None, dry_run: bool = False
    ) -> int:
        """Delete the entries recorded at least *older_than* seconds ago by the store's clock
        (oldest first, at most *limit*); how many (with *dry_run*: would be)."""
        ...


@runtime_checkable
class ErrorHistoryStore(Protocol):
    """A store that reads its items' error histories as one list
    (:attr:`Capability.ERROR_HISTORY`)."""

    async def recent_errors(self, *, limit: int = 50, before: str | None = None) -> list[ItemError]:
        """The entries of every item's error history, newest first (by their time, then item
        id, then place in the history), in one snapshot; at most *limit* (1 to 1000), those
        after the cursor *before* (an :attr:`ItemError.cursor` of the page before)."""
        ...


def audit_trail_of(store: Any) -> AuditTrail | None:
    """*store*'s audit trail if it declares :attr:`Capability.AUDIT_TRAIL`, else None."""
    if Capability.AUDIT_TRAIL in capabilities_of(store):
        trail: AuditTrail = store.audit
        return trail
    return None


@runtime_checkable
class BatchWrites(Protocol):
    """What sets a worker port apart from the seed's writes: leases renewed and outcomes
    settled in batches (``run_due_pass`` writes to a store without them with the seed's calls)."""

    async def renew_many(self, leases: Sequence[Lease], lease: float) -> dict[str, LeaseStatus]: ...

    async def settle_many(self, settlements: Sequence[Settlement]) -> list[bool]: ...


@runtime_checkable
class SeedWrites(Protocol):
    """The seed's single-item writes, fenced by the lease version (``LeaseLost`` when stale).

    Not a port of a runner (which renews and settles in batches); every backend here keeps them,
    and ``run_due_pass`` writes with them to a store that has no :class:`WorkerStore` port."""

    async def renew(
        self, item_id: str, worker_id: str, lease_version: int, lease: float
    ) -> LeaseStatus: ...

    async def release(self, item_id: str, lease_version: int, delay: float) -> None: ...

    async def reschedule(
        self, item_id: str, lease_version: int, at: dt.datetime, config: JSONValue
    ) -> None: ...

    async def complete(self, item_id: str, lease_version: int) -> None: ...

    async def mark_error(self, item_id: str, lease_version: int, error: str) -> None: ...


class EnqueueFront:
    """``enqueue``, written once for every backend: a :class:`NewItem` of its options, handed
    to the backend's ``enqueue_many``."""

    async def enqueue_many(self, entries: Sequence[NewItem]) -> list[Enqueued]:
        raise NotImplementedError  # pragma: no cover - every backend defines it

    @entry_signature
    async def enqueue(self, spec_id: str, **options: Unpack[EnqueueOptions]) -> WorkItem:
        """Add an item, due at *due_at* (default: now); config ``None`` means ``{}``.

        The options are :class:`NewItem`'s fields: ``config``, ``tenant_id``, ``subject_id``,
        ``due_at``, ``item_id``, ``idempotency_key``, ``priority`` (lower first),
        ``queue``, ``evaluation_timeout`` (seconds, stored as ``WorkItem.timeout``), ``unique``
        (how long the key holds: ``"forever"``, ``"unfinished"`` or a period), and
        ``concurrency_key`` / ``concurrency_limit``. With an idempotency key an existing item
        holds, nothing is written and that item is returned (``enqueue_many`` says which
        happened). An explicit item id that exists raises :class:`DuplicateItem`; a bad value
        raises ``ValueError`` or :class:`ConfigError` naming the field. See ``docs/queues.md``.
        """
        [done] = await self.enqueue_many([NewItem(spec_id=spec_id, **options)])
        return done.item


class SingleWrites:
    """The seed's one-item writes ``release``, ``reschedule`` and ``complete``, written once.

    Each is one :class:`Settlement` handed to the backend's ``_settle_one``, which applies it
    fenced or raises :class:`LeaseLost`; so the three read, validate and fail the same way on
    every backend.
    """

    async def _settle_one(self, settlement: Settlement) -> None:
        raise NotImplementedError  # pragma: no cover - every backend defines it

    async def release(self, item_id: str, lease_version: int, delay: float) -> None:
        """Hand the item back, due again after *delay* seconds (error count unchanged)."""
        await self._settle_one(
            Settlement(
                item_id=item_id, lease_version=lease_version, kind=SettleKind.RELEASE, delay=delay
            )
        )

    async def reschedule(
        self, item_id: str, lease_version: int, at: dt.datetime, config: JSONValue
    ) -> None:
        """Set the next due time and the new config in one write."""
        await self._settle_one(
            Settlement(
                item_id=item_id,
                lease_version=lease_version,
                kind=SettleKind.RESCHEDULE,
                at=at,
                config=check_json(config),
            )
        )

    async def complete(self, item_id: str, lease_version: int) -> None:
        """Finish the item for good."""
        await self._settle_one(
            Settlement(item_id=item_id, lease_version=lease_version, kind=SettleKind.COMPLETE)
        )


def combines(cls: type) -> bool:
    """Whether *cls*'s ``settle_and_claim`` is as specific as its ``settle_many`` and
    ``claim_due``: a subclass that changes either (a test double adding faults or latency, an
    auditing wrapper) without saying how they combine does not offer
    :attr:`Capability.SETTLE_AND_CLAIM`, so a runner calls its two methods separately."""
    mro = cls.__mro__

    def owner(name: str) -> type | None:
        return next((each for each in mro if name in vars(each)), None)

    combined = owner("settle_and_claim")
    return combined is not None and all(
        (other := owner(name)) is None or issubclass(combined, other)
        for name in ("settle_many", "claim_due")
    )


def declared(cls: type, capabilities: frozenset[Capability]) -> frozenset[Capability]:
    """*capabilities* as a store class *cls* declares them: without
    :attr:`Capability.SETTLE_AND_CLAIM` when a subclass changed a half of it (:func:`combines`)."""
    if Capability.SETTLE_AND_CLAIM in capabilities and not combines(cls):
        return capabilities - {Capability.SETTLE_AND_CLAIM}
    return capabilities


def capabilities_of(store: Any) -> frozenset[Capability]:
    """What *store* declares it can do. A store written before capabilities were declared
    (no ``capabilities``) is read by the attributes it had then: ``exact_wakeups`` and
    ``serial_writes`` true, a ``settle_and_claim`` method; this is the one place they are read."""
    declared: frozenset[Capability] | None = getattr(store, "capabilities", None)
    if declared is not None:
        return frozenset(declared)
    found = set()
    if getattr(store, "exact_wakeups", False) is True:
        found.add(Capability.EXACT_WAKEUPS)
    if getattr(store, "serial_writes", False) is True:
        found.add(Capability.SERIAL_WRITES)
    if callable(getattr(store, "settle_and_claim", None)) and combines(type(store)):
        found.add(Capability.SETTLE_AND_CLAIM)
    return frozenset(found)
