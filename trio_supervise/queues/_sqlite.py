"""The SQLite queue: the embedded default, one file and nothing to install.

Two connections per queue, each used by one thread at a time: every blocking call goes through
``trio.to_thread.run_sync`` with the connection's own ``CapacityLimiter(1)``. The *writer*
serves claims, renewals and settlements; the *reader* serves status reads (``get``,
``list_items``, ``counts``, ``next_due_at``), so however many status pages are open, a renewal
never queues behind a read: in WAL mode readers and the writer do not block each other. SQLite
lets one writer in at a time anyway, so more writer connections would only make this process's
own calls queue on the file lock (and spin in the busy handler) instead of on the limiter; the
limiter is fair and costs nothing. ``sqlite3`` connections may be used from different threads as
long as it is one at a time (``check_same_thread=False``), which the limiters guarantee.
(``:memory:`` has one connection for both, since a second one would be another database.)

Every call first checks, with one ``stat``, that the path still names the file that was opened:
a database deleted or replaced under a running worker raises :class:`QueueFailed` instead of
"settling" into a file nobody will ever read.

Several processes on one machine can share one file: the database is in WAL mode, waits up to
``busy_timeout`` seconds for another process's write lock, and every write runs in a
``BEGIN IMMEDIATE`` transaction, which takes the write lock up front, so a transaction never
fails half-way on a lock upgrade. Times are stored as integer microseconds since the Unix
epoch, so they sort and compare exactly and round-trip every ``datetime`` the clock returns.

Wake-ups: writes in this process wake :meth:`SQLiteQueue.wait_for_work` at once. Commits by
any other connection (another process's queue, the application's own connection after
:meth:`SQLiteQueue.enqueue_on`) are seen within ``watch_interval``: while it waits,
``wait_for_work`` reads ``PRAGMA data_version`` on the reader connection that often (one
``stat`` and one pragma in a thread; it changes only when another connection commits, so a
rolled-back transaction wakes nothing). ``watch_interval=None`` turns that off: such work is
then found when the caller's poll interval ends.
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
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, ClassVar, TypeVar

import attrs
import trio
import trio_util

from .._clock import Clock, SystemClock, utc
from .._errors import QueueError, QueueFailed, QueueUnavailable, SchemaError
from ..job import MAX_ERRORS, Lease, WorkItem
from ..job._model import BOOL, SECONDS, TIME
from . import _sql
from ._outbox import sqlite_savepoint
from ._ports import Capability, declared
from ._sqlbase import SettleEntry, SQLQueue
from .sql._rows import NEW_ROW_COLUMNS, NEW_ROW_KINDS, Codec

__all__ = ["DEFAULT_SQLITE_PATH", "DEFAULT_WATCH_INTERVAL", "SQLiteQueue"]

DEFAULT_SQLITE_PATH = "trio_supervise.db"
"""The database file used when nothing is configured, relative to the working directory."""

DEFAULT_WATCH_INTERVAL = 0.1
"""Seconds between two looks at ``PRAGMA data_version`` while :meth:`SQLiteQueue.wait_for_work`
waits: how soon another connection's commit wakes a runner. Each look is one thread hop (about
half a millisecond of CPU when idle, so 0.5% of a core at this interval, however many
waiters share the queue)."""

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)
_Q = _sql.load_queries("sqlite")
_ENQUEUE_UNKEYED = _sql.without_conflict_clause(_Q["enqueue"])
_ID = NEW_ROW_COLUMNS.index("id")
_SECONDS = [n for n, kind in enumerate(NEW_ROW_KINDS) if kind == SECONDS]
"""The columns of a new row that hold a float (seconds)."""


@functools.cache
def _enqueue_rows_query(varying: tuple[bool, ...], keyed: bool) -> str:
    """The ``enqueue_rows`` template filled in: the columns *varying* (one flag per
    :data:`NEW_ROW_COLUMNS`, the id's always set) come from each JSON row (the row itself when
    only the id varies), the others from the parameter of the column's name."""
    positions = [n for n, flag in enumerate(varying) if flag]
    values: dict[str, str] = {}
    for n, name in enumerate(NEW_ROW_COLUMNS):
        if not varying[n]:
            values[name] = f":{name}"
        elif len(positions) == 1:
            values[name] = "r.value"
        else:
            values[name] = f"json_extract(r.value, '$[{positions.index(n)}]')"
    query = _Q["enqueue_rows"].format_map(values)
    return query if keyed else _sql.without_conflict_clause(query)


_MAX_PARAMETERS = 999
"""The smallest ``SQLITE_MAX_VARIABLE_NUMBER`` a build may have (32766 since SQLite 3.32)."""
_PADDING = [None] * _MAX_PARAMETERS
_ORD = operator.itemgetter("ord")


@functools.cache
def _values_query(name: str, width: int, size: int) -> str:
    """The template query *name* for *size* rows of *width* values: its ``{rows}`` filled in
    with ``(?3, ?4, ...), ...``, numbered after the query's own ``?1`` and ``?2``."""
    rows = ", ".join(
        "(" + ", ".join(f"?{3 + n * width + k}" for k in range(width)) + ")" for n in range(size)
    )
    return _Q[name].replace("{rows}", rows)


def _values_chunk(width: int) -> int:
    """Rows per statement: the largest power of two whose parameters fit in any build."""
    return 1 << ((_MAX_PARAMETERS - 2) // width).bit_length() - 1


def _execute_values(
    conn: sqlite3.Connection,
    name: str,
    head: tuple[Any, Any],
    rows: Sequence[Sequence[Any]],
) -> list[sqlite3.Row]:
    """Run the template query *name* (see :func:`_values_query`) over *rows*, with *head* as
    ``?1`` and ``?2``; the rows it returns.

    One statement per chunk of rows, not one per row: stepping a statement from Python costs
    more than the write it makes. A chunk is padded with rows of NULLs (a NULL id matches
    nothing) to a power of two, so a few statement texts serve every batch size, each prepared
    once and then taken from the connection's statement cache.
    """
    returned: list[sqlite3.Row] = []
    if not rows:
        return returned
    width = len(rows[0])
    chunk = _values_chunk(width)
    for start in range(0, len(rows), chunk):
        part = rows[start : start + chunk]
        size = 1 << (len(part) - 1).bit_length()
        params = list(head)
        for row in part:
            params += row
        params += _PADDING[: (size - len(part)) * width]
        returned += conn.execute(_values_query(name, width, size), params).fetchall()
    return returned


T = TypeVar("T")


def _to_us(value: dt.datetime) -> int:
    return (utc(value) - _EPOCH) // _US


def _from_us(value: int) -> dt.datetime:
    # The same exact integer arithmetic as timedelta(microseconds=value), in half the time.
    return _EPOCH + _US * value


_MIN_US = -(2**63)
"""Before every stored time: the cursor of a first page."""

_CODEC = Codec(
    # Times are integers (microseconds since the epoch), booleans 0 or 1: the same exact
    # arithmetic as timedelta(microseconds=value), in half the time.
    decode={TIME: "_EPOCH + _US * $value", BOOL: "True if $value else False"},
    encode_time="_to_us($value)",
    namespace={"_EPOCH": _EPOCH, "_US": _US, "_to_us": _to_us},
)


def _next(conn: sqlite3.Connection | sqlite3.Cursor, counter: str) -> int:
    """A number the database's *counter* (``next_version``: a claim's lease version;
    ``next_incarnation``: an insert's incarnation) never gave before, inside a write
    transaction (schema 0005)."""
    number: int = conn.execute(_Q[counter]).fetchone()[0]
    return number


def _statements(script: str) -> list[str]:
    """Split a script into complete statements (triggers and all), dropping comment lines."""
    statements, buffer = [], ""
    for line in script.splitlines(keepends=True):
        if line.lstrip().startswith("--"):
            continue
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        raise ValueError(f"incomplete SQL statement at the end of a script: {buffer.strip()!r}")
    return statements


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on any exception."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self._conn.execute("BEGIN IMMEDIATE")
        return self._conn

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self._conn.execute("COMMIT")
        elif self._conn.in_transaction:
            self._conn.execute("ROLLBACK")


def _schema_version(conn: sqlite3.Connection) -> int:
    if not conn.execute(_Q["version_table_exists"]).fetchone()["present"]:
        return 0
    return int(conn.execute(_Q["schema_version"]).fetchone()["version"])


def migrate_connection(
    conn: sqlite3.Connection,
    now_us: int,
    *,
    where: str,
    fresh: bool = True,
    upto: int | None = None,
) -> int:
    """Bring the schema on *conn* up to date in one ``BEGIN IMMEDIATE`` transaction.

    An empty database gets ``schema.sql`` in one go (``fresh=False`` replays the migrations
    instead); an older one gets the pending migrations in order, up to *upto* if given.
    Concurrent migrators take turns on the write lock and see each other's work. Returns the
    version reached.
    """
    latest = _sql.latest_version("sqlite")
    upto = latest if upto is None else upto
    with _Transaction(conn):
        conn.execute(_Q["create_version_table"])
        current = int(conn.execute(_Q["schema_version"]).fetchone()["version"])
        if current > latest:
            raise _sql.too_new(current, "sqlite", where)
        if current == 0 and fresh and upto == latest:
            for statement in _statements(_sql.schema_sql("sqlite")):
                conn.execute(statement)
            conn.execute(_Q["record_version"], {"version": latest, "now": now_us})
            return latest
        for migration in _sql.migrations("sqlite")[current:upto]:
            for statement in _statements(migration.sql):
                conn.execute(statement)
            conn.execute(_Q["record_version"], {"version": migration.version, "now": now_us})
        return max(current, upto)


def _connect(path: str, busy_timeout: float, *, mode: str = "rwc") -> sqlite3.Connection:
    """Open *path*: ``rwc`` creates it if missing, ``rw`` and ``ro`` never do.

    ``rw`` on a file this process may not write (say, read-only) opens it read-only, so reads
    work and writes fail as :class:`QueueFailed`.
    """
    if mode == "rwc" or path == ":memory:":
        conn = sqlite3.connect(
            path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
    else:
        if not os.path.exists(path):
            raise QueueFailed(f"no database at {path}; run `trio-supervise migrate` to create it")
        uri = f"file:{urllib.parse.quote(os.path.abspath(path))}?mode="
        try:
            conn = sqlite3.connect(
                uri + mode,
                timeout=busy_timeout,
                isolation_level=None,
                check_same_thread=False,
                uri=True,
            )
        except sqlite3.OperationalError:
            if mode != "rw":
                raise
            conn = sqlite3.connect(
                uri + "ro",
                timeout=busy_timeout,
                isolation_level=None,
                check_same_thread=False,
                uri=True,
            )
    with contextlib.ExitStack() as on_failure:
        on_failure.callback(conn.close)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        on_failure.pop_all()
    return conn


_TRANSIENT = {"SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL", "SQLITE_IOERR", "SQLITE_PROTOCOL"}
"""Result codes that may pass: another process's lock, a full disk, an I/O hiccup."""
_PERMANENT = {"SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH", "SQLITE_NOTADB"}
"""Result codes no retry fixes: read-only, permission denied, file gone or not a database."""
_DATA_ERRORS = (sqlite3.IntegrityError, sqlite3.DataError, ValueError, OverflowError)
"""What one unstorable value raises: the entry is at fault, not the database."""


def _map_error(error: sqlite3.Error, where: str) -> QueueError:
    """Transient faults become :class:`QueueUnavailable`, permanent ones :class:`QueueFailed`."""
    text = str(error)
    if "no such table" in text:
        return SchemaError(
            f"{where} has no queue schema ({text}); run `trio-supervise migrate` first"
        )
    name = getattr(error, "sqlite_errorname", "") or ""
    base = "_".join(name.split("_")[:2])  # SQLITE_READONLY_DIRECTORY -> SQLITE_READONLY
    if name == "SQLITE_READONLY_DBMOVED" or base in _PERMANENT:
        return QueueFailed(f"SQLite queue at {where}: {text}")
    if base in _TRANSIENT or (
        isinstance(error, sqlite3.OperationalError) and ("locked" in text or "busy" in text)
    ):
        return QueueUnavailable(f"SQLite queue at {where}: {text}")
    return QueueError(f"SQLite queue at {where}: {text}")


async def _open(fn: Callable[[], T], path: str, busy_timeout: float) -> T:
    """Run *fn*, which opens (and perhaps migrates) the file at *path*, in a thread.

    Where SQLite does not wait for another connection's lock, *fn* is tried again, with backoff,
    until *busy_timeout* has passed: switching a fresh file to WAL while another connection
    holds its write lock (several processes starting on one new file) returns ``SQLITE_BUSY``
    at once instead of waiting, to avoid a deadlock. Other faults are mapped at once.
    """
    deadline = trio.current_time() + busy_timeout
    delay = 0.005
    while True:
        try:
            return await trio.to_thread.run_sync(fn)
        except sqlite3.Error as error:
            mapped = _map_error(error, path)
            if not isinstance(mapped, QueueUnavailable) or trio.current_time() + delay > deadline:
                raise mapped from error
        await trio.sleep(delay)
        delay = min(delay * 2, 0.25)


def _identity(path: str) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the file at *path*; None for ``:memory:``."""
    if path == ":memory:":
        return None
    info = os.stat(path)
    return info.st_dev, info.st_ino


@attrs.define(eq=False, kw_only=True)
class SQLiteQueue(SQLQueue):
    """The :class:`WorkQueue` protocol on one SQLite file. Open it with :meth:`connect`."""

    _declared: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.SETTLE_AND_CLAIM, Capability.SERIAL_WRITES, Capability.TRANSACTIONAL_ENQUEUE}
    )

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What this store does beyond its ports (see :class:`Capability`)."""
        return declared(type(self), self._declared)

    _path: str = attrs.field(alias="path")
    _conn: sqlite3.Connection = attrs.field(alias="conn")
    _reader: sqlite3.Connection = attrs.field(alias="reader")
    _clock: Clock = attrs.field(alias="clock")
    _identity: tuple[int, int] | None = attrs.field(alias="identity")
    _watch_interval: float | None = attrs.field(alias="watch_interval", default=None)
    _where: str = attrs.field(init=False)
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
        now_us = _to_us(clock.now())

        def open_sync() -> tuple[sqlite3.Connection, sqlite3.Connection, tuple[int, int] | None]:
            conn = _connect(path, busy_timeout, mode="rwc" if create else "rw")
            with contextlib.ExitStack() as on_failure:
                on_failure.callback(conn.close)
                found = _schema_version(conn)
                latest = _sql.latest_version("sqlite")
                if found > latest:
                    raise _sql.too_new(found, "sqlite", path)
                if found < latest:
                    if not migrate:
                        raise _sql.missing(found, "sqlite", path, f"sqlite:///{path}")
                    migrate_connection(conn, now_us, where=path)
                reader = conn
                if path != ":memory:":
                    reader = _connect(path, busy_timeout, mode="ro")
                    on_failure.callback(reader.close)
                identity = _identity(path)
                on_failure.pop_all()
            return conn, reader, identity

        conn, reader, identity = await _open(open_sync, path, busy_timeout)
        return cls(
            path=path,
            conn=conn,
            reader=reader,
            clock=clock,
            identity=identity,
            watch_interval=None if path == ":memory:" else watch_interval,
        )

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    async def __aenter__(self) -> SQLiteQueue:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- internals ---------------------------------------------------------------------------

    def _check_file(self) -> None:
        """Raise :class:`QueueFailed` if the path no longer names the file that was opened."""
        try:
            found = _identity(self._where)
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
        self, fn: Callable[[sqlite3.Connection], T], *, read: bool = False, retry: bool = True
    ) -> T:
        """Run *fn* on the writer connection (or, with *read*, the reader) in its thread."""
        if self._closed:
            raise QueueError(f"the SQLite queue at {self._path} is closed")
        conn, limiter = (self._reader, self._read_limiter) if read else (self._conn, self._limiter)

        def checked(conn: sqlite3.Connection) -> T:
            self._check_file()
            return fn(conn)

        try:
            return await trio.to_thread.run_sync(checked, conn, limiter=limiter)
        except sqlite3.Error as error:
            raise _map_error(error, self._path) from error

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
                version = await self._run(self._change_mark, read=True)
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
            raise _map_error(error, self._path) from error

    # -- the dialect (see _sqlbase) ------------------------------------------------------

    _queries: ClassVar[Mapping[str, str]] = _Q

    def _clock_now(self) -> dt.datetime:
        return self._clock.now()

    _backend: ClassVar[_sql.Backend] = "sqlite"
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

    def _transaction(self, conn: sqlite3.Connection) -> _Transaction:
        return _Transaction(conn)

    _write = _transaction

    def _now(self) -> int:
        return _to_us(self._clock.now())

    _time = staticmethod(_to_us)
    _from_time = staticmethod(_from_us)
    _codec: ClassVar[Codec] = _CODEC

    @staticmethod
    def _columns(cur: sqlite3.Cursor) -> tuple[str, ...]:
        return tuple(column[0] for column in cur.description)

    @staticmethod
    def _ids(values: Sequence[str]) -> str:
        return json.dumps(list(values))

    def _is_duplicate(self, error: Exception) -> bool:
        return isinstance(error, sqlite3.IntegrityError)

    def _data_errors(self) -> tuple[type[Exception], ...]:
        return _DATA_ERRORS

    def _cursor(self, conn: sqlite3.Connection) -> sqlite3.Cursor:
        cur = conn.cursor()
        cur.row_factory = sqlite3.Row
        return cur

    def _insert_rows(
        self,
        cur: sqlite3.Cursor,
        rows: Sequence[tuple[Any, ...]],
        now: int,
        *,
        keyed: bool,
        notify: bool,
    ) -> tuple[int, dt.datetime]:
        columns = list(zip(*rows, strict=True))
        incarnation = _next(cur, "next_incarnation")
        params: dict[str, Any] = {"now": now, "incarnation": incarnation}
        varying = []
        for n, (name, column) in enumerate(zip(NEW_ROW_COLUMNS, columns, strict=True)):
            same = n != _ID and column.count(column[0]) == len(column)  # the ids always vary
            if same:
                params[name] = column[0]
            varying.append(not same)
        if any(
            varying[n] and not all(t is None or t.is_integer() for t in columns[n])
            for n in _SECONDS
        ):
            # A fractional number in the JSON would go through SQLite's text-to-float
            # conversion, which is not correctly rounded on every build: bound as a double.
            cur.executemany(
                _Q["enqueue"] if keyed else _ENQUEUE_UNKEYED,
                [
                    dict(zip(NEW_ROW_COLUMNS, row, strict=True), now=now, incarnation=incarnation)
                    for row in rows
                ],
            )
            return cur.rowcount, _from_us(now)
        # One statement reading one JSON array: SQLite's fastest multi-row form. The strings
        # go as UTF-8 (every text is checked free of NULs and lone surrogates).
        picked = [column for column, flag in zip(columns, varying, strict=True) if flag]
        values = picked[0] if len(picked) == 1 else list(zip(*picked, strict=True))
        params["rows"] = json.dumps(values, ensure_ascii=False)
        cur.execute(_enqueue_rows_query(tuple(varying), keyed), params)
        return cur.rowcount, _from_us(now)

    def _claim_in(self, conn: sqlite3.Connection, params: dict[str, Any]) -> list[WorkItem]:
        # The claim's lease version, from the database's counter (see next_version). Rows as
        # tuples: the cheapest to build and to unpack.
        cur = conn.cursor()
        cur.row_factory = None
        cur.execute(_Q["claim_due"], {**params, "version": _next(conn, "next_version")})
        return self._all(cur)

    def _renew_rows(
        self, conn: sqlite3.Connection, leases: Sequence[Lease], lease_us: int, now: int
    ) -> Iterable[sqlite3.Row]:
        return _execute_values(
            conn,
            "renew_many",
            (now, lease_us),
            [(each.item_id, each.version, each.worker_id) for each in leases],
        )

    def _settle_rows(
        self, conn: sqlite3.Connection, entries: Sequence[SettleEntry], now: int
    ) -> list[Any]:
        ords = {}
        values = []
        for position, (_, s, converted) in enumerate(entries, start=1):
            ords[s.item_id, s.lease_version] = position
            values.append(
                (
                    s.item_id,
                    s.lease_version,
                    s.kind.value,
                    s.error,
                    converted["delay_us"],
                    converted["at"],
                    converted["config"],
                    converted["result"],
                )
            )
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
                conn, "settle_many", (now, MAX_ERRORS), values
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


async def migrate_path(path: str | os.PathLike[str], *, clock: Clock | None = None) -> int:
    """Bring the schema of the SQLite file at *path* up to date; returns the version reached."""
    path = os.fspath(path)
    now_us = _to_us((SystemClock() if clock is None else clock).now())

    def run() -> int:
        conn = _connect(path, 5.0)
        try:
            return migrate_connection(conn, now_us, where=path)
        finally:
            conn.close()

    return await _open(run, path, 5.0)
