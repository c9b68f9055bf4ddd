"""The item model, declared once: a work item, an entry that creates one, and the records around
them. Every fast path the stores use to build, copy or change items is generated from these
declarations (:mod:`._fields`), and each field says how a store keeps it (``metadata["stored"]``,
and for :class:`NewItem` the columns it is written to: the SQL layer generates its row decoders
and encoders from them), so a new field is a change here, to its check, its SQL column and a
migration.

The semantics of each field (what a store promises about it) are in ``docs/queues.md``.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeAlias, TypedDict

import attrs

from .._clock import utc
from ._fields import build_function, copy_function, field_names, replace_function
from ._json import JSONValue, copy_json
from ._rates import RateLimit

__all__ = [
    "DEFAULT_QUEUE",
    "MAX_ERRORS",
    "EnqueueOptions",
    "Enqueued",
    "ErrorEntry",
    "ItemState",
    "JSONValue",
    "Lease",
    "LeaseStatus",
    "NewItem",
    "QueueInfo",
    "UniqueScope",
    "UnfrozenItem",
    "WorkItem",
    "append_error",
    "build_item",
    "copy_item",
    "replace_item",
    "stored_columns",
    "stored_kind",
]

DEFAULT_QUEUE = "default"
"""The queue an item waits in unless told otherwise."""

MAX_ERRORS = 10
"""How many errors an item's ``errors`` history keeps (the oldest is dropped first)."""

UniqueScope: TypeAlias = Literal["forever", "unfinished"] | dt.timedelta | float
"""How long an item's idempotency key holds (``NewItem.unique``, ``enqueue(unique=...)``):

- ``"forever"`` (the default): as long as the item exists, in any state;
- ``"unfinished"``: while the item is queued or running; once it is completed, cancelled or
  dead, the next enqueue with the key creates a new item;
- a ``timedelta`` or a positive number of seconds: for that long after the item was created.
"""


class ItemState(enum.StrEnum):
    """Where an item is in its life (drawn in ``docs/architecture.md``)."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    DEAD = "dead"

    @property
    def finished(self) -> bool:
        """True for the states an item never leaves on its own."""
        return self in (ItemState.COMPLETED, ItemState.CANCELLED, ItemState.DEAD)


@attrs.frozen(kw_only=True)
class ErrorEntry:
    """One recorded error of an item: when, by which worker, on which attempt, and what."""

    at: dt.datetime = attrs.field(converter=utc)
    worker: str
    """The lease owner that held the item when the error was written."""
    attempt: int
    error: str
    """The stored error text (as in ``last_error``)."""


def append_error(errors: tuple[ErrorEntry, ...], entry: ErrorEntry) -> tuple[ErrorEntry, ...]:
    """*errors* with *entry* appended, keeping the newest :data:`MAX_ERRORS`."""
    return (*errors, entry)[-MAX_ERRORS:]


# How a store keeps a field (metadata["stored"]); a field without one is stored as is. WorkItem's
# fields are read back by these; NewItem's are written by them, to the columns its
# metadata["columns"] names (default: the column of the field's name).
JSON = "json"
"""A JSON value (a config, a result), stored as JSON text."""
ERRORS = "errors"
"""The error history, a JSON array of entries."""
TIME = "time"
"""A timezone-aware datetime (SQLite: microseconds since the epoch)."""
BOOL = "bool"
"""A boolean (SQLite: 0 or 1)."""
STATE = "state"
"""An :class:`ItemState`, stored as its text."""
NEW_ID = "new-id"
"""A new item's id, or None for one the store makes up."""
SECONDS = "seconds"
"""A number of seconds, or None (a float column)."""
UNIQUE = "unique"
"""A :data:`UniqueScope`: stored as the scope's name and its period in microseconds."""
TAGS = "tags"
"""A tuple of strings, stored as a JSON array."""
OPTION = "option"
"""An enqueue option that says how to write the item, not a column (``debounce``)."""
DEADLINE = "deadline"
"""A new item's timezone-aware datetime, or None for none (a :data:`TIME` is now when None)."""


def _stored(kind: str, *columns: str) -> dict[str, Any]:
    return {"stored": kind, "columns": columns} if columns else {"stored": kind}


def stored_kind(field: attrs.Attribute[Any]) -> str | None:
    """How a store keeps *field* (one of the kinds above), or None: as is."""
    kind: str | None = field.metadata.get("stored")
    return kind


def stored_columns(field: attrs.Attribute[Any]) -> tuple[str, ...]:
    """The columns a store writes *field* to: its ``metadata["columns"]``, else its name."""
    columns: tuple[str, ...] = field.metadata.get("columns", (field.name,))
    return columns


@attrs.frozen(kw_only=True)
class WorkItem:
    """One unit of durable work, as the queue last stored it."""

    id: str
    spec_id: str
    tenant_id: str = ""
    subject_id: str = ""
    config: JSONValue = attrs.field(factory=dict, metadata=_stored(JSON))
    cancel_requested: bool = attrs.field(default=False, metadata=_stored(BOOL))
    lease_version: int = 0
    state: ItemState = attrs.field(default=ItemState.QUEUED, metadata=_stored(STATE))
    due_at: dt.datetime = attrs.field(converter=utc, metadata=_stored(TIME))
    error_count: int = 0
    last_error: str | None = None
    lease_owner: str | None = None
    lease_expires_at: dt.datetime | None = attrs.field(
        default=None, converter=attrs.converters.optional(utc), metadata=_stored(TIME)
    )
    idempotency_key: str | None = None
    created_at: dt.datetime = attrs.field(converter=utc, metadata=_stored(TIME))
    updated_at: dt.datetime = attrs.field(converter=utc, metadata=_stored(TIME))
    attempt: int = 0
    """Claims since the last successful evaluation, counted by the claim itself; a runner
    settles an item claimed more than ``max_attempts`` times as dead."""
    priority: int = 0
    """From MIN_PRIORITY to MAX_PRIORITY; a lower number is claimed first."""
    queue: str = DEFAULT_QUEUE
    """The named queue the item waits in."""
    timeout: float | None = None
    """Seconds one evaluation may take, overriding the driver's ``timeout``; None: the driver's."""
    result: JSONValue = attrs.field(default=None, metadata=_stored(JSON))
    """The JSON result a completed item was stopped with (``Stop(result=...)``), else None."""
    errors: tuple[ErrorEntry, ...] = attrs.field(default=(), metadata=_stored(ERRORS))
    """The last :data:`MAX_ERRORS` errors, oldest first (kept across retries)."""
    parent_id: str | None = None
    """The item whose outcome created this one (None: enqueued from outside)."""
    waiting_children: int = 0
    """How many of its children this item still waits for; while above 0 it is not due."""

    @property
    def waiting(self) -> bool:
        """Whether this item is queued, waiting for its children (not due until they finish)."""
        return self.waiting_children > 0 and self.state is ItemState.QUEUED

    unique_scope: str = "forever"
    """How long ``idempotency_key`` holds: ``"forever"``, ``"unfinished"`` or ``"period"``
    (until ``unique_until``); see :data:`UniqueScope`."""
    unique_until: dt.datetime | None = attrs.field(
        default=None, converter=attrs.converters.optional(utc), metadata=_stored(TIME)
    )
    """With the ``"period"`` scope, when the key stops holding."""
    released_key: str | None = None
    """The key this item held until its scope lapsed and a newer item took it (then
    ``idempotency_key`` is None); ``get_by_key`` still finds it by that key."""
    concurrency_key: str | None = None
    """The fleet-wide key whose running items are limited (see the queues guide), or None."""
    concurrency_limit: int | None = None
    """At most this many items of ``concurrency_key`` run at once; None without a key."""
    tags: tuple[str, ...] = attrs.field(default=(), metadata=_stored(TAGS))
    """Labels for finding the item (``list_items(tags=...)``), in the order given."""
    traceparent: str | None = None
    """The W3C ``traceparent`` of the span current when the item was enqueued (with the
    ``otel`` extra), which its evaluations' spans continue; None without one."""
    start_by: dt.datetime | None = attrs.field(
        default=None, converter=attrs.converters.optional(utc), metadata=_stored(TIME)
    )
    """Its start deadline: claimed after it, the item is never evaluated but settled dead,
    saying so (``docs/flow-control.md``); None: none."""

    @property
    def lease(self) -> Lease:
        """The lease this copy of the item was handed out under."""
        return Lease(item_id=self.id, version=self.lease_version, worker_id=self.lease_owner or "")


class UnfrozenItem(WorkItem):
    """:class:`WorkItem`'s layout without the frozen ``__setattr__``: what the stores' hot paths
    fill or change by plain stores (see :mod:`._fields`). Never handed out: what leaves a store
    is a ``WorkItem`` (an ``UnfrozenItem`` becomes one by ``__class__`` assignment)."""

    __slots__ = ()
    __setattr__ = object.__setattr__
    __delattr__ = object.__delattr__


ITEM_FIELDS = field_names(WorkItem)
"""WorkItem's field names, in declaration order (the order of the SQL claims' columns)."""

replace_item: Callable[..., WorkItem] = replace_function(WorkItem, UnfrozenItem)
"""``attrs.evolve(item, **changes)`` without the converters, for values a store produced or
checked itself (every datetime UTC already)."""

build_item: Callable[..., WorkItem] = build_function(WorkItem, UnfrozenItem)
"""``WorkItem(**fields)`` without the converters, each field's default for the ones left out."""


copy_item: Callable[[WorkItem], WorkItem] = copy_function(
    WorkItem, UnfrozenItem, {"config": copy_json, "result": copy_json}
)
"""A copy of a stored item for a caller, its config and result copied too (the memory queue
hands out copies, as a durable backend's freshly decoded rows are)."""


@attrs.frozen(kw_only=True)
class NewItem:
    """One item to enqueue: the keyword arguments of ``enqueue`` as a record.

    For ``enqueue_many`` (and whatever else writes new items). Nothing is checked here: the
    queue checks every entry before it writes any.
    """

    spec_id: str
    config: JSONValue = attrs.field(default=None, metadata=_stored(JSON))
    """``None`` means ``{}``; an attrs instance is unstructured by the shared converter."""
    tenant_id: str = ""
    subject_id: str = ""
    due_at: dt.datetime | None = attrs.field(default=None, metadata=_stored(TIME))
    """Default: now."""
    item_id: str | None = attrs.field(default=None, metadata=_stored(NEW_ID, "id"))
    """Default: a random one."""
    idempotency_key: str | None = None
    priority: int = 0
    queue: str = DEFAULT_QUEUE
    evaluation_timeout: float | None = attrs.field(
        default=None, metadata=_stored(SECONDS, "timeout")
    )
    unique: UniqueScope = attrs.field(
        default="forever", metadata=_stored(UNIQUE, "unique_scope", "period_us")
    )
    """How long *idempotency_key* holds once this item is created (see :data:`UniqueScope`)."""
    concurrency_key: str | None = None
    """The fleet-wide key whose running items are limited, or None."""
    concurrency_limit: int | None = None
    """At most this many items of *concurrency_key* run at once (default 1 with a key)."""
    tags: Sequence[str] = attrs.field(default=(), metadata=_stored(TAGS))
    """Labels for finding the item: at most :data:`MAX_TAGS` distinct non-empty strings."""
    traceparent: str | None = None
    """A W3C ``traceparent`` for the item's evaluations to continue; None: the span current
    at the enqueue, if ``opentelemetry`` is in use and one is (else none)."""
    start_by: dt.datetime | None = attrs.field(default=None, metadata=_stored(DEADLINE))
    """A start deadline (timezone-aware, not before *due_at*): an item not started by then is
    never started, but settled dead, saying so. Default: none."""
    debounce: bool = attrs.field(default=False, metadata=_stored(OPTION))
    """With *idempotency_key*: when a queued item holds the key, it takes this entry's config
    and due time (the newest wins, ``Enqueued.replaced``); when a running one does, the key
    moves to this entry's new item. Never a running item's config (``docs/flow-control.md``)."""


class EnqueueOptions(TypedDict, total=False):
    """The keywords of ``enqueue`` (and ``enqueue_on``, ``DriverRegistry.enqueue``) after the
    spec id: :class:`NewItem`'s fields, for typing ``**options`` (checked against NewItem at
    import)."""

    config: JSONValue
    tenant_id: str
    subject_id: str
    due_at: dt.datetime | None
    item_id: str | None
    idempotency_key: str | None
    priority: int
    queue: str
    evaluation_timeout: float | None
    unique: UniqueScope
    concurrency_key: str | None
    concurrency_limit: int | None
    tags: Sequence[str]
    traceparent: str | None
    start_by: dt.datetime | None
    debounce: bool


def _check_options() -> None:
    entry = set(field_names(NewItem)) - {"spec_id"}
    options = set(EnqueueOptions.__annotations__)
    if entry != options:  # pragma: no cover - a field added to one and not the other
        raise RuntimeError(f"EnqueueOptions and NewItem differ: {sorted(entry ^ options)}")


_check_options()


@attrs.frozen(kw_only=True)
class Enqueued:
    """What enqueueing one :class:`NewItem` did."""

    item: WorkItem
    """The new item, or the existing one that holds the key."""
    created: bool
    """False: an existing item holds the idempotency key, and nothing was written (but see
    *replaced*)."""
    replaced: bool = False
    """True: the entry asked to ``debounce``, and the queued item holding its key took its
    config and due time."""


@attrs.frozen(kw_only=True)
class QueueInfo:
    """One named queue: whether it is paused, how many items it holds per state, and its rate
    limit (with, while its window is full, when it lets a start in again)."""

    name: str
    paused: bool = False
    paused_at: dt.datetime | None = attrs.field(
        default=None, converter=attrs.converters.optional(utc)
    )
    counts: Mapping[ItemState, int] = attrs.field(factory=dict)
    rate_limit: RateLimit | None = None
    """At most this many starts per period, fleet-wide (see ``docs/flow-control.md``)."""
    throttled_until: dt.datetime | None = attrs.field(
        default=None, converter=attrs.converters.optional(utc)
    )
    """While the rate limit holds its items back: when the next may start; else None."""


@attrs.frozen
class Lease:
    """Who holds an item, under which version."""

    item_id: str
    version: int
    worker_id: str


class LeaseStatus(enum.StrEnum):
    """What a renewal found."""

    HELD = "held"
    CANCEL_REQUESTED = "cancel-requested"
    LOST = "lost"
