"""The durable journal port of the SQL layer (:class:`~trio_supervise.queues.DurableJournal`):
each item incarnation's journal and the events sent to it, in two tables that name the
incarnation and go with their item (a trigger on delete; see the migrations).

A journal write is one fenced statement (``record_entry``); when it writes nothing, the same
transaction reads why. Writes and reads made at once (workflows evaluated side by side) are run
together, one transaction and one thread hop for the group (:class:`JournalWrites`), the
group's writes in one statement (``record_entries``) and its reads in three.

An event is kept and a queued item waiting for it made due in one transaction, which tells
other processes (``NOTIFY`` on PostgreSQL); an item running meanwhile
is flagged (``event_woken``), so that its evaluation's reschedule is due at once: the
evaluation may have looked for the event just before it came.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from typing import Any

import attrs
import trio

from ..._errors import ItemNotFound, ItemStateError, LeaseLost
from ...job import (
    ItemEvent,
    ItemState,
    Journal,
    JournalEntry,
    JSONValue,
    check_entry,
    check_event,
)
from ._base import Lane, Row, SQLBase

__all__ = ["JournalWrites", "SQLDurable"]


_ENTRY_KEYS = (
    "id",
    "version",
    "position",
    "kind",
    "name",
    "result",
    "attempts",
    "started_at",
    "finished_at",
    "wake_at",
)
"""A ``record_entry``'s parameters, in the order of SQLite's ``record_entries`` row arrays."""


def _loaded(value: Any) -> JSONValue:
    """A stored JSON value (its text, as both dialects' connections read it)."""
    return json.loads(value) if isinstance(value, str | bytes) else value


@attrs.define(eq=False)
class _Op:
    """One ``record_entry`` (*params* set) or ``read_journal`` (None) waiting for its group."""

    item_id: str
    params: dict[str, Any] | None = None
    done: bool = False
    error: Exception | None = None
    """Why it was refused (``LeaseLost``, ``ItemStateError``, ``ItemNotFound``); None: done."""
    alone: bool = False
    """Its group's transaction failed: it is run again on its own."""
    rows: tuple[list[Row], list[Row]] = ([], [])
    """A read's entries and events, in order."""


@attrs.define(eq=False)
class JournalWrites:
    """A queue's journal reads and writes waiting to be run together (a group commit): one
    writer at a time takes every one waiting and runs them in one transaction."""

    waiting: list[_Op] = attrs.Factory(list)
    writing: bool = False
    turn: trio.Event = attrs.Factory(trio.Event)
    """Set when the current writer's turn ends (then replaced)."""


class SQLDurable(SQLBase):
    """The durable journal port: journals read, entries recorded fenced, events sent."""

    _journal_writes: JournalWrites
    """Each dialect's own (an attrs field)."""

    def _optional_time(self, value: dt.datetime | None) -> Any:
        return None if value is None else self._time(value)

    def _journal_entry(self, row: Row) -> JournalEntry:
        finished, wake = row["finished_at"], row["wake_at"]
        return JournalEntry(
            position=row["position"],
            kind=row["kind"],
            name=row["name"],
            result=_loaded(row["result"]),
            attempts=row["attempts"],
            started_at=self._from_time(row["started_at"]),
            finished_at=None if finished is None else self._from_time(finished),
            wake_at=None if wake is None else self._from_time(wake),
        )

    async def read_journal(self, item_id: str) -> Journal:
        # Read with the journal writes waiting, if any (one thread hop and one transaction for
        # the group: a workflow's first read costs no hop of its own while others write), else
        # in a snapshot on the reader.
        op = _Op(item_id)
        await self._journal_turn(op)
        entries, events = op.rows
        return Journal(
            entries=tuple(self._journal_entry(row) for row in entries),
            events=tuple(
                ItemEvent(
                    name=row["name"],
                    payload=_loaded(row["payload"]),
                    sent_at=self._from_time(row["sent_at"]),
                )
                for row in events
            ),
        )

    async def record_entry(self, item_id: str, lease_version: int, entry: JournalEntry) -> None:
        entry = check_entry(entry)
        result = entry.result
        op = _Op(
            item_id,
            {
                "id": item_id,
                "version": lease_version,
                "position": entry.position,
                "kind": str(entry.kind),
                "name": entry.name,
                "result": "null" if result is None else json.dumps(result),
                "attempts": entry.attempts,
                "started_at": self._time(entry.started_at),
                "finished_at": self._optional_time(entry.finished_at),
                "wake_at": self._optional_time(entry.wake_at),
            },
        )
        await self._journal_turn(op)

    async def _journal_turn(self, op: _Op) -> None:
        """Run *op* with the group it joins; raise its refusal."""
        writes = self._journal_writes
        writes.waiting.append(op)
        try:
            while not op.done:
                if writes.writing:
                    await writes.turn.wait()
                else:
                    await self._write_journal(writes)
        finally:
            if not op.done and op in writes.waiting:
                writes.waiting.remove(op)  # cancelled before its turn: never run
        if op.alone:
            # Its group's transaction failed: run again on its own, so that it meets its own
            # error (a dead connection, a value out of range) and no other entry's.
            await self._run_group([op])
        if op.error is not None:
            raise op.error

    async def _write_journal(self, writes: JournalWrites) -> None:
        """Run every journal read and write waiting, in one transaction and one thread hop (a
        group commit: workflows evaluated at once record their steps together); the next group
        waits for this one's turn to end."""
        writes.writing = True
        group: list[_Op] = []
        try:
            # The workflows woken with this one (by the last group's end) record their next
            # steps before it takes the group: one group for them, not one of one and another
            # of the rest. Twice: Trio runs the tasks woken together in a random order, so
            # after one checkpoint this one may still run first.
            await trio.lowlevel.checkpoint()
            await trio.lowlevel.checkpoint()
            group, writes.waiting = writes.waiting, []
            await self._run_group(group)
        except Exception:
            for op in group:
                op.done = op.alone = True
        finally:
            # Not run (this writer was cancelled before its statements ran): first in line for
            # the next writer.
            writes.waiting[:0] = [op for op in group if not op.done]
            writes.writing = False
            turn, writes.turn = writes.turn, trio.Event()
            turn.set()

    async def _run_group(self, group: list[_Op]) -> None:
        """A group with writes in one write transaction on the writer; reads alone in one
        snapshot on the reader, as before there were groups."""
        if any(op.params is not None for op in group):
            await self._run(lambda conn: self._record_group(conn, group), lane=Lane.WORKER)
        else:
            await self._run(lambda conn: self._read_group(conn, group), lane=Lane.READ)

    def _read_group(self, conn: Any, group: list[_Op]) -> None:
        with self._snapshot(conn):
            self._read_journals(conn, group)
        for op in group:
            op.done, op.alone = True, False

    def _record_group(self, conn: Any, group: list[_Op]) -> None:
        """Run each op of *group* in one transaction, the reads first, each write fenced; each
        learns its outcome once the transaction commits. Run again on a dead connection: a
        write that landed then reads as "recorded already", which a workflow never meets (it
        reads the journal again after any error)."""
        reads = [op for op in group if op.params is None]
        writes = [(op, op.params) for op in group if op.params is not None]
        with self._journal_transaction(conn):
            self._read_journals(conn, reads)
            recorded = self._insert_entries(conn, [params for _, params in writes])
            outcomes = [
                None if ok else self._refusal(conn, params)
                for (_, params), ok in zip(writes, recorded, strict=True)
            ]
        for (op, _), outcome in zip(writes, outcomes, strict=True):
            op.error = outcome
        for op in group:
            op.done, op.alone = True, False

    def _journal_transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """What a group runs in: a transaction (PostgreSQL: pipelined, its BEGIN sent with the
        first statements)."""
        return self._transaction(conn)

    def _read_journals(self, conn: Any, reads: list[_Op]) -> None:
        """Each read's journal: three statements for the group, whatever its size."""
        if not reads:
            return
        queries = self._queries
        params = {"ids": self._id_list(list(dict.fromkeys(op.item_id for op in reads)))}
        # All three sent before any is read: one round trip for them in a pipeline.
        cursors = [
            conn.execute(queries[name], params)
            for name in ("journal_items", "journal_entries_of", "journal_events_of")
        ]
        there = {row["id"] for row in cursors[0].fetchall()}
        entries: dict[str, list[Row]] = {}
        for row in cursors[1].fetchall():
            entries.setdefault(row["item_id"], []).append(row)
        events: dict[str, list[Row]] = {}
        for row in cursors[2].fetchall():
            events.setdefault(row["item_id"], []).append(row)
        for op in reads:
            if op.item_id in there:
                op.rows = (entries.get(op.item_id, []), events.get(op.item_id, []))
                op.error = None
            else:
                op.error = ItemNotFound(op.item_id)

    def _id_list(self, ids: list[str]) -> Any:
        """A list of item ids as the dialect's statements take it (SQLite: JSON text)."""
        return json.dumps(ids)

    def _insert_entries(self, conn: Any, rows: list[dict[str, Any]]) -> list[bool]:
        """Run ``record_entry`` for each of *rows* (in the caller's transaction); whether each
        wrote its entry. One statement for the group (``record_entries``), unless two rows
        name one item and position (then one statement each, in order)."""
        if not rows:
            return []
        keys = {(params["id"], params["position"]) for params in rows}
        if len(rows) == 1 or len(keys) != len(rows):
            query = self._queries["record_entry"]
            return [conn.execute(query, params).fetchone() is not None for params in rows]
        written = {
            (row["item_id"], row["position"])
            for row in conn.execute(self._queries["record_entries"], self._entries_params(rows))
        }
        return [(params["id"], params["position"]) in written for params in rows]

    def _entries_params(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """``record_entries``'s parameters (SQLite: one JSON array of rows)."""
        return {"rows": json.dumps([[params[key] for key in _ENTRY_KEYS] for params in rows])}

    def _refusal(self, conn: Any, params: dict[str, Any]) -> Exception:
        """Why ``record_entry`` wrote nothing: a stale lease, or the position taken."""
        queries = self._queries
        item_id, version = params["id"], params["version"]
        item = conn.execute(queries["journal_item"], {"id": item_id}).fetchone()
        if item is None:
            return LeaseLost(item_id, version, "no such item")
        if item["state"] != ItemState.RUNNING or item["lease_version"] != version:
            return LeaseLost(
                item_id, version, f"item is {item['state']} at version {item['lease_version']}"
            )
        there = conn.execute(
            queries["journal_position"],
            {"id": item_id, "incarnation": item["incarnation"], "position": params["position"]},
        ).fetchone()
        return ItemStateError(
            f"item {item_id!r}: journal position {params['position']} is recorded already "
            f"({there['kind']} {there['name']!r})"
        )

    async def send_event(self, item_id: str, name: str, payload: JSONValue = None) -> None:
        payload = check_event(name, payload)
        now = self._now()
        queries = self._queries
        look = queries.get("journal_item_locked", queries["journal_item"])

        def run(conn: Any) -> None:
            with self._transaction(conn):
                item = conn.execute(look, {"id": item_id}).fetchone()
                if item is None:
                    raise ItemNotFound(item_id)
                if ItemState(item["state"]).finished:
                    raise ItemStateError(
                        f"item {item_id!r} is {item['state']}: it takes no more events"
                    )
                params = {
                    "id": item_id,
                    "incarnation": item["incarnation"],
                    "name": name,
                    "payload": json.dumps(payload),
                    "now": now,
                }
                conn.execute(queries["insert_event"], params)
                conn.execute(queries["wake_running"], params)
                woken = conn.execute(queries["wake_waiting"], params).fetchone()
                if woken is not None:
                    self._notify(conn, [woken["spec_id"]])

        await self._run(run, lane=Lane.CALLER, retry=False)
        self._changed()
