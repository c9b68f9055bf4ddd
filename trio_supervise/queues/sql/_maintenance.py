"""The maintenance port of the SQL layer: retention and schedule fires.

``prune`` deletes finished items in short transactions of bounded size; ``fire_schedule``
records a schedule's fire and enqueues its item in one transaction (through the enqueue core),
so a fire is enqueued once across any number of processes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from ..._clock import utc
from ...job import Enqueued, ItemState, NewItem, check_name, check_prune
from .. import _sql
from ._base import Lane
from ._producer import EnqueueCore

__all__ = ["SQLMaintenance"]


class SQLMaintenance(EnqueueCore):
    """The maintenance port: what the pruner and the scheduler call."""

    async def prune(
        self,
        older_than: Mapping[ItemState, float],
        *,
        limit: int | None = None,
        dry_run: bool = False,
    ) -> dict[ItemState, int]:
        ages = check_prune(older_than, limit)
        query = self._queries["prune_count" if dry_run else "prune"]
        counts: dict[ItemState, int] = {}
        for state, age in ages.items():
            params = {
                "state": str(state),
                "age_us": _sql.duration_us(f"older_than[{state}]", age),
                "now": self._now(),
                "limit": self._no_limit if limit is None else limit,
            }

            def count(conn: Any, params: dict[str, Any] = params) -> int:
                return int(conn.execute(query, params).fetchone()["n"])

            def delete(conn: Any, params: dict[str, Any] = params) -> int:
                with self._write(conn):  # one short transaction per state and batch
                    return int(conn.execute(query, params).rowcount)

            counts[state] = await (
                self._run(count, lane=Lane.READ) if dry_run else self._run(delete, lane=Lane.CALLER)
            )
        if not dry_run and any(counts.values()):
            self._changed()
        return counts

    async def fire_schedule(self, name: str, fire: dt.datetime, entry: NewItem) -> Enqueued | None:
        batch = self._prepare([entry])
        params = {
            "name": check_name(name, "schedule name"),
            "fire": self._time(utc(fire)),
            "now": self._now(),
        }
        queries = self._queries

        def run(conn: Any) -> Enqueued | None:
            with self._transaction(conn):
                recorded = conn.execute(queries["record_fire"], params).fetchone()
                if recorded is None:
                    return None
                done, _ = self._write_batch(conn, batch, notify=True, check_ids=True)
                return done[0]

        # Not retried on a dead connection: the commit may have landed (see _run).
        enqueued = await self._run(run, lane=Lane.CALLER, retry=False)
        if enqueued is not None and enqueued.created:
            self._changed()
        return enqueued

    async def last_fires(self, names: Sequence[str]) -> dict[str, dt.datetime]:
        params = {"names": self._ids(list(names))}
        query = self._queries["last_fires"]
        rows = await self._run(lambda conn: conn.execute(query, params).fetchall(), lane=Lane.READ)
        return {row["name"]: self._from_time(row["last_fire_at"]) for row in rows}
