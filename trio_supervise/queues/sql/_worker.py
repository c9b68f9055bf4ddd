"""The worker port of the SQL layer: claims, renewals, settlements, waiting for work.

Everything a runner calls (:class:`WorkerStore`), plus the seed's single-item writes
(:class:`SeedWrites`) and ``settle_and_claim`` (the ``SETTLE_AND_CLAIM`` capability): the
settlement batch is :class:`SettleBatch`; the claim, the renewal and the wait are here, each
dialect supplying its statements (:meth:`SQLWorker._claim_rows`, :meth:`SQLWorker._renew_rows`)
and its wake-ups.
"""

from __future__ import annotations

import datetime as dt
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import trio

from ..._errors import LeaseLost
from ...job import (
    DEFAULT_QUEUE,
    MAX_ERRORS,
    Lease,
    LeaseStatus,
    Settlement,
    WorkItem,
    storable_text,
)
from .. import _sql
from .._ports import SingleWrites
from ._base import Lane, Row
from ._settle import SettleBatch, SettleEntry

__all__ = ["SQLWorker"]

_claim_order: Callable[[WorkItem], tuple[int, dt.datetime, str]] = operator.attrgetter(
    "priority", "due_at", "id"
)
"""A claimed item's place in the claim's order (read in C: a third of a function's cost)."""


class SQLWorker(SettleBatch, SingleWrites):
    """The worker port: what a runner (and ``run_due_pass``) calls."""

    # -- hooks -------------------------------------------------------------------------------

    def _claim_rows(self, conn: Any, params: dict[str, Any]) -> list[WorkItem]:
        """Lease the claimable items (``claim_due``'s parameters), concurrency keys respected.

        SQLite's one statement under its write lock; PostgreSQL overrides it (an unkeyed fast
        path, and a locked keyed path: see its ``claim_keyed`` query)."""
        with self._write(conn):
            return self._claim_in(conn, params)

    def _claim_in(self, conn: Any, params: dict[str, Any]) -> list[WorkItem]:
        """:meth:`_claim_rows` inside the transaction the caller holds."""
        raise NotImplementedError  # pragma: no cover

    def _renew_rows(
        self, conn: Any, leases: Sequence[Lease], lease_us: int, now: Any, lease_now: Any
    ) -> Iterable[Row]:
        """Renew *leases* (a keyed one only while live at *lease_now*); the rows renewed
        (``id, lease_version, lease_owner, cancel_requested``)."""
        raise NotImplementedError  # pragma: no cover

    def _before_wait(self) -> None:
        """Called before every :meth:`wait_for_work` (PostgreSQL starts its listener)."""

    def _change_mark(self, conn: Any) -> Any:
        """What :meth:`_wait_changed` compares to learn of other connections' commits (SQLite:
        ``PRAGMA data_version``); None when only this process's writes wake waiters."""
        return None

    async def _wait_changed(self, generation: int, mark: Any) -> None:
        """Return when this process wrote since *generation* (or, see :meth:`_change_mark`,
        another connection committed since *mark*)."""
        await self._changes.wait_value(_sql.other_than(generation))

    # -- claims and renewals -----------------------------------------------------------------

    async def claim_due(
        self,
        spec_ids: Sequence[str],
        worker_id: str,
        lease: float,
        limit: int,
        *,
        queue: str = DEFAULT_QUEUE,
    ) -> list[WorkItem]:
        params = self._claim_params(spec_ids, worker_id, lease, limit, queue)
        if limit == 0 or not spec_ids:
            await trio.lowlevel.checkpoint()
            return []
        return self._claimed_items(
            await self._run(lambda conn: self._claim_rows(conn, params), lane=Lane.WORKER)
        )

    def _claim_params(
        self, spec_ids: Sequence[str], worker_id: str, lease: float, limit: int, queue: str
    ) -> dict[str, Any]:
        """``claim_due``'s statement parameters, checked."""
        now = self._now()
        return {
            "queue": queue,
            "spec_ids": self._ids(spec_ids),
            "worker_id": worker_id,
            "lease_us": _sql.duration_us("lease", lease, positive=True),
            "limit": _sql.check_limit(limit),
            "now": now,
            "lease_now": self._lease_now(now, 2 * lease),
            "rated": False,  # PostgreSQL's claim: see claim_due
            "key_caps": None,  # with key rate limits, what each key may start: see claim_due
        }

    @staticmethod
    def _claimed_items(items: list[WorkItem]) -> list[WorkItem]:
        """The claimed *items* in claim order."""
        items.sort(key=_claim_order)
        return items

    async def renew(
        self, item_id: str, worker_id: str, lease_version: int, lease: float
    ) -> LeaseStatus:
        status = (await self.renew_many([Lease(item_id, lease_version, worker_id)], lease))[item_id]
        if status is LeaseStatus.LOST:
            raise LeaseLost(item_id, lease_version, "renewal refused")
        return status

    async def renew_many(self, leases: Sequence[Lease], lease: float) -> dict[str, LeaseStatus]:
        lease_us = _sql.duration_us("lease", lease, positive=True)
        if not leases:
            await trio.lowlevel.checkpoint()
            return {}
        now = self._now()
        lease_now = self._lease_now(now, 2 * lease)

        def run(conn: Any) -> dict[tuple[str, int, str], bool]:
            with self._write(conn):
                return {
                    (row["id"], row["lease_version"], row["lease_owner"]): bool(
                        row["cancel_requested"]
                    )
                    for row in self._renew_rows(conn, leases, lease_us, now, lease_now)
                }

        held = await self._run(run, lane=Lane.WORKER)
        statuses = {}
        for each in leases:
            cancel = held.get((each.item_id, each.version, each.worker_id))
            if cancel is None:
                statuses[each.item_id] = LeaseStatus.LOST
            elif cancel:
                statuses[each.item_id] = LeaseStatus.CANCEL_REQUESTED
            else:
                statuses[each.item_id] = LeaseStatus.HELD
        return statuses

    # -- settlements -------------------------------------------------------------------------

    async def mark_error(self, item_id: str, lease_version: int, error: str) -> None:
        params = {
            "id": item_id,
            "version": lease_version,
            "error": storable_text(error),
            "now": self._now(),
            "max_errors": MAX_ERRORS,
        }
        query = self._queries["mark_error"]

        def run(conn: Any) -> None:
            with self._write(conn):
                if conn.execute(query, params).fetchone() is None:
                    raise LeaseLost(item_id, lease_version, self._why(conn, item_id))

        await self._run(run, lane=Lane.WORKER, retry=False)

    async def _settle_one(self, settlement: Settlement) -> None:
        [applied] = await self._settle([settlement], why=True)
        if not applied:  # pragma: no cover - _settle raises LeaseLost for a single write
            raise LeaseLost(settlement.item_id, settlement.lease_version)

    async def settle_many(self, settlements: Sequence[Settlement]) -> list[bool]:
        return await self._settle(settlements, why=False)

    async def settle_and_claim(
        self,
        settlements: Sequence[Settlement],
        spec_ids: Sequence[str],
        worker_id: str,
        lease: float,
        limit: int,
        *,
        queue: str = DEFAULT_QUEUE,
    ) -> tuple[list[bool], list[WorkItem]]:
        """:meth:`settle_many` then :meth:`claim_due`, in one call: one thread hop, one
        transaction (SQLite: one ``BEGIN IMMEDIATE``; PostgreSQL: one pipelined transaction, one
        commit, when the batch has no children).

        When it raises, nothing was claimed, and the settlements are as after a failed
        :meth:`settle_many`. Once the settlements are written, a claim that fails comes back
        empty instead (the next :meth:`claim_due` reports the error).
        """
        params = self._claim_params(spec_ids, worker_id, lease, limit, queue)
        if limit == 0 or not spec_ids:
            return await self.settle_many(settlements), []
        first, sent, entries, children = self._settle_plan(settlements)
        if not sent:
            return [], await self.claim_due(spec_ids, worker_id, lease, limit, queue=queue)
        now = params["now"]
        data_errors = self._data_errors()

        woke: list[bool] = []

        def run(conn: Any) -> tuple[set[int], list[WorkItem]]:
            try:
                return self._settle_and_claim_in(conn, entries, now, children, params, woke)
            except data_errors:
                pass
            # An entry the database refuses: the slow way, then the claim on its own.
            woke.clear()
            applied = self._settle_sync(conn, entries, now, children, why=False, woke=woke)
            return applied, self._claim_after(conn, params)

        applied, rows = await self._run(run, lane=Lane.WORKER)
        results = self._settle_results(settlements, first, sent, applied, woke)
        return results, self._claimed_items(rows)

    def _settle_and_claim_in(
        self,
        conn: Any,
        entries: Sequence[SettleEntry],
        now: Any,
        children: bool,
        params: dict[str, Any],
        woke: list[bool] | None = None,
    ) -> tuple[set[int], list[WorkItem]]:
        """Settle *entries* and claim (``claim_due``'s *params*) in one transaction; the
        indices applied and the items claimed (and in *woke*, whether the rows make anything
        claimable). Raises the driver's data error, having written nothing, when the database
        refuses an entry's value (the caller then writes the batch the slow way). SQLite: one
        ``BEGIN IMMEDIATE``; PostgreSQL overrides it."""
        with self._transaction(conn):
            rows = self._settle_in(conn, entries, now, children, woke)
            claimed = self._claim_in(conn, params)
        return {entries[row["ord"] - 1][0] for row in rows}, claimed

    def _claim_after(self, conn: Any, params: dict[str, Any]) -> list[WorkItem]:
        """A claim after the settlements committed: one that fails claims nothing (see
        :meth:`settle_and_claim`), since raising would report the written settlements as
        failed."""
        try:
            return self._claim_rows(conn, params)
        except Exception:
            return []

    # -- waiting for work --------------------------------------------------------------------

    async def _next_due(
        self, spec_ids: Sequence[str], queues: Sequence[str] | None, *, mark: bool = False
    ) -> tuple[Any, float, Any, float | None]:
        """The next claimable time (stored form), how many seconds away it is, with *mark*
        the :meth:`_change_mark` read just before on the same connection, and, while every
        one of *queues* is held back by its rate limit, the seconds until the first frees
        (else None): no write can make work due before that."""
        now = self._now()
        params = {
            "spec_ids": self._ids(spec_ids),
            "queues": None if queues is None else self._ids(queues),
            "now": now,
            "lease_now": self._lease_now(now),
        }
        query = self._queries["next_due_at"]

        def run(conn: Any) -> tuple[Any, float, Any, float | None]:
            seen = self._change_mark(conn) if mark else None
            row = conn.execute(query, params).fetchone()
            return row["at"], row["wait"], seen, row["held"]

        return await self._run(run, lane=Lane.WAIT)

    async def next_due_at(
        self, spec_ids: Sequence[str], *, queues: Sequence[str] | None = None
    ) -> dt.datetime | None:
        at, _, _, _ = await self._next_due(spec_ids, queues)
        return None if at is None else self._from_time(at)

    async def wait_for_work(
        self, spec_ids: Sequence[str], *, queues: Sequence[str] | None = None
    ) -> None:
        self._before_wait()
        while True:
            generation = self._changes.value
            at, wait, mark, held = await self._next_due(spec_ids, queues, mark=True)
            if at is not None and wait <= 0:
                return
            if held is not None:
                # Throttled: nothing the fleet writes makes work due sooner (only a change of
                # the limit could; the caller's poll interval bounds the wait anyway).
                await trio.sleep(held)
                continue
            with trio.move_on_after(float("inf") if at is None else wait):
                await self._wait_changed(generation, mark)
