"""One way in from configuration: a URL names the backend and where its data lives.

=================================  =================================================
``memory://``                      :class:`MemoryQueue` (nothing stored; tests, demos)
``sqlite:///relative/path.db``     :class:`SQLiteQueue`, path relative to the cwd
``sqlite:////absolute/path.db``    :class:`SQLiteQueue`, absolute path
``postgresql://user@host/db``      :class:`PostgresQueue` (``postgres://`` too)
=================================  =================================================
"""

from __future__ import annotations

import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .._clock import Clock
from ._ports import (
    WorkQueue,
)
from ._sql import redact_dsn
from .memory import MemoryQueue

__all__ = ["DEFAULT_DATABASE_URL", "migrate", "open_queue", "parse_queue_url"]

DEFAULT_DATABASE_URL = "sqlite:///trio_supervise.db"
"""The queue used when nothing is configured: a SQLite file in the working directory."""

_RULE = (
    "a queue URL is 'memory://', 'sqlite:///relative/path.db', 'sqlite:////absolute/path.db' "
    "or 'postgresql://[user[:password]@]host[:port]/database' ('postgres://' too)"
)


def parse_queue_url(url: str) -> tuple[str, str]:
    """Split *url* into ``(backend, target)``: ``("memory", "")``, ``("sqlite", path)`` or
    ``("postgres", dsn)``. A URL that fits no rule raises :class:`ValueError` naming the rules.
    """
    if not isinstance(url, str):
        raise TypeError(f"url must be a string, got {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise ValueError(f"{redact_dsn(url)!r} is not a queue URL: {_RULE}")
    if scheme == "memory":
        if rest:
            raise ValueError(f"'memory://' takes nothing after the scheme: {_RULE}")
        return "memory", ""
    if scheme == "sqlite":
        if not rest.startswith("/") or len(rest) < 2:
            raise ValueError(f"{url!r} names no SQLite file: {_RULE}")
        path = urllib.parse.unquote(rest[1:])
        if "?" in path or "#" in path:
            raise ValueError(f"{url!r}: SQLite queue URLs take no query string: {_RULE}")
        return "sqlite", path
    if scheme in ("postgresql", "postgres"):
        return "postgres", url
    raise ValueError(f"unknown queue URL scheme {scheme!r} in {redact_dsn(url)!r}: {_RULE}")


@asynccontextmanager
async def open_queue(
    url: str = DEFAULT_DATABASE_URL,
    *,
    clock: Clock | None = None,
    migrate: bool | None = None,
    create: bool = True,
) -> AsyncIterator[WorkQueue]:
    """Open the queue that *url* names, and close it on the way out.

    :param clock: where "now" comes from. Defaults: Trio's clock for memory (so virtual time
        works), the system clock for SQLite, the database's ``now()`` for PostgreSQL.
    :param migrate: bring a missing or older schema up to date on open. The default (``None``)
        does so for SQLite, whose file belongs to the application, and not for PostgreSQL,
        where a shared database is migrated on purpose (``trio-supervise migrate``) and a
        missing schema raises :class:`SchemaError` saying so.
    :param create: with ``False`` (commands that only read) a SQLite file that does not exist
        raises :class:`QueueFailed` ("no database at PATH; run `trio-supervise migrate` to
        create it") instead of being created.
    """
    backend, target = parse_queue_url(url)
    queue: WorkQueue
    if backend == "memory":
        queue = MemoryQueue() if clock is None else MemoryQueue(clock=clock)
    elif backend == "sqlite":
        from .sql._sqlite import SQLiteQueue

        queue = await SQLiteQueue.connect(
            target, clock=clock, migrate=True if migrate is None else migrate, create=create
        )
    else:
        from .sql._postgres import PostgresQueue

        queue = await PostgresQueue.connect(target, clock=clock, migrate=bool(migrate))
    try:
        yield queue
    finally:
        await queue.aclose()


async def migrate(target: str | WorkQueue) -> int:
    """Apply pending schema migrations to the queue a URL (or an open queue) names.

    Safe to run from several processes at once, and idempotent. Returns the schema version
    reached (0 for the memory queue, which has no schema). A database whose schema is newer than
    this release knows raises :class:`SchemaError` and is left alone.
    """
    import trio

    from .sql import _postgres, _postgres_db, _sqlite, _sqlite_db

    if isinstance(target, str):
        backend, where = parse_queue_url(target)
    elif isinstance(target, _sqlite.SQLiteQueue):
        backend, where = "sqlite", target.path
    elif isinstance(target, _postgres.PostgresQueue):
        return await target.migrate()
    elif isinstance(target, MemoryQueue):
        backend, where = "memory", ""
    else:
        raise TypeError(f"cannot migrate a {type(target).__name__}")
    if backend == "memory":
        await trio.lowlevel.checkpoint()
        return 0
    if backend == "sqlite":
        return await _sqlite_db.migrate_path(where)
    return await _postgres_db.migrate_dsn(where)
