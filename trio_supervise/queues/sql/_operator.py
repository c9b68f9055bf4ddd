"""The operator port of the SQL layer: what a person or a console reads and does.

Reads (``get``, ``list_items``, ``counts``, ``list_children``, ``list_queues``) run on the
dialect's read connections and take one snapshot when they take several statements; actions
(``request_cancel``, ``retry``, ``delete``, ``edit_config``, pausing and resuming a queue) are
one short transaction each.
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
import json
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from ..._errors import ItemNotFound, ItemStateError
from ...job import (
    ItemError,
    ItemState,
    JSONValue,
    QueueInfo,
    WorkItem,
    check_config,
    check_errors_page,
    check_queue_name,
    check_tags,
    item_errors,
    newest_errors,
)
from .. import _sql
from ._base import Lane, Row
from ._key_rates import SQLKeyRates

__all__ = ["SQLOperator"]

_WAITED_FOR = (
    "item {item_id!r} is a child its parent waits for; cancel it first (the parent counts it), "
    "then delete it"
)


def _list_page(
    conn: Any,
    queries: Mapping[str, str],
    params: Mapping[str, Any],
    items: Callable[[Any], list[WorkItem]],
    *,
    states: Sequence[ItemState] | None,
    after: str | None,
    start: Any,
) -> list[WorkItem]:
    """``list_items`` on a SQL backend (*conn* a sqlite3 or psycopg connection, dict-like rows;
    *items* reads a cursor's rows as items).

    One indexed page per state (``list_state``, or ``list_state_specs`` when *params* holds
    spec ids; ``list_running``/``list_running_specs`` for the running state where the dialect
    has them) after the cursor ``(due_at, id)``, merged by ``(due_at, id)`` and cut at
    ``params["limit"]``. The cursor is the row of the item *after* (:class:`ItemNotFound` if
    there is none), or *start*, a time before every stored one.
    """
    after_due, after_id = start, ""
    if after is not None:
        cursor = conn.execute(queries["get"], {"id": after}).fetchone()
        if cursor is None:
            raise ItemNotFound(after)
        after_due, after_id = cursor["due_at"], cursor["id"]
    specs = params["spec_ids"] is not None
    wanted = list(ItemState) if states is None else list(dict.fromkeys(states))
    pages = [
        items(
            conn.execute(
                listing_statement(queries, state, specs=specs),
                {**params, "state": str(state), "after_due": after_due, "after_id": after_id},
            )
        )
        for state in wanted
    ]
    merged = heapq.merge(*pages, key=_list_order)
    return list(itertools.islice(merged, params["limit"]))


def listing_statement(queries: Mapping[str, str], state: ItemState, *, specs: bool) -> str:
    """The statement that lists one page of *state* (of some specs only, with *specs*).

    A dialect whose listing index holds the running rows too has one statement for every state
    (SQLite); PostgreSQL's reads the running ones from the lease index, in a statement of their
    own (``list_running``): one statement with an arm per kind, only one of which could return
    rows, had the planner plan the other arm too (at a million rows a parallel scan, whose
    workers started to read nothing).
    """
    suffix = "_specs" if specs else ""
    query = queries[f"list_state{suffix}"]
    if state is ItemState.RUNNING:
        return queries.get(f"list_running{suffix}", query)
    return query


_list_order: Callable[[WorkItem], tuple[dt.datetime, str]] = operator.attrgetter("due_at", "id")


class SQLOperator(SQLKeyRates):
    """The operator port: reads and actions of a person, the CLI or a console."""

    # -- reads -------------------------------------------------------------------------------

    async def get(self, item_id: str) -> WorkItem:
        query = self._queries["get"]
        item = await self._run(
            lambda conn: self._one(conn.execute(query, {"id": item_id})), lane=Lane.READ
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
        tags: Sequence[str] | None = None,
    ) -> list[WorkItem]:
        wanted = check_tags(tags or ())
        params: dict[str, Any] = {
            "spec_ids": None if spec_ids is None else self._ids(spec_ids),
            "limit": _sql.check_limit(limit),
            "tags": json.dumps(wanted) if wanted else None,
        }
        queries, start = self._queries, self._first_cursor

        def run(conn: Any) -> list[WorkItem]:
            with self._snapshot(conn):  # one statement per state: one snapshot for them all
                return _list_page(
                    conn, queries, params, self._all, states=states, after=after, start=start
                )

        return await self._run(run, lane=Lane.READ)

    async def recent_errors(self, *, limit: int = 50, before: str | None = None) -> list[ItemError]:
        """The entries of every item's error history, newest first (see
        :class:`~trio_supervise.queues.ErrorHistoryStore`).

        An item's errors are never newer than its ``updated_at``, so the items holding errors
        are read newest ``updated_at`` first, a batch at a time (the partial index
        ``trio_supervise_items_errors_idx``), until the errors found that are newer than every
        item left fill the page: a first page reads about as many items as it shows errors.
        """
        limit, key = check_errors_page(limit, before)
        query, batch = self._queries["items_with_errors"], max(limit, 50)

        def run(conn: Any) -> list[ItemError]:
            found: list[ItemError] = []
            params: dict[str, Any] = {"updated_at": None, "id": "", "limit": batch}
            with self._snapshot(conn):
                while True:
                    items = self._all(conn.execute(query, params))
                    found += item_errors(items, key)
                    if len(items) < batch:
                        return newest_errors(found, limit)
                    frontier = items[-1].updated_at
                    if sum(error.entry.at > frontier for error in found) >= limit:
                        return newest_errors(found, limit)
                    params["updated_at"] = self._time(frontier)
                    params["id"] = items[-1].id

        return await self._run(run, lane=Lane.READ)

    async def counts(self) -> Mapping[tuple[str, ItemState], int]:
        query = self._queries["counts"]
        rows = await self._run(lambda conn: conn.execute(query).fetchall(), lane=Lane.READ)
        return {(row["spec_id"], ItemState(row["state"])): row["n"] for row in rows}

    async def list_children(self, parent_id: str, *, limit: int = 1000) -> list[WorkItem]:
        params = {"parent_id": parent_id, "limit": _sql.check_limit(limit)}
        query = self._queries["list_children"]
        return await self._run(lambda conn: self._all(conn.execute(query, params)), lane=Lane.READ)

    async def list_queues(self) -> list[QueueInfo]:
        queries = self._queries

        def run(conn: Any) -> tuple[list[Row], list[Row], list[Row]]:
            with self._snapshot(conn):
                return (
                    conn.execute(queries["paused_queues"]).fetchall(),
                    conn.execute(queries["queue_counts"]).fetchall(),
                    conn.execute(queries["queue_rates"]).fetchall(),
                )

        paused_rows, count_rows, rate_rows = await self._run(run, lane=Lane.READ)
        paused = {row["queue"]: self._from_time(row["paused_at"]) for row in paused_rows}
        rates = self._rates_read(rate_rows)
        counts: dict[str, dict[ItemState, int]] = {name: {} for name in (*paused, *rates)}
        for row in count_rows:
            counts.setdefault(row["queue"], {})[ItemState(row["state"])] = row["n"]
        return [
            QueueInfo(
                name=name,
                paused=name in paused,
                paused_at=paused.get(name),
                counts=counts[name],
                rate_limit=rates[name][0] if name in rates else None,
                throttled_until=rates[name][1] if name in rates else None,
            )
            for name in sorted(counts)
        ]

    # -- actions -----------------------------------------------------------------------------

    def _current(self, conn: Any, item_id: str) -> WorkItem:
        """*item_id* as it stands, when an action changed nothing (:class:`ItemNotFound` if
        there is none)."""
        item = self._one(conn.execute(self._queries["get"], {"id": item_id}))
        if item is None:
            raise ItemNotFound(item_id)
        return item

    async def request_cancel(self, item_id: str) -> WorkItem:
        now = self._now()
        params = {"id": item_id, "now": now}
        query = self._queries["request_cancel"]

        def run(conn: Any) -> tuple[WorkItem, bool]:
            with self._transaction(conn):
                item = self._one(conn.execute(query, params))
                if item is None:  # finished, or flagged already: nothing to write
                    return self._current(conn, item_id), False
                if item.parent_id is not None and item.state is ItemState.CANCELLED:
                    # A waited-for child cancelled while queued: its parent's fan-in counts it.
                    self._notify(conn, self._fan_in(conn, [item_id], now))
                return item, True

        item, written = await self._run(run, lane=Lane.CALLER)
        if written:
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
                self._current(conn, item_id)
                raise ItemStateError(f"item {item_id!r} is running; cancel it first")

        item = await self._run(run, lane=Lane.CALLER)
        self._changed()
        return item

    async def delete(self, item_id: str) -> WorkItem:
        def refused(current: WorkItem) -> NoReturn:
            if current.state is ItemState.RUNNING:
                raise ItemStateError(f"item {item_id!r} is running; cancel it first")
            if current.waiting_children:
                raise ItemStateError(f"item {item_id!r} is waiting for its children")
            raise ItemStateError(_WAITED_FOR.format(item_id=item_id))

        item = await self._run(  # not retried: a lost commit would read as "not found"
            lambda conn: self._act(conn, "delete_item", {"id": item_id}, refused),
            lane=Lane.CALLER,
            retry=False,
        )
        self._changed()
        return item

    async def edit_config(self, item_id: str, config: JSONValue) -> WorkItem:
        params = {"id": item_id, "config": json.dumps(check_config(config)), "now": self._now()}

        def refused(current: WorkItem) -> NoReturn:
            raise ItemStateError(
                f"item {item_id!r} is running; its config can change once it is not"
            )

        return await self._run(
            lambda conn: self._act(conn, "edit_config", params, refused), lane=Lane.CALLER
        )

    def _act(
        self,
        conn: Any,
        name: str,
        params: Mapping[str, Any],
        refused: Callable[[WorkItem], NoReturn],
    ) -> WorkItem:
        """Run the one-item write *name*: the item as written; when it changed nothing,
        *refused* says why, from the item as it stands."""
        with self._write(conn):
            item = self._one(conn.execute(self._queries[name], params))
            if item is None:
                refused(self._current(conn, params["id"]))
            return item

    async def pause_queue(self, queue: str) -> bool:
        params = {"queue": check_queue_name(queue), "now": self._now()}
        query = self._queries["pause_queue"]

        def run(conn: Any) -> bool:
            with self._write(conn):
                return conn.execute(query, params).fetchone() is not None

        paused = await self._run(run, lane=Lane.CALLER)
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

        resumed = await self._run(run, lane=Lane.CALLER)
        self._changed()
        return resumed
