"""PostgreSQL connections: opening them, their session, migrations, and mapping errors.

Every connection the queue opens is in autocommit with dict rows, its session in UTC and
``jsonb`` loaded as text (:func:`configure`). psycopg's errors become :class:`QueueUnavailable`
(the server cannot be reached: retry), :class:`QueueFailed` (authentication, permission,
read-only, missing database or schema: no retry helps) or :class:`QueueError`, with the
original chained; no password from the DSN reaches a message (see :func:`redact_dsn`).
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import trio

from ..._errors import QueueError, QueueFailed, QueueUnavailable, SchemaError
from .. import _sql
from .._sql import redact_dsn, scrub_dsn

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "QUERIES",
    "Row",
    "check_schema_name",
    "configure",
    "connect_kwargs",
    "data_errors",
    "map_any",
    "map_error",
    "mapped_errors",
    "migrate_connection",
    "migrate_dsn",
    "open_connection",
    "reads_text_json",
    "schema_version",
    "text_json",
]

QUERIES = _sql.load_queries("postgres")
_Q = QUERIES
Row = dict[str, Any]
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_UNAVAILABLE_STATES = {"57P01", "57P02", "57P03", "53300"}
_LOCK_NOT_AVAILABLE = "55P03"
"""A statement's ``lock_timeout`` passed (a caller's: see ``_postgres_pool.py``)."""
_PERMANENT_STATES = {"28000", "28P01", "42501", "25006", "3D000", "3F000"}
"""Authentication, privilege, read-only transaction, missing database or schema."""
_PERMANENT_TEXT = ("authentication failed", "permission denied", "does not exist")
"""The same, in libpq's words when the connection itself is refused (no SQLSTATE then)."""


def data_errors() -> tuple[type[Exception], ...]:
    """What one unstorable value raises: the entry is at fault, not the database."""
    import psycopg

    return (psycopg.DataError, psycopg.IntegrityError, ValueError, OverflowError)


def reads_text_json(conn: psycopg.Connection[Any]) -> bool:
    """Whether *conn* loads ``jsonb`` as text (:func:`text_json`): the queue's own do."""
    from psycopg.pq import Format
    from psycopg.types.string import TextLoader

    jsonb = conn.adapters.types.get("jsonb")
    return jsonb is not None and conn.adapters.get_loader(jsonb.oid, Format.TEXT) is TextLoader


def text_json(adapters: Any) -> None:
    """Load ``jsonb`` as its text on connections or cursors of *adapters*: the item decoders
    read it (``'{}'`` and ``'[]'``, the common values, without a parse), as on SQLite."""
    from psycopg.types.string import TextLoader

    adapters.register_loader("jsonb", TextLoader)


def configure(
    conn: psycopg.Connection[Any], *, lock_timeout: str | None = None, generic_plans: bool = False
) -> None:
    """Set up a new pool connection: its session in UTC, so psycopg loads every ``timestamptz``
    as a UTC datetime (``datetime.UTC``) that needs no conversion, whatever the server's
    ``TimeZone``, and ``jsonb`` loaded as its text (:func:`text_json`). No query of the queue
    depends on the session's time zone otherwise. Plain ``SET``\\ s rather than startup
    options, so connection poolers (PgBouncer) that refuse ``options`` still work (PgBouncer
    keeps them per client). With *lock_timeout* (``"10000ms"``), a statement waits no longer
    for a lock (a caller's connections: see ``_postgres_pool.py``).

    With *generic_plans* (the worker lane), every prepared statement runs its generic plan.
    PostgreSQL otherwise plans ``claim_due`` and ``next_due_at`` anew at every execution (a
    custom plan for the parameters' values, chosen because the generic plan's LIMIT and due
    times are estimated, not known), which cost more than executing them: about 0.6 ms of
    the server's CPU per claim of 64 rows against 1 ms of execution, and 0.75 ms per look at
    what is due against 0.3. Both statements' generic plans walk the same indexes in the same
    order as their custom ones (EXPLAIN EXECUTE, docs/benchmarks.md, issue 34)."""
    conn.execute("SET TimeZone TO 'UTC'")
    if lock_timeout is not None:
        conn.execute("SELECT set_config('lock_timeout', %s, false)", [lock_timeout])
    if generic_plans:
        conn.execute("SET plan_cache_mode TO force_generic_plan")
    text_json(conn.adapters)


def map_error(error: Exception, dsn: str) -> QueueError:
    """The project's exception for a psycopg (or pool) error; the caller chains *error*."""
    import psycopg
    import psycopg_pool

    where = redact_dsn(dsn)
    text = scrub_dsn(str(error), dsn)
    error.args = (text,)  # the caller chains *error*: its traceback must not show the password
    if isinstance(error, psycopg.errors.UndefinedTable):
        return SchemaError(
            f"PostgreSQL queue at {where} has no queue schema ({text}); "
            "run `trio-supervise migrate` first"
        )
    sqlstate = getattr(error, "sqlstate", None)
    if sqlstate in _PERMANENT_STATES or (
        isinstance(error, psycopg.OperationalError)
        and sqlstate is None
        and any(words in str(error) for words in _PERMANENT_TEXT)
    ):
        return QueueFailed(f"PostgreSQL queue at {where}: {text}")
    if sqlstate == _LOCK_NOT_AVAILABLE:
        return QueueUnavailable(
            "the PostgreSQL queue is busy: another transaction held a lock this call needs "
            f"for longer than the call may wait (connect_timeout), at {where}: {text}"
        )
    if isinstance(
        error, psycopg_pool.PoolTimeout | psycopg_pool.PoolClosed | psycopg.InterfaceError
    ):
        return QueueUnavailable(f"PostgreSQL queue at {where} is unavailable: {text}")
    if isinstance(error, psycopg.OperationalError) and (
        sqlstate is None or sqlstate.startswith("08") or sqlstate in _UNAVAILABLE_STATES
    ):
        return QueueUnavailable(f"PostgreSQL queue at {where} is unavailable: {text}")
    return QueueError(f"PostgreSQL queue at {where}: {text}")


def connect_kwargs(schema: str | None, connect_timeout: float) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "autocommit": True,
        "connect_timeout": max(2, math.ceil(connect_timeout)),
    }
    if schema is not None:
        kwargs["options"] = f"-c search_path={schema}"
    return kwargs


def schema_version(conn: psycopg.Connection[Row] | psycopg.Cursor[Row]) -> int:
    if not conn.execute(_Q["version_table_exists"]).fetchone()["present"]:  # type: ignore[index]
        return 0
    return int(conn.execute(_Q["schema_version"]).fetchone()["version"])  # type: ignore[index]


def migrate_connection(
    conn: psycopg.Connection[Row],
    *,
    where: str,
    schema: str | None = None,
    fresh: bool = True,
    upto: int | None = None,
) -> int:
    """Bring the schema on *conn* up to date, one transaction per step, under an advisory lock.

    Each step takes a transaction-scoped advisory lock keyed by the schema, so processes
    migrating at once take turns and each sees the others' work. An empty schema gets
    ``schema.sql`` in one step (``fresh=False`` replays the migrations instead); an older one
    gets its pending migrations in order, up to *upto* if given. Returns the version reached.
    """
    latest = _sql.latest_version("postgres")
    upto = latest if upto is None else upto
    while True:
        with conn.transaction():
            conn.execute(_Q["migration_lock"], {"schema": schema})
            if schema is not None:
                from psycopg import sql

                conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))
                )
            conn.execute(_Q["create_version_table"])
            row = conn.execute(_Q["schema_version"]).fetchone()
            current = int(row["version"])  # type: ignore[index]
            if current > latest:
                raise _sql.too_new(current, "postgres", where)
            if current >= upto:
                return current
            if current == 0 and fresh and upto == latest:
                conn.execute(_sql.schema_sql("postgres").encode())
                conn.execute(_Q["record_version"], {"version": latest})
                return latest
            migration = _sql.migrations("postgres")[current]
            conn.execute(migration.sql.encode())
            conn.execute(_Q["record_version"], {"version": migration.version})


def open_connection(
    dsn: str, *, schema: str | None = None, connect_timeout: float = 10.0
) -> psycopg.Connection[Row]:
    """One autocommit connection with dict rows (blocking; call it from a thread)."""
    import psycopg
    from psycopg.rows import dict_row

    return psycopg.connect(dsn, row_factory=dict_row, **connect_kwargs(schema, connect_timeout))


def check_schema_name(schema: str | None) -> str | None:
    """Refuse a schema name that is not a plain SQL identifier."""
    if schema is not None and not _SCHEMA_NAME.match(schema):
        raise ValueError(
            "schema must be a plain identifier (letters, digits, underscores; not starting "
            f"with a digit; at most 63 characters), got {schema!r}"
        )
    return schema


@contextlib.contextmanager
def mapped_errors(dsn: str) -> Iterator[None]:
    """Raise a psycopg or pool error of the block as ours (:func:`map_error`), the original
    chained; anything else propagates unchanged."""
    try:
        yield
    except Exception as error:
        mapped = map_any(error, dsn)
        if mapped is None:
            raise
        raise mapped from error


def map_any(error: Exception, dsn: str) -> QueueError | None:
    """Map a psycopg or pool error; None for anything else (which propagates unchanged)."""
    import psycopg
    import psycopg_pool

    if isinstance(error, psycopg.Error | psycopg_pool.PoolTimeout | psycopg_pool.PoolClosed):
        return map_error(error, dsn)
    return None


async def migrate_dsn(dsn: str, *, schema: str | None = None, connect_timeout: float = 10.0) -> int:
    """Bring the schema in the database at *dsn* up to date; returns the version reached."""
    check_schema_name(schema)
    where = redact_dsn(dsn) if schema is None else f"{redact_dsn(dsn)} (schema {schema})"

    def run() -> int:
        with open_connection(dsn, schema=schema, connect_timeout=connect_timeout) as conn:
            return migrate_connection(conn, where=where, schema=schema)

    with mapped_errors(dsn):
        return await trio.to_thread.run_sync(run)
