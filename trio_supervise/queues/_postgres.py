"""The PostgreSQL queue: many worker processes on many machines share one database.

Blocking psycopg calls run in threads (``trio.to_thread.run_sync``) on connections from a
``psycopg_pool.ConnectionPool``; a ``CapacityLimiter`` the size of the pool bounds how many run
at once, so no thread ever waits inside the pool. Status reads (``get``, ``list_items``,
``counts``, ``next_due_at``) have a small pool of their own (``read_pool_size``), so however
many status pages are open, claims, renewals and settlements always find a connection.

- Claims are one statement: a CTE picks the first claimable ids in ``(priority, due_at, id)``
  order ``FOR UPDATE SKIP LOCKED`` (concurrent claimers skip each other's rows instead of
  waiting) and an ``UPDATE ... RETURNING`` leases them. A partial index on
  ``(queue, priority, due_at, id)`` over the queued and running rows serves it. Rows with a
  concurrency key take a second, transactional path under advisory locks on their keys (see
  ``claim_keyed`` in ``queries.sql``), so two claimers never both count a key's slot free.
- Every write after a claim is fenced: the lease version (and, for renewals, the owner) is in
  the ``WHERE``. ``renew_many`` and ``settle_many`` are one ``UPDATE ... FROM unnest(...)``; a
  ``settle_many`` batch of a runner's settlements of items without a parent, none with
  children or waits, is that one statement in autocommit, its wake-ups sent by the statement
  itself (``settle_alone``); any other batch (a child's fan-in must commit with its settlement)
  takes a transaction, as every batch did before.
- Lease times come from the database's clock (``now()``) by default, so machines whose clocks
  disagree still agree on leases; pass ``clock=`` to inject one (tests), and its times are sent
  as parameters instead.
- Wake-ups: a write that makes work due now sends ``NOTIFY`` in its transaction; a dedicated
  connection in a thread ``LISTEN``\\ s and wakes :meth:`PostgresQueue.wait_for_work`. An
  enqueue's notification names the due item's queue and spec id (see :func:`_due_hint`), so a
  waiter serving both returns at once, without asking the database again what is due, and
  one that no waiter serves wakes nobody; every other notification (settlements, fan-in,
  retries, resumed queues, older versions of this library) makes the waiters look again. The
  listener reconnects when it drops (waking every waiter, since notifications may have been
  missed); the caller's poll interval is the fallback.

Errors from psycopg become :class:`QueueUnavailable` (the server cannot be reached: retry),
:class:`QueueFailed` (authentication, permission, read-only, missing database or schema: no
retry helps) or :class:`QueueError`, with the original chained. No password from the DSN
reaches a message or a log line: see :func:`redact_dsn`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import operator
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import attrs
import trio
import trio_util

from .._clock import Clock, SystemClock, utc
from .._errors import QueueError, QueueFailed, QueueUnavailable, SchemaError
from ..job import MAX_ERRORS, Lease, WorkItem
from ..job._model import BOOL, TIME
from . import _sql
from ._outbox import psycopg_savepoint
from ._ports import Capability, declared
from ._sql import redact_dsn, scrub_dsn
from ._sqlbase import PLAIN_VALUES, SettleEntry, SQLQueue, woken_by
from .sql._rows import NEW_ROW_COLUMNS, Codec, item_decoder

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

__all__ = ["PostgresQueue", "redact_dsn"]

logger = logging.getLogger("trio_supervise.queues")

_Q = _sql.load_queries("postgres")
_ENQUEUE_UNKEYED = _sql.without_conflict_clause(_Q["enqueue_many"])
_SETTLE_ALONE = _sql.with_query(_Q["settle_alone"], "settle_many", _Q["settle_many"])
_ARRAYS = tuple(f"{column}_array" for column in NEW_ROW_COLUMNS)
"""The ``enqueue_many`` query's array parameters, one per :data:`NEW_ROW_COLUMNS`, in order."""
_ID = NEW_ROW_COLUMNS.index("id")
_SAVEPOINT = "SAVEPOINT trio_supervise_claim"
_ROLLBACK_TO_SAVEPOINT = "ROLLBACK TO SAVEPOINT trio_supervise_claim"
"""Before the claim of a pipelined settle-and-claim, rolled back to when the settlement's
fan-in must run before the claim (see :meth:`PostgresQueue._settle_and_claim_in`)."""
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_CHANNEL = "trio_supervise"
_MAX_PAYLOAD = 8000
"""PostgreSQL refuses a ``NOTIFY`` payload of this many bytes or more."""
T = TypeVar("T")
Row = dict[str, Any]


_UNAVAILABLE_STATES = {"57P01", "57P02", "57P03", "53300"}
_RECONNECT_WAIT = 2.0
"""Seconds a call whose connection died waits for a fresh one before reporting the outage."""


_PERMANENT_STATES = {"28000", "28P01", "42501", "25006", "3D000", "3F000"}
"""Authentication, privilege, read-only transaction, missing database or schema."""
_PERMANENT_TEXT = ("authentication failed", "permission denied", "does not exist")
"""The same, in libpq's words when the connection itself is refused (no SQLSTATE then)."""
_MIN_TIME = dt.datetime(1, 1, 1, tzinfo=dt.UTC)
"""Before every stored time: the cursor of a first page."""


def _data_errors() -> tuple[type[Exception], ...]:
    """What one unstorable value raises: the entry is at fault, not the database."""
    import psycopg

    return (psycopg.DataError, psycopg.IntegrityError, ValueError, OverflowError)


_SETTLEMENT = operator.itemgetter(1)
_VALUES = operator.itemgetter(2)
_ITEM_ID = operator.attrgetter("item_id")
_LEASE_VERSION = operator.attrgetter("lease_version")
_KIND = operator.attrgetter("kind")
_ERROR = operator.attrgetter("error")
_AT = operator.itemgetter("at")
_CONFIG = operator.itemgetter("config")
_RESULT = operator.itemgetter("result")
_DELAY_US = operator.itemgetter("delay_us")

_CODEC = Codec(
    # psycopg loads a timestamptz as a UTC datetime in the pool's UTC sessions (see
    # _configure): kept as it is; one in another zone is converted, as WorkItem would.
    decode={TIME: "$value if $value.tzinfo is _UTC else _utc($value)", BOOL: "$value"},
    encode_time="_utc($value)",
    namespace={"_UTC": dt.UTC, "_utc": utc},
)
"""How stored values become an item's: JSON arrives as its text (the queue's connections load
``jsonb`` as text, see :func:`_configure`), read as on SQLite."""


def _reads_text_json(conn: psycopg.Connection[Any]) -> bool:
    """Whether *conn* loads ``jsonb`` as text (:func:`_text_json`): the queue's own do."""
    from psycopg.pq import Format
    from psycopg.types.string import TextLoader

    jsonb = conn.adapters.types.get("jsonb")
    return jsonb is not None and conn.adapters.get_loader(jsonb.oid, Format.TEXT) is TextLoader


def _text_json(adapters: Any) -> None:
    """Load ``jsonb`` as its text on connections or cursors of *adapters*: the item decoders
    read it (``'{}'`` and ``'[]'``, the common values, without a parse), as on SQLite."""
    from psycopg.types.string import TextLoader

    adapters.register_loader("jsonb", TextLoader)


def _configure(conn: psycopg.Connection[Any]) -> None:
    """Set up a new pool connection: its session in UTC, so psycopg loads every ``timestamptz``
    as a UTC datetime (``datetime.UTC``) that needs no conversion, whatever the server's
    ``TimeZone``, and ``jsonb`` loaded as its text (:func:`_text_json`). No query of the queue
    depends on the session's time zone otherwise. A plain
    ``SET`` rather than a startup option, so connection poolers (PgBouncer) that refuse
    ``options`` still work (PgBouncer keeps ``TimeZone`` per client)."""
    conn.execute("SET TimeZone TO 'UTC'")
    _text_json(conn.adapters)


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
    if isinstance(
        error, psycopg_pool.PoolTimeout | psycopg_pool.PoolClosed | psycopg.InterfaceError
    ):
        return QueueUnavailable(f"PostgreSQL queue at {where} is unavailable: {text}")
    if isinstance(error, psycopg.OperationalError) and (
        sqlstate is None or sqlstate.startswith("08") or sqlstate in _UNAVAILABLE_STATES
    ):
        return QueueUnavailable(f"PostgreSQL queue at {where} is unavailable: {text}")
    return QueueError(f"PostgreSQL queue at {where}: {text}")


def _connect_kwargs(schema: str | None, connect_timeout: float) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "autocommit": True,
        "connect_timeout": max(2, math.ceil(connect_timeout)),
    }
    if schema is not None:
        kwargs["options"] = f"-c search_path={schema}"
    return kwargs


def _schema_version(conn: psycopg.Connection[Row]) -> int:
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

    return psycopg.connect(dsn, row_factory=dict_row, **_connect_kwargs(schema, connect_timeout))


def check_schema_name(schema: str | None) -> str | None:
    """Refuse a schema name that is not a plain SQL identifier."""
    if schema is not None and not _SCHEMA_NAME.match(schema):
        raise ValueError(
            "schema must be a plain identifier (letters, digits, underscores; not starting "
            f"with a digit; at most 63 characters), got {schema!r}"
        )
    return schema


Hint = tuple[str, str]
"""A notification's word that work is due now: ``(queue, spec_id)``."""


def _due_payload(queue: str, spec_id: str) -> str:
    """The ``NOTIFY`` payload for an enqueued item due now: its queue and spec id, as a JSON pair
    (or the spec id alone, as other notifications send it, if the pair would be too long).

    The enqueue statement writes it in SQL (``enqueue_many`` in ``queries.sql``), byte for byte
    as this does: this is the format's definition for readers and tests."""
    payload = json.dumps([queue, spec_id], ensure_ascii=False, separators=(",", ":"))
    return payload if len(payload.encode()) < _MAX_PAYLOAD else spec_id


def _due_hint(payload: str) -> Hint | None:
    """The ``(queue, spec_id)`` a :func:`_due_payload` names; None for any other payload (a spec
    id, a queue name): the waiter then asks the database. A spec id that happens to look like a
    pair can only make a waiter return early, which :meth:`WorkQueue.wait_for_work` allows."""
    if not payload.startswith("["):
        return None
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    if type(value) is list and len(value) == 2 and all(type(part) is str for part in value):
        return value[0], value[1]
    return None


@attrs.define(eq=False)
class _Waiter:
    """One :meth:`PostgresQueue.wait_for_work` call: what it serves, and whether a notification
    said such work is due."""

    spec_ids: frozenset[str]
    queues: frozenset[str] | None
    due: bool = False


@attrs.define(eq=False)
class _Listener:
    """``LISTEN`` on a dedicated connection in a thread; reconnects when the connection drops.

    Each notification calls *wake* in Trio at once (``run_sync_soon``) with its hint (see
    :func:`_due_hint`), None when anything may have changed (the connection was just made)."""

    dsn: str
    schema: str | None
    channel: str
    token: trio.lowlevel.TrioToken
    wake: Callable[[Hint | None], None]
    stop: threading.Event = attrs.field(factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="trio_supervise-listen", daemon=True)
        self.thread.start()

    def _wake(self, hint: Hint | None) -> bool:
        try:
            self.token.run_sync_soon(self.wake, hint)
        except trio.RunFinishedError:
            return False
        return True

    def _run(self) -> None:
        import psycopg
        from psycopg import sql

        backoff = 0.5
        while not self.stop.is_set():
            try:
                with open_connection(self.dsn, schema=self.schema) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    backoff = 0.5
                    # Anything that happened before LISTEN took effect was missed: look again.
                    if not self._wake(None):
                        return
                    while not self.stop.is_set():
                        for notify in conn.notifies(timeout=0.2):
                            if not self._wake(_due_hint(notify.payload)):
                                return
            except psycopg.Error as error:
                if self.stop.is_set():
                    return
                logger.warning(
                    "queue LISTEN connection to %s failed (%s); reconnecting in %.1fs",
                    redact_dsn(self.dsn),
                    scrub_dsn(str(error), self.dsn),
                    backoff,
                )
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()


@attrs.define(eq=False, kw_only=True)
class PostgresQueue(SQLQueue):
    """The :class:`WorkQueue` protocol on PostgreSQL. Open it with :meth:`connect`."""

    _dsn: str = attrs.field(alias="dsn", repr=redact_dsn)
    _pool: ConnectionPool[Any] = attrs.field(alias="pool", repr=False)
    _db_clock: bool = attrs.field(alias="db_clock")
    _clock: Clock = attrs.field(alias="clock")
    _schema: str | None = attrs.field(alias="schema")
    _listen: bool = attrs.field(alias="listen")
    _limiter: trio.CapacityLimiter = attrs.field(alias="limiter")
    _read_pool: ConnectionPool[Any] = attrs.field(alias="read_pool", repr=False)
    _read_limiter: trio.CapacityLimiter = attrs.field(alias="read_limiter")
    _changes: trio_util.AsyncValue[int] = attrs.field(
        init=False, factory=lambda: trio_util.AsyncValue(0)
    )
    _listener: _Listener | None = attrs.field(init=False, default=None)
    _waiters: set[_Waiter] = attrs.field(init=False, factory=set)
    _closed: bool = attrs.field(init=False, default=False)

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        clock: Clock | None = None,
        schema: str | None = None,
        migrate: bool = False,
        pool_size: int = 10,
        read_pool_size: int = 2,
        connect_timeout: float = 10.0,
        listen: bool = True,
    ) -> PostgresQueue:
        """Connect to the queue in the database at *dsn* (a libpq URL or key/value string).

        :param clock: inject a clock for due times and leases (tests); by default the
            database's ``now()`` is used, so every machine agrees on leases.
        :param schema: keep the tables in this PostgreSQL schema (default: the ``search_path``).
        :param migrate: bring a missing or older schema up to date; otherwise such a schema
            raises :class:`SchemaError`. A newer schema than this release knows always does.
        :param pool_size: connections in the pool, and blocking calls in flight at once.
        :param read_pool_size: connections kept for status reads (``get``, ``list_items``,
            ``counts``, ``next_due_at``) apart from the pool, so reads never take a connection
            a renewal or settlement needs.
        :param connect_timeout: seconds to wait for a connection.
        :param listen: wake :meth:`wait_for_work` on ``NOTIFY`` (otherwise it polls).
        """
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, got {pool_size}")
        if read_pool_size < 1:
            raise ValueError(f"read_pool_size must be at least 1, got {read_pool_size}")
        if not (connect_timeout > 0) or connect_timeout == float("inf"):
            raise ValueError(f"connect_timeout must be a positive number, got {connect_timeout!r}")
        check_schema_name(schema)

        def open_sync() -> tuple[ConnectionPool[Any], ConnectionPool[Any]]:
            from psycopg_pool import ConnectionPool

            where = redact_dsn(dsn) if schema is None else f"{redact_dsn(dsn)} (schema {schema})"
            with open_connection(dsn, schema=schema, connect_timeout=connect_timeout) as conn:
                found = _schema_version(conn)
                latest = _sql.latest_version("postgres")
                if found > latest:
                    raise _sql.too_new(found, "postgres", where)
                if found < latest:
                    if not migrate:
                        raise _sql.missing(found, "postgres", where, redact_dsn(dsn))
                    migrate_connection(conn, where=where, schema=schema)
            from psycopg.rows import dict_row

            def new_pool(name: str, size: int) -> ConnectionPool[Any]:
                return ConnectionPool(
                    dsn,
                    kwargs={"row_factory": dict_row, **_connect_kwargs(schema, connect_timeout)},
                    configure=_configure,
                    min_size=1,
                    max_size=size,
                    open=False,
                    name=name,
                    timeout=connect_timeout,
                )

            pool, read_pool = (
                new_pool("trio_supervise", pool_size),
                new_pool("trio_supervise-read", read_pool_size),
            )
            with contextlib.ExitStack() as on_failure:
                for each in (pool, read_pool):
                    on_failure.callback(each.close)
                    each.open(wait=True, timeout=connect_timeout)
                on_failure.pop_all()
            return pool, read_pool

        try:
            pool, read_pool = await trio.to_thread.run_sync(open_sync)
        except Exception as error:
            if isinstance(error, QueueError):
                raise
            mapped = _map_any(error, dsn)
            if mapped is None:
                raise
            raise mapped from error
        return cls(
            dsn=dsn,
            pool=pool,
            db_clock=clock is None,
            clock=SystemClock() if clock is None else clock,
            schema=schema,
            listen=listen,
            limiter=trio.CapacityLimiter(pool_size),
            read_pool=read_pool,
            read_limiter=trio.CapacityLimiter(read_pool_size),
        )

    @property
    def clock(self) -> Clock:
        """The injected clock; in database-clock mode, the local clock (close to the database's)."""
        return self._clock

    @property
    def channel(self) -> str:
        """The ``LISTEN``/``NOTIFY`` channel: one per schema."""
        return _CHANNEL if self._schema is None else f"{_CHANNEL}:{self._schema}"

    async def __aenter__(self) -> PostgresQueue:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- internals ---------------------------------------------------------------------------

    def _now(self) -> dt.datetime | None:
        return None if self._db_clock else utc(self._clock.now())

    async def _run(
        self,
        fn: Callable[[psycopg.Connection[Row]], T],
        *,
        retry: bool = True,
        read: bool = False,
    ) -> T:
        """Run *fn* on a pooled connection in a thread (from the read pool, with *read*).

        When the connection turns out to be dead (the server restarted, or an administrator
        terminated it while it sat in the pool), the pool's other idle connections are likely
        dead too: they are checked and replaced, and *fn* runs once more on a fresh connection,
        waited for at most ``_RECONNECT_WAIT`` seconds (a server that is down is reported as
        :class:`QueueUnavailable` soon, so the runner backs off and its health shows why).
        Only for calls that may safely run twice (*retry*): reads, and writes that are fenced or
        idempotent. A connection that dies mid-call leaves its transaction rolled back, unless
        the commit itself was lost in flight, which is why ``enqueue`` and ``mark_error`` pass
        ``retry=False``.
        """
        if self._closed:
            raise QueueError(f"the PostgreSQL queue at {redact_dsn(self._dsn)} is closed")

        pool, limiter = (
            (self._read_pool, self._read_limiter) if read else (self._pool, self._limiter)
        )

        def call() -> T:
            import psycopg

            with pool.connection() as conn:
                try:
                    return fn(conn)
                except psycopg.OperationalError:
                    if not (retry and conn.broken):
                        raise
            pool.check()
            with pool.connection(timeout=_RECONNECT_WAIT) as conn:
                return fn(conn)

        try:
            return await trio.to_thread.run_sync(call, limiter=limiter)
        except Exception as error:
            mapped = _map_any(error, self._dsn)
            if mapped is None:
                raise
            raise mapped from error

    @contextlib.contextmanager
    def _outbox(self, conn: Any) -> Iterator[psycopg.Connection[Row]]:
        if self._closed:
            raise QueueError(f"the PostgreSQL queue at {redact_dsn(self._dsn)} is closed")
        where = redact_dsn(self._dsn)
        if self._schema is not None:
            where = f"{where}, schema {self._schema}"
        try:
            with psycopg_savepoint(conn, schema=self._schema, where=where) as conn:
                yield conn
        except Exception as error:
            mapped = _map_any(error, self._dsn)
            if mapped is None:
                raise
            raise mapped from error

    def _notify(self, conn: psycopg.Connection[Row], spec_ids: Sequence[str]) -> None:
        if spec_ids:
            conn.execute(_Q["notify"], {"channel": self.channel, "spec_ids": sorted(set(spec_ids))})

    # -- the dialect (see _sqlbase) ------------------------------------------------------

    _queries: ClassVar[Mapping[str, str]] = _Q
    _declared: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.SETTLE_AND_CLAIM, Capability.TRANSACTIONAL_ENQUEUE}
    )

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What this store does beyond its ports (see :class:`Capability`)."""
        return declared(type(self), self._declared)

    def _clock_now(self) -> dt.datetime:
        return self._clock.now()

    _backend: ClassVar[_sql.Backend] = "postgres"
    _first_cursor: ClassVar[dt.datetime] = _MIN_TIME

    @staticmethod
    @contextlib.contextmanager
    def _snapshot(conn: psycopg.Connection[Row]) -> Iterator[None]:
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield

    @staticmethod
    def _transaction(conn: psycopg.Connection[Row]) -> contextlib.AbstractContextManager[Any]:
        return conn.transaction()

    @staticmethod
    def _write(conn: psycopg.Connection[Row]) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    _time = staticmethod(utc)

    @staticmethod
    def _from_time(value: dt.datetime) -> dt.datetime:
        return value

    _codec: ClassVar[Codec] = _CODEC

    @staticmethod
    def _columns(cur: psycopg.Cursor[Any]) -> tuple[str, ...]:
        return _columns(cur)

    @staticmethod
    def _ids(values: Sequence[str]) -> list[str]:
        return list(values)

    def _is_duplicate(self, error: Exception) -> bool:
        import psycopg

        return isinstance(error, psycopg.errors.UniqueViolation)

    def _data_errors(self) -> tuple[type[Exception], ...]:
        return _data_errors()

    def _cursor(self, conn: psycopg.Connection[Any]) -> psycopg.Cursor[Row]:
        from psycopg.rows import dict_row

        cur = conn.cursor(row_factory=dict_row)
        if not _reads_text_json(conn):  # the application's connection (enqueue_on)
            _text_json(cur.adapters)
        return cur

    def _insert_rows(
        self,
        cur: psycopg.Cursor[Row],
        rows: Sequence[tuple[Any, ...]],
        now: dt.datetime | None,
        *,
        keyed: bool,
        notify: bool,
    ) -> tuple[int, dt.datetime]:
        # One array per column (the rows transposed), but a column with one value in every
        # row goes as an empty array and that value (see the query); ids always whole. The
        # statement returns the stored now() and sends the wake-ups itself: one round trip.
        arrays: dict[str, Any] = {"now": now, "channel": self.channel if notify else None}
        columns = zip(*rows, strict=True)
        named = zip(NEW_ROW_COLUMNS, _ARRAYS, columns, strict=True)
        for n, (name, array, column) in enumerate(named):
            first = column[0]
            if n != _ID and column.count(first) == len(column):  # the ids always go whole
                arrays[name], arrays[array] = first, []
            else:
                arrays[name], arrays[array] = None, list(column)
        query = _Q["enqueue_many"] if keyed else _ENQUEUE_UNKEYED
        row = cur.execute(query, arrays).fetchone()
        assert row is not None
        return row["inserted"], utc(row["now"])

    # The claims return WorkItems, decoded in the thread (see _claimed).

    def _claim_rows(self, conn: psycopg.Connection[Row], params: dict[str, Any]) -> list[Any]:
        # The fast path: one autocommit statement leases the window's unkeyed rows and says how
        # many keyed ones it saw (a row with a NULL id when it leased none).
        claimed, keyed = _claimed(_claim_cursor(conn).execute(_Q["claim_due"], params, binary=True))
        left = params["limit"] - len(claimed)
        if not keyed or left <= 0:
            return claimed
        return claimed + self._claim_keyed(conn, {**params, "limit": left})

    @staticmethod
    def _claim_keyed(conn: psycopg.Connection[Row], params: dict[str, Any]) -> list[Any]:
        # The keyed path: lock the window's keys (try-locks, held to commit), then claim in a
        # statement whose snapshot starts after the locks: see claim_keys and claim_keyed.
        with conn.transaction():
            keys = [row["key"] for row in conn.execute(_Q["claim_keys"], params)]
            if not keys:
                return []
            cur = _claim_cursor(conn).execute(
                _Q["claim_keyed"], {**params, "keys": keys}, binary=True
            )
            return _claimed(cur)[0]

    def _renew_rows(
        self, conn: psycopg.Connection[Row], leases: Sequence[Lease], lease_us: int, now: Any
    ) -> list[Row]:
        params = {
            "ids": [each.item_id for each in leases],
            "versions": [each.version for each in leases],
            "owners": [each.worker_id for each in leases],
            "lease_us": lease_us,
            "now": now,
        }
        return conn.execute(_Q["renew_many"], params).fetchall()

    @staticmethod
    def _settle_params(entries: Sequence[SettleEntry], now: Any) -> dict[str, Any]:
        # Each column is read out by one C loop (map), and the four every entry fills go as
        # array literals built by one join each (see _text_array, _int_array): psycopg's list
        # dumpers walk a list in Python, about 0.3 us a value. A column of NULLs (most
        # batches: no reschedule time, config, error or result) goes as NULL, which unnest
        # pads like an empty array: nothing to dump (see the query).
        sent = list(map(_SETTLEMENT, entries))
        values = list(map(_VALUES, entries))
        delays_us: str | list[int]
        ats: list[Any] | None
        configs: list[Any] | None
        results: list[Any] | None
        if values.count(PLAIN_VALUES) == len(values):
            ats = configs = results = None
            delays_us = "{" + ",".join(["0"] * len(values)) + "}"
        else:
            ats = _nulls_none(list(map(_AT, values)))
            configs = _nulls_none(list(map(_CONFIG, values)))
            results = _nulls_none(list(map(_RESULT, values)))
            delays_us = _int_array(list(map(_DELAY_US, values)))
        return {
            "ids": _text_array(list(map(_ITEM_ID, sent))),
            "versions": _int_array(list(map(_LEASE_VERSION, sent))),
            "kinds": _text_array(list(map(_KIND, sent))),
            "delays_us": delays_us,
            "ats": ats,
            "configs": configs,
            "errors": _nulls_none(list(map(_ERROR, sent))),
            "results": results,
            "now": now,
            "max_errors": MAX_ERRORS,
        }

    def _settle_sync(
        self,
        conn: psycopg.Connection[Row],
        entries: Sequence[SettleEntry],
        now: Any,
        children: bool,
        *,
        why: bool,
    ) -> set[int]:
        # A runner's batch of items without a parent (Settlement._parentless), without
        # children or waits, that wants no reason for a refusal: one statement in autocommit
        # (see settle_alone), all or nothing. A value the database refuses fails it, and the
        # general way writes the batch (entry by entry, so that entry alone becomes dead).
        if children or why or not all(s._parentless for _, s, _ in entries):
            return super()._settle_sync(conn, entries, now, children, why=why)
        params = {**self._settle_params(entries, now), "channel": self.channel}
        try:
            row = conn.execute(_SETTLE_ALONE, params).fetchone()
        except self._data_errors():
            return super()._settle_sync(conn, entries, now, children, why=False)
        assert row is not None
        return {entries[n - 1][0] for n in row["ords"] or ()}

    def _settle_rows(
        self, conn: psycopg.Connection[Row], entries: Sequence[SettleEntry], now: Any
    ) -> list[Row]:
        return conn.execute(_Q["settle_many"], self._settle_params(entries, now)).fetchall()

    def _claim_in(self, conn: psycopg.Connection[Row], params: dict[str, Any]) -> list[Any]:
        return self._claim_rows(conn, params)

    def _settle_and_claim_in(
        self,
        conn: psycopg.Connection[Row],
        entries: Sequence[SettleEntry],
        now: Any,
        children: bool,
        params: dict[str, Any],
    ) -> tuple[set[int], list[Any]]:
        if children:
            # Children are written entry by entry, reading as they go: the general way.
            return super()._settle_and_claim_in(conn, entries, now, children, params)
        # One transaction, pipelined: BEGIN, the settlement and the claim go out together (one
        # round trip), the wake-ups and COMMIT together (another), and the batch costs one
        # commit (one WAL flush) instead of two. The claim sees the settlement (same
        # transaction), so it leaves the settled rows alone: they are no longer claimable.
        with conn.pipeline(), conn.transaction():
            settling = conn.execute(_Q["settle_many"], self._settle_params(entries, now))
            conn.execute(_SAVEPOINT)
            claiming = _claim_cursor(conn).execute(_Q["claim_due"], params, binary=True)
            rows = settling.fetchall()
            claimed, keyed = _claimed(claiming)
            due = woken_by(rows)
            if rows and any(row["parent_id"] is not None for row in rows):
                # A child finished: its fan-in may make its parent due, and the claim must see
                # that, as it sees every other effect of the settlement. Undo the claim, count
                # the children, claim again.
                conn.execute(_ROLLBACK_TO_SAVEPOINT)
                due.extend(self._children_and_fan_in(conn, entries, rows, now))
                claiming = _claim_cursor(conn).execute(_Q["claim_due"], params, binary=True)
                claimed, keyed = _claimed(claiming)
            self._notify(conn, due)
            left = params["limit"] - len(claimed)
            if keyed and left > 0:
                claimed += self._claim_keyed(conn, {**params, "limit": left})
        return {entries[row["ord"] - 1][0] for row in rows}, claimed

    def _set_parents(
        self, conn: psycopg.Connection[Row], children: Sequence[dict[str, Any]]
    ) -> None:
        params = {
            "ids": [child["id"] for child in children],
            "parent_ids": [child["parent_id"] for child in children],
            "parent_versions": [child["parent_version"] for child in children],
        }
        conn.execute(_Q["set_parents"], params)

    def _fan_in(
        self, conn: psycopg.Connection[Row], item_ids: Sequence[str], now: Any
    ) -> list[str]:
        rows = conn.execute(_Q["fan_in"], {"ids": list(item_ids), "now": now}).fetchall()
        return [row["spec_id"] for row in rows if row["due_now"]]

    def _before_wait(self) -> None:
        self._start_listener()

    def _notified(self, hint: Hint | None) -> None:
        """A notification arrived (the listener calls this in Trio). One naming a queue and spec
        id marks the waiters serving them due and wakes the waiters, or, if none serves them,
        nobody (it says nothing about other work); any other wakes every waiter to look again."""
        if hint is not None:
            queue, spec_id = hint
            named = False
            for waiter in self._waiters:
                if spec_id in waiter.spec_ids and (waiter.queues is None or queue in waiter.queues):
                    waiter.due = named = True
            if not named:
                return
        self._changed()

    async def wait_for_work(
        self, spec_ids: Sequence[str], *, queues: Sequence[str] | None = None
    ) -> None:
        # The shared loop (see SQLQueue.wait_for_work), but a notification naming a served queue
        # and spec id ends the wait at once: the claim that follows is the look it would take.
        self._before_wait()
        waiter = _Waiter(frozenset(spec_ids), None if queues is None else frozenset(queues))
        self._waiters.add(waiter)
        try:
            # A mark during the query also moved the generation: the wait below returns at once.
            while not waiter.due:
                generation = self._changes.value
                at, wait, _ = await self._next_due(spec_ids, queues)
                if at is not None and wait <= 0:
                    return
                with trio.move_on_after(math.inf if at is None else wait):
                    await self._wait_changed(generation, None)
        finally:
            self._waiters.discard(waiter)

    def _start_listener(self) -> None:
        if self._listen and self._listener is None and not self._closed:
            self._listener = _Listener(
                dsn=self._dsn,
                schema=self._schema,
                channel=self.channel,
                token=trio.lowlevel.current_trio_token(),
                wake=self._notified,
            )
            self._listener.start()

    async def migrate(self) -> int:
        """Apply pending migrations through this queue's pool; returns the version reached."""
        where = redact_dsn(self._dsn)
        return await self._run(
            lambda conn: migrate_connection(conn, where=where, schema=self._schema)
        )

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        listener, self._listener = self._listener, None
        pools = (self._pool, self._read_pool)

        def close() -> None:
            if listener is not None:
                listener.close()
            for pool in pools:
                pool.close()

        await trio.to_thread.run_sync(close)


def _claim_cursor(conn: psycopg.Connection[Any]) -> psycopg.Cursor[tuple[Any, ...]]:
    """A cursor for a claim: rows as tuples, for :func:`_claimed` (asked for in binary: the
    times travel as 8 bytes instead of 30 characters formatted and parsed)."""
    from psycopg.rows import tuple_row

    return conn.cursor(row_factory=tuple_row)


def _claimed(cur: psycopg.Cursor[tuple[Any, ...]]) -> tuple[list[WorkItem], int]:
    """The items a claim statement on *cur* leased, and its ``keyed`` count (0 without one).

    ``claim_due`` returns one row with a NULL id when it leased nothing (for its count)."""
    rows = cur.fetchall()
    if not rows:
        return [], 0
    columns = _columns(cur)
    decode = item_decoder(columns, _CODEC)
    id_at = columns.index("id")
    keyed = rows[0][columns.index("keyed")] if "keyed" in columns else 0
    return [decode(row) for row in rows if row[id_at] is not None], keyed


def _columns(cur: psycopg.Cursor[Any]) -> tuple[str, ...]:
    result = cur.pgresult
    assert result is not None
    return tuple(result.fname(n).decode() for n in range(result.nfields))  # type: ignore[union-attr]


def _nulls_none(values: list[Any]) -> list[Any] | None:
    """*values*, or None if every one is None (``unnest`` pads a NULL array with NULLs, as an
    empty one)."""
    return values if values.count(None) != len(values) else None


def _text_array(values: list[str]) -> str | list[str]:
    """*values* as a PostgreSQL array literal, for a ``%s::text[]`` parameter: every value in
    double quotes, so only a quote or a backslash needs escaping, and those are rare (item
    ids): one join, and a count that finds them. A value that is not text is left to psycopg
    (the list itself), which refuses it as it always has."""
    if not values:
        return "{}"
    try:
        joined = '","'.join(values)
    except TypeError:
        return values
    if joined.count('"') != 2 * (len(values) - 1) or "\\" in joined:
        joined = '","'.join(value.replace("\\", "\\\\").replace('"', '\\"') for value in values)
    return '{"' + joined + '"}'


def _int_array(values: list[int]) -> str | list[int]:
    """*values* as a PostgreSQL array literal, for a ``%s::bigint[]`` parameter: the list's repr
    (digits written by C, whitespace that the array's parser skips), or one value repeated (a
    batch's delays, mostly); a list holding anything but ints is left to psycopg, as
    :func:`_text_array`."""
    if not values:
        return "{}"
    if set(map(type, values)) != {int}:
        return values
    first = values[0]
    if values.count(first) == len(values):
        return "{" + ",".join([str(first)] * len(values)) + "}"
    return "{" + repr(values)[1:-1] + "}"


def _map_any(error: Exception, dsn: str) -> QueueError | None:
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

    try:
        return await trio.to_thread.run_sync(run)
    except Exception as error:
        mapped = _map_any(error, dsn)
        if mapped is None:
            raise
        raise mapped from error
