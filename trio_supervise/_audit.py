"""The console's audit trail: who did what, to which item, queue or schedule, when, and how it went.

Every action taken from the operations console (a retry, a cancel, a pause, a schedule fired by
hand) is recorded as one :class:`AuditEntry` in an :class:`AuditTrail` and shown on the status
page. The trail is a port: a store that declares ``Capability.AUDIT_TRAIL`` keeps one with its
items (``store.audit``: in the database on SQLite and PostgreSQL, so it survives a restart, and
pruned by retention), which a service uses; :class:`MemoryAuditTrail` keeps the latest entries
in the process, for a store without one.
"""

from __future__ import annotations

import collections
import datetime as dt
from collections.abc import Iterable
from typing import Protocol

import attrs
import trio

from ._clock import utc

__all__ = [
    "AuditEntry",
    "AuditTrail",
    "MemoryAuditTrail",
    "check_audit_limit",
    "check_audit_prune",
    "newest_first",
]

MAX_AUDIT_AGE = 10 * 365 * 86_400.0
"""The longest ``older_than`` a prune of the trail takes (ten years, in seconds)."""


def _text(value: object) -> str:
    """*value* as text any store keeps: a NUL or a lone surrogate (a client's hostile user
    name, say) shown as its escape, so that recording an entry never fails on what it says."""
    text = str(value)
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def check_audit_limit(limit: object) -> int:
    """``recent``'s *limit*, checked the same way by every trail."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be an integer >= 0, got {limit!r}")
    return limit


def check_audit_prune(older_than: object, limit: object) -> float:
    """``prune_audit``'s arguments, checked the same way by every store; the age in seconds."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be None or an integer >= 1, got {limit!r}")
    if (
        isinstance(older_than, bool)
        or not isinstance(older_than, int | float)
        or not (0 <= older_than <= MAX_AUDIT_AGE)
    ):
        raise ValueError(
            f"older_than must be a number of seconds from 0 to {MAX_AUDIT_AGE:g}, "
            f"got {older_than!r}"
        )
    return float(older_than)


@attrs.frozen(kw_only=True)
class AuditEntry:
    """One action taken from the console, refused or done."""

    at: dt.datetime = attrs.field(converter=utc)
    """When (the queue's clock)."""
    who: str = attrs.field(converter=_text)
    """Who: the HTTP Basic user name given, ``"token"`` for a bearer token, or ``"local"`` when
    the console asks for no credentials (loopback)."""
    address: str = attrs.field(converter=_text)
    """The client's address, as the HTTP server saw it."""
    action: str = attrs.field(converter=_text)
    """``retry``, ``cancel``, ``delete``, ``run-now``, ``pause``, ``resume``, ``fire`` or
    ``bulk-retry``."""
    target: str = attrs.field(converter=_text)
    """What it was done to: ``item:<id>``, ``queue:<name>``, ``schedule:<name>``, or
    ``items:<count>`` for a bulk retry."""
    ok: bool
    """Whether it was done (False: refused, with the reason in *result*)."""
    result: str = attrs.field(converter=_text)
    """What the console said about it (the message the operator saw)."""


class AuditTrail(Protocol):
    """Where console actions are recorded (see the module doc)."""

    async def record(self, entry: AuditEntry) -> None:
        """Keep *entry*."""
        ...

    async def recent(self, limit: int = 50) -> list[AuditEntry]:
        """The latest *limit* entries, newest first."""
        ...


def _max_entries(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_entries must be an integer >= 1, got {value!r}")


@attrs.define(eq=False)
class MemoryAuditTrail:
    """The latest *max_entries* entries, in this process only (gone at a restart)."""

    max_entries: int = attrs.field(default=1000, validator=_max_entries)
    _entries: collections.deque[AuditEntry] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._entries = collections.deque(maxlen=self.max_entries)

    @property
    def entries(self) -> list[AuditEntry]:
        """Every entry kept, oldest first."""
        return list(self._entries)

    async def record(self, entry: AuditEntry) -> None:
        await trio.lowlevel.checkpoint()
        self._entries.append(entry)

    async def recent(self, limit: int = 50) -> list[AuditEntry]:
        await trio.lowlevel.checkpoint()
        check_audit_limit(limit)
        return newest_first(self._entries, limit)


def newest_first(entries: Iterable[AuditEntry], limit: int) -> list[AuditEntry]:
    """The latest *limit* of *entries* (given in the order recorded), newest first by ``at``,
    the later recorded first among equal times (as the SQL stores order them)."""
    ordered = sorted(enumerate(entries), key=lambda pair: (pair[1].at, pair[0]), reverse=True)
    return [entry for _, entry in ordered[:limit]]
