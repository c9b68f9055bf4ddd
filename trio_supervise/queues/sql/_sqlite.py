"""The SQLite queue: the embedded default, one file and nothing to install.

:class:`SQLiteQueue` is the SQL layer's ports on SQLite: one writer connection (claims,
renewals, settlements, every write) and one read-only reader (status reads), each used by one
thread at a time behind its own ``CapacityLimiter(1)``; writes under ``BEGIN IMMEDIATE``,
batches as one ``VALUES`` statement per chunk; other connections' commits seen through
``PRAGMA data_version`` while :meth:`SQLiteQueue.wait_for_work` waits. The file itself (opening,
migrations, errors) is ``_sqlite_db.py``; what the queue promises is in ``docs/queues.md``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import math
import operator
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

import attrs
import trio
import trio_util

from ..._clock import Clock, StepGuard, SystemClock, WallClock
from ..._errors import QueueError, QueueFailed
from ...job import MAX_ERRORS, Lease, RateLimit, SettleKind, WorkItem, cap_of
from .. import _sql
from .._ports import Capability
from ._base import Lane
from ._durable import JournalWrites
from ._outbox import sqlite_savepoint
from ._queue import SQLQueue
from ._settle import PLAIN_VALUES, SettleEntry
from ._sqlite_db import (
    DATA_ERRORS,
    QUERIES,
    Transaction,
    connect_file,
    file_identity,
    from_us,
    map_error,
    migrate_connection,
    open_file,
    schema_version,
    to_us,
)
from ._sqlite_enqueue import SQLiteEnqueue

__all__ = ["DEFAULT_SQLITE_PATH", "DEFAULT_WATCH_INTERVAL", "SQLiteQueue"]

T = TypeVar("T")
_Q = QUERIES
DEFAULT_SQLITE_PATH = "trio_supervise.db"
"""The database file used when nothing is configured, relative to the working directory."""

DEFAULT_WATCH_INTERVAL = 0.1
"""Seconds between two looks at ``PRAGMA data_version`` while :meth:`SQLiteQueue.wait_for_work`
waits: how soon another connection's commit wakes a runner. Each look is one thread hop (about
half a millisecond of CPU when idle, so 0.5% of a core at this interval, however many
waiters share the queue)."""


_MAX_PARAMETERS = 999
"""The smallest ``SQLITE_MAX_VARIABLE_NUMBER`` a build may have (32766 since SQLite 3.32)."""
_PADDING = [None] * _MAX_PARAMETERS
_ORD = operator.itemgetter("ord")
_KIND_TEXT = {kind: kind.value for kind in SettleKind}
"""Each kind's stored text, a plain ``str``: the enum's ``value`` is a descriptor call, and
sqlite3 binds only exact builtin types without an adapter lookup."""


@functools.cache
def _values_query(name: str, width: int, size: int, head: int, outcomes: str | None = None) -> str:
    """The template query *name* for *size* rows of *width* values: its ``{rows}`` filled in
    with ``(?3, ?4, ...), ...``, numbered after the query's own *head* parameters (``?1``,
    ``?2``, ...); with *outcomes*, its ``{outcomes}`` first filled in with that query."""
    first = head + 1
    rows = ", ".join(
        "(" + ", ".join(f"?{first + n * width + k}" for k in range(width)) + ")"
        for n in range(size)
    )
    query = _Q[name] if outcomes is None else _Q[name].replace("{outcomes}", _Q[outcomes])
    return query.replace("{rows}", rows)


def _values_chunk(width: int, head: int) -> int:
    """Rows per statement: the largest power of two whose parameters fit in any build."""
    return 1 << ((_MAX_PARAMETERS - head) // width).bit_length() - 1


def _execute_values(
    conn: sqlite3.Connection,
    name: str,
    head: tuple[Any, ...],
    rows: Sequence[Sequence[Any]],
    outcomes: str | None = None,
) -> list[sqlite3.Row]:
    """Run the template query *name* (with *outcomes*, see :func:`_values_query`) over *rows*, with
    *head* as ``?1``, ``?2``, ...; the rows it returns.

    One statement per chunk of rows, not one per row: stepping a statement from Python costs
    more than the write it makes. A chunk is padded with rows of NULLs (a NULL id matches
    nothing) to a power of two, so a few statement texts serve every batch size, each prepared
    once and then taken from the connection's statement cache.
    """
    returned: list[sqlite3.Row] = []
    if not rows:
        return returned
    width = len(rows[0])
    chunk = _values_chunk(width, len(head))
    for start in range(0, len(rows), chunk):
        part = rows[start : start + chunk]
        size = 1 << (len(part) - 1).bit_length()
        params = list(head)
        for row in part:
            params += row
        params += _PADDING[: (size - len(part)) * width]
        query = _values_query(name, width, size, len(head), outcomes)
        returned += conn.execute(query, params).fetchall()
    return returned


_MIN_US = -(2**63)
"""Before every stored time: the cursor of a first page."""


@attrs.define(eq=False, kw_only=True)
class SQLiteQueue(SQLiteEnqueue, SQLQueue):
    """The :class:`WorkQueue` protocol on one SQLite file. Open it with :meth:`connect`."""

    _declared: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.SETTLE_AND_CLAIM,
            Capability.SERIAL_WRITES,
            Capability.TRANSACTIONAL_ENQUEUE,
            Capability.AUDIT_TRAIL,
            Capability.ERROR_HISTORY,
            Capability.RATE_LIMITS,
            Capability.KEY_RATE_LIMITS,
            Capability.DURABLE_JOURNAL,
        }
    )

    _inline: ClassVar[bool] = False
    """Run each statement in Trio's own thread instead of a worker thread: for virtual time
    (``trio_supervise.testing.open_virtual_sqlite``), where an autojump clock would jump while
    a thread runs a statement."""

    _path: str = attrs.field(alias="path")
    _conn: sqlite3.Connection = attrs.field(alias="conn")
    _reader: sqlite3.Connection = attrs.field(alias="reader")
    _clock: Clock = attrs.field(alias="clock")
    _guard: StepGuard | None = attrs.field(init=False)
    _identity: tuple[int, int] | None = attrs.field(alias="identity")
    _watch_interval: float | None = attrs.field(alias="watch_interval", default=None)
    _where: str = attrs.field(init=False)
    _journal_writes: JournalWrites = attrs.field(init=False, factory=JournalWrites)
    """The absolute path, as opened: a later ``chdir`` must not look like a deleted file."""

    @_where.default
    def _absolute(self) -> str:
        return self._path if self._path == ":memory:" else os.path.abspath(self._path)

    _limiter: trio.CapacityLimiter = attrs.field(
        init=False, factory=lambda: trio.CapacityLimiter(1)
    )
    _read_limiter: trio.CapacityLimiter = attrs.field(init=False)

    @_read_limiter.default
    def _one_limiter(self) -> trio.CapacityLimiter:
        return self._limiter if self._reader is self._conn else trio.CapacityLimiter(1)

    _changes: trio_util.AsyncValue[int] = attrs.field(
        init=False, factory=lambda: trio_util.AsyncValue(0)
    )
    _closed: bool = attrs.field(init=False, default=False)
    _version: tuple[float, int | None] = attrs.field(init=False, default=(-math.inf, None))
    """The last ``PRAGMA data_version`` the waiters read, and when (Trio's clock): waiters
    share one look per half interval."""

    @classmethod
    async def connect(
        cls,
        path: str | os.PathLike[str] = DEFAULT_SQLITE_PATH,
        *,
        clock: Clock | None = None,
        migrate: bool = True,
        busy_timeout: float = 5.0,
        create: bool = True,
        watch_interval: float | None = DEFAULT_WATCH_INTERVAL,
    ) -> SQLiteQueue:
        """Open (creating if need be) the queue in the file at *path*.

        :param clock: where "now" comes from (default: :class:`SystemClock`).
        :param migrate: bring a missing or older schema up to date (the default, since the file
            belongs to this application); with ``False`` such a schema raises
            :class:`SchemaError`. A schema newer than this release knows always raises it.
        :param busy_timeout: seconds to wait for another process's write lock.
        :param create: with ``False`` a missing file raises :class:`QueueFailed` ("no database
            at PATH; run `trio-supervise migrate` to create it") instead of being created, for
            commands that only read.
        :param watch_interval: while :meth:`wait_for_work` waits, look this often (seconds)
            for commits by other connections (other processes, :meth:`enqueue_on`); None: only
            this queue's own writes and due times wake it.
        """
        path = os.fspath(path)
        if not path:
            raise ValueError("path must be a non-empty file name (or ':memory:')")
        if not (busy_timeout >= 0) or busy_timeout == float("inf"):
            raise ValueError(f"busy_timeout must be a finite number >= 0, got {busy_timeout!r}")
        if watch_interval is not None and (
            not (watch_interval > 0) or watch_interval == float("inf")
        ):
            raise ValueError(
                "watch_interval must be a positive number of seconds or None, "
                f"got {watch_interval!r}"
            )
        clock = SystemClock() if clock is None else clock
        now_us = to_us(clock.now())

        def open_sync() -> tuple[sqlite3.Connection, sqlite3.Connection, tuple[int, int] | None]:
            conn = connect_file(path, busy_timeout, mode="rwc" if create else "rw")
            with contextlib.ExitStack() as on_failure:
                on_failure.callback(conn.close)
                found = schema_version(conn)
                if _sql.to_migrate(found, "sqlite", path, f"sqlite:///{path}", migrate=migrate):
                    migrate_connection(conn, now_us, where=path)
                reader = conn  # ':memory:': a second connection would be another database
                if path != ":memory:":
                    reader = connect_file(path, busy_timeout, mode="ro")
                    on_failure.callback(reader.close)
                identity = file_identity(path)
                on_failure.pop_all()
            return conn, reader, identity

        conn, reader, identity = await open_file(open_sync, path, busy_timeout)
        return cls(
            path=path,
            conn=conn,
            reader=reader,
            clock=clock,
            identity=identity,
            watch_interval=None if path == ":memory:" else watch_interval,
        )

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    # -- internals ---------------------------------------------------------------------------

    def _check_file(self) -> None:
        """Raise :class:`QueueFailed` if the path no longer names the file that was opened."""
        try:
            found = file_identity(self._where)
        except OSError as error:
            found = None
            reason = f"{error.strerror or error}"
        else:
            reason = "replaced by another file"
        if found != self._identity:
            raise QueueFailed(
                f"the SQLite database at {self._path} is gone ({reason}) while the queue had it "
                "open: nothing written since is stored anywhere"
            )

    async def _run(
        self,
        fn: Callable[[sqlite3.Connection], T],
        *,
        lane: Lane = Lane.WORKER,
        retry: bool = True,
    ) -> T:
        """Run *fn* in its connection's thread: the writer's, or for reads (status reads and the
        worker's look at what is due) the reader's."""
        if self._closed:
            raise QueueError(f"the SQLite queue at {self._path} is closed")
        if lane is Lane.READ or lane is Lane.WAIT:
            conn, limiter = self._reader, self._read_limiter
        else:
            conn, limiter = self._conn, self._limiter

        def checked(conn: sqlite3.Connection) -> T:
            self._check_file()
            return fn(conn)

        try:
            if self._inline:
                await trio.lowlevel.checkpoint()
                return checked(conn)
            return await trio.to_thread.run_sync(checked, conn, limiter=limiter)
        except sqlite3.Error as error:
            raise map_error(error, self._path) from error

    _call = _run

    def _change_mark(self, conn: sqlite3.Connection) -> int | None:
        if self._watch_interval is None:
            return None
        return int(conn.execute("PRAGMA data_version").fetchone()[0])

    async def _wait_changed(self, generation: int, mark: Any) -> None:
        if mark is None:
            await super()._wait_changed(generation, mark)
            return
        interval = self._watch_interval or 0
        while True:
            with trio.move_on_after(interval):
                await super()._wait_changed(generation, mark)
                return
            at, version = self._version
            if trio.current_time() - at >= interval / 2:
                version = await self._run(self._change_mark, lane=Lane.WAIT)
                self._version = (trio.current_time(), version)
            if version != mark:
                return

    def _outbox(self, conn: Any) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return self._mapped(sqlite_savepoint(conn, identity=self._identity, where=self._where))

    @contextlib.contextmanager
    def _mapped(
        self, inner: contextlib.AbstractContextManager[sqlite3.Connection]
    ) -> Iterator[sqlite3.Connection]:
        if self._closed:
            raise QueueError(f"the SQLite queue at {self._path} is closed")
        try:
            with inner as conn:
                yield conn
        except sqlite3.Error as error:
            raise map_error(error, self._path) from error

    # -- the dialect's hooks (see _base.py and the ports) --------------------------------

    _first_cursor: ClassVar[int] = _MIN_US
    _no_limit: ClassVar[int] = -1

    @staticmethod
    @contextlib.contextmanager
    def _snapshot(conn: sqlite3.Connection) -> Iterator[None]:
        # A deferred transaction: in WAL mode its first read fixes the snapshot it reads.
        conn.execute("BEGIN")
        try:
            yield
        finally:
            conn.execute("COMMIT")

    def _transaction(self, conn: sqlite3.Connection) -> Transaction:
        return Transaction(conn)

    _write = _transaction

    def _data_errors(self) -> tuple[type[Exception], ...]:
        return DATA_ERRORS

    @_guard.default
    def _new_guard(self) -> StepGuard | None:
        return StepGuard(self._clock) if isinstance(self._clock, WallClock) else None

    def _claim_in(self, conn: sqlite3.Connection, params: dict[str, Any]) -> list[WorkItem]:
        # The claim's lease version, from the database's counter, the queue's rate limit if it
        # has one and whether a key has one (see claim_version). Rows as tuples: the cheapest
        # to build and unpack.
        cur = conn.cursor()
        cur.row_factory = None
        version, rate, key_rated = cur.execute(_Q["claim_version"], params).fetchone()
        if rate is not None or key_rated:
            params = {**params, "now": self._now_under_lock(params["now"])}
        caps = None
        if key_rated:
            keys = [row[0] for row in cur.execute(_Q["claimable_keys"], params).fetchall()]
            caps, _ = self._key_caps(conn, keys, params)
            # Every key found, ruled or not: claim_due takes no keyed row of another key.
            params = {**params, "key_caps": json.dumps({key: cap_of(caps, key) for key in keys})}

        def claim(rated: dict[str, Any]) -> list[WorkItem]:
            cur.execute(_Q["claim_due"], {**rated, "version": version})
            return self._all(cur)

        if rate is None:
            claimed = claim(params)
        else:
            limit, period_us, starts = json.loads(rate)
            claimed = self._claim_rated(
                conn,
                params,
                RateLimit(limit, period_us / 1_000_000),
                [from_us(start) for start in starts],
                from_us(params["now"]),
                claim,
            )
        if caps:
            self._record_key_starts(conn, caps, claimed)
        return claimed

    def _starts_of(self, value: str) -> list[dt.datetime]:
        return [from_us(start) for start in json.loads(value)]

    def _starts_value(self, starts: Sequence[dt.datetime]) -> str:
        return json.dumps([to_us(start) for start in starts])

    def _renew_rows(
        self,
        conn: sqlite3.Connection,
        leases: Sequence[Lease],
        lease_us: int,
        now: int,
        lease_now: int,
    ) -> Iterable[sqlite3.Row]:
        return _execute_values(
            conn,
            "renew_many",
            (now, lease_us, lease_now),
            [(each.item_id, each.version, each.worker_id) for each in leases],
        )

    def _settle_rows(
        self, conn: sqlite3.Connection, entries: Sequence[SettleEntry], now: int
    ) -> list[Any]:
        ords = {}
        plain = True
        for position, (_, s, converted) in enumerate(entries, start=1):
            ords[s.item_id, s.lease_version] = position
            if converted is not PLAIN_VALUES or s.error is not None:
                plain = False
        values: list[tuple[Any, ...]]
        if plain:  # most batches: three values an outcome, no NULL to bind
            values = [(s.item_id, s.lease_version, _KIND_TEXT[s.kind]) for _, s, _ in entries]
        else:
            values = [
                (
                    s.item_id,
                    s.lease_version,
                    _KIND_TEXT[s.kind],
                    s.error,
                    converted["delay_us"],
                    converted["at"],
                    converted["config"],
                    converted["result"],
                )
                for _, s, converted in entries
            ]
        outcomes = "settle_plain_outcomes" if plain else "settle_outcomes"
        rows = [
            {
                "ord": ords[id_, version],
                "spec_id": spec_id,
                "state": state,
                "parent_id": parent_id,
                "concurrency_key": key,
                "due_now": due_now,
            }
            for id_, version, spec_id, state, parent_id, key, due_now in _execute_values(
                conn, "settle_many", (now, MAX_ERRORS), values, outcomes
            )
        ]
        rows.sort(key=_ORD)  # batch order, as one statement per outcome returned them
        return rows

    def _set_parents(self, conn: sqlite3.Connection, children: Sequence[dict[str, Any]]) -> None:
        conn.executemany(_Q["set_parent"], children)

    def _fan_in(self, conn: sqlite3.Connection, item_ids: Sequence[str], now: int) -> list[str]:
        # Inside BEGIN IMMEDIATE: this connection alone writes, so read-then-update is atomic.
        due = []
        for item_id in item_ids:
            waited = conn.execute(_Q["waited_parent"], {"id": item_id}).fetchone()
            if waited is None:
                continue
            conn.execute(_Q["counted"], {"id": item_id})
            row = conn.execute(
                _Q["count_down"],
                {
                    "parent_id": waited["parent_id"],
                    "parent_version": waited["parent_version"],
                    "now": now,
                },
            ).fetchone()
            if row is not None and row["due_now"]:
                due.append(row["spec_id"])
        return due

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        # The reader first: the writer, closing last, checkpoints the WAL and removes it.
        if self._reader is not self._conn:
            async with self._read_limiter:
                await trio.to_thread.run_sync(self._reader.close)
        async with self._limiter:
            await trio.to_thread.run_sync(self._conn.close)
