"""Enqueue from an application that does not run Trio: a Django or Flask app (sync), a FastAPI
app (asyncio), a script.

:class:`Producer` writes items with the same statements, checks and uniqueness rules as
``queue.enqueue`` (it is the same core), on a connection the application holds:

- ``producer.enqueue(conn, spec_id, ...)`` on a ``sqlite3.Connection`` to the queue's file or
  a sync ``psycopg.Connection`` to the queue's database, inside the transaction the application
  has open: the item commits or rolls back with it (nothing here commits or rolls back);
- ``await producer.enqueue_async(conn, spec_id, ...)`` on a ``psycopg.AsyncConnection``, the
  same in an asyncio application;
- given a database URL (``sqlite:///path`` or ``postgresql://...``) instead of a connection,
  it connects, enqueues in a transaction of its own, commits and disconnects.

Runners hear of the items at the commit: on PostgreSQL the insert sends the ``NOTIFY`` they
listen for (delivered at commit, dropped by a rollback); on SQLite they see the commit.
Nothing here imports or runs Trio. See the Queues guide, "Producers outside Trio".
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Sequence
from typing import Any

import attrs
from typing_extensions import Unpack

from ._clock import Clock
from .job import Enqueued, EnqueueOptions, NewItem, WorkItem
from .queues._factory import parse_queue_url
from .queues._ports import entry_signature
from .queues.sql._outside import PostgresOutside, SQLiteOutside

__all__ = ["Producer"]


@attrs.frozen(kw_only=True)
class Producer:
    """Enqueues on an application's own connection, without Trio (see the module doc).

    :param schema: PostgreSQL: the schema holding the queue's tables (default: the
        connection's ``search_path``), as given to ``PostgresQueue.connect``.
    :param clock: where "now" comes from (due times, new ids): by default the system clock on
        SQLite and the database's ``now()`` on PostgreSQL, as the queues read it.
    """

    schema: str | None = None
    clock: Clock | None = None
    _sqlite: SQLiteOutside = attrs.field(init=False, repr=False)
    _postgres: PostgresOutside = attrs.field(init=False, repr=False)

    @_sqlite.default
    def _sqlite_core(self) -> SQLiteOutside:
        return SQLiteOutside(self.clock)

    @_postgres.default
    def _postgres_core(self) -> PostgresOutside:
        if self.clock is None:
            return PostgresOutside(schema=self.schema)
        return PostgresOutside(schema=self.schema, clock=self.clock, db_clock=False)

    @entry_signature
    def enqueue(self, conn: Any, spec_id: str, **options: Unpack[EnqueueOptions]) -> WorkItem:
        """Add an item on *conn* (a ``sqlite3.Connection``, a sync ``psycopg.Connection``, or
        a database URL); the options and the result are ``queue.enqueue``'s.

        On a connection, the item is written in the transaction open on it (opened if none
        is, as the connection's own next statement would: call it inside ``with conn:`` or
        ``with conn.transaction():``) and commits or rolls back with it. If this raises
        (``DuplicateItem``, a bad value named by field, ``SchemaError`` for a database
        without the queue's schema), nothing of the call is written and the transaction is
        still usable.
        """
        [done] = self.enqueue_many(conn, [NewItem(spec_id=spec_id, **options)])
        return done.item

    def enqueue_many(self, conn: Any, entries: Sequence[NewItem]) -> list[Enqueued]:
        """Add many items on *conn* (see :meth:`enqueue`): one :class:`Enqueued` per entry,
        in order, saying whether it was created or an idempotency key matched."""
        if isinstance(conn, str):
            return self._on_url(conn, entries)
        if isinstance(conn, sqlite3.Connection):
            return self._sqlite.enqueue_many_on(conn, entries)
        if _is_psycopg(conn, "Connection"):
            return self._postgres.enqueue_many_on(conn, entries)
        if _is_psycopg(conn, "AsyncConnection"):
            raise TypeError("conn is a psycopg.AsyncConnection: await enqueue_async() with it")
        raise TypeError(
            "conn must be a sqlite3.Connection, a psycopg.Connection or a database URL, "
            f"got {type(conn).__name__}"
        )

    @entry_signature
    async def enqueue_async(
        self, conn: Any, spec_id: str, **options: Unpack[EnqueueOptions]
    ) -> WorkItem:
        """:meth:`enqueue` for asyncio: *conn* a ``psycopg.AsyncConnection`` (inside ``async
        with conn.transaction():``, or with its transaction open) or a PostgreSQL URL."""
        [done] = await self.enqueue_many_async(conn, [NewItem(spec_id=spec_id, **options)])
        return done.item

    async def enqueue_many_async(self, conn: Any, entries: Sequence[NewItem]) -> list[Enqueued]:
        """:meth:`enqueue_many` for asyncio (see :meth:`enqueue_async`)."""
        if isinstance(conn, str):
            return await self._on_url_async(conn, entries)
        if isinstance(conn, sqlite3.Connection):
            raise TypeError("sqlite3 is synchronous: call enqueue() with a sqlite3.Connection")
        if not _is_psycopg(conn, "AsyncConnection"):
            raise TypeError(
                "conn must be a psycopg.AsyncConnection or a PostgreSQL URL, "
                f"got {type(conn).__name__}"
            )
        return await self._postgres.enqueue_many_async(conn, entries)

    def _on_url(self, url: str, entries: Sequence[NewItem]) -> list[Enqueued]:
        backend, target = _durable(url)
        if backend == "sqlite":
            conn = sqlite3.connect(target, timeout=5.0)
            try:
                with conn:  # commits, or rolls back if the enqueue raised
                    return self._sqlite.enqueue_many_on(conn, entries)
            finally:
                conn.close()
        import psycopg

        with psycopg.connect(target) as pg, pg.transaction():
            return self._postgres.enqueue_many_on(pg, entries)

    async def _on_url_async(self, url: str, entries: Sequence[NewItem]) -> list[Enqueued]:
        backend, target = _durable(url)
        if backend == "sqlite":
            raise TypeError("sqlite3 is synchronous: call enqueue() with a sqlite:/// URL")
        import psycopg

        async with await psycopg.AsyncConnection.connect(target) as pg, pg.transaction():
            return await self._postgres.enqueue_many_async(pg, entries)


def _durable(url: str) -> tuple[str, str]:
    backend, target = parse_queue_url(url)
    if backend == "memory":
        raise ValueError("a memory:// queue lives in its own process: a producer cannot reach it")
    return backend, target


def _is_psycopg(conn: object, kind: str) -> bool:
    """Whether *conn* is a psycopg connection of *kind*, without importing psycopg (a
    psycopg connection exists only once psycopg was imported)."""
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(conn, getattr(psycopg, kind))
