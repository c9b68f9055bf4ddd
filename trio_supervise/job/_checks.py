"""The checks every backend makes, the same way: a bad value is refused before anything is
written, with an error naming the field and the rule (``ValueError``, or ``ConfigError`` for a
value no backend can store).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from .._clock import utc
from ._fields import field_names
from ._json import check_json, unstorable
from ._model import (
    DEFAULT_QUEUE,
    ITEM_FIELDS,
    ItemState,
    JSONValue,
    NewItem,
    WorkItem,
    build_item,
)
from ._traceparent import check_traceparent, current_traceparent

__all__ = [
    "DEFAULT_CONCURRENCY_LIMIT",
    "MAX_CHILDREN",
    "MAX_CONCURRENCY_LIMIT",
    "MAX_DELAY",
    "MAX_ID_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_PRIORITY",
    "MAX_TIMEOUT",
    "MIN_PRIORITY",
    "SCOPE_FOREVER",
    "SCOPE_PERIOD",
    "SCOPE_UNFINISHED",
    "WAITING_DUE_AT",
    "check_child",
    "check_concurrency",
    "check_config",
    "check_entries",
    "check_identifier",
    "check_name",
    "check_new_item",
    "check_priority",
    "check_prune",
    "check_queue_name",
    "check_timeout",
    "check_unique",
    "created_item",
    "new_item_ids",
    "plan_batch",
    "repeated_id",
    "shown_value",
    "validate_spec_id",
]

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
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_LENGTH:
        raise ValueError(
            f"{what} must be a non-empty string of at most {MAX_NAME_LENGTH} characters, "
            f"got {shown_value(value)}"
        )
    problem = unstorable(value)
    if problem is not None:
        from .._errors import ConfigError  # imported when needed: a call costs less without

        raise ConfigError(f"{what} must not contain {problem}")
    return value


MAX_TAGS = 16
"""The most tags an item carries."""


def check_tags(tags: object) -> tuple[str, ...]:
    """*tags* as the tuple to store: each a name (:func:`check_name`), a repeated one kept once
    (first place), at most :data:`MAX_TAGS`. A bare string is refused, not split into
    letters."""
    if type(tags) is tuple and not tags:
        return tags
    if isinstance(tags, str | bytes) or not isinstance(tags, Sequence):
        raise ValueError(f"tags must be a list of strings, got {shown_value(tags)}")
    unique = tuple(dict.fromkeys(check_name(tag, "each tag") for tag in tags))
    if len(unique) > MAX_TAGS:
        raise ValueError(f"tags must be at most {MAX_TAGS} distinct strings, got {len(unique)}")
    return unique


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
        problem = unstorable(text)
        if problem is not None:
            raise ConfigError(f"{name} must not contain {problem}")
    if config is None:
        return {}
    if attrs.has(type(config)):
        # What a driver's config_type accepts, enqueue accepts: the shared converter's JSON.
        from .._convert import unstructure

        config = unstructure(config)
    return check_json(config)


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


_SPECIAL = frozenset({"config", "due_at", "unique", "evaluation_timeout", "item_id"})
"""NewItem's fields that are not stored as they are: each becomes the item's own below."""


def _created_item_function() -> Callable[[NewItem, str, dt.datetime], WorkItem]:
    """``created_item``, generated: NewItem's fields that WorkItem also has are copied by name
    (a field added to both is copied with no change here), the others as written below."""
    shared = [name for name in field_names(NewItem) if name in ITEM_FIELDS and name not in _SPECIAL]
    lines = [
        "def created_item(entry, item_id, created_at):",
        "    scope, seconds = _check_unique(entry.unique, entry.idempotency_key)",
        "    timeout = entry.evaluation_timeout",
        "    config = entry.config",
        "    due_at = entry.due_at",
        "    return _build(",
        "        id=item_id,",
        "        config={} if config is None else config,",
        "        due_at=created_at if due_at is None else due_at,",
        "        created_at=created_at,",
        "        updated_at=created_at,",
        "        timeout=None if timeout is None else float(timeout),",
        "        unique_scope=scope,",
        "        unique_until=None if seconds is None else created_at + _seconds(seconds),",
        *(f"        {name}=entry.{name}," for name in shared),
        "    )",
    ]
    namespace: dict[str, Any] = {
        "_check_unique": check_unique,
        "_build": build_item,
        "_seconds": lambda seconds: dt.timedelta(seconds=seconds),
    }
    exec("\n".join(lines), namespace)
    function: Callable[[NewItem, str, dt.datetime], WorkItem] = namespace["created_item"]
    return function


created_item = _created_item_function()
"""``created_item(entry, item_id, created_at)``: the item a checked *entry*
(:func:`check_entries`) becomes, written at *created_at* (UTC) with *item_id*: what every
backend stores, built without reading it back."""


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
    current = current_traceparent()
    """The trace context an entry without one carries: the span current here, if any."""
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
            and entry.tags == ()
            and entry.traceparent is current
            and entry.start_by is None
            and entry.debounce is False
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
            tags = check_tags(entry.tags)
            traceparent = check_traceparent(entry.traceparent) or current
            if entry.debounce is not False:
                if entry.debounce is not True:
                    raise ValueError(f"debounce must be True or False, got {entry.debounce!r}")
                if entry.idempotency_key is None:
                    raise ValueError(
                        "debounce needs an idempotency_key: the key names the pending item "
                        "the newest enqueue replaces"
                    )
            due_at = _aware(entry.due_at, "due_at")
            start_by = _aware(entry.start_by, "start_by")
            if start_by is not None and due_at is not None and start_by < due_at:
                raise ValueError(
                    f"start_by must not be before due_at (it could never start), got start_by "
                    f"{start_by.isoformat()} before due_at {due_at.isoformat()}"
                )
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
            or tags is not entry.tags
            or traceparent is not entry.traceparent
            or start_by is not entry.start_by
        ):
            entry = attrs.evolve(
                entry,
                config=config,
                due_at=due_at,
                concurrency_key=key,
                concurrency_limit=limit,
                tags=tags,
                traceparent=traceparent,
                start_by=start_by,
            )
        checked.append(entry)
    return checked


def _aware(value: object, what: str) -> dt.datetime | None:
    """*value* (a due time, a start deadline) as a UTC datetime; None stays None."""
    if value is None:
        return None
    if not isinstance(value, dt.datetime):
        raise ValueError(f"{what} must be a datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, got naive {value.isoformat()}")
    return utc(value)


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
