"""The SQLite file: opening it, its schema and migrations, transactions, and its errors.

What the queue (``_sqlite.py``) stands on: a connection in WAL mode that waits
``busy_timeout`` for another process's lock, ``BEGIN IMMEDIATE`` transactions, the schema brought
up to date in one of them, times as integer microseconds since the epoch, and SQLite's result
codes sorted into :class:`QueueUnavailable` (transient) and :class:`QueueFailed` (permanent).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import sqlite3
import urllib.parse
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

import trio

from ..._clock import Clock, SystemClock, utc
from ..._errors import QueueError, QueueFailed, QueueUnavailable, SchemaError
from .. import _sql

__all__ = [
    "DATA_ERRORS",
    "EPOCH",
    "QUERIES",
    "US",
    "Transaction",
    "connect_file",
    "file_identity",
    "from_us",
    "map_error",
    "migrate_connection",
    "migrate_path",
    "next_number",
    "open_file",
    "schema_version",
    "to_us",
]

T = TypeVar("T")
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
US = dt.timedelta(microseconds=1)
QUERIES = _sql.load_queries("sqlite")


def to_us(value: dt.datetime) -> int:
    """*value* as it is stored: whole microseconds since the epoch."""
    return (utc(value) - EPOCH) // US


def from_us(value: int) -> dt.datetime:
    """A stored time as a UTC datetime."""
    # The same exact integer arithmetic as timedelta(microseconds=value), in half the time.
    return EPOCH + US * value


def next_number(conn: sqlite3.Connection | sqlite3.Cursor, counter: str) -> int:
    """A number the database's *counter* (``next_version``: a claim's lease version;
    ``next_incarnation``: an insert's incarnation) never gave before, inside a write
    transaction (schema 0005)."""
    number: int = conn.execute(QUERIES[counter]).fetchone()[0]
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


class Transaction:
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


def schema_version(conn: sqlite3.Connection | sqlite3.Cursor) -> int:
    if not conn.execute(QUERIES["version_table_exists"]).fetchone()["present"]:
        return 0
    return int(conn.execute(QUERIES["schema_version"]).fetchone()["version"])


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
    with Transaction(conn):
        conn.execute(QUERIES["create_version_table"])
        current = int(conn.execute(QUERIES["schema_version"]).fetchone()["version"])
        if current > latest:
            raise _sql.too_new(current, "sqlite", where)
        if current == 0 and fresh and upto == latest:
            for statement in _statements(_sql.schema_sql("sqlite")):
                conn.execute(statement)
            conn.execute(QUERIES["record_version"], {"version": latest, "now": now_us})
            return latest
        for migration in _sql.migrations("sqlite")[current:upto]:
            for statement in _statements(migration.sql):
                conn.execute(statement)
            conn.execute(QUERIES["record_version"], {"version": migration.version, "now": now_us})
        return max(current, upto)


def connect_file(path: str, busy_timeout: float, *, mode: str = "rwc") -> sqlite3.Connection:
    """Open *path*: ``rwc`` creates it if missing, ``rw`` and ``ro`` never do.

    ``rw`` on a file this process may not write (say, read-only) opens it read-only, so reads
    work and writes fail as :class:`QueueFailed`. A connection may be used from any thread, one
    at a time (``check_same_thread=False``): the queue's limiters see to that.
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
DATA_ERRORS = (sqlite3.IntegrityError, sqlite3.DataError, ValueError, OverflowError)
"""What one unstorable value raises: the entry is at fault, not the database."""


def map_error(error: sqlite3.Error, where: str) -> QueueError:
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


async def open_file(fn: Callable[[], T], path: str, busy_timeout: float) -> T:
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
            mapped = map_error(error, path)
            if not isinstance(mapped, QueueUnavailable) or trio.current_time() + delay > deadline:
                raise mapped from error
        await trio.sleep(delay)
        delay = min(delay * 2, 0.25)


def file_identity(path: str) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the file at *path*; None for ``:memory:``."""
    if path == ":memory:":
        return None
    info = os.stat(path)
    return info.st_dev, info.st_ino


async def migrate_path(path: str | os.PathLike[str], *, clock: Clock | None = None) -> int:
    """Bring the schema of the SQLite file at *path* up to date; returns the version reached."""
    path = os.fspath(path)
    now_us = to_us((SystemClock() if clock is None else clock).now())

    def run() -> int:
        conn = connect_file(path, 5.0)
        try:
            return migrate_connection(conn, now_us, where=path)
        finally:
            conn.close()

    return await open_file(run, path, 5.0)
