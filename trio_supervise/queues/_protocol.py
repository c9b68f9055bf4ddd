"""The ``WorkQueue`` protocol: what every queue backend promises.

One contract, three backends (memory, SQLite, PostgreSQL), one conformance suite
(``tests/queues``). The semantics below are normative; the in-memory queue is the reference.

Items and states
    An item is ``queued`` (waiting for its ``due_at``), ``running`` (claimed under a lease),
    or finished: ``completed``, ``cancelled`` or ``dead`` (too many errors). Finished items are
    never claimed again; :meth:`WorkQueue.retry` puts one back.

Named queues, priorities, pausing
    Every item waits in one named queue (``queue``, default ``"default"``) and has a
    ``priority``: an integer from :data:`MIN_PRIORITY` (-100) to :data:`MAX_PRIORITY` (100),
    default 0, where **a lower number is claimed first** (as in Oban and River). A claim serves
    one queue. A queue paused with :meth:`WorkQueue.pause_queue` (stored in the database, so for
    the whole fleet) is not claimed until :meth:`WorkQueue.resume_queue`; items already running
    finish and settle as usual, and its due items do not wake :meth:`WorkQueue.wait_for_work`.

Concurrency keys
    An item may carry a ``concurrency_key`` (a non-empty string) and a ``concurrency_limit``
    (an integer from 1 to :data:`MAX_CONCURRENCY_LIMIT`; a key given without a limit gets
    :data:`DEFAULT_CONCURRENCY_LIMIT`, 1; a limit without a key is refused). The key is
    fleet-wide: across queues, spec ids, workers and machines. An item of key *K* with limit *L*
    is claimed only while fewer than *L* running items of *K* hold a live lease (``lease_expires_at
    > now``; an expired one is rescue-able and does not count). The claim decides it atomically.
    A claim first takes the *window*: the first ``limit`` claimable items in claim order, leaving
    out keyed items whose key is at their limit (so a queue head of blocked keyed items never
    starves the items behind it); then, of the window's items of *K*, only the first
    ``L - running(K)`` are claimed (each by its own *L*). The rest of the window stays queued,
    so a claim may return fewer items than ``limit`` while more are due. A blocked keyed item
    becomes claimable, for :meth:`WorkQueue.next_due_at`, when enough of its key's leases expire
    (the *L*-th latest live lease expiry of *K*), or earlier when one of them settles. A keyed
    item's lease that has expired is not renewed (:attr:`LeaseStatus.LOST`): its slot was free
    from that moment, so a late owner stops rather than run beside the item given the slot.

Leases and fencing
    :meth:`WorkQueue.claim_due` hands out items of one queue whose ``due_at`` has passed, plus
    running items whose lease has expired (rescue is part of claiming), ordered by ``priority``,
    then ``due_at``, then ``id``. Each
    claim sets ``lease_owner``, ``lease_expires_at = now + lease`` and a new, strictly larger
    ``lease_version``. Every later write names the item id and that version; a write whose version
    is not the item's current one, or whose item is not running, raises :class:`LeaseLost` (the
    batch forms report it per entry) and changes nothing. Renewal also checks the owner.

Errors and retries
    ``error_count`` counts consecutive failed evaluations: a ``retry``/``dead`` settlement or
    :meth:`WorkQueue.mark_error` adds one and records ``last_error``; a ``continue`` or
    ``reschedule`` settlement (a successful evaluation) sets it back to zero. ``release`` (a lease
    handed back without an outcome) leaves it alone. Text the library writes there is made
    storable first (:func:`storable_text`): a NUL or a lone surrogate is escaped, never dropped.
    Each such error is also appended to the item's ``errors`` history (:class:`ErrorEntry`:
    when, the lease owner that held the item, its attempt, the error text), newest last and
    bounded at :data:`MAX_ERRORS` (the oldest entry is dropped). The history is never reset:
    not by a successful evaluation, not by :meth:`WorkQueue.retry`; it is history.

Attempts
    ``attempt`` counts the claims since the last successful evaluation, and the claim statement
    itself adds one, so a worker killed mid-evaluation still counts (like River's and Oban's
    ``attempt``). A ``continue`` or ``reschedule`` settlement (a long-lived workflow evaluated
    fine) sets it back to zero, and so does :meth:`WorkQueue.retry`; ``release`` (a lease handed
    back at shutdown) takes its claim back (one less); every other outcome keeps it. A runner
    settles an item claimed more than ``max_attempts`` times as ``dead`` without evaluating it.

Idempotency keys and uniqueness scopes
    An item enqueued with an ``idempotency_key`` holds it for its scope (:data:`UniqueScope`):
    ``"forever"`` (the default), ``"unfinished"`` (until it is completed, cancelled or dead) or
    a period from its creation. An enqueue whose key a holder holds writes nothing and returns
    the holder (``Enqueued.created`` False). One whose key's holder has lapsed moves the key to
    the holder's ``released_key`` and creates the new item, in one transaction, so concurrent
    enqueuers of one key create one item. :meth:`WorkQueue.get_by_key` finds the holder, else
    the newest item that held the key. :meth:`WorkQueue.enqueue_many` checks every entry first
    and writes a batch all or nothing.

Unstorable values
    ``enqueue`` and a reschedule's config refuse what a backend cannot store (see
    :func:`check_json`), on every backend alike. A ``settle_many`` entry that still cannot be
    written does not fail its batch: it becomes :func:`unstorable_outcome` (``dead``, saying why).

Child items and fan-in
    A ``continue``, ``reschedule`` or ``complete`` settlement may carry ``children``
    (:class:`NewItem`): they are written in the same transaction as the parent's fenced update,
    and only if it applied (a stale parent creates nothing). Each child records ``parent_id``.
    A child without an ``item_id`` gets :func:`child_item_id` (parent id, lease version, index),
    so the same outcome can never create it twice. A child whose id or idempotency key exists
    already is not created (the existing item is not adopted) and not waited for.
    A ``continue`` with ``wait_for_children`` puts the parent back ``queued`` with
    ``waiting_children`` = the children created and ``due_at`` = :data:`WAITING_DUE_AT` (never
    due); each waited-for child that finishes (``completed``, ``cancelled`` or ``dead``: its
    settlement, a ``request_cancel`` while queued) takes one off, atomically, and the last one
    makes the parent due at once. A child counts once: :meth:`WorkQueue.retry` of a finished
    child does not re-arm its parent. A parent taken out of its wait (retried, cancelled) is
    no longer counted down. With no child created, the parent is due at once.

Exact wake-ups (optional)
    A queue may define a boolean attribute ``exact_wakeups``. True promises that
    :meth:`WorkQueue.wait_for_work` returns by itself whenever work may have become claimable:
    on every write that can make work due, from anywhere, and at the next due time by Trio's
    clock. A runner then waits without its poll interval, so under an autojump clock it does
    not wake every ``poll_interval`` of virtual time while nothing is due. A queue without the
    attribute (or with it False) is polled; the attribute is not part of the protocol's
    structural type, so existing queues need no change. :class:`MemoryQueue` sets it when its
    clock is a :class:`TrioClock` (all its writes happen in this process).

Settle and claim (optional)
    A queue may define ``settle_and_claim(settlements, spec_ids, worker_id, lease, limit, *,
    queue=DEFAULT_QUEUE) -> (list[bool], list[WorkItem])``: :meth:`WorkQueue.settle_many`
    then :meth:`WorkQueue.claim_due`, in one call, the claim seeing every effect of the
    settlements (an item due again at once, a concurrency key's freed slot, a child created, a
    parent made due by its last child). The claim's arguments are checked before anything is
    written. When it raises, nothing was claimed, and the settlements are as after a failed
    ``settle_many``; once they are written, a claim that fails comes back empty instead (the
    next ``claim_due`` reports the error). A runner serving one queue writes each batch of
    outcomes with it, claiming the slots the batch frees in the same call: the SQL backends
    make it one thread hop and one transaction (SQLite: one ``BEGIN IMMEDIATE``; PostgreSQL:
    one commit, its statements pipelined), and :class:`MemoryQueue` is the reference. Like
    ``exact_wakeups`` it is not part of the structural type. A runner uses it only when the
    queue also sets ``serial_writes`` True, promising that its calls run one at a time anyway
    (the memory queue; SQLite's one writer connection), so that a claim beside a write would
    gain nothing; a queue with a pool of connections (PostgreSQL) leaves it False, and the
    runner's claim then runs beside its write, in parallel. And only when ``settle_and_claim``
    is defined by the same class as ``settle_many`` and ``claim_due`` or a subclass of it, so
    a subclass that changes either one alone (a test double adding faults or latency) keeps
    having them called separately.

Retention and editing
    :meth:`WorkQueue.prune` deletes finished items (``completed``, ``cancelled``, ``dead``) whose
    ``updated_at`` is at least a given age, oldest first, at most ``limit`` per state per call:
    each call is one short transaction, so a big backlog is pruned in bounded batches that never
    hold claims or renewals up for long, and any number of pruners may run at once (PostgreSQL
    skips the rows another pruner holds). :meth:`WorkQueue.delete` removes one item that is not
    running; :meth:`WorkQueue.edit_config` replaces the config of one that is not running (a queued
    item before it runs, a dead one before a retry). A deleted item's id and idempotency key are
    free again. An item still waiting for children is neither deleted nor pruned (it is queued).

Cancellation
    :meth:`WorkQueue.request_cancel` cancels a queued item at once. On a running item it sets
    ``cancel_requested``; the owner learns it from its next renewal
    (:attr:`LeaseStatus.CANCEL_REQUESTED`) and settles the item as cancelled. An item claimed
    with ``cancel_requested`` set (its owner died) is settled as cancelled without evaluation.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

import attrs

from .._clock import Clock, utc
from .._convert import MAX_JSON_DEPTH as _MAX_JSON_DEPTH
from .._convert import nested_too_deeply

__all__ = [
    "Enqueued",
    "ItemState",
    "JSONValue",
    "NewItem",
    "UniqueScope",
    "Lease",
    "LeaseStatus",
    "SettleKind",
    "Settlement",
    "WorkItem",
    "WorkQueue",
    "DEFAULT_QUEUE",
    "MAX_CHILDREN",
    "DEFAULT_CONCURRENCY_LIMIT",
    "MAX_CONCURRENCY_LIMIT",
    "MAX_DELAY",
    "WAITING_DUE_AT",
    "MAX_ID_LENGTH",
    "MAX_JSON_DEPTH",
    "MAX_NAME_LENGTH",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "QueueInfo",
    "check_config",
    "check_concurrency",
    "check_name",
    "check_priority",
    "check_prune",
    "check_queue_name",
    "check_timeout",
    "check_json",
    "check_entries",
    "check_new_item",
    "check_child",
    "child_item_id",
    "check_unique",
    "check_identifier",
    "storable_text",
    "unstorable_outcome",
    "validate_spec_id",
]

JSONValue: TypeAlias = Any
"""A value that survives ``json.dumps``/``json.loads`` unchanged (dict, list, str, number, ...)."""


MAX_JSON_DEPTH = _MAX_JSON_DEPTH
"""The deepest nesting of lists and objects a config (or result) may have; deeper is refused
(one number for the queues, the CLI and settings files: ``trio_supervise._convert``)."""

DEFAULT_QUEUE = "default"
"""The queue an item waits in unless told otherwise."""

MIN_PRIORITY = -100
"""The most urgent priority: lower numbers are claimed first."""
MAX_PRIORITY = 100
"""The least urgent priority."""

MAX_DELAY = 1e10
"""The longest delay (seconds, about 317 years) a settlement may ask for: far enough for any
schedule, near enough that every backend can store ``now + delay``."""

MAX_CHILDREN = 10_000
"""The most children one outcome may create."""

WAITING_DUE_AT = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)
"""The ``due_at`` of a parent waiting for its children: never due, until the last child
finishes and sets it to "now" (see the module doc). Shown as "waiting for N children"."""


def _unstorable(text: str) -> str | None:
    """Why a backend cannot store *text* (a NUL, a lone surrogate), or None if it can."""
    if "\x00" in text:
        return "NUL characters"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "lone surrogates (such as '\\udcff')"
    return None


def storable_text(text: str) -> str:
    """*text* as every backend can store it: NULs and lone surrogates spelled as escapes.

    For text the library writes itself (error messages, tracebacks), which must be kept, never
    dropped: ``"\\x00"`` for a NUL, ``"\\udcff"`` for a lone surrogate. Other text is unchanged.
    """
    if text.isascii() and "\x00" not in text:
        return text
    text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _check_tree(value: JSONValue, what: str) -> None:
    """Refuse a JSON tree nested deeper than MAX_JSON_DEPTH or holding unstorable strings."""
    from .._errors import ConfigError

    pending: list[tuple[JSONValue, int]] = [(value, 0)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, str):
            texts: list[str] = [node]
        elif isinstance(node, dict | list):
            if depth >= MAX_JSON_DEPTH:
                raise ConfigError(nested_too_deeply(what))
            if isinstance(node, dict):
                texts = list(node)
                pending.extend((inner, depth + 1) for inner in node.values())
            else:
                texts = []
                pending.extend((inner, depth + 1) for inner in node)
        else:
            continue
        for text in texts:
            problem = _unstorable(text)
            if problem is not None:
                raise ConfigError(f"{what} must not contain {problem} in its strings")


def flat_json_copy(value: JSONValue) -> JSONValue | None:
    """What :func:`check_json` returns for a flat dict of plain scalars (the common config, a
    rescheduled step's counter), without the JSON round trip; None for anything else, and for
    anything :func:`check_json` would refuse or change (it then decides, and words the error)."""
    if type(value) is not dict or MAX_JSON_DEPTH < 1:
        return None
    # A reschedule checks its config here once per evaluation, in the runner (which marks its
    # settlement so that the memory queue need not check it again): keys and values, not
    # items (a dict's items cost a tuple each).
    for key in value:
        if type(key) is not str:
            return None
        # _unstorable's test, inlined for the common case (ASCII without a NUL).
        if (not key.isascii() or "\x00" in key) and _unstorable(key) is not None:
            return None
        inner = value[key]
        kind = type(inner)
        if kind is int or kind is bool or inner is None:
            continue
        if kind is str:
            if (not inner.isascii() or "\x00" in inner) and _unstorable(inner) is not None:
                return None
        elif kind is not float or not math.isfinite(inner):
            return None
    return value.copy()


def copy_json(value: JSONValue) -> JSONValue:
    """A deep copy of a checked JSON tree (what :func:`check_json` returned): every dict and list
    new, the scalars shared (immutable). For the memory queue, which stores its items' configs
    and results and must hand out copies a caller can change in place, as a durable backend's
    freshly decoded rows are; a flat dict (the common config) costs one ``dict.copy``."""
    kind = type(value)
    if kind is dict:
        assert isinstance(value, dict)
        for inner in value.values():
            if type(inner) is dict or type(inner) is list:
                return {key: copy_json(inner) for key, inner in value.items()}
        return value.copy()
    if kind is list:
        assert isinstance(value, list)
        return [copy_json(inner) for inner in value]
    return value


def check_json(value: JSONValue, *, what: str = "config") -> JSONValue:
    """Return a deep copy of *value* through JSON, or raise :class:`ConfigError` naming *what*.

    Refused, the same way on every backend: what JSON cannot hold, nesting deeper than
    :data:`MAX_JSON_DEPTH`, and strings holding a NUL or a lone surrogate (PostgreSQL cannot
    store either, SQLite's text cannot hold a surrogate).
    """
    flat = flat_json_copy(value)
    if flat is not None:
        return flat
    from .._errors import ConfigError

    try:
        text = json.dumps(value, allow_nan=False)
    except RecursionError:
        raise ConfigError(nested_too_deeply(what)) from None
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{what} is not JSON-compatible: {error}") from error
    copy = json.loads(text)
    _check_tree(copy, what)
    return copy


MAX_NAME_LENGTH = 200
"""The longest spec id, queue name, concurrency key and schedule name, in characters."""
MAX_ID_LENGTH = 400
"""The longest item id and idempotency key, in characters. Every backend indexes both, and
PostgreSQL refuses an index entry over 2,704 bytes; so a long one is refused up front, the same
on every backend, rather than by PostgreSQL alone when it is written. A child's default id
(:func:`child_item_id`) is its parent's plus about ten characters, so ids well under the limit
leave room for several levels of children."""


def shown_value(value: object) -> str:
    """*value* for an error message: a long string cut, its length said."""
    if isinstance(value, str) and len(value) > 60:
        return f"{value[:40]!r}... ({len(value)} characters)"
    return repr(value)


def validate_spec_id(spec_id: object) -> str:
    """Refuse an empty, over-long or non-string spec id up front."""
    if not isinstance(spec_id, str) or not spec_id or len(spec_id) > MAX_NAME_LENGTH:
        raise ValueError(
            f"spec_id must be a non-empty string of at most {MAX_NAME_LENGTH} characters, "
            f"got {shown_value(spec_id)}"
        )
    return spec_id


def check_identifier(value: object, what: str) -> None:
    """Refuse an item id or idempotency key that is not None or a non-empty string of at most
    :data:`MAX_ID_LENGTH` characters, naming *what*."""
    if value is None:
        return
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH:
        raise ValueError(
            f"{what} must be a non-empty string of at most {MAX_ID_LENGTH} characters, "
            f"got {shown_value(value)}"
        )


def check_name(value: object, what: str) -> str:
    """Refuse a name (a schedule's, say) that is not a non-empty storable string of at most
    :data:`MAX_NAME_LENGTH` characters, naming *what*."""
    from .._errors import ConfigError

    if not isinstance(value, str) or not value or len(value) > MAX_NAME_LENGTH:
        raise ValueError(
            f"{what} must be a non-empty string of at most {MAX_NAME_LENGTH} characters, "
            f"got {shown_value(value)}"
        )
    problem = _unstorable(value)
    if problem is not None:
        raise ConfigError(f"{what} must not contain {problem}")
    return value


def check_priority(priority: object) -> int:
    """Refuse a priority that is not an integer from MIN_PRIORITY to MAX_PRIORITY."""
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not MIN_PRIORITY <= priority <= MAX_PRIORITY
    ):
        raise ValueError(
            f"priority must be an integer from {MIN_PRIORITY} (claimed first) to "
            f"{MAX_PRIORITY} (claimed last), got {priority!r}"
        )
    return priority


def check_queue_name(queue: object) -> str:
    """Refuse a queue name that is not a non-empty storable string of at most 200 characters."""
    return check_name(queue, "queue")


DEFAULT_CONCURRENCY_LIMIT = 1
"""The limit of an item given a ``concurrency_key`` but no ``concurrency_limit``: one at a time."""
MAX_CONCURRENCY_LIMIT = 1_000_000
"""The largest ``concurrency_limit`` (a number every backend stores as an integer)."""


def check_concurrency(key: object, limit: object) -> tuple[str | None, int | None]:
    """The ``(concurrency_key, concurrency_limit)`` to store; a bad one raises, naming the rule.

    Both None: no key. A key without a limit gets :data:`DEFAULT_CONCURRENCY_LIMIT`. A limit
    without a key is refused (it would limit nothing).
    """
    if key is None:
        if limit is not None:
            raise ValueError(
                f"concurrency_limit needs a concurrency_key, got limit {limit!r} without a key"
            )
        return None, None
    key = check_name(key, "concurrency_key")
    if limit is None:
        return key, DEFAULT_CONCURRENCY_LIMIT
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int)
        or not 1 <= limit <= MAX_CONCURRENCY_LIMIT
    ):
        raise ValueError(
            f"concurrency_limit must be an integer from 1 to {MAX_CONCURRENCY_LIMIT}, got {limit!r}"
        )
    return key, limit


MAX_TIMEOUT = 365 * 24 * 3600.0
"""The longest evaluation timeout (a year, in seconds)."""


def check_timeout(timeout: object, *, what: str = "timeout") -> float | None:
    """Refuse a timeout that is not None or a positive finite number of seconds up to a year."""
    if timeout is None:
        return None
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= MAX_TIMEOUT
    ):
        raise ValueError(
            f"{what} must be a positive number of seconds, at most {MAX_TIMEOUT:g}, got {timeout!r}"
        )
    return float(timeout)


UniqueScope: TypeAlias = Literal["forever", "unfinished"] | dt.timedelta | float
"""How long an item's idempotency key holds (``NewItem.unique``, ``enqueue(unique=...)``):

- ``"forever"`` (the default): as long as the item exists, in any state;
- ``"unfinished"``: while the item is queued or running; once it is completed, cancelled or
  dead, the next enqueue with the key creates a new item;
- a ``timedelta`` or a positive number of seconds: for that long after the item was created.
"""

SCOPE_FOREVER = "forever"
SCOPE_UNFINISHED = "unfinished"
SCOPE_PERIOD = "period"


def check_unique(unique: object, idempotency_key: str | None = None) -> tuple[str, float | None]:
    """``(scope, seconds)`` for a :data:`UniqueScope`: the stored scope name, and the period.

    Refuses anything else, and a scope other than ``"forever"`` without an idempotency key
    (there is nothing for it to apply to), naming the field ``unique``.
    """
    if isinstance(unique, str):
        if unique not in (SCOPE_FOREVER, SCOPE_UNFINISHED):
            raise ValueError(
                "unique must be 'forever', 'unfinished' or a period (a timedelta or a positive "
                f"number of seconds), got {unique!r}"
            )
        scope, seconds = unique, None
    else:
        if isinstance(unique, dt.timedelta):
            seconds = unique.total_seconds()
        elif isinstance(unique, int | float) and not isinstance(unique, bool):
            seconds = float(unique)
        else:
            raise ValueError(
                "unique must be 'forever', 'unfinished' or a period (a timedelta or a positive "
                f"number of seconds), got {unique!r}"
            )
        if not 0 < seconds <= MAX_DELAY:
            raise ValueError(
                f"unique as a period must be from 0 (excluded) to {MAX_DELAY:g} seconds, "
                f"got {unique!r}"
            )
        scope = SCOPE_PERIOD
    if scope != SCOPE_FOREVER and idempotency_key is None:
        raise ValueError(f"unique={unique!r} needs an idempotency_key to apply to")
    return scope, seconds


def check_new_item(
    *,
    spec_id: str,
    config: JSONValue,
    item_id: str | None,
    tenant_id: str,
    subject_id: str,
    idempotency_key: str | None,
    priority: int = 0,
    queue: str = DEFAULT_QUEUE,
    timeout: float | None = None,
    unique: object = "forever",
    shape_checked: bool = False,
) -> JSONValue:
    """Validate what ``enqueue`` was given, the same way on every backend; return the config.

    An attrs instance (a driver's ``config_type``) is unstructured by the shared converter
    first, as :class:`Reschedule` does. Refuses an empty or over-long spec id, item id or
    idempotency key (:data:`MAX_NAME_LENGTH`, :data:`MAX_ID_LENGTH`), a priority or queue name
    out of range, a NUL character or a lone surrogate in any text field
    (PostgreSQL cannot store a NUL, no backend a surrogate, and a spec id with one could never be
    claimed) and a config that :func:`check_json` refuses, each naming the field. Nothing is
    written when this raises. ``shape_checked`` skips the checks of the spec id, priority,
    queue, timeout and unique scope (a batch checks each distinct combination once).
    """
    from .._errors import ConfigError

    if not shape_checked:
        validate_spec_id(spec_id)
        check_priority(priority)
        check_queue_name(queue)
        check_timeout(timeout)
        check_unique(unique, idempotency_key)
    if item_id is not None and (type(item_id) is not str or not 0 < len(item_id) <= MAX_ID_LENGTH):
        check_identifier(item_id, "item_id")
    if idempotency_key is not None and (
        type(idempotency_key) is not str or not 0 < len(idempotency_key) <= MAX_ID_LENGTH
    ):
        check_identifier(idempotency_key, "idempotency_key")
    texts = {
        "spec_id": spec_id,
        "item_id": item_id,
        "tenant_id": tenant_id,
        "subject_id": subject_id,
        "idempotency_key": idempotency_key,
    }
    for name, text in texts.items():
        if text is None or (type(text) is str and text.isascii() and "\x00" not in text):
            continue  # the common case, checked inline (bulk enqueue runs this per entry)
        if not isinstance(text, str):
            raise ValueError(f"{name} must be a string, got {text!r}")
        problem = _unstorable(text)
        if problem is not None:
            raise ConfigError(f"{name} must not contain {problem}")
    if config is None:
        return {}
    if attrs.has(type(config)):
        # What a driver's config_type accepts, enqueue accepts: the shared converter's JSON.
        from .._convert import unstructure

        config = unstructure(config)
    return check_json(config)


def _item_tuple(children: Sequence[NewItem]) -> tuple[NewItem, ...]:
    return tuple(children)


def child_item_id(parent_id: str, lease_version: int, index: int) -> str:
    """The id of the *index*-th child (from 0) created by *parent_id*'s outcome under
    *lease_version*, when the child names none: ``"<parent>.<version>.<index, 4 digits>"``.

    Deterministic, so a settlement written twice cannot create a child twice, and readable
    (``items show order-1.7.0002``); the children of one outcome sort in their order.
    """
    return f"{parent_id}.{lease_version}.{index:04d}"


class ItemState(enum.StrEnum):
    """Where an item is in its life."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    DEAD = "dead"

    @property
    def finished(self) -> bool:
        """True for the states an item never leaves on its own."""
        return self in (ItemState.COMPLETED, ItemState.CANCELLED, ItemState.DEAD)


def check_prune(older_than: Mapping[ItemState, float], limit: int | None) -> dict[ItemState, float]:
    """Validate :meth:`WorkQueue.prune`'s arguments the same way on every backend; return the
    ages by state (``ValueError`` naming the state or the limit and the rule)."""
    bound: object = limit  # checked as whatever it was given
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 1):
        raise ValueError(f"limit must be None or an integer >= 1, got {limit!r}")
    ages: dict[ItemState, float] = {}
    for state, age in older_than.items():
        state = ItemState(state)
        seconds: object = age
        if not state.finished:
            raise ValueError(
                f"only finished items are pruned (completed, cancelled, dead), got {state}"
            )
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not (0 <= seconds <= MAX_DELAY)
        ):
            raise ValueError(
                f"older_than[{state}] must be a number of seconds from 0 to {MAX_DELAY:g}, "
                f"got {seconds!r}"
            )
        ages[state] = float(seconds)
    return ages


def check_config(config: JSONValue) -> JSONValue:
    """An edited config, checked as ``enqueue`` checks one (attrs instances unstructured)."""
    if attrs.has(type(config)):
        from .._convert import unstructure

        config = unstructure(config)
    return check_json({} if config is None else config)


MAX_ERRORS = 10
"""How many errors an item's ``errors`` history keeps (the oldest is dropped first)."""


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


@attrs.frozen(kw_only=True)
class WorkItem:
    """One unit of durable work, as the queue last stored it."""

    id: str
    spec_id: str
    tenant_id: str = ""
    subject_id: str = ""
    config: JSONValue = attrs.field(factory=dict)
    cancel_requested: bool = False
    lease_version: int = 0
    state: ItemState = ItemState.QUEUED
    due_at: dt.datetime = attrs.field(converter=utc)
    error_count: int = 0
    last_error: str | None = None
    lease_owner: str | None = None
    lease_expires_at: dt.datetime | None = attrs.field(
        default=None, converter=attrs.converters.optional(utc)
    )
    idempotency_key: str | None = None
    created_at: dt.datetime = attrs.field(converter=utc)
    updated_at: dt.datetime = attrs.field(converter=utc)
    attempt: int = 0
    """Claims since the last successful evaluation, counted by the claim itself (see the module
    doc); a runner settles an item claimed more than ``max_attempts`` times as dead."""
    priority: int = 0
    """From MIN_PRIORITY to MAX_PRIORITY; a lower number is claimed first."""
    queue: str = DEFAULT_QUEUE
    """The named queue the item waits in."""
    timeout: float | None = None
    """Seconds one evaluation may take, overriding the driver's ``timeout``; None: the driver's."""
    result: JSONValue = None
    """The JSON result a completed item was stopped with (``Stop(result=...)``), else None."""
    errors: tuple[ErrorEntry, ...] = ()
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
        default=None, converter=attrs.converters.optional(utc)
    )
    """With the ``"period"`` scope, when the key stops holding."""
    released_key: str | None = None
    """The key this item held until its scope lapsed and a newer item took it (then
    ``idempotency_key`` is None); :meth:`WorkQueue.get_by_key` still finds it by that key."""
    concurrency_key: str | None = None
    """The fleet-wide key whose running items are limited (see the module doc), or None."""
    concurrency_limit: int | None = None
    """At most this many items of ``concurrency_key`` run at once; None without a key."""

    @property
    def lease(self) -> Lease:
        """The lease this copy of the item was handed out under."""
        return Lease(item_id=self.id, version=self.lease_version, worker_id=self.lease_owner or "")


class UnfrozenItem(WorkItem):
    """:class:`WorkItem`'s layout (no slot of its own) without the frozen class's
    ``__setattr__``: what the queues' hot paths fill or change by plain attribute stores. An
    object of it becomes the :class:`WorkItem` it is by ``__class__`` assignment (allowed
    between classes of one layout): the PostgreSQL queue decodes a claimed row so, and the
    memory queue keeps its stored items as ``UnfrozenItem`` and builds its copies so. Never
    handed out: what leaves a queue is a ``WorkItem``.

    A store on a frozen attrs class goes through a slot's setter called as a function (about
    41 to 60 ns a field), a plain store on a slot is one specialised bytecode (about 8 to 10
    ns), and an item has 29 fields. Both ``__setattr__`` and ``__delattr__`` are object's own,
    so the class keeps CPython's generic attribute setter, which the bytecode specialises on.
    """

    __slots__ = ()
    __setattr__ = object.__setattr__
    __delattr__ = object.__delattr__


_new_object = object.__new__
_set = object.__setattr__
_SLOT_SETTERS: dict[str, Callable[[WorkItem, Any], None]] = {
    field.name: vars(WorkItem)[field.name].__set__ for field in attrs.fields(WorkItem)
}
"""Each field's slot descriptor's ``__set__`` (``WorkItem`` is a slotted attrs class)."""


def replace_trusted(item: WorkItem, **changes: Any) -> WorkItem:
    """``attrs.evolve(item, **changes)`` without running the converters again.

    For the queues' own hot paths (a claim or settlement replaces every stored item twice), where
    evolve's cost is mostly re-running the ``utc`` converters on four datetimes that are UTC
    already. Safe only because every value passed here is one the queue produced or checked
    itself: datetimes are timezone-aware UTC (the clock's ``now`` through ``utc``, plus a
    ``timedelta``, or a :class:`Settlement`'s converted ``at``), and ``WorkItem`` has no other
    converters or validators. Anything a user hands in still goes through ``WorkItem(...)``.
    Frozen attrs classes set their fields with ``object.__setattr__`` too. Every field is set
    here by name (checked at import, below); a key in *changes* that is not a field is ignored,
    so only the queues call this.
    """
    new: WorkItem = _new_object(WorkItem)
    get = changes.get
    _set(new, "id", get("id", item.id))
    _set(new, "spec_id", get("spec_id", item.spec_id))
    _set(new, "tenant_id", get("tenant_id", item.tenant_id))
    _set(new, "subject_id", get("subject_id", item.subject_id))
    _set(new, "config", get("config", item.config))
    _set(new, "cancel_requested", get("cancel_requested", item.cancel_requested))
    _set(new, "lease_version", get("lease_version", item.lease_version))
    _set(new, "state", get("state", item.state))
    _set(new, "due_at", get("due_at", item.due_at))
    _set(new, "error_count", get("error_count", item.error_count))
    _set(new, "last_error", get("last_error", item.last_error))
    _set(new, "lease_owner", get("lease_owner", item.lease_owner))
    _set(new, "lease_expires_at", get("lease_expires_at", item.lease_expires_at))
    _set(new, "idempotency_key", get("idempotency_key", item.idempotency_key))
    _set(new, "created_at", get("created_at", item.created_at))
    _set(new, "updated_at", get("updated_at", item.updated_at))
    _set(new, "attempt", get("attempt", item.attempt))
    _set(new, "priority", get("priority", item.priority))
    _set(new, "queue", get("queue", item.queue))
    _set(new, "timeout", get("timeout", item.timeout))
    _set(new, "result", get("result", item.result))
    _set(new, "errors", get("errors", item.errors))
    _set(new, "parent_id", get("parent_id", item.parent_id))
    _set(new, "waiting_children", get("waiting_children", item.waiting_children))
    _set(new, "unique_scope", get("unique_scope", item.unique_scope))
    _set(new, "unique_until", get("unique_until", item.unique_until))
    _set(new, "released_key", get("released_key", item.released_key))
    _set(new, "concurrency_key", get("concurrency_key", item.concurrency_key))
    _set(new, "concurrency_limit", get("concurrency_limit", item.concurrency_limit))
    return new


def new_trusted(
    *,
    id: str,
    spec_id: str,
    tenant_id: str,
    subject_id: str,
    config: JSONValue,
    due_at: dt.datetime,
    idempotency_key: str | None,
    created_at: dt.datetime,
    priority: int,
    queue: str,
    timeout: float | None,
    unique_scope: str,
    unique_until: dt.datetime | None,
    concurrency_key: str | None = None,
    concurrency_limit: int | None = None,
) -> WorkItem:
    """A just-enqueued :class:`WorkItem` (queued, no lease, no errors) without its converters.

    For bulk enqueue, which builds one per entry: the same trust as :func:`replace_trusted`
    (every datetime is UTC already, every value checked), and every other field its default.
    Each field is set through its slot's own setter (a third cheaper than
    ``object.__setattr__``, which looks the slot up first).
    """
    new: WorkItem = _new_object(WorkItem)
    set_ = _SLOT_SETTERS
    set_["id"](new, id)
    set_["spec_id"](new, spec_id)
    set_["tenant_id"](new, tenant_id)
    set_["subject_id"](new, subject_id)
    set_["config"](new, config)
    set_["cancel_requested"](new, False)
    set_["lease_version"](new, 0)
    set_["state"](new, ItemState.QUEUED)
    set_["due_at"](new, due_at)
    set_["error_count"](new, 0)
    set_["last_error"](new, None)
    set_["lease_owner"](new, None)
    set_["lease_expires_at"](new, None)
    set_["idempotency_key"](new, idempotency_key)
    set_["created_at"](new, created_at)
    set_["updated_at"](new, created_at)
    set_["attempt"](new, 0)
    set_["priority"](new, priority)
    set_["queue"](new, queue)
    set_["timeout"](new, timeout)
    set_["result"](new, None)
    set_["errors"](new, ())
    set_["unique_scope"](new, unique_scope)
    set_["unique_until"](new, unique_until)
    set_["released_key"](new, None)
    set_["concurrency_key"](new, concurrency_key)
    set_["concurrency_limit"](new, concurrency_limit)
    set_["parent_id"](new, None)
    set_["waiting_children"](new, 0)
    return new


def created_item(entry: NewItem, item_id: str, created_at: dt.datetime) -> WorkItem:
    """The item a checked *entry* (:func:`check_entries`) becomes, written at *created_at*
    (UTC) with *item_id*: what every backend stores, built without reading it back."""
    scope, seconds = check_unique(entry.unique, entry.idempotency_key)
    timeout = entry.evaluation_timeout
    return new_trusted(
        id=item_id,
        spec_id=entry.spec_id,
        tenant_id=entry.tenant_id,
        subject_id=entry.subject_id,
        config={} if entry.config is None else entry.config,
        due_at=created_at if entry.due_at is None else entry.due_at,
        idempotency_key=entry.idempotency_key,
        created_at=created_at,
        priority=entry.priority,
        queue=entry.queue,
        timeout=None if timeout is None else float(timeout),
        unique_scope=scope,
        unique_until=None if seconds is None else created_at + dt.timedelta(seconds=seconds),
        concurrency_key=entry.concurrency_key,
        concurrency_limit=entry.concurrency_limit,
    )


def _check_replace_trusted() -> None:
    # A field added to WorkItem but not to replace_trusted would be left unset: comparing the
    # copy reads every field, so that fails here, at import, rather than in a queue.
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    probe = WorkItem(id="probe", spec_id="probe", due_at=epoch, created_at=epoch, updated_at=epoch)
    if replace_trusted(probe) != probe:  # pragma: no cover
        raise RuntimeError("replace_trusted does not copy every WorkItem field")
    fresh = new_trusted(
        id="probe",
        spec_id="probe",
        tenant_id="",
        subject_id="",
        config={},
        due_at=epoch,
        idempotency_key=None,
        created_at=epoch,
        priority=0,
        queue=DEFAULT_QUEUE,
        timeout=None,
        unique_scope="forever",
        unique_until=None,
    )
    if fresh != probe:  # pragma: no cover
        raise RuntimeError("new_trusted does not set every WorkItem field as its default")


_check_replace_trusted()


@attrs.frozen(kw_only=True)
class NewItem:
    """One item to enqueue: the keyword arguments of :meth:`WorkQueue.enqueue` as a record.

    For :meth:`WorkQueue.enqueue_many` (and whatever else writes new items). Nothing is checked
    here: the queue checks every entry (:func:`check_entries`) before it writes any.
    """

    spec_id: str
    config: JSONValue = None
    """``None`` means ``{}``; an attrs instance is unstructured by the shared converter."""
    tenant_id: str = ""
    subject_id: str = ""
    due_at: dt.datetime | None = None
    """Default: now."""
    item_id: str | None = None
    """Default: a random one."""
    idempotency_key: str | None = None
    priority: int = 0
    queue: str = DEFAULT_QUEUE
    evaluation_timeout: float | None = None
    unique: UniqueScope = "forever"
    """How long *idempotency_key* holds once this item is created (see :data:`UniqueScope`)."""
    concurrency_key: str | None = None
    """The fleet-wide key whose running items are limited (see the module doc), or None."""
    concurrency_limit: int | None = None
    """At most this many items of *concurrency_key* run at once (default
    :data:`DEFAULT_CONCURRENCY_LIMIT` with a key)."""


@attrs.frozen(kw_only=True)
class Enqueued:
    """What enqueueing one :class:`NewItem` did."""

    item: WorkItem
    """The new item, or the existing one that holds the key."""
    created: bool
    """False: an existing item holds the idempotency key, and nothing was written."""


def _plain_text(text: object) -> bool:
    """A str of ASCII without a NUL: storable everywhere, no need to look closer."""
    return type(text) is str and text.isascii() and "\x00" not in text


def check_entries(entries: Sequence[NewItem]) -> list[NewItem]:
    """Every entry checked (:func:`check_new_item`), its config the checked JSON copy (or
    None for an empty one: each backend stores ``{}``).

    A bad entry raises the error :func:`check_new_item` raises (``ConfigError`` or
    ``ValueError``), its message starting ``entry N:`` (0-based) when there is more than one,
    so nothing is written for a batch with one bad entry.
    """
    checked = []
    shapes: set[tuple[Any, ...]] = set()
    """The (spec id, priority, queue, timeout, unique, keyed) combinations checked already."""
    for index, entry in enumerate(entries):
        if not isinstance(entry, NewItem):
            raise TypeError(f"entry {index}: expected a NewItem, got {type(entry).__name__}")
        shape = (
            type(entry.spec_id),
            entry.spec_id,
            type(entry.priority),
            entry.priority,
            type(entry.queue),
            entry.queue,
            type(entry.evaluation_timeout),
            entry.evaluation_timeout,
            type(entry.unique),
            entry.unique,
            entry.idempotency_key is None,
        )
        try:
            known = shape in shapes
        except TypeError:  # something unhashable: a bad value, the full check names it
            known = False
        if (
            known
            and entry.config is None
            and entry.item_id is None
            and entry.due_at is None
            and entry.concurrency_key is None
            and entry.concurrency_limit is None
            and _plain_text(entry.tenant_id)
            and _plain_text(entry.subject_id)
            and (entry.idempotency_key is None or _plain_text(entry.idempotency_key))
        ):
            # The common bulk entry, whose shape was checked already: what check_new_item
            # checks per entry, inline (it would return the entry unchanged).
            checked.append(entry)
            continue
        try:
            config = check_new_item(
                spec_id=entry.spec_id,
                config=entry.config,
                item_id=entry.item_id,
                tenant_id=entry.tenant_id,
                subject_id=entry.subject_id,
                idempotency_key=entry.idempotency_key,
                priority=entry.priority,
                queue=entry.queue,
                timeout=entry.evaluation_timeout,
                unique=entry.unique,
                shape_checked=known,
            )
            if not known:
                with contextlib.suppress(TypeError):
                    shapes.add(shape)
            key, limit = check_concurrency(entry.concurrency_key, entry.concurrency_limit)
            due_at = entry.due_at
            if due_at is not None:
                if not isinstance(due_at, dt.datetime):
                    raise ValueError(f"due_at must be a datetime, got {due_at!r}")
                if due_at.tzinfo is None or due_at.utcoffset() is None:
                    raise ValueError(
                        f"due_at must be a timezone-aware datetime, got naive {due_at.isoformat()}"
                    )
                due_at = utc(due_at)
        except ValueError as error:
            if len(entries) == 1:
                raise
            raise type(error)(f"entry {index}: {error}") from None
        if type(config) is dict and not config:
            config = None  # an empty config stays None: "{}" to every backend, no copy to make
        if (
            config is not entry.config
            or due_at is not entry.due_at
            or limit is not entry.concurrency_limit
        ):
            entry = attrs.evolve(
                entry, config=config, due_at=due_at, concurrency_key=key, concurrency_limit=limit
            )
        checked.append(entry)
    return checked


def check_child(child: NewItem, *, what: str) -> NewItem:
    """An outcome's *child* checked as :func:`check_entries` checks an entry, its errors
    prefixed with *what* (``children[2] of spec 'album': config is not JSON-compatible ...``)."""
    from .._errors import ConfigError

    try:
        [checked] = check_entries([child])
    except ConfigError as error:
        raise ConfigError(f"{what}: {error}") from None
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from None
    return checked


def new_item_ids(now: dt.datetime, count: int) -> list[str]:
    """*count* new random item ids, 32 hex digits (as ``uuid4().hex``), in increasing order.

    12 digits of *now* in milliseconds since the Unix epoch (as a UUIDv7's), 8 of a counter
    from a random start, 12 random (48 bits). Ids written together are neighbours in the
    primary-key index, in order, so a bulk insert appends to it instead of touching a random
    page per row (which makes a SQLite insert of random ids twice as slow).
    """
    ms = max(0, (utc(now) - _EPOCH) // _MS) % (1 << 48)
    prefix = f"{ms:012x}"
    start = int.from_bytes(os.urandom(4))
    randoms = os.urandom(6 * count).hex()
    return [
        f"{prefix}{(start + n) % (1 << 32):08x}{randoms[12 * n : 12 * n + 12]}"
        for n in range(count)
    ]


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MS = dt.timedelta(milliseconds=1)


def plan_batch(entries: Sequence[NewItem]) -> tuple[list[int], dict[int, int]]:
    """Which entries of a checked batch to write, and which repeat an earlier one's key.

    Returns ``(sent, repeats)``: the indices to write, in order, and for every entry whose
    idempotency key an earlier entry of the batch carries, that earlier entry's index (the
    first wins; the rest report ``created=False`` with its item). Explicit item ids are checked
    by the backend once it knows which sent entries an existing item's key answers:
    :func:`repeated_id`.
    """
    first_by_key: dict[str, int] = {}
    repeats: dict[int, int] = {}
    sent: list[int] = []
    for index, entry in enumerate(entries):
        key = entry.idempotency_key
        if key is not None:
            first = first_by_key.setdefault(key, index)
            if first != index:
                repeats[index] = first
                continue
        sent.append(index)
    return sent, repeats


def repeated_id(ids: Iterable[str | None]) -> str | None:
    """The first explicit item id that occurs twice in *ids* (None: no id does)."""
    seen: set[str] = set()
    for item_id in ids:
        if item_id is not None:
            if item_id in seen:
                return item_id
            seen.add(item_id)
    return None


@attrs.frozen(kw_only=True)
class QueueInfo:
    """One named queue: whether it is paused, and how many items it holds per state."""

    name: str
    paused: bool = False
    paused_at: dt.datetime | None = attrs.field(
        default=None, converter=attrs.converters.optional(utc)
    )
    counts: Mapping[ItemState, int] = attrs.field(factory=dict)


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


class SettleKind(enum.StrEnum):
    """How an evaluation ended, as written back to the queue."""

    CONTINUE = "continue"
    """Evaluated fine; due again after ``delay`` seconds. Clears the error count."""
    RESCHEDULE = "reschedule"
    """Evaluated fine; due at ``at`` with the new ``config`` in one write. Clears the errors."""
    COMPLETE = "complete"
    """Finished for good, with the JSON ``result`` if any."""
    CANCEL = "cancel"
    """Finished because cancellation was requested."""
    RETRY = "retry"
    """Failed with ``error``; due again after ``delay`` seconds. Adds one to the error count."""
    DEAD = "dead"
    """Failed with ``error`` for the last time: never claimed again until retried by hand."""
    RELEASE = "release"
    """Lease handed back without an outcome (shutdown); due again after ``delay``, the claim's
    attempt taken back. Errors kept; with an ``error`` (a failure that is not the item's own,
    such as a drivers' context that failed to build) it is recorded too (the error count, the
    history), and the item never goes dead for it."""


@attrs.frozen(kw_only=True)
class Settlement:
    """One write-back of an evaluation's outcome, fenced by ``(item_id, lease_version)``."""

    item_id: str
    lease_version: int
    kind: SettleKind
    delay: float = 0.0
    at: dt.datetime | None = attrs.field(default=None, converter=attrs.converters.optional(utc))
    config: JSONValue = None
    result: JSONValue = None
    """A ``complete`` settlement's JSON result (checked like a config before it is written)."""
    error: str | None = attrs.field(
        default=None, converter=attrs.converters.optional(storable_text)
    )
    """Made storable on the way in (:func:`storable_text`): escaped, never dropped."""
    children: tuple[NewItem, ...] = attrs.field(default=(), converter=_item_tuple)
    """Items to create with this settlement, atomically and only if it applies (``continue``,
    ``reschedule`` and ``complete`` only); a child without an ``item_id`` is given
    :func:`child_item_id` here. Checked by the backend as ``enqueue`` checks (an unstorable
    child makes the whole entry :func:`unstorable_outcome`)."""
    wait_for_children: bool = False
    """``continue`` only: the parent waits, not due, until every child created has finished."""
    _checked: bool = attrs.field(init=False, default=False, eq=False, repr=False)
    """Internal, never set by ``__init__`` nor kept by ``attrs.evolve``: ``config`` and
    ``result`` are :func:`check_json`'s copies made for this settlement alone (the runner's
    settlement of a driver's outcome), so a backend may store them without checking and
    copying them again. Not compared: equal settlements are equal however they were built."""
    _parentless: bool = attrs.field(init=False, default=False, eq=False, repr=False)
    """Internal, set by the runner alone (never by ``__init__`` nor kept by ``attrs.evolve``):
    the settled item has no parent, as the runner read from the item it claimed (an item's
    parent never changes), so no parent's fan-in follows from it. PostgreSQL writes a batch of
    such settlements without children or waits as one statement in autocommit; any other batch
    goes the general way, in one transaction with the fan-in."""

    def __attrs_post_init__(self) -> None:
        if self.children or self.wait_for_children:
            self._check_children()
        if self.kind is SettleKind.RESCHEDULE and self.at is None:
            raise ValueError("a reschedule settlement needs 'at'")
        if self.kind in (SettleKind.RETRY, SettleKind.DEAD) and self.error is None:
            raise ValueError(f"a {self.kind} settlement needs 'error'")
        if not (0.0 <= self.delay <= MAX_DELAY):
            raise ValueError(
                f"delay must be a number of seconds from 0 to {MAX_DELAY:g}, got {self.delay!r}"
            )

    def _check_children(self) -> None:
        if self.wait_for_children and self.kind is not SettleKind.CONTINUE:
            raise ValueError(f"a {self.kind} settlement cannot wait for children")
        if not self.children:
            return
        if self.kind not in (SettleKind.CONTINUE, SettleKind.RESCHEDULE, SettleKind.COMPLETE):
            raise ValueError(f"a {self.kind} settlement cannot create children")
        if len(self.children) > MAX_CHILDREN:
            raise ValueError(
                f"children: at most {MAX_CHILDREN} per outcome, got {len(self.children)}"
            )
        named = []
        for index, child in enumerate(self.children):
            if not isinstance(child, NewItem):
                raise TypeError(f"children[{index}] must be a NewItem, got {child!r}")
            if child.item_id is None:
                child = attrs.evolve(
                    child, item_id=child_item_id(self.item_id, self.lease_version, index)
                )
            named.append(child)
        object.__setattr__(self, "children", tuple(named))


class UnfrozenSettlement(Settlement):
    """:class:`Settlement`'s layout without the frozen ``__setattr__``, as
    :class:`UnfrozenItem` is :class:`WorkItem`'s: the settlement built per evaluation is filled
    by plain stores on one, which then becomes the ``Settlement`` it is."""

    __slots__ = ()
    __setattr__ = object.__setattr__
    __delattr__ = object.__delattr__


def unstorable_outcome(settlement: Settlement, error: Exception) -> Settlement:
    """What a settlement the backend cannot store becomes: ``dead``, with the reason.

    One entry of a ``settle_many`` batch that cannot be written (a rescheduled config no backend
    can store, a value out of the database's range) must not take its batch-mates down, nor be
    re-run for ever: it is settled ``dead`` (fenced as usual) with ``last_error`` saying why, and
    ``trio-supervise items retry`` revives it once fixed.
    """
    return Settlement(
        item_id=settlement.item_id,
        lease_version=settlement.lease_version,
        kind=SettleKind.DEAD,
        error=f"the {settlement.kind} outcome could not be stored: {error}",
    )


class SingleWrites:
    """The seed's one-item writes (``release``, ``reschedule``, ``complete``), written once.

    Each is one :class:`Settlement` handed to the backend's ``_settle_one``, which applies it
    fenced or raises :class:`LeaseLost`; so the three read, validate and fail the same way on
    every backend.
    """

    async def _settle_one(self, settlement: Settlement) -> None:
        raise NotImplementedError

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


@runtime_checkable
class WorkQueue(Protocol):
    """A durable (or in-memory) queue of leased work items.

    Durations are seconds (``float``); datetimes are timezone-aware. Every method may raise
    :class:`QueueError` (or :class:`QueueUnavailable`) when the backend fails.
    """

    @property
    def clock(self) -> Clock:
        """Where this queue reads "now" from for due times and lease expiries."""
        ...

    # -- producing and inspecting ------------------------------------------------------------

    async def enqueue(
        self,
        spec_id: str,
        *,
        config: JSONValue = None,
        tenant_id: str = "",
        subject_id: str = "",
        due_at: dt.datetime | None = None,
        item_id: str | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        queue: str = DEFAULT_QUEUE,
        evaluation_timeout: float | None = None,
        unique: UniqueScope = "forever",
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
    ) -> WorkItem:
        """Add an item, due at *due_at* (default: now); config ``None`` means ``{}``.

        It waits in *queue* with *priority* (lower first; see the module doc); a priority out
        of range raises :class:`ValueError`. *evaluation_timeout* (seconds) bounds each
        evaluation of this item (stored as ``WorkItem.timeout``), overriding its driver's
        ``timeout``. With a *concurrency_key*, at most *concurrency_limit* (default 1) items of
        that key run at once, fleet-wide (see the module doc); a limit without a key raises
        :class:`ValueError`.

        With an *idempotency_key* that an existing item holds, nothing is written and that
        item is returned (:meth:`enqueue_many` says which happened). How long the new item
        holds its key is *unique* (see :data:`UniqueScope`): ``"forever"`` (the default: while
        the item exists, in any state), ``"unfinished"`` (until it is completed, cancelled or
        dead) or a period (a ``timedelta`` or seconds from its creation). The holder's own
        scope decides: when it has lapsed, the enqueue moves the key to the holder's
        ``released_key`` and creates a new item, in one transaction, so any number of
        concurrent enqueuers with one key create one item. An explicit *item_id* that exists
        already raises :class:`DuplicateItem`. A config that is not JSON raises
        :class:`ConfigError`.
        """
        ...

    async def enqueue_many(self, entries: Sequence[NewItem]) -> list[Enqueued]:
        """Add many items at once (one transaction, one round trip per batch on SQL).

        Per entry, in order, an :class:`Enqueued`: the new item, or the existing one that holds
        its idempotency key (``created=False``; an entry repeating an earlier entry's key
        reports that entry's item). Every entry is checked before anything is written: a bad
        one raises ``ConfigError``/``ValueError`` naming its index and field. An explicit item
        id that exists already (or twice in the batch) raises :class:`DuplicateItem` and
        nothing of the batch is written. Waiters are woken once per batch.
        """
        ...

    async def get_by_key(self, idempotency_key: str) -> WorkItem:
        """The item holding *idempotency_key*; else the newest one that held it (its scope
        lapsed and a newer item took it); else :class:`ItemNotFound`."""
        ...

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
    ) -> list[WorkItem]:
        """Items filtered by state and spec, ordered by ``due_at`` then ``id``.

        *after* is a cursor: the id of an item (the last one of the previous page); only items
        after it in that order come back. An unknown id raises :class:`ItemNotFound`. Costs
        O(rows shown) on the SQL backends (an index per state).
        """
        ...

    async def counts(self) -> Mapping[tuple[str, ItemState], int]:
        """How many items there are per ``(spec_id, state)`` (pairs with none are omitted)."""
        ...

    async def list_children(self, parent_id: str, *, limit: int = 1000) -> list[WorkItem]:
        """The items *parent_id*'s outcomes created (``parent_id`` set), at most *limit*, by
        ``(created_at, id)``: one outcome's children in their order. None for an unknown id."""
        ...

    async def request_cancel(self, item_id: str) -> WorkItem:
        """Cancel a queued item at once, or flag a running one for its owner; see the module doc."""
        ...

    async def retry(self, item_id: str, *, at: dt.datetime | None = None) -> WorkItem:
        """Put a finished (or queued) item back in the queue, due at *at* (default: now).

        Clears the error count and the cancel flag. A running item raises :class:`ItemStateError`.
        """
        ...

    async def prune(
        self,
        older_than: Mapping[ItemState, float],
        *,
        limit: int | None = None,
        dry_run: bool = False,
    ) -> dict[ItemState, int]:
        """Delete finished items last updated at least ``older_than[state]`` seconds ago.

        Per state of *older_than* (each must be finished, each age a finite number >= 0), the
        oldest such items by ``updated_at`` first, at most *limit* of them (None: all). Returns
        how many were deleted per state given (with *dry_run*, how many would be: nothing is
        deleted). See "Retention and editing" in the module doc.
        """
        ...

    async def delete(self, item_id: str) -> WorkItem:
        """Delete one item and return it as it was. A running item (or one waiting for its
        children) raises :class:`ItemStateError`; a missing one :class:`ItemNotFound`."""
        ...

    async def edit_config(self, item_id: str, config: JSONValue) -> WorkItem:
        """Replace the config of a queued or finished item (checked as ``enqueue`` checks it:
        :class:`ConfigError`); a running item raises :class:`ItemStateError`."""
        ...

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
        """Claim up to *limit* claimable items of *spec_ids* in *queue* for *lease* seconds,
        by ``(priority, due_at, id)``; none while *queue* is paused."""
        ...

    async def renew(
        self, item_id: str, worker_id: str, lease_version: int, lease: float
    ) -> LeaseStatus:
        """Extend a lease to ``now + lease``; :class:`LeaseLost` if it is no longer this one's."""
        ...

    async def renew_many(self, leases: Sequence[Lease], lease: float) -> dict[str, LeaseStatus]:
        """Renew many leases in one round trip; stale ones come back as ``LOST``."""
        ...

    async def release(self, item_id: str, lease_version: int, delay: float) -> None:
        """Hand the item back, due again after *delay* seconds (error count unchanged)."""
        ...

    async def reschedule(
        self, item_id: str, lease_version: int, at: dt.datetime, config: JSONValue
    ) -> None:
        """Set the next due time and the new config in one write."""
        ...

    async def complete(self, item_id: str, lease_version: int) -> None:
        """Finish the item for good."""
        ...

    async def mark_error(self, item_id: str, lease_version: int, error: str) -> None:
        """Record an error (count + 1, ``last_error``); the lease stays held."""
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
        """Return when work of *spec_ids* in *queues* (default: every queue) may be claimable.

        Returns at once when something is due already; early when the backend learns of new work
        (an enqueue in this process, a NOTIFY); otherwise at the next known due time. It may
        return early spuriously. Callers bound the wait with a cancel scope (the poll interval):
        ``with trio.move_on_after(poll_interval): await queue.wait_for_work(spec_ids)``.
        """
        ...

    # -- schedules ---------------------------------------------------------------------------

    async def fire_schedule(self, name: str, fire: dt.datetime, entry: NewItem) -> Enqueued | None:
        """Enqueue *entry* as schedule *name*'s fire at *fire*, unless a fire at or after
        *fire* was recorded for it already: then nothing is written and None is returned.

        Recording the fire and enqueueing its item are one transaction, so across any number
        of schedulers each fire is enqueued once, and never again once its item is pruned.
        The entry is checked as ``enqueue_many`` checks one; its idempotency key (the fire's
        deterministic id) makes a fire enqueued before fires were recorded one too."""
        ...

    async def last_fires(self, names: Sequence[str]) -> dict[str, dt.datetime]:
        """The last fire recorded for each of the schedules *names* that has one."""
        ...

    # -- queues ------------------------------------------------------------------------------

    async def pause_queue(self, queue: str) -> bool:
        """Stop claims from *queue* across the fleet; False if it was paused already."""
        ...

    async def resume_queue(self, queue: str) -> bool:
        """Let *queue* be claimed again; False if it was not paused."""
        ...

    async def list_queues(self) -> list[QueueInfo]:
        """Every queue that holds items or is paused, by name."""
        ...

    async def aclose(self) -> None:
        """Release connections and threads. Idempotent."""
        ...
