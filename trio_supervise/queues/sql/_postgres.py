"""The PostgreSQL queue: many worker processes on many machines share one database.

:class:`PostgresQueue` is the SQL layer's ports on PostgreSQL: blocking psycopg calls in threads,
on connections pooled by lane (``_postgres_pool.py``); a claim as one ``FOR UPDATE SKIP LOCKED``
statement (keyed rows on a second path under advisory locks: ``claim_keyed`` in
``queries.sql``); a runner's plain settlement batch as one autocommit statement
(``settle_alone``), any other in a transaction with its children and fan-in; "now" from the
database's clock unless a clock is injected. Connections, migrations and errors are
``_postgres_db.py``, wake-ups ``_postgres_listen.py``; the contract is in ``docs/queues.md``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import attrs
import trio
import trio_util

from ..._clock import Clock, StepGuard, SystemClock, WallClock
from ..._errors import QueueError
from ...job import Lease, WorkItem, cap_of
from .. import _sql
from .._ports import Capability
from .._sql import redact_dsn
from ._base import Lane
from ._durable import JournalWrites
from ._key_rates import KeyCaps
from ._outbox import psycopg_savepoint
from ._postgres_arrays import int_array, nulls_none, settle_params, text_array
from ._postgres_db import (
    QUERIES,
    Row,
    check_schema_name,
    data_errors,
    mapped_errors,
    migrate_connection,
    open_connection,
    schema_version,
)
from ._postgres_enqueue import _CODEC, PostgresEnqueue, column_names
from ._postgres_listen import Wakeups
from ._postgres_pool import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_POOL_SIZE,
    DEFAULT_READ_POOL_SIZE,
    DEFAULT_WORKER_POOL_SIZE,
    Lanes,
    check_pool_options,
)
from ._queue import SQLQueue
from ._rows import item_decoder
from ._settle import SettleEntry, woken_by

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresQueue"]

_Q = QUERIES
_SETTLE_ALONE = _sql.with_query(_Q["settle_alone"], "settle_many", _Q["settle_many"])
_SAVEPOINT = "SAVEPOINT trio_supervise_claim"
_ROLLBACK_TO_SAVEPOINT = "ROLLBACK TO SAVEPOINT trio_supervise_claim"
"""Before the claim of a pipelined settle-and-claim, rolled back to when the settlement's
fan-in must run before the claim (see :meth:`PostgresQueue._settle_and_claim_in`)."""
T = TypeVar("T")
_MIN_TIME = dt.datetime(1, 1, 1, tzinfo=dt.UTC)
"""Before every stored time: the cursor of a first page."""


@attrs.define(eq=False, kw_only=True)
class PostgresQueue(PostgresEnqueue, SQLQueue):
    """The :class:`WorkQueue` protocol on PostgreSQL. Open it with :meth:`connect`."""

    _dsn: str = attrs.field(alias="dsn", repr=redact_dsn)
    _notifies_wakeups: ClassVar[bool] = True
    _lanes: Lanes = attrs.field(alias="lanes", repr=False)
    _db_clock: bool = attrs.field(alias="db_clock")
    _clock: Clock = attrs.field(alias="clock")
    _guard: StepGuard | None = attrs.field(init=False)
    _schema: str | None = attrs.field(alias="schema")
    _listen: bool = attrs.field(alias="listen")
    _changes: trio_util.AsyncValue[int] = attrs.field(
        init=False, factory=lambda: trio_util.AsyncValue(0)
    )
    _closed: bool = attrs.field(init=False, default=False)
    _journal_writes: JournalWrites = attrs.field(init=False, factory=JournalWrites)
    _wakeups: Wakeups = attrs.field(init=False)

    @_guard.default
    def _new_guard(self) -> StepGuard | None:
        # The database's clock (the default) is one clock for the whole fleet: no guard.
        clock = self._clock
        if self._db_clock or not isinstance(clock, WallClock):
            return None
        return StepGuard(clock)

    @_wakeups.default
    def _new_wakeups(self) -> Wakeups:
        return Wakeups(
            dsn=self._dsn,
            schema=self._schema,
            channel=self.channel,
            changed=self._changed,
            listen=self._listen,
        )

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        clock: Clock | None = None,
        schema: str | None = None,
        migrate: bool = False,
        pool_size: int = DEFAULT_POOL_SIZE,
        worker_pool_size: int = DEFAULT_WORKER_POOL_SIZE,
        read_pool_size: int = DEFAULT_READ_POOL_SIZE,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        listen: bool = True,
    ) -> PostgresQueue:
        """Connect to the queue in the database at *dsn* (a libpq URL or key/value string).

        :param clock: inject a clock for due times and leases (tests); by default the
            database's ``now()`` is used, so every machine agrees on leases.
        :param schema: keep the tables in this PostgreSQL schema (default: the ``search_path``).
        :param migrate: bring a missing or older schema up to date; otherwise such a schema
            raises :class:`SchemaError`. A newer schema than this release knows always does.
        :param pool_size: connections for the callers' writes (enqueues, an operator's
            actions, upkeep), and their calls in flight at once.
        :param worker_pool_size: connections for the worker port alone (claims, renewals,
            settlements), so no caller ever takes one a renewal needs; opened as needed.
        :param read_pool_size: connections kept for status reads (``get``, ``list_items``,
            ``counts``, ``list_queues``), so reads never take a connection a write needs.
        :param connect_timeout: the longest a caller (not the worker port) waits: for a
            connection, then for any lock its statements need; past it, the call raises
            :class:`QueueUnavailable` saying which. Also the timeout of opening a connection.
        :param listen: wake :meth:`wait_for_work` on ``NOTIFY`` (otherwise it polls).
        """
        check_pool_options(
            pool_size=pool_size,
            worker_pool_size=worker_pool_size,
            read_pool_size=read_pool_size,
            connect_timeout=connect_timeout,
        )
        check_schema_name(schema)

        def open_sync() -> Lanes:
            where = redact_dsn(dsn) if schema is None else f"{redact_dsn(dsn)} (schema {schema})"
            with open_connection(dsn, schema=schema, connect_timeout=connect_timeout) as conn:
                found = schema_version(conn)
                if _sql.to_migrate(found, "postgres", where, redact_dsn(dsn), migrate=migrate):
                    migrate_connection(conn, where=where, schema=schema)
            return Lanes.open(
                dsn,
                schema=schema,
                pool_size=pool_size,
                worker_pool_size=worker_pool_size,
                read_pool_size=read_pool_size,
                connect_timeout=connect_timeout,
            )

        with mapped_errors(dsn):
            lanes = await trio.to_thread.run_sync(open_sync)
        return cls(
            dsn=dsn,
            lanes=lanes,
            db_clock=clock is None,
            clock=SystemClock() if clock is None else clock,
            schema=schema,
            listen=listen,
        )

    # -- internals ---------------------------------------------------------------------------

    async def _run(
        self,
        fn: Callable[[psycopg.Connection[Row]], T],
        *,
        lane: Lane = Lane.WORKER,
        retry: bool = True,
    ) -> T:
        """Run *fn* on a connection of *lane* in a thread (see :meth:`Lanes.run`)."""
        if self._closed:
            raise QueueError(f"the PostgreSQL queue at {redact_dsn(self._dsn)} is closed")
        return await self._lanes.run(fn, lane, retry)

    @contextlib.contextmanager
    def _outbox(self, conn: Any) -> Iterator[psycopg.Connection[Row]]:
        if self._closed:
            raise QueueError(f"the PostgreSQL queue at {redact_dsn(self._dsn)} is closed")
        where = redact_dsn(self._dsn)
        if self._schema is not None:
            where = f"{where}, schema {self._schema}"
        with (
            mapped_errors(self._dsn),
            psycopg_savepoint(conn, schema=self._schema, where=where) as conn,
        ):
            yield conn

    # -- the dialect's hooks (see _base.py and the ports) --------------------------------

    _declared: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.SETTLE_AND_CLAIM,
            Capability.TRANSACTIONAL_ENQUEUE,
            Capability.RATE_LIMITS,
            Capability.KEY_RATE_LIMITS,
            Capability.AUDIT_TRAIL,
            Capability.ERROR_HISTORY,
            Capability.DURABLE_JOURNAL,
        }
    )

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

    @staticmethod
    def _data_errors() -> tuple[type[Exception], ...]:
        return data_errors()

    # The claims return WorkItems, decoded in the thread (see _claimed).

    def _claim_rows(self, conn: psycopg.Connection[Row], params: dict[str, Any]) -> list[Any]:
        # The fast path: one autocommit statement leases the window's unkeyed rows and says how
        # many keyed ones it saw (a row with a NULL id when it leased none).
        claimed, keyed, rated = _claimed(
            _claim_cursor(conn).execute(_Q["claim_due"], params, binary=True)
        )
        if rated:
            return self._claim_rated_path(conn, params)
        left = params["limit"] - len(claimed)
        if not keyed or left <= 0:
            return claimed
        return claimed + self._claim_keyed(conn, {**params, "limit": left})

    def _claim_rated_path(
        self, conn: psycopg.Connection[Row], params: dict[str, Any]
    ) -> list[WorkItem]:
        # A rate-limited queue: under its limit's row lock (lock_rate), the claim as ever with
        # rated set (keyed rows too), then the starts recorded; one transaction.
        def claim(rated: dict[str, Any]) -> list[WorkItem]:
            rated = {**rated, "rated": True}
            cur = _claim_cursor(conn).execute(_Q["claim_due"], rated, binary=True)
            claimed, keyed, _ = _claimed(cur)
            left = rated["limit"] - len(claimed)
            if keyed and left > 0:
                claimed += self._claim_keyed(conn, {**rated, "limit": left})
            return claimed

        with conn.transaction():
            row = conn.execute(_Q["lock_rate"], params).fetchone()
            if row is None:  # the limit was lifted meanwhile: the next claim takes them
                return []
            now = row["now"] if params["now"] is None else self._now_under_lock(params["now"])
            return self._claim_rated(conn, params, self._rate(row), list(row["starts"]), now, claim)

    @staticmethod
    def _starts_of(value: list[dt.datetime]) -> list[dt.datetime]:
        return list(value)

    @staticmethod
    def _starts_value(starts: Sequence[dt.datetime]) -> list[dt.datetime]:
        return list(starts)

    def _claim_keyed(self, conn: psycopg.Connection[Row], params: dict[str, Any]) -> list[Any]:
        # The keyed path: lock the window's keys (try-locks, held to commit), then claim in a
        # statement whose snapshot starts after the locks: see claim_keys and claim_keyed.
        # With key rate limits, the locked keys' logs are read under those locks and each key
        # claims no more than its window lets start (key_caps), then its starts are written.
        with conn.transaction():
            rows = conn.execute(_Q["claim_keys"], params).fetchall()
            keys = [row["key"] for row in rows]
            caps: KeyCaps = {}
            now = params["now"]
            if rows and rows[0]["key_rated"]:
                params = {**params, "now": self._now_under_lock(params["now"])}
                caps, now = self._key_caps(conn, keys, params)
                keys = [key for key in keys if cap_of(caps, key) > 0]
            if not keys:
                return []
            # With key rates the claim is at the time they were judged by, so its items'
            # updated_at are their starts as the keys' logs record them.
            keyed = {**params, "now": now, "keys": keys}
            if caps:
                keyed["key_caps"] = json.dumps(self._caps_value(caps))
            claimed = _claimed(_claim_cursor(conn).execute(_Q["claim_keyed"], keyed, binary=True))[
                0
            ]
            if caps:
                self._record_key_starts(conn, caps, claimed)
            return claimed

    def _renew_rows(
        self,
        conn: psycopg.Connection[Row],
        leases: Sequence[Lease],
        lease_us: int,
        now: Any,
        lease_now: Any,
    ) -> list[Row]:
        params = {
            "ids": [each.item_id for each in leases],
            "versions": [each.version for each in leases],
            "owners": [each.worker_id for each in leases],
            "lease_us": lease_us,
            "now": now,
            "lease_now": lease_now,
        }
        return conn.execute(_Q["renew_many"], params).fetchall()

    def _settle_sync(
        self,
        conn: psycopg.Connection[Row],
        entries: Sequence[SettleEntry],
        now: Any,
        children: bool,
        *,
        why: bool,
        woke: list[bool] | None = None,
    ) -> set[int]:
        # A runner's batch of items without a parent (Settlement._parentless), without
        # children or waits, that wants no reason for a refusal: one statement in autocommit
        # (see settle_alone), all or nothing. A value the database refuses fails it, and the
        # general way writes the batch (entry by entry, so that entry alone becomes dead).
        if children or why or not all(s._parentless for _, s, _ in entries):
            return super()._settle_sync(conn, entries, now, children, why=why, woke=woke)
        params = {**settle_params(entries, now), "channel": self.channel}
        try:
            row = conn.execute(_SETTLE_ALONE, params).fetchone()
        except self._data_errors():
            return super()._settle_sync(conn, entries, now, children, why=False, woke=woke)
        assert row is not None
        return {entries[n - 1][0] for n in row["ords"] or ()}

    def _settle_rows(
        self, conn: psycopg.Connection[Row], entries: Sequence[SettleEntry], now: Any
    ) -> list[Row]:
        return conn.execute(_Q["settle_many"], settle_params(entries, now)).fetchall()

    def _claim_in(self, conn: psycopg.Connection[Row], params: dict[str, Any]) -> list[Any]:
        return self._claim_rows(conn, params)

    def _settle_and_claim_in(
        self,
        conn: psycopg.Connection[Row],
        entries: Sequence[SettleEntry],
        now: Any,
        children: bool,
        params: dict[str, Any],
        woke: list[bool] | None = None,
    ) -> tuple[set[int], list[Any]]:
        if children:
            # Children are written entry by entry, reading as they go: the general way.
            return super()._settle_and_claim_in(conn, entries, now, children, params, woke)
        # One transaction, pipelined: BEGIN, the settlement and the claim go out together (one
        # round trip), the wake-ups and COMMIT together (another), and the batch costs one
        # commit (one WAL flush) instead of two. The claim sees the settlement (same
        # transaction), so it leaves the settled rows alone: they are no longer claimable.
        threshold = conn.prepare_threshold
        try:
            with conn.pipeline() as pipeline, conn.transaction():
                settling = conn.execute(_Q["settle_many"], settle_params(entries, now))
                conn.execute(_SAVEPOINT)
                claiming = _claim_cursor(conn).execute(_Q["claim_due"], params, binary=True)
                rows = settling.fetchall()
                claimed, keyed, rated = _claimed(claiming)
                due = woken_by(rows)
                if rows and any(row["parent_id"] is not None for row in rows):
                    # A child finished: its fan-in may make its parent due, and the claim must
                    # see that, as it sees every other effect of the settlement. Undo the
                    # claim, count the children, claim again.
                    conn.execute(_ROLLBACK_TO_SAVEPOINT)
                    # psycopg forgets (and deallocates) every prepared statement when it reads
                    # a ROLLBACK's result, which in a pipeline it reads after later statements
                    # went out: one it prepared meanwhile would stay in its cache, gone from
                    # the server ("prepared statement ... does not exist" at its next use).
                    # So the result is read now, and nothing more is prepared in this pipeline.
                    pipeline.sync()
                    conn.prepare_threshold = None
                    due.extend(self._children_and_fan_in(conn, entries, rows, now))
                    claiming = _claim_cursor(conn).execute(_Q["claim_due"], params, binary=True)
                    claimed, keyed, rated = _claimed(claiming)
                self._notify(conn, due)
                left = params["limit"] - len(claimed)
                if rated:
                    claimed = self._claim_rated_path(conn, params)
                elif keyed and left > 0:
                    claimed += self._claim_keyed(conn, {**params, "limit": left})
        finally:
            conn.prepare_threshold = threshold
        return {entries[row["ord"] - 1][0] for row in rows}, claimed

    @staticmethod
    @contextlib.contextmanager
    def _journal_transaction(conn: psycopg.Connection[Row]) -> Iterator[None]:
        # BEGIN goes out with the group's reads (or its insert), COMMIT alone: two round
        # trips for a group where each statement would cost one.
        with conn.pipeline(), conn.transaction():
            yield

    def _id_list(self, ids: list[str]) -> Any:
        return text_array(ids)

    def _entries_params(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        # Each column an array for record_entries' unnest; the item ids, kinds and names as
        # literals (text_array), a column of NULLs as NULL (finished and wake times, mostly).
        def column(key: str) -> list[Any]:
            return [params[key] for params in rows]

        return {
            "ids": text_array(column("id")),
            "versions": int_array(column("version")),
            "positions": int_array(column("position")),
            "kinds": text_array(column("kind")),
            "names": text_array(column("name")),
            "results": text_array(column("result")),
            "attempts": int_array(column("attempts")),
            "started_ats": column("started_at"),
            "finished_ats": nulls_none(column("finished_at")),
            "wake_ats": nulls_none(column("wake_at")),
        }

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
        self._wakeups.start()

    async def wait_for_work(
        self, spec_ids: Sequence[str], *, queues: Sequence[str] | None = None
    ) -> None:
        # The shared loop (see SQLWorker.wait_for_work), but a notification naming a served queue
        # and spec id ends the wait at once: the claim that follows is the look it would take.
        self._before_wait()
        with self._wakeups.waiting(spec_ids, queues) as waiter:
            # A mark during the query also moved the generation: the wait below returns at once.
            while not waiter.due:
                generation = self._changes.value
                at, wait, _, held = await self._next_due(spec_ids, queues)
                if at is not None and wait <= 0:
                    return
                if held is not None:  # throttled: see SQLWorker.wait_for_work
                    await trio.sleep(held)
                    continue
                with trio.move_on_after(math.inf if at is None else wait):
                    await self._wait_changed(generation, None)

    async def migrate(self) -> int:
        """Apply pending migrations through this queue's pool; returns the version reached."""
        where = redact_dsn(self._dsn)
        return await self._run(
            lambda conn: migrate_connection(conn, where=where, schema=self._schema),
            lane=Lane.CALLER,
        )

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        listener = self._wakeups.close()

        def close() -> None:
            if listener is not None:
                listener.close()
            self._lanes.close()

        await trio.to_thread.run_sync(close)


def _claim_cursor(conn: psycopg.Connection[Any]) -> psycopg.Cursor[tuple[Any, ...]]:
    """A cursor for a claim: rows as tuples, for :func:`_claimed` (asked for in binary: the
    times travel as 8 bytes instead of 30 characters formatted and parsed)."""
    from psycopg.rows import tuple_row

    return conn.cursor(row_factory=tuple_row)


def _claimed(cur: psycopg.Cursor[tuple[Any, ...]]) -> tuple[list[WorkItem], int, bool]:
    """The items a claim statement on *cur* leased, its ``keyed`` count (0 without one) and
    whether its queue is ``rated`` (it has a rate limit, and the statement left its rows out).

    ``claim_due`` returns one row with a NULL id when it leased nothing (for its count)."""
    rows = cur.fetchall()
    if not rows:
        return [], 0, False
    columns = column_names(cur)
    decode = item_decoder(columns, _CODEC)
    id_at = columns.index("id")
    keyed = rows[0][columns.index("keyed")] if "keyed" in columns else 0
    rated = bool(rows[0][columns.index("rated")]) if "rated" in columns else False
    return [decode(row) for row in rows if row[id_at] is not None], keyed, rated
