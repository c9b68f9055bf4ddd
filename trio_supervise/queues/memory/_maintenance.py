"""The memory queue's maintenance side (:class:`MaintenanceSide`): retention (``prune``) and
schedule fires (a fire recorded and its item enqueued in one step).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import trio

from ..._clock import utc
from ...job import (
    Enqueued,
    ItemState,
    NewItem,
    WorkItem,
    check_entries,
    check_name,
    check_prune,
)
from ._state import MemoryState

__all__ = ["MaintenanceSide"]


class MaintenanceSide(MemoryState):
    """What upkeep uses (:class:`MaintenanceStore`): retention and schedule fires."""

    __slots__ = ()

    if TYPE_CHECKING:  # the producer side's, called here

        def _enqueue_many(self, entries: Sequence[NewItem]) -> list[Enqueued]: ...

    async def prune(
        self,
        older_than: Mapping[ItemState, float],
        *,
        limit: int | None = None,
        dry_run: bool = False,
    ) -> dict[ItemState, int]:
        await trio.lowlevel.checkpoint()
        ages = check_prune(older_than, limit)
        now = self._now()
        found: dict[ItemState, list[WorkItem]] = {state: [] for state in ages}
        cutoffs = {state: now - dt.timedelta(seconds=age) for state, age in ages.items()}
        for item in self._items.values():
            cutoff = cutoffs.get(item.state)
            if cutoff is not None and item.updated_at <= cutoff:
                found[item.state].append(item)
        counts: dict[ItemState, int] = {}
        for state, items in found.items():
            items.sort(key=lambda item: (item.updated_at, item.id))
            chosen = items if limit is None else items[:limit]
            counts[state] = len(chosen)
            if not dry_run:
                for item in chosen:
                    self._remove(item)
        if not dry_run and any(counts.values()):
            self._log("prune", "", counts={str(k): v for k, v in counts.items()})
            self._changed()
        return counts

    async def fire_schedule(self, name: str, fire: dt.datetime, entry: NewItem) -> Enqueued | None:
        await trio.lowlevel.checkpoint()
        check_name(name, "schedule name")
        fire = utc(fire)
        check_entries([entry])  # refused before anything is recorded
        last = self._last_fires.get(name)
        if last is not None and fire <= last:
            return None
        [done] = self._enqueue_many([entry])  # no checkpoint in between: one step
        self._last_fires[name] = fire
        return done

    async def last_fires(self, names: Sequence[str]) -> dict[str, dt.datetime]:
        await trio.lowlevel.checkpoint()
        return {name: self._last_fires[name] for name in names if name in self._last_fires}
