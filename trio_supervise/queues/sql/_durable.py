"""The durable journal port of the SQL layer (:class:`~trio_supervise.queues.DurableJournal`):
each item incarnation's journal and the events sent to it, in two tables that name the
incarnation and go with their item (a trigger on delete; see the migrations).

A journal write is one fenced statement (``record_entry``); when it writes nothing, the same
transaction reads why. An event is kept and a queued item waiting for it made due in one
transaction, which tells other processes (``NOTIFY`` on PostgreSQL); an item running meanwhile
is flagged (``event_woken``), so that its evaluation's reschedule is due at once: the
evaluation may have looked for the event just before it came.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

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

__all__ = ["SQLDurable"]


def _loaded(value: Any) -> JSONValue:
    """A stored JSON value (its text, as both dialects' connections read it)."""
    return json.loads(value) if isinstance(value, str | bytes) else value


class SQLDurable(SQLBase):
    """The durable journal port: journals read, entries recorded fenced, events sent."""

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
        params = {
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
        queries = self._queries

        def run(conn: Any) -> None:
            with self._transaction(conn):
                if conn.execute(queries["record_entry"], params).fetchone() is not None:
                    return
                item = conn.execute(queries["journal_item"], {"id": item_id}).fetchone()
                if item is None:
                    raise LeaseLost(item_id, lease_version, "no such item")
                if item["state"] != ItemState.RUNNING or item["lease_version"] != lease_version:
                    raise LeaseLost(
                        item_id,
                        lease_version,
                        f"item is {item['state']} at version {item['lease_version']}",
                    )
                there = conn.execute(
                    queries["journal_position"],
                    {"id": item_id, "incarnation": item["incarnation"], "position": entry.position},
                ).fetchone()
                raise ItemStateError(
                    f"item {item_id!r}: journal position {entry.position} is recorded already "
                    f"({there['kind']} {there['name']!r})"
                )

        # Retried on a dead connection: a write that landed reads as "recorded already" then,
        # which the workflow never meets (it reads the journal again after any error).
        await self._run(run, lane=Lane.WORKER)

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
