"""The console's audit trail: who did what, to which item, queue or schedule, when, and how it went.

Every action taken from the operations console (a retry, a cancel, a pause, a schedule fired by
hand) is recorded as one :class:`AuditEntry` in an :class:`AuditTrail` and shown on the status
page. The trail is a port: :class:`MemoryAuditTrail` keeps the latest entries in the process
(what a service uses until the store has a durable one); a durable implementation writes them to
the database behind the same two methods.
"""

from __future__ import annotations

import collections
import datetime as dt
from typing import Protocol

import attrs
import trio

from ._clock import utc

__all__ = ["AuditEntry", "AuditTrail", "MemoryAuditTrail"]


@attrs.frozen(kw_only=True)
class AuditEntry:
    """One action taken from the console, refused or done."""

    at: dt.datetime = attrs.field(converter=utc)
    """When (the queue's clock)."""
    who: str
    """Who: the HTTP Basic user name given, ``"token"`` for a bearer token, or ``"local"`` when
    the console asks for no credentials (loopback)."""
    address: str
    """The client's address, as the HTTP server saw it."""
    action: str
    """``retry``, ``cancel``, ``delete``, ``run-now``, ``pause``, ``resume``, ``fire`` or
    ``bulk-retry``."""
    target: str
    """What it was done to: ``item:<id>``, ``queue:<name>``, ``schedule:<name>``, or
    ``items:<count>`` for a bulk retry."""
    ok: bool
    """Whether it was done (False: refused, with the reason in *result*)."""
    result: str
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
        count: object = limit  # checked as whatever it was given
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"limit must be an integer >= 0, got {limit!r}")
        newest = list(reversed(self._entries))
        return newest[:limit]
