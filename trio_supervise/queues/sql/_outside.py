"""The enqueue core on an application's own connection, with no queue open and no Trio
running: what :mod:`trio_supervise.producer` stands on.

:class:`SQLiteOutside` and :class:`PostgresOutside` are the dialects' enqueue hooks
(``_sqlite_enqueue.py``, ``_postgres_enqueue.py``) joined with :class:`OutboxWrites`, so an
item is written by the very statements and checks of ``queue.enqueue`` (on PostgreSQL the
insert also sends the ``NOTIFY`` runners wait for, delivered at the application's commit). Each
first checks that the connection's database holds the schema this release writes.

An asyncio application's ``psycopg.AsyncConnection`` is driven by the same blocking core from
a worker thread (:class:`BridgedConnection`): each statement is handed to the event loop and
waited for, so the core runs unchanged while the connection is only ever used on its loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import sqlite3
import weakref
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

import attrs

from ..._clock import Clock, StepGuard, SystemClock
from ...job import Enqueued, NewItem
from .. import _sql
from ._outbox import psycopg_savepoint, savepoint_on, sqlite_file, sqlite_savepoint
from ._postgres_db import check_schema_name
from ._postgres_db import schema_version as postgres_version
from ._postgres_enqueue import PostgresEnqueue
from ._producer import OutboxWrites
from ._sqlite_db import file_identity
from ._sqlite_db import schema_version as sqlite_version
from ._sqlite_enqueue import SQLiteEnqueue

__all__ = ["BridgedConnection", "PostgresOutside", "SQLiteOutside"]

T = TypeVar("T")


class SQLiteOutside(SQLiteEnqueue, OutboxWrites):
    """Enqueue on an application's ``sqlite3.Connection`` to a queue's file."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = SystemClock() if clock is None else clock
        self._guard = None  # no lease is judged here

    @contextlib.contextmanager
    def _outbox(self, conn: Any) -> Iterator[sqlite3.Connection]:
        if not isinstance(conn, sqlite3.Connection):
            raise TypeError(f"conn must be a sqlite3.Connection, got {type(conn).__name__}")
        path = sqlite_file(conn)
        if not path:
            raise ValueError(
                "conn is connected to an in-memory database, where no runner can see an "
                "item: connect it to the queue's file"
            )
        with sqlite_savepoint(conn, identity=file_identity(path), where=path) as inner:
            _check_version(sqlite_version(self._cursor(inner)), "sqlite", path)
            yield inner


@attrs.define(eq=False)
class PostgresOutside(PostgresEnqueue, OutboxWrites):
    """Enqueue on an application's psycopg connection to a queue's database (its tables in
    *schema*, or on the connection's ``search_path``); "now" is the database's unless a
    *clock* is given."""

    _schema: str | None = attrs.field(alias="schema", default=None)
    _clock: Clock = attrs.field(alias="clock", factory=SystemClock)
    _db_clock: bool = attrs.field(alias="db_clock", default=True)
    _guard: StepGuard | None = attrs.field(init=False, default=None)
    """No lease is judged here."""
    _checked: weakref.WeakKeyDictionary[Any, int] = attrs.field(
        init=False, factory=weakref.WeakKeyDictionary
    )
    """The connections whose schema version was found right, each with the server process it
    was found on (a connection that reconnected is checked again)."""

    def __attrs_post_init__(self) -> None:
        check_schema_name(self._schema)

    @property
    def _where(self) -> str:
        return "the connection's database" + (
            "" if self._schema is None else f", schema {self._schema}"
        )

    @contextlib.contextmanager
    def _outbox(self, conn: Any) -> Iterator[Any]:
        savepoint = (
            savepoint_on(conn, schema=self._schema, where=self._where)
            if isinstance(conn, BridgedConnection)
            else psycopg_savepoint(conn, schema=self._schema, where=self._where)
        )
        with savepoint as inner:
            # Once per connection: the version of a schema does not change under a session
            # (a migration that changes it would have to run beside the application's
            # transactions; restart the producers after it, as the runners are).
            raw = conn.raw if isinstance(conn, BridgedConnection) else conn
            pid = raw.info.backend_pid
            if self._checked.get(raw) != pid:
                _check_version(postgres_version(self._cursor(inner)), "postgres", self._where)
                self._checked[raw] = pid
            yield inner

    async def enqueue_many_async(self, conn: Any, entries: Sequence[NewItem]) -> list[Enqueued]:
        """:meth:`enqueue_many_on` on an asyncio ``psycopg.AsyncConnection``: the same core,
        in a worker thread, each statement run on *conn*'s event loop."""
        import psycopg

        if not isinstance(conn, psycopg.AsyncConnection):
            raise TypeError(f"conn must be a psycopg.AsyncConnection, got {type(conn).__name__}")
        self._prepare(entries)  # a bad entry is refused before a thread is taken
        bridged = BridgedConnection(conn, asyncio.get_running_loop())
        return await asyncio.to_thread(self.enqueue_many_on, bridged, entries)


def _check_version(found: int, backend: _sql.Backend, where: str) -> None:
    """Refuse a database whose queue schema is missing, older or newer than this release's."""
    _sql.to_migrate(found, backend, where, "<your database URL>", migrate=False)


# -- an asyncio connection driven from a thread -------------------------------------------------


@attrs.frozen
class _Loop:
    loop: asyncio.AbstractEventLoop

    def run(self, step: Coroutine[Any, Any, T]) -> T:
        """Run *step* on the loop and wait for it (from a thread that is not the loop's)."""
        return asyncio.run_coroutine_threadsafe(step, self.loop).result()


class BridgedCursor:
    """What the enqueue core asks of a sync psycopg cursor, over an ``AsyncCursor``: each
    ``execute`` runs on the loop and brings its rows back whole."""

    def __init__(self, loop: _Loop, cursor: Any) -> None:
        self._loop = loop
        self._cursor = cursor
        self._rows: collections.deque[Any] = collections.deque()

    def execute(self, query: Any, params: Any = None) -> BridgedCursor:
        async def step() -> list[Any]:
            await self._cursor.execute(query, params)
            if self._cursor.description is None:
                return []
            rows: list[Any] = await self._cursor.fetchall()
            return rows

        self._rows = collections.deque(self._loop.run(step()))
        return self

    def fetchone(self) -> Any:
        return self._rows.popleft() if self._rows else None

    def fetchall(self) -> list[Any]:
        rows = list(self._rows)
        self._rows.clear()
        return rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())

    @property
    def rowcount(self) -> int:
        count: int = self._cursor.rowcount
        return count

    @property
    def pgresult(self) -> Any:
        return self._cursor.pgresult

    @property
    def description(self) -> Any:
        return self._cursor.description

    @property
    def adapters(self) -> Any:
        return self._cursor.adapters


class BridgedConnection:
    """What the enqueue core and its savepoint ask of a sync ``psycopg.Connection``, over an
    ``AsyncConnection`` whose loop runs in another thread (see the module doc)."""

    def __init__(self, conn: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._conn = conn
        self._loop = _Loop(loop)

    @property
    def raw(self) -> Any:
        """The ``AsyncConnection`` this stands for."""
        return self._conn

    @property
    def info(self) -> Any:
        return self._conn.info

    @property
    def closed(self) -> bool:
        closed: bool = self._conn.closed
        return closed

    @property
    def autocommit(self) -> bool:
        autocommit: bool = self._conn.autocommit
        return autocommit

    @property
    def adapters(self) -> Any:
        return self._conn.adapters

    def cursor(self, *, row_factory: Any = None) -> BridgedCursor:
        made = (
            self._conn.cursor()
            if row_factory is None
            else self._conn.cursor(row_factory=row_factory)
        )
        return BridgedCursor(self._loop, made)

    def execute(self, query: Any, params: Any = None) -> BridgedCursor:
        return self.cursor().execute(query, params)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """A savepoint (or transaction) on the loop, left as ``async with`` would leave it."""
        block = self._conn.transaction()
        self._loop.run(block.__aenter__())
        try:
            yield
        except Exception as error:
            if not self._loop.run(block.__aexit__(type(error), error, error.__traceback__)):
                raise
        else:
            self._loop.run(block.__aexit__(None, None, None))
