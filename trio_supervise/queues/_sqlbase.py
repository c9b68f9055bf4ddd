"""The protocol written once for both SQL backends.

:class:`SQLQueue` holds every method of :class:`WorkQueue` that SQLite and PostgreSQL share:
argument checks, row conversion, the fenced writes and their errors, the settlement batch (with
an unstorable entry split out of its batch), renewals, waits. What differs is small and lives
in each backend:

- the dialect's SQL, in its ``queries.sql`` (:attr:`SQLQueue._queries`), the same names on both;
- how values travel (:meth:`SQLQueue._time`, :meth:`SQLQueue._now`, :meth:`SQLQueue._ids`,
  :meth:`SQLQueue._from_time`), and how stored values are read into an item
  (:attr:`SQLQueue._codec`, for the decoders ``sql/_rows.py`` generates);
- how a blocking call reaches a connection (:meth:`SQLQueue._run`: SQLite's writer and
  read-only reader, each behind its own limiter; PostgreSQL's pool, read pool and listener);
- the claim (:meth:`SQLQueue._claim_rows`: SQLite's one statement under its write lock,
  PostgreSQL's unkeyed fast path plus an advisory-locked keyed path);
- the two batched statements: one ``UPDATE ... FROM (VALUES ...)`` per chunk of rows
  (SQLite) and one ``unnest`` statement (PostgreSQL) (:meth:`SQLQueue._renew_rows`,
  :meth:`SQLQueue._settle_rows`);
- wake-ups (:meth:`SQLQueue._notify`, :meth:`SQLQueue._before_wait`, and SQLite's look at
  other connections' commits: :meth:`SQLQueue._change_mark`, :meth:`SQLQueue._wait_changed`);
- how the application's own connection is checked and wrapped for :meth:`SQLQueue.enqueue_on`
  (:meth:`SQLQueue._outbox`, see ``_outbox.py``);
- the multi-row insert of new items (:meth:`SQLQueue._insert_rows`) and a cursor with rows
  read by column name on any connection, the application's too (:meth:`SQLQueue._cursor`).

Enqueueing is written once as a synchronous core, :meth:`SQLQueue._enqueue_rows`, that runs in
a transaction its caller holds: the queue's own :meth:`SQLQueue.enqueue_many` on its
connection, or the application's code on the application's own connection.

Every statement runs inside :meth:`SQLQueue._transaction` on the connection it was given.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, NoReturn, TypeVar

import attrs
import trio
from typing_extensions import Unpack

from .._clock import utc
from .._errors import DuplicateItem, ItemNotFound, ItemStateError, LeaseLost, QueueError
from ..job import (
    DEFAULT_QUEUE,
    MAX_ERRORS,
    WAITING_DUE_AT,
    Enqueued,
    EnqueueOptions,
    ItemState,
    JSONValue,
    Lease,
    LeaseStatus,
    NewItem,
    QueueInfo,
    SettleKind,
    Settlement,
    WorkItem,
    check_child,
    check_config,
    check_entries,
    check_json,
    check_name,
    check_prune,
    check_queue_name,
    check_unique,
    created_item,
    new_item_ids,
    plan_batch,
    repeated_id,
    storable_text,
    unstorable_outcome,
)
from . import _sql
from ._ports import EnqueueFront, SingleWrites, entry_signature
from .sql._rows import NEW_ROW_COLUMNS, Codec, item_decoder, row_encoder

__all__ = [
    "NEW_ROW_COLUMNS",
    "PLAIN_VALUES",
    "EnqueueBatch",
    "SQLQueue",
    "SettleEntry",
]

T = TypeVar("T")
Row = Any
"""A row as the driver returns it, read by column name (``sqlite3.Row``, a psycopg dict)."""

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)


def woken_by(rows: Iterable[Row]) -> list[str]:
    """The spec ids a settlement's *rows* make worth a look elsewhere: an item due again now, or
    a concurrency key's slot freed (its blocked items may be due). Other processes' waiters hear
    of them (NOTIFY) instead of at their next poll."""
    return [
        row["spec_id"]
        for row in rows
        if (row["state"] == "queued" and row["due_now"]) or row["concurrency_key"] is not None
    ]


_FINISHED_STATES = frozenset(str(state) for state in ItemState if state.finished)
"""The stored text of the states an item never leaves on its own (a child's fan-in)."""

_claim_order: Callable[[WorkItem], tuple[int, dt.datetime, str]] = operator.attrgetter(
    "priority", "due_at", "id"
)
"""A claimed item's place in the claim's order (read in C: a third of a function's cost)."""

_WAITED_FOR = (
    "item {item_id!r} is a child its parent waits for; cancel it first (the parent counts it), "
    "then delete it"
)

SettleEntry = tuple[int, Settlement, Mapping[str, Any]]
"""One settlement on its way to the database: its position, itself, its converted values."""
PLAIN_VALUES: Mapping[str, Any] = MappingProxyType(
    {"delay_us": 0, "at": None, "config": None, "result": None, "children": ()}
)
"""The converted values of most settlements (a completion without a result, a release or a
cancellation without a delay): one shared, read-only mapping instead of a dict per entry."""
_RESCHEDULE = SettleKind.RESCHEDULE
_COMPLETE = SettleKind.COMPLETE
_PAIR = operator.attrgetter("item_id", "lease_version")
_SETTLEMENT = operator.itemgetter(1)
_CHILDREN = operator.attrgetter("children")
_WAITS = operator.attrgetter("wait_for_children")


@attrs.frozen
class EnqueueBatch:
    """A checked batch of new items, converted for the database (:meth:`SQLQueue._prepare`)."""

    entries: list[NewItem]
    """Every entry, checked (configs are the checked copies)."""
    sent: list[int]
    """The indices of the entries to write (a repeated key is written once)."""
    repeats: dict[int, int]
    """Index of an entry repeating an earlier entry's key -> that entry's index."""
    rows: list[tuple[Any, ...]]
    """One row of values per sent entry, in the order of ``sent``, its columns those of
    :data:`NEW_ROW_COLUMNS`."""
    now: Any
    """The "now" parameter the batch was prepared with."""


_ID = NEW_ROW_COLUMNS.index("id")
_KEY = NEW_ROW_COLUMNS.index("idempotency_key")


class _IdTaken(Exception):
    """An insert of a batch with explicit ids broke a uniqueness (see
    :meth:`SQLQueue._write_batch`): *ids* the batch's explicit ids, *error* the driver's."""

    def __init__(self, ids: Sequence[str], error: Exception) -> None:
        super().__init__(ids, error)
        self.ids = list(ids)
        self.error = error


def _scopes(
    known: dict[tuple[Any, bool], tuple[str, int | None]],
) -> Callable[[NewItem], tuple[str, int | None]]:
    """A batch's ``scope(entry)``: the entry's uniqueness scope as stored, its name and its
    period in microseconds (see :func:`check_unique`), kept in *known*."""

    def scope(entry: NewItem) -> tuple[str, int | None]:
        key = entry.idempotency_key
        unique = (entry.unique, key is None)
        found = known.get(unique)
        if found is None:
            name, seconds = check_unique(entry.unique, key)
            period = None if seconds is None else _sql.duration_us("unique", seconds)
            found = known[unique] = (name, period)
        return found

    return scope


_MAX_KEY_ROUNDS = 5
"""How often one enqueue looks again for a key's holder that changed under it (each round
needs another transaction to take or release the key in between)."""


class SQLQueue(EnqueueFront, SingleWrites):
    """The :class:`WorkQueue` protocol over a SQL dialect; see the module doc for the hooks."""

    _queries: ClassVar[Mapping[str, str]]
    _backend: ClassVar[_sql.Backend]
    _first_cursor: ClassVar[Any]
    """A time before every stored one: the cursor of a first page."""
    _no_limit: ClassVar[Any] = None
    """The ``LIMIT`` parameter meaning "all rows" (SQLite: -1; PostgreSQL: NULL)."""
    _codec: ClassVar[Codec]
    """How the dialect reads stored values into an item's fields (see ``sql/_rows.py``)."""
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

    def _snapshot(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """A read-only transaction whose statements all see one snapshot of the database, for
        a read that takes several statements (a page of items, the queues): an item that moves
        between two of them is seen once, where it was (PostgreSQL: ``REPEATABLE READ``;
        SQLite: a deferred transaction on the reader connection)."""
        raise NotImplementedError  # pragma: no cover

    def _now(self) -> Any:
        """The "now" parameter of a statement (PostgreSQL: None for the database's clock)."""
        raise NotImplementedError  # pragma: no cover

    def _clock_now(self) -> dt.datetime:
        """The queue's clock's "now" (new item ids start with it)."""
        raise NotImplementedError  # pragma: no cover

    def _time(self, value: dt.datetime) -> Any:
        """A datetime as a statement parameter."""
        raise NotImplementedError  # pragma: no cover

    def _from_time(self, value: Any) -> dt.datetime:
        """A stored time as a datetime."""
        raise NotImplementedError  # pragma: no cover

    def _columns(self, cur: Any) -> tuple[str, ...]:
        """The names of the columns of *cur*'s rows, in order."""
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

    def _claim_rows(self, conn: Any, params: dict[str, Any]) -> list[WorkItem]:
        """Lease the claimable items (``claim_due``'s parameters), concurrency keys respected.

        SQLite's one statement under its write lock; PostgreSQL overrides it (an unkeyed fast
        path, and a locked keyed path: see its ``claim_keyed`` query)."""
        with self._write(conn):
            return self._claim_in(conn, params)

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

    def _set_parents(self, conn: Any, children: Sequence[dict[str, Any]]) -> None:
        """Record each created child's ``parent_id`` and ``parent_version`` (``id``,
        ``parent_id``, ``parent_version`` per child)."""
        raise NotImplementedError  # pragma: no cover

    def _fan_in(self, conn: Any, item_ids: Sequence[str], now: Any) -> list[str]:
        """*item_ids* just finished: count each waited-for one (once) toward its parent's wait;
        the spec ids of the parents that became due."""
        raise NotImplementedError  # pragma: no cover

    def _cursor(self, conn: Any) -> Any:
        """A cursor on *conn* whose rows are read by column name, whatever the connection's own
        row factory (the application's connection may have none)."""
        raise NotImplementedError  # pragma: no cover

    def _insert_rows(
        self, cur: Any, rows: Sequence[tuple[Any, ...]], now: Any, *, keyed: bool, notify: bool
    ) -> tuple[int, dt.datetime]:
        """Insert the items of *rows* (:data:`NEW_ROW_COLUMNS`, created at *now*; ``ON
        CONFLICT (idempotency_key) DO NOTHING`` if any is *keyed*; without keys no conflict is
        possible, and the plain insert is faster); how many rows were inserted, and the
        ``created_at`` stored in them (PostgreSQL: the database's ``now()`` when it keeps the
        time). With *notify*, tell other processes of the inserted items due now, in the
        transaction (PostgreSQL: ``NOTIFY`` in the same statement, one per queue and spec id,
        see ``enqueue_many`` in its ``queries.sql``; SQLite's waiters look for commits)."""
        raise NotImplementedError  # pragma: no cover

    def _notify(self, conn: Any, spec_ids: Sequence[str]) -> None:
        """Tell other processes that work of *spec_ids* became due (in the transaction)."""

    def _before_wait(self) -> None:
        """Called before every :meth:`wait_for_work` (PostgreSQL starts its listener)."""

    def _changed(self) -> None:
        self._changes.value += 1

    # -- shared ------------------------------------------------------------------------------

    def _decode(self, cur: Any, row: Row) -> WorkItem:
        """*row*, read from *cur*, as a :class:`WorkItem` (by a decoder generated for its
        columns, see ``sql/_rows.py``)."""
        return item_decoder(self._columns(cur), self._codec, mapping=type(row) is dict)(row)

    def _one(self, cur: Any) -> WorkItem | None:
        """The item of the one row *cur* returned, or None if it returned none."""
        row = cur.fetchone()
        return None if row is None else self._decode(cur, row)

    def _all(self, cur: Any) -> list[WorkItem]:
        """The items of the rows *cur* returned."""
        rows = cur.fetchall()
        if not rows:
            return []
        decode = item_decoder(self._columns(cur), self._codec, mapping=type(rows[0]) is dict)
        return [decode(row) for row in rows]

    def _why(self, conn: Any, item_id: str) -> str:
        row = conn.execute(self._queries["get"], {"id": item_id}).fetchone()
        if row is None:
            return "no such item"
        return f"item is {row['state']} at version {row['lease_version']}"

    # -- producing and inspecting ------------------------------------------------------------

    async def enqueue_many(self, entries: Sequence[NewItem]) -> list[Enqueued]:
        batch = self._prepare(entries)
        if not batch.entries:
            await trio.lowlevel.checkpoint()
            return []
        # A batch without keys is one statement (the insert, which also returns the stored
        # time and, on PostgreSQL, notifies): in PostgreSQL's autocommit its own transaction,
        # one round trip. A keyed batch looks up its keys' holders first, in a transaction.
        keyed = any(row[_KEY] is not None for row in batch.rows)
        write = self._transaction if keyed else self._write

        def run(conn: Any) -> list[Enqueued]:
            try:
                with write(conn):
                    done, _ = self._write_batch(conn, batch, notify=True)
            except _IdTaken as taken:
                self._raise_taken(conn, taken)
            return done

        # Not retried on a dead connection: the commit may have landed (see _run).
        done = await self._run(run, retry=False)
        if any(each.created for each in done):
            self._changed()
        return done

    def _prepare(self, entries: Sequence[NewItem]) -> EnqueueBatch:
        """Check every entry and convert the ones to write; raises before anything is written."""
        checked = check_entries(entries)
        sent, repeats = plan_batch(checked)
        now = self._now()
        ids = iter(new_item_ids(self._clock_now(), len(sent)))
        known: dict[tuple[Any, bool], tuple[str, int | None]] = {}
        rows = row_encoder(self._codec)(checked, sent, now, ids, known, _scopes(known))
        return EnqueueBatch(checked, sent, repeats, rows, now)

    def _enqueue_rows(
        self, conn: Any, entries: Sequence[NewItem]
    ) -> tuple[list[Enqueued], list[str]]:
        """Enqueue *entries* on *conn*, inside a transaction the caller holds.

        The core of every enqueue: :meth:`enqueue_many` calls it on the queue's connection in
        its own transaction; code that enqueues in the application's transaction calls it on
        the application's connection (a ``psycopg.Connection`` for :class:`PostgresQueue`, a
        ``sqlite3.Connection`` for :class:`SQLiteQueue`, with this queue's schema on its
        ``search_path`` / in its file). Synchronous and blocking: from Trio, call it in a
        thread. It reads rows through :meth:`_cursor`, so the connection's row factory does
        not matter.

        Contract:

        - every entry is checked first (a bad one raises ``ConfigError``/``ValueError`` naming
          its index and field) and nothing is executed then;
        - it runs its statements on *conn* and neither commits, rolls back nor notifies; an
          exception it raises (:class:`DuplicateItem` for an explicit item id that exists, a
          driver error) leaves the caller's transaction to be rolled back: some of the batch
          may have been written in it;
        - it returns one :class:`Enqueued` per entry, in order, and the spec ids of the items
          it created that are due now. The caller wakes waiters for those once the transaction
          commits: ``queue._notify(conn, spec_ids)`` inside the transaction on PostgreSQL
          (``NOTIFY`` is delivered at commit), and ``queue._changed()`` after the commit for
          this process's own waiters (SQLite has only those).
        - On PostgreSQL, at the default ``READ COMMITTED`` isolation, concurrent enqueuers of
          one key create one item between them (the later ones wait for the first's commit
          and find its item). At ``SERIALIZABLE`` or ``REPEATABLE READ`` a concurrent one may
          fail with a serialization error instead, to be retried by the caller.
        """
        return self._write_batch(conn, self._prepare(entries), notify=False, check_ids=True)

    def _write_batch(
        self, conn: Any, batch: EnqueueBatch, *, notify: bool, check_ids: bool = False
    ) -> tuple[list[Enqueued], list[str]]:
        """Write a prepared batch on *conn* (see :meth:`_enqueue_rows`); with *notify*, the
        insert itself tells other processes of the items due now (:meth:`_insert_rows`).

        With *check_ids*, explicit ids are looked up before the insert, so that one that
        exists raises :class:`DuplicateItem` naming it. Without, the insert is tried at once
        (one statement fewer) and a uniqueness it breaks raises :class:`_IdTaken`: the caller
        rolls back (a failed statement aborts a PostgreSQL transaction) and then asks
        :meth:`_raise_taken` which id exists."""
        queries, rows, now = self._queries, batch.rows, batch.now
        cur = self._cursor(conn)
        found: dict[int, WorkItem] = {}
        """Position in ``rows`` -> the existing item holding its key."""
        pending = list(range(len(rows)))
        keyed = any(each[_KEY] is not None for each in rows)
        if keyed:
            pending = self._take_keys(cur, rows, pending, found, now)
        explicit = [rows[pos][_ID] for pos in pending if batch.entries[batch.sent[pos]].item_id]
        twice = repeated_id(explicit)
        if twice is not None:
            raise DuplicateItem(twice)
        if explicit and check_ids:
            taken = {
                row["id"]
                for row in cur.execute(
                    queries["existing_ids"], {"ids": self._ids(explicit)}
                ).fetchall()
            }
            for item_id in explicit:
                if item_id in taken:
                    raise DuplicateItem(item_id)
        written: set[int] = set()
        created_at: dt.datetime | None = None
        for _ in range(_MAX_KEY_ROUNDS):
            if not pending:
                break
            try:
                inserted, stored_at = self._insert_rows(
                    cur,
                    rows if len(pending) == len(rows) else [rows[pos] for pos in pending],
                    now,
                    keyed=keyed,
                    notify=notify,
                )
            except Exception as error:
                if self._is_duplicate(error) and explicit:
                    if not check_ids:
                        raise _IdTaken(explicit, error) from error
                    # Taken since the check above.
                    raise DuplicateItem(
                        explicit[0] if len(explicit) == 1 else ", ".join(explicit)
                    ) from error
                raise
            if created_at is None:
                created_at = stored_at
            if inserted == len(pending):
                written.update(pending)
                pending = []
                break
            # Some entries lost their key to another enqueuer since we looked: theirs win. Find
            # which were written, then look again for the others' holders (and release again,
            # should that holder have lapsed already).
            ids = self._ids([rows[pos][_ID] for pos in pending])
            stored = {row["id"] for row in cur.execute(queries["existing_ids"], {"ids": ids})}
            missing = [pos for pos in pending if rows[pos][_ID] not in stored]
            written.update(pos for pos in pending if rows[pos][_ID] in stored)
            pending = self._take_keys(cur, rows, missing, found, now)
        if pending:  # pragma: no cover - the key changed hands five times during one enqueue
            key = rows[pending[0]][_KEY]
            raise QueueError(f"the holder of idempotency key {key!r} kept changing; try again")
        due: set[str] = set()
        entries = batch.entries
        sent_done: list[Enqueued] = []
        """One per sent entry, in the order of ``sent``."""
        for pos, index in enumerate(batch.sent):
            if pos in written:
                assert created_at is not None
                item = created_item(entries[index], rows[pos][_ID], created_at)
                if item.due_at <= created_at:
                    due.add(item.spec_id)
                sent_done.append(Enqueued(item=item, created=True))
            else:
                sent_done.append(Enqueued(item=found[pos], created=False))
        if not batch.repeats:  # every entry was sent: the common case
            return sent_done, sorted(due)
        by_sent = dict(zip(batch.sent, sent_done, strict=True))
        results = []
        for index in range(len(entries)):
            first = batch.repeats.get(index)
            if first is None:
                results.append(by_sent[index])
            else:
                results.append(Enqueued(item=by_sent[first].item, created=False))
        return results, sorted(due)

    def _raise_taken(self, conn: Any, taken: _IdTaken) -> NoReturn:
        """Raise what *taken* means, asked on *conn* once the failed insert is rolled back:
        :class:`DuplicateItem` for the first of its explicit ids that exists, else the
        driver's error itself (the insert broke another rule)."""
        existing = {
            row["id"]
            for row in self._cursor(conn).execute(
                self._queries["existing_ids"], {"ids": self._ids(taken.ids)}
            )
        }
        for item_id in taken.ids:
            if item_id in existing:
                raise DuplicateItem(item_id) from taken.error
        raise taken.error

    def _take_keys(
        self,
        cur: Any,
        rows: Sequence[tuple[Any, ...]],
        positions: Sequence[int],
        found: dict[int, WorkItem],
        now: Any,
    ) -> list[int]:
        """Release the lapsed holders of the keys at *positions* and record the live holders
        in *found*; the positions left to insert."""
        queries = self._queries
        keys = self._ids(sorted({rows[pos][_KEY] for pos in positions} - {None}))
        cur.execute(queries["release_keys"], {"keys": keys, "now": now})
        cur.execute(queries["holders"], {"keys": keys})
        holders = {item.idempotency_key: item for item in self._all(cur)}
        left = []
        for pos in positions:
            holder = holders.get(rows[pos][_KEY])
            if holder is None:
                left.append(pos)
            else:
                found[pos] = holder
        return left

    async def get_by_key(self, idempotency_key: str) -> WorkItem:
        query = self._queries["get_by_key"]
        item = await self._run(
            lambda conn: self._one(conn.execute(query, {"key": idempotency_key})), read=True
        )
        if item is None:
            raise ItemNotFound(idempotency_key, "idempotency key")
        return item

    # -- the outbox: enqueue on the application's own transaction ----------------------------

    def _outbox(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """Check the application's *conn* and hold a savepoint in its transaction around the
        body, with the queue's row factory and schema (see ``_outbox.py``)."""
        raise NotImplementedError  # pragma: no cover

    @entry_signature
    def enqueue_on(self, conn: Any, spec_id: str, **options: Unpack[EnqueueOptions]) -> WorkItem:
        """Enqueue on the application's own open transaction on *conn*; blocking (from Trio,
        call it in a thread: ``await trio.to_thread.run_sync(...)``).

        The item commits or rolls back with the application's transaction: this never commits
        it nor rolls it back. The arguments and the result are those of :meth:`enqueue`
        (:meth:`enqueue_many_on` for several, and to learn whether a key matched). Workers
        learn of the item when the transaction commits, never before: PostgreSQL's ``NOTIFY``
        is sent in the transaction (and delivered at commit only); SQLite's
        :meth:`wait_for_work` sees the commit through ``PRAGMA data_version``. If this
        raises, nothing of the call is written and the transaction is still usable.

        :param conn: a ``sqlite3.Connection`` to the queue's file, or a sync
            ``psycopg.Connection`` to the queue's database, with a transaction open or about
            to open (see the Queues guide, "Enqueue in your own transaction").
        """
        entry = NewItem(spec_id=spec_id, **options)
        [done] = self.enqueue_many_on(conn, [entry])
        return done.item

    def enqueue_many_on(self, conn: Any, entries: Sequence[NewItem]) -> list[Enqueued]:
        """:meth:`enqueue_many` on the application's own open transaction on *conn*: one
        :class:`Enqueued` per entry, in order; see :meth:`enqueue_on`. Every entry is checked
        before anything is sent on *conn*; if this raises, none of the batch is written."""
        batch = self._prepare(entries)
        if not batch.entries:
            return []
        try:
            with self._outbox(conn) as inner:
                done, _ = self._write_batch(inner, batch, notify=True)
        except _IdTaken as taken:
            # That savepoint is rolled back: ask in another which explicit id exists.
            with self._outbox(conn) as inner:
                self._raise_taken(inner, taken)
        return done

    async def get(self, item_id: str) -> WorkItem:
        query = self._queries["get"]
        item = await self._run(
            lambda conn: self._one(conn.execute(query, {"id": item_id})), read=True
        )
        if item is None:
            raise ItemNotFound(item_id)
        return item

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

        def run(conn: Any) -> list[WorkItem]:
            with self._snapshot(conn):  # one statement per state: one snapshot for them all
                return _sql.list_page(
                    conn, queries, params, self._all, states=states, after=after, start=start
                )

        return await self._run(run, read=True)

    async def counts(self) -> Mapping[tuple[str, ItemState], int]:
        query = self._queries["counts"]
        rows = await self._run(lambda conn: conn.execute(query).fetchall(), read=True)
        return {(row["spec_id"], ItemState(row["state"])): row["n"] for row in rows}

    async def list_children(self, parent_id: str, *, limit: int = 1000) -> list[WorkItem]:
        params = {"parent_id": parent_id, "limit": _sql.check_limit(limit)}
        query = self._queries["list_children"]
        return await self._run(lambda conn: self._all(conn.execute(query, params)), read=True)

    async def request_cancel(self, item_id: str) -> WorkItem:
        now = self._now()
        params = {"id": item_id, "now": now}
        query = self._queries["request_cancel"]

        def run(conn: Any) -> WorkItem | None:
            with self._transaction(conn):
                item = self._one(conn.execute(query, params))
                if (
                    item is not None
                    and item.parent_id is not None
                    and item.state is ItemState.CANCELLED
                ):
                    # A waited-for child cancelled while queued: its parent's fan-in counts it.
                    self._notify(conn, self._fan_in(conn, [item_id], now))
                return item

        item = await self._run(run)
        if item is None:
            raise ItemNotFound(item_id)
        self._changed()
        return item

    async def retry(self, item_id: str, *, at: dt.datetime | None = None) -> WorkItem:
        now = self._now()
        params = {"id": item_id, "now": now, "at": now if at is None else self._time(at)}
        queries = self._queries

        def run(conn: Any) -> WorkItem:
            with self._transaction(conn):
                cur = conn.execute(queries["retry"], params)
                row = cur.fetchone()
                if row is not None:
                    if row["due_now"]:
                        self._notify(conn, [row["spec_id"]])
                    return self._decode(cur, row)
                if conn.execute(queries["get"], params).fetchone() is None:
                    raise ItemNotFound(item_id)
                raise ItemStateError(f"item {item_id!r} is running; cancel it first")

        item = await self._run(run)
        self._changed()
        return item

    # -- retention and editing ---------------------------------------------------------------

    async def prune(
        self,
        older_than: Mapping[ItemState, float],
        *,
        limit: int | None = None,
        dry_run: bool = False,
    ) -> dict[ItemState, int]:
        ages = check_prune(older_than, limit)
        query = self._queries["prune_count" if dry_run else "prune"]
        counts: dict[ItemState, int] = {}
        for state, age in ages.items():
            params = {
                "state": str(state),
                "age_us": _sql.duration_us(f"older_than[{state}]", age),
                "now": self._now(),
                "limit": self._no_limit if limit is None else limit,
            }

            def count(conn: Any, params: dict[str, Any] = params) -> int:
                return int(conn.execute(query, params).fetchone()["n"])

            def delete(conn: Any, params: dict[str, Any] = params) -> int:
                with self._write(conn):  # one short transaction per state and batch
                    return int(conn.execute(query, params).rowcount)

            counts[state] = await (self._run(count, read=True) if dry_run else self._run(delete))
        if not dry_run and any(counts.values()):
            self._changed()
        return counts

    async def delete(self, item_id: str) -> WorkItem:
        params = {"id": item_id}
        queries = self._queries

        def run(conn: Any) -> WorkItem:
            with self._write(conn):
                item = self._one(conn.execute(queries["delete_item"], params))
                if item is not None:
                    return item
                current = conn.execute(queries["get"], params).fetchone()
                if current is None:
                    raise ItemNotFound(item_id)
                if current["state"] == "running":
                    raise ItemStateError(f"item {item_id!r} is running; cancel it first")
                if current["waiting_children"]:
                    raise ItemStateError(f"item {item_id!r} is waiting for its children")
                raise ItemStateError(_WAITED_FOR.format(item_id=item_id))

        item = await self._run(run, retry=False)  # a lost commit would read as "not found"
        self._changed()
        return item

    async def edit_config(self, item_id: str, config: JSONValue) -> WorkItem:
        params = {"id": item_id, "config": json.dumps(check_config(config)), "now": self._now()}
        queries = self._queries

        def run(conn: Any) -> WorkItem:
            with self._write(conn):
                item = self._one(conn.execute(queries["edit_config"], params))
                if item is not None:
                    return item
                if conn.execute(queries["get"], params).fetchone() is None:
                    raise ItemNotFound(item_id)
                raise ItemStateError(
                    f"item {item_id!r} is running; its config can change once it is not"
                )

        return await self._run(run)

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
        params = self._claim_params(spec_ids, worker_id, lease, limit, queue)
        if limit == 0 or not spec_ids:
            await trio.lowlevel.checkpoint()
            return []
        return self._claimed_items(await self._run(lambda conn: self._claim_rows(conn, params)))

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
        if (
            s.delay == 0
            and s.at is None
            and not s.children
            and s.kind is not _RESCHEDULE
            and (s.result is None or s.kind is not _COMPLETE)
        ):
            return index, s, PLAIN_VALUES  # nothing to convert, nothing that can be refused
        try:
            values = {
                # No delay is the common one (a completion): 0 without the checks' arithmetic.
                "delay_us": 0 if s.delay == 0 else _sql.duration_us("delay", s.delay),
                "at": None if s.at is None else self._time(s.at),
                # A runner's own settlement carries check_json's copies already (``_checked``,
                # see _workflow._plain_settlement): dumped without checking them again.
                "config": (
                    json.dumps(s.config if s._checked else check_json(s.config))
                    if s.kind is SettleKind.RESCHEDULE
                    else None
                ),
                "result": (
                    json.dumps(s.result if s._checked else check_json(s.result, what="result"))
                    if s.kind is SettleKind.COMPLETE and s.result is not None
                    else None
                ),
                "children": [
                    check_child(child, what=f"children[{index}]")
                    for index, child in enumerate(s.children)
                ]
                if s.children
                else [],
            }
        except (ValueError, OverflowError) as error:
            return self._entry(index, unstorable_outcome(s, error))
        return index, s, values

    def _write_children(
        self, conn: Any, s: Settlement, children: Sequence[NewItem]
    ) -> tuple[int, list[str]]:
        """Enqueue the checked *children* of the applied settlement *s* through
        :meth:`_enqueue_rows` (in the settlement's transaction) and record their parent; how
        many were created, and the spec ids due now.

        A child repeating an earlier child's id, or whose id exists already, is left out first,
        so the enqueue core never refuses the settlement for it; one whose key is held is not
        created by the core itself. None of these is this parent's child, nor waited for.
        """
        wanted: dict[str, NewItem] = {}
        for child in children:
            assert child.item_id is not None  # Settlement names every child
            wanted.setdefault(child.item_id, child)
        taken = {
            row["id"]
            for row in conn.execute(
                self._queries["existing_ids"], {"ids": self._ids(list(wanted))}
            ).fetchall()
        }
        fresh = [child for item_id, child in wanted.items() if item_id not in taken]
        if not fresh:
            return 0, []
        done, due = self._enqueue_rows(conn, fresh)
        version = s.lease_version if s.wait_for_children else None
        made = [
            {"id": each.item.id, "parent_id": s.item_id, "parent_version": version}
            for each in done
            if each.created
        ]
        if made:
            self._set_parents(conn, made)
        return len(made), due

    def _children_and_fan_in(
        self, conn: Any, entries: Sequence[SettleEntry], rows: Sequence[Row], now: Any
    ) -> list[str]:
        """After *rows* settled: write the applied entries' children and waits, and count the
        finished children toward their parents; the spec ids that became due."""
        due: list[str] = []
        # Entry by entry, in batch order, as the memory queue writes them (so an id or key two
        # entries' children share goes to the first that creates it).
        for ord_ in sorted(row["ord"] for row in rows):
            _, s, values = entries[ord_ - 1]
            created = 0
            if values["children"]:
                created, created_due = self._write_children(conn, s, values["children"])
                due.extend(created_due)
            if s.wait_for_children:
                params = {
                    "id": s.item_id,
                    "version": s.lease_version,
                    "n": created,
                    "waiting": self._time(WAITING_DUE_AT),
                    "now": now,
                }
                waited = conn.execute(self._queries["wait_for_children"], params).fetchone()
                if waited is not None and waited["due_now"]:
                    due.append(waited["spec_id"])
        finished = [
            entries[row["ord"] - 1][1].item_id
            for row in rows
            if row["parent_id"] is not None and row["state"] in _FINISHED_STATES
        ]
        if finished:
            due.extend(self._fan_in(conn, finished, now))
        return due

    def _settle_plan(
        self, settlements: Sequence[Settlement]
    ) -> tuple[dict[tuple[str, int], int] | None, list[Settlement], list[SettleEntry], bool]:
        """The settlements to send (each (id, version) once), as entries: (the index of each
        pair's first settlement, or None when no pair repeats and every settlement is sent;
        the sent settlements; their entries; whether any entry has children or waits for
        them)."""
        # One statement cannot update a row twice, and a second write with the same
        # (id, version) would be stale after the first anyway: send each pair once. No pair
        # repeats in a runner's batches: one set of the pairs (a C loop) tells.
        first: dict[tuple[str, int], int] | None = None
        if len(set(map(_PAIR, settlements))) == len(settlements):
            sent = list(settlements)
        else:
            first = {}
            for index, s in enumerate(settlements):
                first.setdefault((s.item_id, s.lease_version), index)
            sent = [settlements[index] for index in sorted(first.values())]
        entry = self._entry
        entries = [entry(index, s) for index, s in enumerate(sent)]
        # An entry's children are converted from its settlement's (the same number).
        written = list(map(_SETTLEMENT, entries))
        children = any(map(_CHILDREN, written)) or any(map(_WAITS, written))
        return first, sent, entries, children

    def _settle_in(
        self, conn: Any, entries: Sequence[SettleEntry], now: Any, children: bool
    ) -> list[Row]:
        """Apply *entries* in the transaction the caller holds: the fenced update, children,
        fan-in and the wake-ups; the rows settled."""
        rows = self._settle_rows(conn, entries, now)
        due = woken_by(rows)
        if rows and (children or any(row["parent_id"] is not None for row in rows)):
            due.extend(self._children_and_fan_in(conn, entries, rows, now))
        self._notify(conn, due)
        return rows

    def _settle_sync(
        self, conn: Any, entries: Sequence[SettleEntry], now: Any, children: bool, *, why: bool
    ) -> set[int]:
        """Write *entries*, a transaction per try; the indices of the applied ones. A batch the
        database refuses for one entry's value is written entry by entry, so that entry alone
        becomes dead (:func:`unstorable_outcome`)."""
        data_errors = self._data_errors()

        def write(entries: Sequence[SettleEntry]) -> list[Row]:
            with self._transaction(conn):
                rows = self._settle_in(conn, entries, now, children)
                if why and not rows:
                    s = entries[0][1]
                    raise LeaseLost(s.item_id, s.lease_version, self._why(conn, s.item_id))
            return rows

        try:
            return {entries[row["ord"] - 1][0] for row in write(entries)}
        except data_errors:
            if why:
                raise
        # One entry holds a value the database refuses: write them one by one, so it alone
        # becomes dead (unstorable_outcome) and its batch-mates are settled as asked.
        applied = set()
        for index, s, values in entries:
            try:
                rows = write([(index, s, values)])
            except data_errors as error:
                rows = write([self._entry(index, unstorable_outcome(s, error))])
            if rows:
                applied.add(index)
        return applied

    def _settle_results(
        self,
        settlements: Sequence[Settlement],
        first: Mapping[tuple[str, int], int] | None,
        sent: Sequence[Settlement],
        applied: set[int],
    ) -> list[bool]:
        """Per settlement, whether it was applied (a repeated (id, version) never is)."""
        if first is None:  # every settlement was sent, at its own index
            results = list(map(applied.__contains__, range(len(settlements))))
        else:
            applied_ids = {(sent[i].item_id, sent[i].lease_version) for i in applied}
            results = [
                (s.item_id, s.lease_version) in applied_ids
                and first[(s.item_id, s.lease_version)] == i
                for i, s in enumerate(settlements)
            ]
        if any(results):
            self._changed()
        return results

    async def _settle(self, settlements: Sequence[Settlement], *, why: bool) -> list[bool]:
        first, sent, entries, children = self._settle_plan(settlements)
        if not sent:
            await trio.lowlevel.checkpoint()
            return []
        now = self._now()
        applied = await self._run(
            lambda conn: self._settle_sync(conn, entries, now, children, why=why)
        )
        return self._settle_results(settlements, first, sent, applied)

    def _claim_params(
        self, spec_ids: Sequence[str], worker_id: str, lease: float, limit: int, queue: str
    ) -> dict[str, Any]:
        """``claim_due``'s statement parameters, checked."""
        return {
            "queue": queue,
            "spec_ids": self._ids(spec_ids),
            "worker_id": worker_id,
            "lease_us": _sql.duration_us("lease", lease, positive=True),
            "limit": _sql.check_limit(limit),
            "now": self._now(),
        }

    @staticmethod
    def _claimed_items(items: list[WorkItem]) -> list[WorkItem]:
        """The claimed *items* in claim order."""
        items.sort(key=_claim_order)
        return items

    def _settle_and_claim_in(
        self,
        conn: Any,
        entries: Sequence[SettleEntry],
        now: Any,
        children: bool,
        params: dict[str, Any],
    ) -> tuple[set[int], list[WorkItem]]:
        """Settle *entries* and claim (``claim_due``'s *params*) in one transaction; the
        indices applied and the items claimed. Raises the driver's data error, having written
        nothing, when the database refuses an entry's value (the caller then writes the batch
        the slow way). SQLite: one ``BEGIN IMMEDIATE``; PostgreSQL overrides it."""
        with self._transaction(conn):
            rows = self._settle_in(conn, entries, now, children)
            claimed = self._claim_in(conn, params)
        return {entries[row["ord"] - 1][0] for row in rows}, claimed

    def _claim_in(self, conn: Any, params: dict[str, Any]) -> list[WorkItem]:
        """:meth:`_claim_rows` inside the transaction the caller holds."""
        raise NotImplementedError  # pragma: no cover

    async def settle_and_claim(
        self,
        settlements: Sequence[Settlement],
        spec_ids: Sequence[str],
        worker_id: str,
        lease: float,
        limit: int,
        *,
        queue: str = DEFAULT_QUEUE,
    ) -> tuple[list[bool], list[WorkItem]]:
        """:meth:`settle_many` then :meth:`claim_due`, in one call: one thread hop, one
        transaction (SQLite: one ``BEGIN IMMEDIATE``; PostgreSQL: one pipelined transaction, one
        commit, when the batch has no children).

        When it raises, nothing was claimed, and the settlements are as after a failed
        :meth:`settle_many`. Once the settlements are written, a claim that fails comes back
        empty instead (the next :meth:`claim_due` reports the error).
        """
        params = self._claim_params(spec_ids, worker_id, lease, limit, queue)
        if limit == 0 or not spec_ids:
            return await self.settle_many(settlements), []
        first, sent, entries, children = self._settle_plan(settlements)
        if not sent:
            return [], await self.claim_due(spec_ids, worker_id, lease, limit, queue=queue)
        now = params["now"]
        data_errors = self._data_errors()

        def run(conn: Any) -> tuple[set[int], list[WorkItem]]:
            try:
                return self._settle_and_claim_in(conn, entries, now, children, params)
            except data_errors:
                pass
            # An entry the database refuses: the slow way, then the claim on its own.
            applied = self._settle_sync(conn, entries, now, children, why=False)
            return applied, self._claim_after(conn, params)

        applied, rows = await self._run(run)
        return self._settle_results(settlements, first, sent, applied), self._claimed_items(rows)

    def _claim_after(self, conn: Any, params: dict[str, Any]) -> list[WorkItem]:
        """A claim after the settlements committed: one that fails claims nothing (see
        :meth:`settle_and_claim`), since raising would report the written settlements as
        failed."""
        try:
            return self._claim_rows(conn, params)
        except Exception:
            return []

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

    # -- schedules ---------------------------------------------------------------------------

    async def fire_schedule(self, name: str, fire: dt.datetime, entry: NewItem) -> Enqueued | None:
        batch = self._prepare([entry])
        params = {
            "name": check_name(name, "schedule name"),
            "fire": self._time(utc(fire)),
            "now": self._now(),
        }
        queries = self._queries

        def run(conn: Any) -> Enqueued | None:
            with self._transaction(conn):
                recorded = conn.execute(queries["record_fire"], params).fetchone()
                if recorded is None:
                    return None
                done, _ = self._write_batch(conn, batch, notify=True, check_ids=True)
                return done[0]

        # Not retried on a dead connection: the commit may have landed (see _run).
        enqueued = await self._run(run, retry=False)
        if enqueued is not None and enqueued.created:
            self._changed()
        return enqueued

    async def last_fires(self, names: Sequence[str]) -> dict[str, dt.datetime]:
        params = {"names": self._ids(list(names))}
        query = self._queries["last_fires"]
        rows = await self._run(lambda conn: conn.execute(query, params).fetchall(), read=True)
        return {row["name"]: self._from_time(row["last_fire_at"]) for row in rows}

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
            with self._snapshot(conn):
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
