"""The settlement batch of the worker port: fenced outcomes, their children and fan-in.

:meth:`SettleBatch._settle` converts a batch of :class:`Settlement`\\ s once (an entry whose
values cannot be stored becomes :func:`unstorable_outcome`), sends each (id, version) once,
writes them in one transaction with the children the applied ones carry (through the enqueue
core) and the fan-in of the finished children, and wakes other processes. A batch the database
refuses for one entry's value is written entry by entry, so that entry alone becomes dead.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar

import trio

from ..._errors import LeaseLost
from ...job import (
    WAITING_DUE_AT,
    ItemState,
    NewItem,
    SettleKind,
    Settlement,
    check_child,
    check_json,
    unstorable_outcome,
)
from .. import _sql
from ._base import Lane, Row
from ._producer import EnqueueCore

__all__ = ["PLAIN_VALUES", "SettleBatch", "SettleEntry", "woken_by"]


def woken_by(rows: Iterable[Row]) -> list[str]:
    """The spec ids a settlement's *rows* make worth a look elsewhere: an item due again now, or
    a concurrency key's slot freed (its blocked items may be due). Other processes' waiters hear
    of them (NOTIFY) instead of at their next poll."""
    return [
        row["spec_id"]
        for row in rows
        if (row["state"] == "queued" and row["due_now"]) or row["concurrency_key"] is not None
    ]


_FINISHED_STATES = frozenset(str(state) for state in ItemState if state.finished)
"""The stored text of the states an item never leaves on its own (a child's fan-in)."""

SettleEntry = tuple[int, Settlement, Mapping[str, Any]]
"""One settlement on its way to the database: its position, itself, its converted values."""
PLAIN_VALUES: Mapping[str, Any] = MappingProxyType(
    {"delay_us": 0, "at": None, "config": None, "result": None, "children": ()}
)
"""The converted values of most settlements (a completion without a result, a release or a
cancellation without a delay): one shared, read-only mapping instead of a dict per entry."""
_RESCHEDULE = SettleKind.RESCHEDULE
_COMPLETE = SettleKind.COMPLETE
_PAIR = operator.attrgetter("item_id", "lease_version")
_SETTLEMENT = operator.itemgetter(1)
_CHILDREN = operator.attrgetter("children")
_WAITS = operator.attrgetter("wait_for_children")
_FINISHING = frozenset({SettleKind.COMPLETE, SettleKind.CANCEL, SettleKind.DEAD})


def _rows_wake(row: Row) -> bool:
    """Whether a settled *row* makes anything claimable, now or later: it is queued again (due
    now or later, or waiting for children), it held a concurrency key's slot, or it is a child
    (its parent's fan-in)."""
    return (
        row["state"] == "queued"
        or row["concurrency_key"] is not None
        or (row["parent_id"] is not None)
    )


def _only_finishes(s: Settlement) -> bool:
    """Whether *s* only finishes its item: nothing becomes due by it, but a concurrency key's
    slot or a parent's fan-in, which the settlement's statement notifies."""
    return s.kind in _FINISHING and not s.children and not s.wait_for_children


class SettleBatch(EnqueueCore):
    """Settlements written in batches, with their children and fan-in."""

    _notifies_wakeups: ClassVar[bool] = False
    """Whether every settlement that makes an item claimable (due now, a concurrency key's
    slot freed, a parent's fan-in) tells this process's waiters through the database too
    (PostgreSQL's NOTIFY, which its own listener hears): then a batch that only finished items
    (completed, cancelled, dead, without children) wakes nobody here. SQLite has no such
    channel: every applied batch wakes this process's waiters to look again."""

    # -- hooks -------------------------------------------------------------------------------

    def _data_errors(self) -> tuple[type[Exception], ...]:
        """What one unstorable value raises: the entry is at fault, not the database."""
        raise NotImplementedError  # pragma: no cover

    def _settle_rows(self, conn: Any, entries: Sequence[SettleEntry], now: Any) -> list[Row]:
        """Apply *entries* fenced; the rows settled (``ord`` (1-based), ``spec_id``, ``state``,
        ``due_now``)."""
        raise NotImplementedError  # pragma: no cover

    def _set_parents(self, conn: Any, children: Sequence[dict[str, Any]]) -> None:
        """Record each created child's ``parent_id`` and ``parent_version`` (``id``,
        ``parent_id``, ``parent_version`` per child)."""
        raise NotImplementedError  # pragma: no cover

    # -- the batch ---------------------------------------------------------------------------

    def _why(self, conn: Any, item_id: str) -> str:
        row = conn.execute(self._queries["get"], {"id": item_id}).fetchone()
        if row is None:
            return "no such item"
        return f"item is {row['state']} at version {row['lease_version']}"

    def _entry(self, index: int, s: Settlement) -> SettleEntry:
        """*s* with its values converted for the database; an unstorable one becomes dead."""
        if (
            s.delay == 0
            and s.at is None
            and not s.children
            and s.kind is not _RESCHEDULE
            and (s.result is None or s.kind is not _COMPLETE)
        ):
            return index, s, PLAIN_VALUES  # nothing to convert, nothing that can be refused
        try:
            values = {
                # No delay is the common one (a completion): 0 without the checks' arithmetic.
                "delay_us": 0 if s.delay == 0 else _sql.duration_us("delay", s.delay),
                "at": None if s.at is None else self._time(s.at),
                # A runner's own settlement carries check_json's copies already (``_checked``,
                # see job/_outcomes.py, _plain_settlement): dumped without checking them again.
                "config": (
                    json.dumps(s.config if s._checked else check_json(s.config))
                    if s.kind is SettleKind.RESCHEDULE
                    else None
                ),
                "result": (
                    json.dumps(s.result if s._checked else check_json(s.result, what="result"))
                    if s.kind is SettleKind.COMPLETE and s.result is not None
                    else None
                ),
                "children": [
                    check_child(child, what=f"children[{index}]")
                    for index, child in enumerate(s.children)
                ]
                if s.children
                else [],
            }
        except (ValueError, OverflowError) as error:
            return self._entry(index, unstorable_outcome(s, error))
        return index, s, values

    def _write_children(
        self, conn: Any, s: Settlement, children: Sequence[NewItem]
    ) -> tuple[int, list[str]]:
        """Enqueue the checked *children* of the applied settlement *s* through
        :meth:`_enqueue_rows` (in the settlement's transaction) and record their parent; how
        many were created, and the spec ids due now.

        A child repeating an earlier child's id, or whose id exists already, is left out first,
        so the enqueue core never refuses the settlement for it; one whose key is held is not
        created by the core itself. None of these is this parent's child, nor waited for.
        """
        wanted: dict[str, NewItem] = {}
        for child in children:
            assert child.item_id is not None  # Settlement names every child
            wanted.setdefault(child.item_id, child)
        taken = {
            row["id"]
            for row in conn.execute(
                self._queries["existing_ids"], {"ids": self._ids(list(wanted))}
            ).fetchall()
        }
        fresh = [child for item_id, child in wanted.items() if item_id not in taken]
        if not fresh:
            return 0, []
        done, due = self._enqueue_rows(conn, fresh)
        version = s.lease_version if s.wait_for_children else None
        made = [
            {"id": each.item.id, "parent_id": s.item_id, "parent_version": version}
            for each in done
            if each.created
        ]
        if made:
            self._set_parents(conn, made)
        return len(made), due

    def _children_and_fan_in(
        self, conn: Any, entries: Sequence[SettleEntry], rows: Sequence[Row], now: Any
    ) -> list[str]:
        """After *rows* settled: write the applied entries' children and waits, and count the
        finished children toward their parents; the spec ids that became due."""
        due: list[str] = []
        # Entry by entry, in batch order, as the memory queue writes them (so an id or key two
        # entries' children share goes to the first that creates it).
        for ord_ in sorted(row["ord"] for row in rows):
            _, s, values = entries[ord_ - 1]
            created = 0
            if values["children"]:
                created, created_due = self._write_children(conn, s, values["children"])
                due.extend(created_due)
            if s.wait_for_children:
                params = {
                    "id": s.item_id,
                    "version": s.lease_version,
                    "n": created,
                    "waiting": self._time(WAITING_DUE_AT),
                    "now": now,
                }
                waited = conn.execute(self._queries["wait_for_children"], params).fetchone()
                if waited is not None and waited["due_now"]:
                    due.append(waited["spec_id"])
        finished = [
            entries[row["ord"] - 1][1].item_id
            for row in rows
            if row["parent_id"] is not None and row["state"] in _FINISHED_STATES
        ]
        if finished:
            due.extend(self._fan_in(conn, finished, now))
        return due

    def _settle_plan(
        self, settlements: Sequence[Settlement]
    ) -> tuple[dict[tuple[str, int], int] | None, list[Settlement], list[SettleEntry], bool]:
        """The settlements to send (each (id, version) once), as entries: (the index of each
        pair's first settlement, or None when no pair repeats and every settlement is sent;
        the sent settlements; their entries; whether any entry has children or waits for
        them)."""
        # One statement cannot update a row twice, and a second write with the same
        # (id, version) would be stale after the first anyway: send each pair once. No pair
        # repeats in a runner's batches: one set of the pairs (a C loop) tells.
        first: dict[tuple[str, int], int] | None = None
        if len(set(map(_PAIR, settlements))) == len(settlements):
            sent = list(settlements)
        else:
            first = {}
            for index, s in enumerate(settlements):
                first.setdefault((s.item_id, s.lease_version), index)
            sent = [settlements[index] for index in sorted(first.values())]
        entry = self._entry
        entries = [entry(index, s) for index, s in enumerate(sent)]
        # An entry's children are converted from its settlement's (the same number).
        written = list(map(_SETTLEMENT, entries))
        children = any(map(_CHILDREN, written)) or any(map(_WAITS, written))
        return first, sent, entries, children

    def _settle_in(
        self,
        conn: Any,
        entries: Sequence[SettleEntry],
        now: Any,
        children: bool,
        woke: list[bool] | None = None,
    ) -> list[Row]:
        """Apply *entries* in the transaction the caller holds: the fenced update, children,
        fan-in and the wake-ups; the rows settled. Appends to *woke* whether they make anything
        claimable now or later (:func:`_rows_wake`)."""
        rows = self._settle_rows(conn, entries, now)
        if woke is not None:
            woke.append(children or any(map(_rows_wake, rows)))
        due = woken_by(rows)
        if rows and (children or any(row["parent_id"] is not None for row in rows)):
            due.extend(self._children_and_fan_in(conn, entries, rows, now))
        self._notify(conn, due)
        return rows

    def _settle_sync(
        self,
        conn: Any,
        entries: Sequence[SettleEntry],
        now: Any,
        children: bool,
        *,
        why: bool,
        woke: list[bool] | None = None,
    ) -> set[int]:
        """Write *entries*, a transaction per try; the indices of the applied ones (and, in
        *woke*, whether each try's rows make anything claimable). A batch the database refuses
        for one entry's value is written entry by entry, so that entry alone becomes dead
        (:func:`unstorable_outcome`)."""
        data_errors = self._data_errors()

        def write(entries: Sequence[SettleEntry]) -> list[Row]:
            with self._transaction(conn):
                rows = self._settle_in(conn, entries, now, children, woke)
                if why and not rows:
                    s = entries[0][1]
                    raise LeaseLost(s.item_id, s.lease_version, self._why(conn, s.item_id))
            return rows

        try:
            return {entries[row["ord"] - 1][0] for row in write(entries)}
        except data_errors:
            if why:
                raise
        # One entry holds a value the database refuses: write them one by one, so it alone
        # becomes dead (unstorable_outcome) and its batch-mates are settled as asked.
        applied = set()
        for index, s, values in entries:
            try:
                rows = write([(index, s, values)])
            except data_errors as error:
                rows = write([self._entry(index, unstorable_outcome(s, error))])
            if rows:
                applied.add(index)
        return applied

    def _settle_results(
        self,
        settlements: Sequence[Settlement],
        first: Mapping[tuple[str, int], int] | None,
        sent: Sequence[Settlement],
        applied: set[int],
        woke: Sequence[bool] = (),
    ) -> list[bool]:
        """Per settlement, whether it was applied (a repeated (id, version) never is). This
        process's waiters are woken when the applied ones may make anything claimable: as
        *woke* says when the rows were read, else by the settlements' kinds."""
        if first is None:  # every settlement was sent, at its own index
            results = list(map(applied.__contains__, range(len(settlements))))
        else:
            applied_ids = {(sent[i].item_id, sent[i].lease_version) for i in applied}
            results = [
                (s.item_id, s.lease_version) in applied_ids
                and first[(s.item_id, s.lease_version)] == i
                for i, s in enumerate(settlements)
            ]
        if woke:
            wakes = any(woke)
        else:
            wakes = not self._notifies_wakeups or not all(map(_only_finishes, sent))
        if any(results) and wakes:
            # Something may be due sooner than a waiter thinks (a reschedule to a later time
            # is not notified: only what is due now is). Waking a waiter costs it a look at
            # what is due (a query): a runner serving a second queue made one per batch of the
            # first queue's completions (P13s, P13p, issue 34).
            self._changed()
        return results

    async def _settle(self, settlements: Sequence[Settlement], *, why: bool) -> list[bool]:
        first, sent, entries, children = self._settle_plan(settlements)
        if not sent:
            await trio.lowlevel.checkpoint()
            return []
        now = self._now()
        woke: list[bool] = []
        applied = await self._run(
            lambda conn: self._settle_sync(conn, entries, now, children, why=why, woke=woke),
            lane=Lane.WORKER,
        )
        return self._settle_results(settlements, first, sent, applied, woke)
