"""The base of the SQL layer: the dialect's hooks that every port uses, and reading rows.

:class:`SQLBase` declares what each dialect (:class:`SQLiteQueue`, :class:`PostgresQueue`)
supplies: how a blocking call reaches a connection of its :class:`Lane` (:meth:`SQLBase._run`),
transactions and snapshots, "now" and how values travel, the cursor's columns. The ports
(``_producer.py``, ``_worker.py``, ``_operator.py``, ``_maintenance.py``) are mixins over it;
each declares the further hooks only it needs. Rows become items through the decoders
``_rows.py`` generates.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, ClassVar, Self, TypeVar

from ..._clock import Clock, StepGuard
from ...job import WorkItem
from .. import _sql
from .._ports import Capability, declared
from ._rows import Codec, item_decoder

__all__ = ["Lane", "Row", "SQLBase"]

T = TypeVar("T")
Row = Any
"""A row as the driver returns it (a tuple, a ``sqlite3.Row``, a psycopg dict)."""


class Lane(enum.Enum):
    """Who a blocking call is for: each dialect maps lanes to its connections, so that a port's
    calls never wait for capacity another port holds (see ``docs/queues.md``, "Lanes")."""

    WORKER = "worker"
    """The worker port's claims, renewals and settlements: capacity nothing else takes."""
    WAIT = "wait"
    """The worker port's look at what is due next (SQLite: the reader)."""
    CALLER = "caller"
    """Enqueues, an operator's actions, upkeep: waits bounded (PostgreSQL)."""
    READ = "read"
    """Status reads: connections of their own, waits bounded (PostgreSQL)."""


class SQLBase:
    """What every port of the SQL layer reads and calls; each dialect defines the hooks."""

    _queries: ClassVar[Mapping[str, str]]
    _backend: ClassVar[_sql.Backend]
    _first_cursor: ClassVar[Any]
    """A time before every stored one: the cursor of a first page."""
    _no_limit: ClassVar[Any] = None
    """The ``LIMIT`` parameter meaning "all rows" (SQLite: -1; PostgreSQL: NULL)."""
    _codec: ClassVar[Codec]
    """How the dialect reads stored values into an item's fields (see ``_rows.py``)."""
    _declared: ClassVar[frozenset[Capability]]
    """What the dialect can do beyond the ports (see :attr:`capabilities`)."""
    _changes: Any
    _clock: Clock
    _guard: StepGuard | None
    """Judges other owners' leases when the clock is a stepped wall clock (see StepGuard)."""

    @property
    def clock(self) -> Clock:
        """Where this store reads "now" from for due times and lease expiries."""
        return self._clock

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What this store does beyond its ports (see :class:`Capability`)."""
        return declared(type(self), self._declared)

    async def aclose(self) -> None:
        """Release connections and threads. Idempotent."""
        raise NotImplementedError  # pragma: no cover - every dialect defines it

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- hooks -------------------------------------------------------------------------------

    async def _run(
        self, fn: Callable[[Any], T], *, lane: Lane = Lane.WORKER, retry: bool = True
    ) -> T:  # pragma: no cover - every dialect defines it
        """Run *fn* on a connection of *lane* in a thread; map the driver's errors to ours.
        *retry*: *fn* may run again on a fresh connection if its connection was dead."""
        raise NotImplementedError

    def _transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """A transaction around several statements."""
        raise NotImplementedError  # pragma: no cover

    def _write(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """What one writing statement runs in: SQLite takes the write lock up front
        (``BEGIN IMMEDIATE``); a PostgreSQL statement in autocommit needs nothing more (a
        ``BEGIN``/``COMMIT`` pair would cost two round trips on every claim)."""
        raise NotImplementedError  # pragma: no cover

    def _snapshot(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """A read-only transaction whose statements all see one snapshot of the database, for
        a read that takes several statements (a page of items, the queues): an item that moves
        between two of them is seen once, where it was (PostgreSQL: ``REPEATABLE READ``;
        SQLite: a deferred transaction on the reader connection)."""
        raise NotImplementedError  # pragma: no cover

    def _now(self) -> Any:
        """The "now" parameter of a statement (PostgreSQL: None for the database's clock)."""
        raise NotImplementedError  # pragma: no cover

    def _lease_now(self, now: Any, hold: float | None = None) -> Any:
        """The "lease_now" parameter: the time by which a statement judges whether a lease has
        expired (*now*, the "now" parameter, unless the clock is a wall clock that a step
        could make run ahead: see :class:`~trio_supervise.StepGuard`)."""
        guard = self._guard
        return now if guard is None else self._time(guard.now(hold))

    def _clock_now(self) -> dt.datetime:
        """The queue's clock's "now" (new item ids start with it)."""
        return self._clock.now()

    def _time(self, value: dt.datetime) -> Any:
        """A datetime as a statement parameter."""
        raise NotImplementedError  # pragma: no cover

    def _from_time(self, value: Any) -> dt.datetime:
        """A stored time as a datetime."""
        raise NotImplementedError  # pragma: no cover

    def _columns(self, cur: Any) -> tuple[str, ...]:
        """The names of the columns of *cur*'s rows, in order."""
        raise NotImplementedError  # pragma: no cover

    def _ids(self, values: Sequence[str]) -> Any:
        """A list of texts as one statement parameter."""
        raise NotImplementedError  # pragma: no cover

    def _fan_in(self, conn: Any, item_ids: Sequence[str], now: Any) -> list[str]:
        """*item_ids* just finished: count each waited-for one (once) toward its parent's wait;
        the spec ids of the parents that became due."""
        raise NotImplementedError  # pragma: no cover

    def _notify(self, conn: Any, spec_ids: Sequence[str]) -> None:
        """Tell other processes that work of *spec_ids* became due (in the transaction)."""

    def _changed(self) -> None:
        self._changes.value += 1

    # -- rows into items ---------------------------------------------------------------------

    def _decode(self, cur: Any, row: Row) -> WorkItem:
        """*row*, read from *cur*, as a :class:`WorkItem` (by a decoder generated for its
        columns, see ``sql/_rows.py``)."""
        return item_decoder(self._columns(cur), self._codec, mapping=type(row) is dict)(row)

    def _one(self, cur: Any) -> WorkItem | None:
        """The item of the one row *cur* returned, or None if it returned none."""
        row = cur.fetchone()
        return None if row is None else self._decode(cur, row)

    def _all(self, cur: Any) -> list[WorkItem]:
        """The items of the rows *cur* returned."""
        rows = cur.fetchall()
        if not rows:
            return []
        decode = item_decoder(self._columns(cur), self._codec, mapping=type(rows[0]) is dict)
        return [decode(row) for row in rows]
