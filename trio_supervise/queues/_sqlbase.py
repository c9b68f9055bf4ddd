"""The protocol written once for both SQL backends.

:class:`SQLQueue` holds every method of :class:`WorkQueue` that SQLite and PostgreSQL share:
argument checks, row conversion, the fenced writes and their errors, the settlement batch (with
an unstorable entry split out of its batch), renewals, waits. What differs is small and lives
in each backend:

- the dialect's SQL, in its ``queries.sql`` (:attr:`SQLQueue._queries`), the same names on both;
- how values travel (:meth:`SQLQueue._time`, :meth:`SQLQueue._now`, :meth:`SQLQueue._ids`,
  :meth:`SQLQueue._from_time`, :meth:`SQLQueue._from_config`);
- how a blocking call reaches a connection (:meth:`SQLQueue._run`: SQLite's writer and
  read-only reader, each behind its own limiter; PostgreSQL's pool, read pool and listener);
- the two batched statements, where one statement per row (SQLite) and one ``unnest``
  statement (PostgreSQL) are each the fast form (:meth:`SQLQueue._renew_rows`,
  :meth:`SQLQueue._settle_rows`);
- wake-ups (:meth:`SQLQueue._notify`, :meth:`SQLQueue._before_wait`).

Every statement runs inside :meth:`SQLQueue._transaction` on the connection it was given.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import trio

from .._errors import DuplicateItem, ItemNotFound, ItemStateError, LeaseLost, QueueError
from . import _sql
from ._protocol import (
    DEFAULT_QUEUE,
    MAX_ERRORS,
    ErrorEntry,
    ItemState,
    JSONValue,
    Lease,
    LeaseStatus,
    QueueInfo,
    SettleKind,
    Settlement,
    SingleWrites,
    WorkItem,
    check_json,
    check_new_item,
    check_queue_name,
    storable_text,
    unstorable_outcome,
)

__all__ = ["SQLQueue", "SettleEntry"]

T = TypeVar("T")
Row = Any
"""A row as the driver returns it, read by column name (``sqlite3.Row``, a psycopg dict)."""

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _error_entries(stored: Any) -> tuple[ErrorEntry, ...]:
    """The stored ``errors`` JSON array (``at`` in microseconds since the epoch) as entries."""
    return tuple(
        ErrorEntry(
            at=_EPOCH + dt.timedelta(microseconds=each["at"]),
            worker=each["worker"],
            attempt=each["attempt"],
            error=each["error"] or "",
        )
        for each in stored
    )


_STATES = {str(state): state for state in ItemState}
"""``ItemState(text)`` as a dict lookup (the enum call costs ten times as much per row)."""

SettleEntry = tuple[int, Settlement, dict[str, Any]]
"""One settlement on its way to the database: its position, itself, its converted values."""


class SQLQueue(SingleWrites):
    """The :class:`WorkQueue` protocol over a SQL dialect; see the module doc for the hooks."""

    _queries: ClassVar[Mapping[str, str]]
    _backend: ClassVar[_sql.Backend]
    _first_cursor: ClassVar[Any]
    """A time before every stored one: the cursor of a first page."""
    _changes: Any

    # -- hooks -------------------------------------------------------------------------------

    async def _run(
        self, fn: Callable[[Any], T], *, read: bool = False, retry: bool = True
    ) -> T:  # pragma: no cover - every backend defines it
        """Run *fn* on a connection in a thread; map the driver's errors to ours."""
        raise NotImplementedError

    def _transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """A transaction around several statements."""
        raise NotImplementedError  # pragma: no cover

    def _write(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """What one writing statement runs in: SQLite takes the write lock up front
        (``BEGIN IMMEDIATE``); a PostgreSQL statement in autocommit needs nothing more (a
        ``BEGIN``/``COMMIT`` pair would cost two round trips on every claim)."""
        raise NotImplementedError  # pragma: no cover

    def _now(self) -> Any:
        """The "now" parameter of a statement (PostgreSQL: None for the database's clock)."""
        raise NotImplementedError  # pragma: no cover

    def _time(self, value: dt.datetime) -> Any:
        """A datetime as a statement parameter."""
        raise NotImplementedError  # pragma: no cover

    def _from_time(self, value: Any) -> dt.datetime:
        """A stored time as a datetime."""
        raise NotImplementedError  # pragma: no cover

    def _from_config(self, value: Any) -> JSONValue:
        """A stored config as a JSON value."""
        raise NotImplementedError  # pragma: no cover

    def _ids(self, values: Sequence[str]) -> Any:
        """A list of texts as one statement parameter."""
        raise NotImplementedError  # pragma: no cover

    def _is_duplicate(self, error: Exception) -> bool:
        """True if *error* is a unique violation (an explicit item id that exists)."""
        raise NotImplementedError  # pragma: no cover

    def _data_errors(self) -> tuple[type[Exception], ...]:
        """What one unstorable value raises: the entry is at fault, not the database."""
        raise NotImplementedError  # pragma: no cover

    def _renew_rows(
        self, conn: Any, leases: Sequence[Lease], lease_us: int, now: Any
    ) -> Iterable[Row]:
        """Renew *leases*; the rows renewed (``id, lease_version, lease_owner,
        cancel_requested``)."""
        raise NotImplementedError  # pragma: no cover

    def _settle_rows(self, conn: Any, entries: Sequence[SettleEntry], now: Any) -> list[Row]:
        """Apply *entries* fenced; the rows settled (``ord`` (1-based), ``spec_id``, ``state``,
        ``due_now``)."""
        raise NotImplementedError  # pragma: no cover

    def _notify(self, conn: Any, spec_ids: Sequence[str]) -> None:
        """Tell other processes that work of *spec_ids* became due (in the transaction)."""

    def _before_wait(self) -> None:
        """Called before every :meth:`wait_for_work` (PostgreSQL starts its listener)."""

    def _changed(self) -> None:
        self._changes.value += 1

    # -- shared ------------------------------------------------------------------------------

    def _item(self, row: Row) -> WorkItem:
        expires = row["lease_expires_at"]
        state = row["state"]
        return WorkItem(
            id=row["id"],
            spec_id=row["spec_id"],
            tenant_id=row["tenant_id"],
            subject_id=row["subject_id"],
            config=self._from_config(row["config"]),
            cancel_requested=bool(row["cancel_requested"]),
            lease_version=row["lease_version"],
            state=_STATES[state] if state in _STATES else ItemState(state),
            due_at=self._from_time(row["due_at"]),
            error_count=row["error_count"],
            last_error=row["last_error"],
            lease_owner=row["lease_owner"],
            lease_expires_at=None if expires is None else self._from_time(expires),
            idempotency_key=row["idempotency_key"],
            created_at=self._from_time(row["created_at"]),
            updated_at=self._from_time(row["updated_at"]),
            attempt=row["attempt"],
            priority=row["priority"],
            queue=row["queue"],
            timeout=row["timeout"],
            result=None if (result := row["result"]) is None else self._from_config(result),
            errors=_error_entries(self._from_config(row["errors"])),
        )

    def _why(self, conn: Any, item_id: str) -> str:
        row = conn.execute(self._queries["get"], {"id": item_id}).fetchone()
        if row is None:
            return "no such item"
        return f"item is {row['state']} at version {row['lease_version']}"

    # -- producing and inspecting ------------------------------------------------------------

    def _new_params(
        self,
        spec_id: str,
        *,
        config: JSONValue,
        tenant_id: str,
        subject_id: str,
        due_at: dt.datetime | None,
        item_id: str | None,
        idempotency_key: str | None,
        priority: int,
        queue: str,
        evaluation_timeout: float | None,
    ) -> dict[str, Any]:
        """The checked parameters of one new item's statements."""
        config = check_new_item(
            spec_id=spec_id,
            config=config,
            item_id=item_id,
            tenant_id=tenant_id,
            subject_id=subject_id,
            idempotency_key=idempotency_key,
            priority=priority,
            queue=queue,
            timeout=evaluation_timeout,
        )
        now = self._now()
        return {
            "id": uuid.uuid4().hex if item_id is None else item_id,
            "spec_id": spec_id,
            "tenant_id": tenant_id,
            "subject_id": subject_id,
            "config": json.dumps(config),
            "due_at": now if due_at is None else self._time(due_at),
            "idempotency_key": idempotency_key,
            "now": now,
            "priority": priority,
            "queue": queue,
            "timeout": None if evaluation_timeout is None else float(evaluation_timeout),
        }

    def _enqueue_row(self, conn: Any, params: Mapping[str, Any]) -> tuple[Row, bool]:
        """Insert one item on *conn*, in a transaction the caller holds: its row, and whether
        it was created (False: an item with its idempotency key exists)."""
        queries = self._queries
        if params["idempotency_key"] is not None:
            row = conn.execute(queries["get_by_key"], params).fetchone()
            if row is not None:
                return row, False
        try:
            row = conn.execute(queries["enqueue"], params).fetchone()
        except Exception as error:
            if self._is_duplicate(error):
                raise DuplicateItem(params["id"]) from error
            raise
        if row is None:  # another enqueuer took the key since: theirs wins
            existing = conn.execute(queries["get_by_key"], params).fetchone()
            if existing is None:  # pragma: no cover - deleted in between
                key = params["idempotency_key"]
                raise QueueError(f"item with idempotency key {key!r} vanished")
            return existing, False
        if row["due_now"]:
            self._notify(conn, [params["spec_id"]])
        return row, True

    async def enqueue(
        self,
        spec_id: str,
        *,
        config: JSONValue = None,
        tenant_id: str = "",
        subject_id: str = "",
        due_at: dt.datetime | None = None,
        item_id: str | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        queue: str = DEFAULT_QUEUE,
        evaluation_timeout: float | None = None,
    ) -> WorkItem:
        params = self._new_params(
            spec_id,
            config=config,
            tenant_id=tenant_id,
            subject_id=subject_id,
            due_at=due_at,
            item_id=item_id,
            idempotency_key=idempotency_key,
            priority=priority,
            queue=queue,
            evaluation_timeout=evaluation_timeout,
        )

        def run(conn: Any) -> tuple[Row, bool]:
            with self._transaction(conn):
                return self._enqueue_row(conn, params)

        row, created = await self._run(run, retry=False)
        if created:
            self._changed()
        return self._item(row)

    # -- the outbox: enqueue on the application's own transaction ----------------------------

    def _outbox(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """Check the application's *conn* and hold a savepoint in its transaction around the
        body, with the queue's row factory and schema (see ``_outbox.py``)."""
        raise NotImplementedError  # pragma: no cover

    def enqueue_on(
        self,
        conn: Any,
        spec_id: str,
        *,
        config: JSONValue = None,
        tenant_id: str = "",
        subject_id: str = "",
        due_at: dt.datetime | None = None,
        item_id: str | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        queue: str = DEFAULT_QUEUE,
        evaluation_timeout: float | None = None,
    ) -> WorkItem:
        """Enqueue on the application's own open transaction on *conn*; blocking (run it in
        a thread from Trio: ``await trio.to_thread.run_sync(...)``).

        The item commits or rolls back with the application's transaction: this never commits
        nor rolls it back. The arguments and the result are those of :meth:`enqueue`. Workers
        learn of the item when the transaction commits, never before: PostgreSQL sends its
        ``NOTIFY`` in the transaction (delivered at commit only); SQLite's
        :meth:`wait_for_work` sees the commit through ``PRAGMA data_version``. If this raises,
        nothing of the call is written and the transaction is still usable.

        :param conn: a ``sqlite3.Connection`` to the queue's file, or a sync
            ``psycopg.Connection`` to the queue's database, with a transaction open or about to
            open (see the Queues guide, "Enqueue in your own transaction").
        """
        params = self._new_params(
            spec_id,
            config=config,
            tenant_id=tenant_id,
            subject_id=subject_id,
            due_at=due_at,
            item_id=item_id,
            idempotency_key=idempotency_key,
            priority=priority,
            queue=queue,
            evaluation_timeout=evaluation_timeout,
        )
        with self._outbox(conn) as conn:
            row, _ = self._enqueue_row(conn, params)
            return self._item(row)

    async def get(self, item_id: str) -> WorkItem:
        query = self._queries["get"]
        row = await self._run(
            lambda conn: conn.execute(query, {"id": item_id}).fetchone(), read=True
        )
        if row is None:
            raise ItemNotFound(item_id)
        return self._item(row)

    async def list_items(
        self,
        *,
        states: Sequence[ItemState] | None = None,
        spec_ids: Sequence[str] | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[WorkItem]:
        params: dict[str, Any] = {
            "spec_ids": None if spec_ids is None else self._ids(spec_ids),
            "limit": _sql.check_limit(limit),
        }
        queries, start = self._queries, self._first_cursor

        def run(conn: Any) -> list[Any]:
            return _sql.list_page(conn, queries, params, states=states, after=after, start=start)

        return [self._item(row) for row in await self._run(run, read=True)]

    async def counts(self) -> Mapping[tuple[str, ItemState], int]:
        query = self._queries["counts"]
        rows = await self._run(lambda conn: conn.execute(query).fetchall(), read=True)
        return {(row["spec_id"], ItemState(row["state"])): row["n"] for row in rows}

    async def request_cancel(self, item_id: str) -> WorkItem:
        params = {"id": item_id, "now": self._now()}
        query = self._queries["request_cancel"]

        def run(conn: Any) -> Row:
            with self._write(conn):
                return conn.execute(query, params).fetchone()

        row = await self._run(run)
        if row is None:
            raise ItemNotFound(item_id)
        self._changed()
        return self._item(row)

    async def retry(self, item_id: str, *, at: dt.datetime | None = None) -> WorkItem:
        now = self._now()
        params = {"id": item_id, "now": now, "at": now if at is None else self._time(at)}
        queries = self._queries

        def run(conn: Any) -> Row:
            with self._transaction(conn):
                row = conn.execute(queries["retry"], params).fetchone()
                if row is not None:
                    if row["due_now"]:
                        self._notify(conn, [row["spec_id"]])
                    return row
                if conn.execute(queries["get"], params).fetchone() is None:
                    raise ItemNotFound(item_id)
                raise ItemStateError(f"item {item_id!r} is running; cancel it first")

        row = await self._run(run)
        self._changed()
        return self._item(row)

    # -- the worker side ---------------------------------------------------------------------

    async def claim_due(
        self,
        spec_ids: Sequence[str],
        worker_id: str,
        lease: float,
        limit: int,
        *,
        queue: str = DEFAULT_QUEUE,
    ) -> list[WorkItem]:
        params = {
            "queue": queue,
            "spec_ids": self._ids(spec_ids),
            "worker_id": worker_id,
            "lease_us": _sql.duration_us("lease", lease, positive=True),
            "limit": _sql.check_limit(limit),
            "now": self._now(),
        }
        if limit == 0 or not spec_ids:
            await trio.lowlevel.checkpoint()
            return []
        query = self._queries["claim_due"]

        def run(conn: Any) -> list[Row]:
            with self._write(conn):
                rows: list[Row] = conn.execute(query, params).fetchall()
                return rows

        items = [self._item(row) for row in await self._run(run)]
        items.sort(key=lambda item: (item.priority, item.due_at, item.id))
        return items

    async def renew(
        self, item_id: str, worker_id: str, lease_version: int, lease: float
    ) -> LeaseStatus:
        status = (await self.renew_many([Lease(item_id, lease_version, worker_id)], lease))[item_id]
        if status is LeaseStatus.LOST:
            raise LeaseLost(item_id, lease_version, "renewal refused")
        return status

    async def renew_many(self, leases: Sequence[Lease], lease: float) -> dict[str, LeaseStatus]:
        lease_us = _sql.duration_us("lease", lease, positive=True)
        if not leases:
            await trio.lowlevel.checkpoint()
            return {}
        now = self._now()

        def run(conn: Any) -> dict[tuple[str, int, str], bool]:
            with self._write(conn):
                return {
                    (row["id"], row["lease_version"], row["lease_owner"]): bool(
                        row["cancel_requested"]
                    )
                    for row in self._renew_rows(conn, leases, lease_us, now)
                }

        held = await self._run(run)
        statuses = {}
        for each in leases:
            cancel = held.get((each.item_id, each.version, each.worker_id))
            if cancel is None:
                statuses[each.item_id] = LeaseStatus.LOST
            elif cancel:
                statuses[each.item_id] = LeaseStatus.CANCEL_REQUESTED
            else:
                statuses[each.item_id] = LeaseStatus.HELD
        return statuses

    async def mark_error(self, item_id: str, lease_version: int, error: str) -> None:
        params = {
            "id": item_id,
            "version": lease_version,
            "error": storable_text(error),
            "now": self._now(),
            "max_errors": MAX_ERRORS,
        }
        query = self._queries["mark_error"]

        def run(conn: Any) -> None:
            with self._write(conn):
                if conn.execute(query, params).fetchone() is None:
                    raise LeaseLost(item_id, lease_version, self._why(conn, item_id))

        await self._run(run, retry=False)

    async def _settle_one(self, settlement: Settlement) -> None:
        [applied] = await self._settle([settlement], why=True)
        if not applied:  # pragma: no cover - _settle raises LeaseLost for a single write
            raise LeaseLost(settlement.item_id, settlement.lease_version)

    async def settle_many(self, settlements: Sequence[Settlement]) -> list[bool]:
        return await self._settle(settlements, why=False)

    def _entry(self, index: int, s: Settlement) -> SettleEntry:
        """*s* with its values converted for the database; an unstorable one becomes dead."""
        try:
            values = {
                "delay_us": _sql.duration_us("delay", s.delay),
                "at": None if s.at is None else self._time(s.at),
                "config": (
                    json.dumps(check_json(s.config)) if s.kind is SettleKind.RESCHEDULE else None
                ),
                "result": (
                    json.dumps(check_json(s.result, what="result"))
                    if s.kind is SettleKind.COMPLETE and s.result is not None
                    else None
                ),
            }
        except (ValueError, OverflowError) as error:
            return self._entry(index, unstorable_outcome(s, error))
        return index, s, values

    async def _settle(self, settlements: Sequence[Settlement], *, why: bool) -> list[bool]:
        # One statement cannot update a row twice, and a second write with the same
        # (id, version) would be stale after the first anyway: send each pair once.
        first: dict[tuple[str, int], int] = {}
        for index, s in enumerate(settlements):
            first.setdefault((s.item_id, s.lease_version), index)
        sent = [settlements[index] for index in sorted(first.values())]
        if not sent:
            await trio.lowlevel.checkpoint()
            return []
        now = self._now()
        entries = [self._entry(index, s) for index, s in enumerate(sent)]
        data_errors = self._data_errors()

        def write(conn: Any, entries: Sequence[SettleEntry]) -> list[Row]:
            with self._transaction(conn):
                rows = self._settle_rows(conn, entries, now)
                self._notify(
                    conn,
                    [row["spec_id"] for row in rows if row["state"] == "queued" and row["due_now"]],
                )
                if why and not rows:
                    s = entries[0][1]
                    raise LeaseLost(s.item_id, s.lease_version, self._why(conn, s.item_id))
            return rows

        def run(conn: Any) -> set[int]:
            try:
                return {entries[row["ord"] - 1][0] for row in write(conn, entries)}
            except data_errors:
                if why:
                    raise
            # One entry holds a value the database refuses: write them one by one, so it alone
            # becomes dead (unstorable_outcome) and its batch-mates are settled as asked.
            applied = set()
            for index, s, values in entries:
                try:
                    rows = write(conn, [(index, s, values)])
                except data_errors as error:
                    rows = write(conn, [self._entry(index, unstorable_outcome(s, error))])
                if rows:
                    applied.add(index)
            return applied

        applied = await self._run(run)
        applied_ids = {(sent[i].item_id, sent[i].lease_version) for i in applied}
        results = [
            (s.item_id, s.lease_version) in applied_ids and first[(s.item_id, s.lease_version)] == i
            for i, s in enumerate(settlements)
        ]
        if any(results):
            self._changed()
        return results

    async def _next_due(
        self, spec_ids: Sequence[str], queues: Sequence[str] | None, *, mark: bool = False
    ) -> tuple[Any, float, Any]:
        """The next claimable time (stored form), how many seconds away it is and, with
        *mark*, the :meth:`_change_mark` read just before on the same connection."""
        params = {
            "spec_ids": self._ids(spec_ids),
            "queues": None if queues is None else self._ids(queues),
            "now": self._now(),
        }
        query = self._queries["next_due_at"]

        def run(conn: Any) -> tuple[Any, float, Any]:
            seen = self._change_mark(conn) if mark else None
            row = conn.execute(query, params).fetchone()
            return row["at"], row["wait"], seen

        return await self._run(run, read=True)

    def _change_mark(self, conn: Any) -> Any:
        """What :meth:`_wait_changed` compares to learn of other connections' commits (SQLite:
        ``PRAGMA data_version``); None when only this process's writes wake waiters."""
        return None

    async def _wait_changed(self, generation: int, mark: Any) -> None:
        """Return when this process wrote since *generation* (or, see :meth:`_change_mark`,
        another connection committed since *mark*)."""
        await self._changes.wait_value(_sql.other_than(generation))

    async def next_due_at(
        self, spec_ids: Sequence[str], *, queues: Sequence[str] | None = None
    ) -> dt.datetime | None:
        at, _, _ = await self._next_due(spec_ids, queues)
        return None if at is None else self._from_time(at)

    async def wait_for_work(
        self, spec_ids: Sequence[str], *, queues: Sequence[str] | None = None
    ) -> None:
        self._before_wait()
        while True:
            generation = self._changes.value
            at, wait, mark = await self._next_due(spec_ids, queues, mark=True)
            if at is not None and wait <= 0:
                return
            with trio.move_on_after(float("inf") if at is None else wait):
                await self._wait_changed(generation, mark)

    # -- queues ------------------------------------------------------------------------------

    async def pause_queue(self, queue: str) -> bool:
        params = {"queue": check_queue_name(queue), "now": self._now()}
        query = self._queries["pause_queue"]

        def run(conn: Any) -> bool:
            with self._write(conn):
                return conn.execute(query, params).fetchone() is not None

        paused = await self._run(run)
        self._changed()
        return paused

    async def resume_queue(self, queue: str) -> bool:
        params = {"queue": check_queue_name(queue)}
        query = self._queries["resume_queue"]

        def run(conn: Any) -> bool:
            with self._transaction(conn):
                resumed = conn.execute(query, params).fetchone() is not None
                if resumed:
                    self._notify(conn, [queue])
                return resumed

        resumed = await self._run(run)
        self._changed()
        return resumed

    async def list_queues(self) -> list[QueueInfo]:
        queries = self._queries

        def run(conn: Any) -> tuple[list[Row], list[Row]]:
            return (
                conn.execute(queries["paused_queues"]).fetchall(),
                conn.execute(queries["queue_counts"]).fetchall(),
            )

        paused_rows, count_rows = await self._run(run, read=True)
        paused = {row["queue"]: self._from_time(row["paused_at"]) for row in paused_rows}
        counts: dict[str, dict[ItemState, int]] = {name: {} for name in paused}
        for row in count_rows:
            counts.setdefault(row["queue"], {})[ItemState(row["state"])] = row["n"]
        return [
            QueueInfo(
                name=name, paused=name in paused, paused_at=paused.get(name), counts=counts[name]
            )
            for name in sorted(counts)
        ]
