"""The producer port of the SQL layer: enqueueing, written once as a synchronous core.

:class:`EnqueueCore` checks a batch and converts it (:meth:`EnqueueCore._prepare`, rows made by
the encoder ``_rows.py`` generates from :class:`NewItem`'s declaration) and writes it in a
transaction its caller holds (:meth:`EnqueueCore._write_batch`), idempotency keys and their
scopes included: the queue's own :meth:`SQLProducer.enqueue_many`, a settlement's children,
a schedule's fire, or the application's code on its own connection
(:meth:`SQLProducer.enqueue_on`, see ``_outbox.py``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import attrs
import trio
from typing_extensions import Unpack

from ..._errors import DuplicateItem, ItemNotFound, QueueError
from ...job import (
    Enqueued,
    EnqueueOptions,
    ItemState,
    NewItem,
    WorkItem,
    check_entries,
    check_unique,
    created_item,
    new_item_ids,
    plan_batch,
    repeated_id,
)
from .. import _sql
from .._ports import EnqueueFront, entry_signature
from ._base import Lane, SQLBase
from ._rows import NEW_ROW_COLUMNS, row_encoder

__all__ = ["EnqueueBatch", "EnqueueCore", "OutboxWrites", "SQLProducer"]


@attrs.frozen
class EnqueueBatch:
    """A checked batch of new items, converted for the database (:meth:`EnqueueCore._prepare`)."""

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
_CONFIG = NEW_ROW_COLUMNS.index("config")
_DUE_AT = NEW_ROW_COLUMNS.index("due_at")


class _IdTaken(Exception):
    """An insert of a batch with explicit ids broke a uniqueness (see
    :meth:`EnqueueCore._write_batch`): *ids* the batch's explicit ids, *error* the driver's."""

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


class EnqueueCore(SQLBase):
    """The enqueue core every port that creates items shares (producers, a settlement's
    children, a schedule's fire)."""

    # -- hooks -------------------------------------------------------------------------------

    def _is_duplicate(self, error: Exception) -> bool:
        """True if *error* is a unique violation (an explicit item id that exists)."""
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

    # -- the core ----------------------------------------------------------------------------

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
        debounced = {pos for pos, index in enumerate(batch.sent) if batch.entries[index].debounce}
        replaced: set[int] = set()
        """Positions whose key's queued holder took their config and due time."""
        if keyed:
            pending = self._take_keys(cur, rows, pending, found, now, debounced, replaced)
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
            pending = self._take_keys(cur, rows, missing, found, now, debounced, replaced)
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
                if pos in replaced:
                    due.add(found[pos].spec_id)  # due sooner, maybe: a wake-up to look
                sent_done.append(Enqueued(item=found[pos], created=False, replaced=pos in replaced))
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
        debounced: set[int],
        replaced: set[int],
    ) -> list[int]:
        """Release the lapsed holders of the keys at *positions* and record the live holders
        in *found*; the positions left to insert. A *debounced* position whose holder is
        queued gives it its config and due time (recorded in *replaced*); one whose holder is
        running takes the key from it (the running item is never changed otherwise)."""
        queries = self._queries
        keys = self._ids(sorted({rows[pos][_KEY] for pos in positions} - {None}))
        cur.execute(queries["release_keys"], {"keys": keys, "now": now})
        cur.execute(queries["holders"], {"keys": keys})
        holders = {item.idempotency_key: item for item in self._all(cur)}
        left = []
        for pos in positions:
            holder = holders.get(rows[pos][_KEY])
            if holder is not None and pos in debounced:
                holder, took = self._debounce(cur, rows[pos], holder, now)
                if took:
                    replaced.add(pos)
            if holder is None:
                left.append(pos)
            else:
                found[pos] = holder
        return left

    def _debounce(
        self, cur: Any, row: tuple[Any, ...], holder: WorkItem, now: Any
    ) -> tuple[WorkItem | None, bool]:
        """A debounced entry (*row*) meets its key's *holder*: a queued holder takes the row's
        config and due time (the item as written, True); a running one gives up the key (None:
        the row is to be inserted); else the holder as it is (a claim or a settlement may have
        moved it since it was read: the statements check its state again)."""
        queries = self._queries
        if holder.state is ItemState.QUEUED and not holder.waiting_children:
            params = {"id": holder.id, "config": row[_CONFIG], "due_at": row[_DUE_AT], "now": now}
            updated = self._one(cur.execute(queries["debounce"], params))
            if updated is not None:
                return updated, True
        released = (
            holder.state is ItemState.RUNNING
            and cur.execute(queries["release_running_key"], {"id": holder.id}).fetchone()
        )
        return (None, False) if released else (holder, False)


class OutboxWrites(EnqueueCore):
    """Enqueueing on the application's own transaction, blocking: what a SQL queue offers
    (``enqueue_on``) and what a producer outside Trio is (:mod:`trio_supervise.producer`);
    each dialect's :meth:`_outbox` checks the connection and holds the savepoint.

    The enqueue is the core's (:meth:`EnqueueCore._write_batch`, the same statements and
    checks as ``enqueue_many``), with ``notify``: on PostgreSQL the insert sends the
    ``NOTIFY`` itself, in the application's transaction (delivered at its commit)."""

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


class SQLProducer(OutboxWrites, EnqueueFront):
    """The producer port: ``enqueue`` (:class:`EnqueueFront`), ``enqueue_many``, ``get_by_key``,
    and enqueueing on the application's own transaction (:class:`OutboxWrites`)."""

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
        done = await self._run(run, lane=Lane.CALLER, retry=False)
        if any(each.created for each in done):
            self._changed()
        return done

    async def get_by_key(self, idempotency_key: str) -> WorkItem:
        query = self._queries["get_by_key"]
        item = await self._run(
            lambda conn: self._one(conn.execute(query, {"key": idempotency_key})), lane=Lane.READ
        )
        if item is None:
            raise ItemNotFound(idempotency_key, "idempotency key")
        return item
