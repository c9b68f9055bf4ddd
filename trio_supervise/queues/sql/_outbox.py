"""Enqueue on the application's own open transaction (the outbox pattern).

:meth:`SQLProducer.enqueue_on` runs the queue's enqueue statements on a connection the
application holds, inside the transaction the application has open, so the business write and
the item commit or roll back together. The functions here prepare such a connection and put
the call in a savepoint; they never commit or roll back the application's transaction.

- **SQLite** (:func:`sqlite_savepoint`): a ``sqlite3.Connection`` to the queue's own file. A
  connection in the module's default mode with no transaction open gets ``BEGIN IMMEDIATE``
  (the application's ``commit()`` or ``rollback()`` ends it, as it would have ended the
  transaction its own next ``INSERT`` opens); one in autocommit mode (``isolation_level=None``,
  or ``autocommit=True`` on Python 3.12+) must have run ``BEGIN`` itself, since nothing would
  ever end a transaction the queue opened there.
- **PostgreSQL** (:func:`psycopg_savepoint`): a sync ``psycopg.Connection`` (Trio programs use
  the sync driver in a thread, as the queue itself does). Either not in autocommit mode (the
  first statement opens the transaction, as for any statement of the application's) or inside
  ``with conn.transaction():``. A queue in a schema of its own sets ``search_path`` to that
  schema for the call only (``set_config(..., true)``, restored afterwards), so the
  application's connection needs no setting of its own.

Either way the call runs in a savepoint: when it raises (a :class:`DuplicateItem`, a bad
value), nothing of it is written and the application's transaction is still usable (on
PostgreSQL an error would otherwise abort it). Rows are read through cursors of the queue's
own row factory: the application's connection keeps its own.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..._errors import SchemaError

if TYPE_CHECKING:
    import psycopg

__all__ = ["psycopg_savepoint", "savepoint_on", "sqlite_file", "sqlite_savepoint"]

_SAVEPOINT = "trio_supervise_enqueue"


def sqlite_file(conn: sqlite3.Connection) -> str:
    """The file of *conn*'s main database ('' for an in-memory or temporary one)."""
    cur = conn.cursor()
    cur.row_factory = None  # plain tuples, whatever the application's factory
    for row in cur.execute("PRAGMA database_list").fetchall():
        if row[1] == "main":
            return str(row[2] or "")
    return ""  # pragma: no cover - every connection has a main database


def _autocommit(conn: sqlite3.Connection) -> bool:
    """True if the sqlite3 module opens no transaction of its own on this connection."""
    mode = getattr(conn, "autocommit", None)  # Python 3.12+: True, False or LEGACY (-1)
    if mode is True:
        return True
    if mode is False:
        return False  # PEP 249 mode: a transaction is always open
    return conn.isolation_level is None


@contextlib.contextmanager
def sqlite_savepoint(
    conn: Any, *, identity: tuple[int, int] | None, where: str
) -> Iterator[sqlite3.Connection]:
    """Check that *conn* is a sqlite3 connection to the queue's file and run the body in a
    savepoint of its transaction (opening one in the module's default mode, see the module
    doc)."""
    if not isinstance(conn, sqlite3.Connection):
        raise TypeError(
            f"conn must be a sqlite3.Connection to the queue's database, got {type(conn).__name__}"
        )
    if identity is None:
        raise ValueError(
            "enqueue_on needs a queue in a database file: another connection to ':memory:' "
            "is another database"
        )
    path = sqlite_file(conn)
    try:
        info = os.stat(path) if path else None
    except OSError:  # pragma: no cover - the connection holds the file open
        info = None
    if info is None or (info.st_dev, info.st_ino) != identity:
        raise ValueError(
            f"conn must be connected to the queue's database {where}, "
            f"but it is connected to {path or 'an in-memory database'}"
        )
    if not conn.in_transaction:
        if _autocommit(conn):
            raise ValueError(
                "conn has no transaction open and is in autocommit mode: enqueue_on would "
                "commit the item at once; run conn.execute('BEGIN IMMEDIATE') first and "
                "COMMIT with the business write"
            )
        level = (conn.isolation_level or "").upper()
        conn.execute("BEGIN EXCLUSIVE" if level == "EXCLUSIVE" else "BEGIN IMMEDIATE")
    conn.execute(f"SAVEPOINT {_SAVEPOINT}")
    try:
        yield conn
    except Exception:
        conn.execute(f"ROLLBACK TO {_SAVEPOINT}")
        conn.execute(f"RELEASE {_SAVEPOINT}")
        raise
    conn.execute(f"RELEASE {_SAVEPOINT}")


@contextlib.contextmanager
def psycopg_savepoint(
    conn: Any, *, schema: str | None, where: str
) -> Iterator[psycopg.Connection[Any]]:
    """Check that *conn* is a usable sync psycopg connection to a database holding the queue's
    schema and run the body in a savepoint of its transaction, on the queue's
    ``search_path`` (see the module doc)."""
    import psycopg

    if not isinstance(conn, psycopg.Connection):
        hint = (
            " (Trio programs use the sync psycopg.Connection, in a thread)"
            if isinstance(conn, psycopg.AsyncConnection)
            else ""
        )
        raise TypeError(f"conn must be a psycopg.Connection, got {type(conn).__name__}{hint}")
    with savepoint_on(conn, schema=schema, where=where) as inner:
        yield inner


@contextlib.contextmanager
def savepoint_on(conn: Any, *, schema: str | None, where: str) -> Iterator[Any]:
    """:func:`psycopg_savepoint` on *conn*, a sync psycopg connection or what stands for one
    (an asyncio connection driven from a thread, see ``_outside.py``)."""
    from psycopg.pq import TransactionStatus
    from psycopg.rows import dict_row

    status = conn.info.transaction_status
    if conn.closed or status == TransactionStatus.UNKNOWN:
        raise ValueError("conn is closed or broken")
    if status == TransactionStatus.INERROR:
        raise ValueError("conn's transaction has failed; roll it back before enqueueing")
    if status == TransactionStatus.ACTIVE:
        raise ValueError("conn is running another statement (one thread at a time)")
    if status == TransactionStatus.IDLE and conn.autocommit:
        raise ValueError(
            "conn has no transaction open and is in autocommit mode: enqueue_on would commit "
            "the item at once; call it inside `with conn.transaction():`"
        )
    # The first statement also opens the transaction of a non-autocommit connection, so
    # conn.transaction() below is a savepoint in it, never a transaction of its own.
    row = (
        conn.cursor(row_factory=dict_row)
        .execute(
            "SELECT current_setting('search_path') AS old, "
            "to_regclass(coalesce(%(schema)s || '.', '') || 'trio_supervise_items') "
            "IS NOT NULL AS present",
            {"schema": schema},
        )
        .fetchone()
    )
    assert row is not None
    if not row["present"]:
        place = "its search_path" if schema is None else f"schema {schema}"
        raise SchemaError(
            f"conn's database has no queue table in {place}: it must be connected to the "
            f"queue's database ({where})"
        )
    with conn.transaction():
        if schema is None:
            yield conn
        else:
            conn.execute("SELECT set_config('search_path', %(path)s, true)", {"path": schema})
            yield conn
            conn.execute("SELECT set_config('search_path', %(path)s, true)", {"path": row["old"]})
