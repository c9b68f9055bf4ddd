"""The memory queue's audit trail (:class:`AuditSide`): the console's entries kept beside the
items, for as long as the queue lives, and pruned by age as the SQL stores prune theirs."""

from __future__ import annotations

import datetime as dt

import attrs
import trio

from ..._audit import AuditEntry, check_audit_limit, check_audit_prune, newest_first
from ._state import MemoryState

__all__ = ["AuditSide", "MemoryStoreTrail"]


@attrs.frozen(eq=False)
class MemoryStoreTrail:
    """The :class:`~trio_supervise.AuditTrail` of a :class:`MemoryQueue` (its ``audit``)."""

    _entries: list[AuditEntry]

    async def record(self, entry: AuditEntry) -> None:
        await trio.lowlevel.checkpoint()
        if not isinstance(entry, AuditEntry):
            raise TypeError(f"entry must be an AuditEntry, got {type(entry).__name__}")
        self._entries.append(entry)

    async def recent(self, limit: int = 50) -> list[AuditEntry]:
        await trio.lowlevel.checkpoint()
        return newest_first(self._entries, check_audit_limit(limit))


class AuditSide(MemoryState):
    """What :class:`~trio_supervise.queues.AuditStore` asks: the trail and its retention."""

    __slots__ = ()

    @property
    def audit(self) -> MemoryStoreTrail:
        """The console's audit trail, kept with the items (gone with the queue)."""
        return MemoryStoreTrail(self._audit)

    async def prune_audit(
        self, older_than: float, *, limit: int | None = None, dry_run: bool = False
    ) -> int:
        await trio.lowlevel.checkpoint()
        cutoff = self._now() - dt.timedelta(seconds=check_audit_prune(older_than, limit))
        old = sorted((entry.at, n) for n, entry in enumerate(self._audit) if entry.at <= cutoff)
        doomed = {n for _, n in (old if limit is None else old[:limit])}
        if not dry_run and doomed:
            self._audit[:] = [e for n, e in enumerate(self._audit) if n not in doomed]
        return len(doomed)
