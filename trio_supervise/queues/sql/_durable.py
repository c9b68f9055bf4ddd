"""The durable journal port of the SQL layer (:class:`~trio_supervise.queues.DurableJournal`):
each item incarnation's journal and the events sent to it, in two tables that name the
incarnation and go with their item (a trigger on delete; see the migrations).

A journal write is one fenced statement (``record_entry``); when it writes nothing, the same
transaction reads why. Writes made at once (workflows evaluated side by side) are written
together, one transaction and one thread hop for the group (:class:`JournalWrites`).

An event is kept and a queued item waiting for it made due in one transaction, which tells
other processes (``NOTIFY`` on PostgreSQL); an item running meanwhile
is flagged (``event_woken``), so that its evaluation's reschedule is due at once: the
evaluation may have looked for the event just before it came.
"""

from __future__ import annotations

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


def _loaded(value: Any) -> JSONValue:
    """A stored JSON value (its text, as both dialects' connections read it)."""
    return json.loads(value) if isinstance(value, str | bytes) else value


@attrs.define(eq=False)
class _Write:
    """One ``record_entry`` waiting for its group's transaction."""

    params: dict[str, Any]
    done: bool = False
    error: Exception | None = None
    """Why it was refused (``LeaseLost``, ``ItemStateError``); None: recorded."""
    alone: bool = False
    """Its group's transaction failed: it is written again on its own."""


@attrs.define(eq=False)
class JournalWrites:
    """A queue's journal writes waiting to be written together (a group commit): one writer at
    a time takes every write waiting and records them in one transaction."""

    waiting: list[_Write] = attrs.Factory(list)
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
        queries = self._queries

        def run(conn: Any) -> tuple[list[Row], list[Row]]:
            with self._snapshot(conn):
                item = conn.execute(queries["journal_item"], {"id": item_id}).fetchone()
                if item is None:
                    raise ItemNotFound(item_id)
                params = {"id": item_id, "incarnation": item["incarnation"]}
                return (
                    conn.execute(queries["journal_entries"], params).fetchall(),
                    conn.execute(queries["journal_events"], params).fetchall(),
                )

        entries, events = await self._run(run, lane=Lane.READ)
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
        write = _Write(
            {
                "id": item_id,
                "version": lease_version,
                "position": entry.position,
                "kind": str(entry.kind),
                "name": entry.name,
                "result": json.dumps(entry.result),
                "attempts": entry.attempts,
                "started_at": self._time(entry.started_at),
                "finished_at": self._optional_time(entry.finished_at),
                "wake_at": self._optional_time(entry.wake_at),
            }
        )
        writes = self._journal_writes
        writes.waiting.append(write)
        try:
            while not write.done:
                if writes.writing:
                    await writes.turn.wait()
                else:
                    await self._write_journal(writes)
        finally:
            if not write.done and write in writes.waiting:
                writes.waiting.remove(write)  # cancelled before its turn: never written
        if write.alone:
            # Its group's transaction failed: written again on its own, so that it meets its
            # own error (a dead connection, a value out of range) and no other entry's.
            await self._run(lambda conn: self._record_group(conn, [write]), lane=Lane.WORKER)
        if write.error is not None:
            raise write.error

    async def _write_journal(self, writes: JournalWrites) -> None:
        """Write every journal entry waiting, in one transaction and one thread hop (a group
        commit: workflows evaluated at once record their steps together); the next group
        waits for this one's turn to end."""
        writes.writing = True
        group, writes.waiting = writes.waiting, []
        try:
            await self._run(lambda conn: self._record_group(conn, group), lane=Lane.WORKER)
        except Exception:
            for write in group:
                write.done = write.alone = True
        finally:
            # Not written (this writer was cancelled before its statement ran): first in line
            # for the next writer.
            writes.waiting[:0] = [write for write in group if not write.done]
            writes.writing = False
            turn, writes.turn = writes.turn, trio.Event()
            turn.set()

    def _record_group(self, conn: Any, group: list[_Write]) -> None:
        """Record each entry of *group*, fenced, in one transaction; each write learns its
        outcome once the transaction commits. Run again on a dead connection: a write that
        landed then reads as "recorded already", which a workflow never meets (it reads the
        journal again after any error)."""
        with self._transaction(conn):
            recorded = self._insert_entries(conn, [write.params for write in group])
            outcomes = [
                None if ok else self._refusal(conn, write.params)
                for write, ok in zip(group, recorded, strict=True)
            ]
        for write, outcome in zip(group, outcomes, strict=True):
            write.error, write.done, write.alone = outcome, True, False

    def _insert_entries(self, conn: Any, rows: list[dict[str, Any]]) -> list[bool]:
        """Run ``record_entry`` for each of *rows* (in the caller's transaction); whether each
        wrote its entry. PostgreSQL pipelines them (one round trip)."""
        query = self._queries["record_entry"]
        return [conn.execute(query, params).fetchone() is not None for params in rows]

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
