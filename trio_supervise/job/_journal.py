"""A durable workflow's journal as a store keeps it: what each position of one item incarnation
recorded (:class:`JournalEntry`), the events sent to the item (:class:`ItemEvent`), and both as
read together (:class:`Journal`).

The store only keeps these, fenced by the lease version; what they mean (a step's result, a
sleep's wake time, a wait's payload) is the workflow's (``trio_supervise.durable``).
"""

from __future__ import annotations

import datetime as dt
import enum

import attrs

from .._clock import utc
from ._checks import check_name
from ._json import check_json
from ._model import JSONValue

__all__ = [
    "MAX_JOURNAL_ENTRIES",
    "EntryKind",
    "ItemEvent",
    "Journal",
    "JournalEntry",
    "check_entry",
    "check_event",
]

MAX_JOURNAL_ENTRIES = 10_000
"""Positions one incarnation's journal may hold (0 to this, exclusive)."""


class EntryKind(enum.StrEnum):
    """What a journal position recorded."""

    STEP = "step"
    """A step's result: the step ran to its end and is never run again."""
    SLEEP = "sleep"
    """A durable sleep, with the time it wakes at (``wake_at``)."""
    WAIT = "wait"
    """A wait for an event, with its deadline (``wake_at``, None: none); pending until resolved
    (``finished_at`` set) with the event's payload or a timeout."""
    PATCH = "patch"
    """A version marker (``Workflow.patched``): the code at this position is the patched one."""


@attrs.frozen(kw_only=True)
class JournalEntry:
    """One position of an item incarnation's journal."""

    position: int
    kind: EntryKind = attrs.field(converter=EntryKind)
    name: str
    result: JSONValue = None
    """A step's result, a resolved wait's outcome (the workflow's encoding), else None."""
    attempts: int = 1
    """How many times a step's function ran before its result was recorded."""
    started_at: dt.datetime = attrs.field(converter=utc)
    finished_at: dt.datetime | None = attrs.field(
        default=None, converter=attrs.converters.optional(utc)
    )
    """When it ended; None for a wait not resolved yet (pending)."""
    wake_at: dt.datetime | None = attrs.field(
        default=None, converter=attrs.converters.optional(utc)
    )
    """A sleep's wake time, a wait's deadline (None: a wait without one)."""

    @property
    def pending(self) -> bool:
        """Whether this is a wait that has not been resolved yet."""
        return self.finished_at is None


@attrs.frozen(kw_only=True)
class ItemEvent:
    """One event sent to an item (``send_event``), in the order the store received them."""

    name: str
    payload: JSONValue = None
    sent_at: dt.datetime = attrs.field(converter=utc)


@attrs.frozen(kw_only=True)
class Journal:
    """An item's current incarnation's journal, by position, and the events sent to it, in
    order; one snapshot."""

    entries: tuple[JournalEntry, ...] = ()
    events: tuple[ItemEvent, ...] = ()


_WHAT = {kind: (f"{kind} name", f"{kind} result") for kind in EntryKind}
"""How a check names an entry's name and result, by kind (formatted once: an enum's format
costs more than the checks)."""


def check_entry(entry: JournalEntry) -> JournalEntry:
    """*entry* as a store may write it (its result a checked copy), or ``ValueError`` /
    :class:`ConfigError` naming the field."""
    if not isinstance(entry, JournalEntry):
        raise TypeError(f"entry must be a JournalEntry, got {entry!r}")
    if not (0 <= entry.position < MAX_JOURNAL_ENTRIES):
        raise ValueError(
            f"position must be from 0 to {MAX_JOURNAL_ENTRIES - 1}, got {entry.position!r}"
        )
    name_of, result_of = _WHAT[entry.kind]
    check_name(entry.name, name_of)
    if entry.attempts < 0:
        raise ValueError(f"attempts must be >= 0, got {entry.attempts!r}")
    result = check_json(entry.result, what=result_of)
    return entry if result is entry.result else attrs.evolve(entry, result=result)


def check_event(name: str, payload: JSONValue) -> JSONValue:
    """An event's payload as a store may write it, after its *name* is checked."""
    check_name(name, "event name")
    return check_json(payload, what=f"event {name!r} payload")
