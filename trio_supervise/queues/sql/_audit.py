"""The console's audit trail on the SQL layer: entries written to ``trio_supervise_audit`` (so
they outlive the process) and read back newest first; pruned by retention like finished items.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..._audit import AuditEntry, check_audit_limit, check_audit_prune
from .. import _sql
from ._base import Lane, SQLBase

__all__ = ["SQLAudit", "SQLAuditTrail"]


@attrs.frozen(eq=False)
class SQLAuditTrail:
    """The :class:`~trio_supervise.AuditTrail` of a SQL store (its ``audit``)."""

    _store: SQLAudit

    async def record(self, entry: AuditEntry) -> None:
        await self._store._record_audit(entry)

    async def recent(self, limit: int = 50) -> list[AuditEntry]:
        return await self._store._recent_audit(limit)


class SQLAudit(SQLBase):
    """What :class:`~trio_supervise.queues.AuditStore` asks: the trail and its retention."""

    @property
    def audit(self) -> SQLAuditTrail:
        """The console's audit trail, kept in the database."""
        return SQLAuditTrail(self)

    async def _record_audit(self, entry: AuditEntry) -> None:
        if not isinstance(entry, AuditEntry):
            raise TypeError(f"entry must be an AuditEntry, got {type(entry).__name__}")
        params = {
            "at": self._time(entry.at),
            "who": entry.who,
            "address": entry.address,
            "action": entry.action,
            "target": entry.target,
            "ok": entry.ok,
            "result": entry.result,
        }
        query = self._queries["record_audit"]

        def run(conn: Any) -> None:
            with self._write(conn):
                conn.execute(query, params)

        # Not retried on a dead connection: the commit may have landed (see _run).
        await self._run(run, lane=Lane.CALLER, retry=False)

    async def _recent_audit(self, limit: int) -> list[AuditEntry]:
        params = {"limit": check_audit_limit(limit)}
        query = self._queries["recent_audit"]
        rows = await self._run(lambda conn: conn.execute(query, params).fetchall(), lane=Lane.READ)
        return [
            AuditEntry(
                at=self._from_time(row["at"]),
                who=row["who"],
                address=row["address"],
                action=row["action"],
                target=row["target"],
                ok=bool(row["ok"]),
                result=row["result"],
            )
            for row in rows
        ]

    async def prune_audit(
        self, older_than: float, *, limit: int | None = None, dry_run: bool = False
    ) -> int:
        age = check_audit_prune(older_than, limit)
        params = {
            "age_us": _sql.duration_us("older_than", age),
            "now": self._now(),
            "limit": self._no_limit if limit is None else limit,
        }
        if dry_run:
            query = self._queries["prune_audit_count"]
            return await self._run(
                lambda conn: int(conn.execute(query, params).fetchone()["n"]), lane=Lane.READ
            )
        query = self._queries["prune_audit"]

        def delete(conn: Any) -> int:
            with self._write(conn):
                return int(conn.execute(query, params).rowcount)

        return await self._run(delete, lane=Lane.CALLER)
