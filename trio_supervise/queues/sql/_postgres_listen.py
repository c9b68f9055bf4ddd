"""Wake-ups on PostgreSQL: the ``LISTEN`` thread, and the hints it passes to waiters.

A write that makes work due now sends ``NOTIFY`` in its transaction; a dedicated connection in a
thread (:class:`Listener`) ``LISTEN``\\ s and wakes this process's waiters (:class:`Wakeups`).
An enqueue's notification names the due item's queue and spec id (:func:`due_payload`), so a
waiter serving both returns at once, and one that no waiter serves wakes nobody; every other
notification makes the waiters look again. The listener reconnects when it drops (waking every
waiter, since notifications may have been missed).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence

import attrs
import trio

from .._sql import redact_dsn, scrub_dsn
from ._postgres_db import open_connection

__all__ = ["CHANNEL", "Hint", "Listener", "Waiter", "Wakeups", "due_hint", "due_payload"]

logger = logging.getLogger("trio_supervise.queues")

CHANNEL = "trio_supervise"
"""The ``LISTEN``/``NOTIFY`` channel (of the default schema; another schema's adds its name)."""
_MAX_PAYLOAD = 8000
"""PostgreSQL refuses a ``NOTIFY`` payload of this many bytes or more."""

Hint = tuple[str, str]
"""A notification's word that work is due now: ``(queue, spec_id)``."""


def due_payload(queue: str, spec_id: str) -> str:
    """The ``NOTIFY`` payload for an enqueued item due now: its queue and spec id, as a JSON pair
    (or the spec id alone, as other notifications send it, if the pair would be too long).

    The enqueue statement writes it in SQL (``enqueue_many`` in ``queries.sql``), byte for byte
    as this does: this is the format's definition for readers and tests."""
    payload = json.dumps([queue, spec_id], ensure_ascii=False, separators=(",", ":"))
    return payload if len(payload.encode()) < _MAX_PAYLOAD else spec_id


def due_hint(payload: str) -> Hint | None:
    """The ``(queue, spec_id)`` a :func:`due_payload` names; None for any other payload (a spec
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
class Waiter:
    """One :meth:`PostgresQueue.wait_for_work` call: what it serves, and whether a notification
    said such work is due."""

    spec_ids: frozenset[str]
    queues: frozenset[str] | None
    due: bool = False


@attrs.define(eq=False)
class Listener:
    """``LISTEN`` on a dedicated connection in a thread; reconnects when the connection drops.

    Each notification calls *wake* in Trio at once (``run_sync_soon``) with its hint (see
    :func:`due_hint`), None when anything may have changed (the connection was just made)."""

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
                            if not self._wake(due_hint(notify.payload)):
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
class Wakeups:
    """One queue's waiters, and the :class:`Listener` that wakes them (started by the first
    wait). *changed* wakes every waiter to look again (the queue's own writes call it too)."""

    dsn: str
    schema: str | None
    channel: str
    changed: Callable[[], None]
    listen: bool
    waiters: set[Waiter] = attrs.field(factory=set)
    _listener: Listener | None = None
    _closed: bool = False

    def start(self) -> None:
        """Start listening, unless it has started (or is off, or closed)."""
        if self.listen and self._listener is None and not self._closed:
            self._listener = Listener(
                dsn=self.dsn,
                schema=self.schema,
                channel=self.channel,
                token=trio.lowlevel.current_trio_token(),
                wake=self.notified,
            )
            self._listener.start()

    def notified(self, hint: Hint | None) -> None:
        """A notification arrived (the listener calls this in Trio). One naming a queue and spec
        id marks the waiters serving them due and wakes the waiters, or, if none serves them,
        nobody (it says nothing about other work); any other wakes every waiter to look again."""
        if hint is not None:
            queue, spec_id = hint
            named = False
            for waiter in self.waiters:
                if spec_id in waiter.spec_ids and (waiter.queues is None or queue in waiter.queues):
                    waiter.due = named = True
            if not named:
                return
        self.changed()

    @contextlib.contextmanager
    def waiting(self, spec_ids: Sequence[str], queues: Sequence[str] | None) -> Iterator[Waiter]:
        """One waiter of *spec_ids* in *queues*, for as long as the block runs."""
        waiter = Waiter(frozenset(spec_ids), None if queues is None else frozenset(queues))
        self.waiters.add(waiter)
        try:
            yield waiter
        finally:
            self.waiters.discard(waiter)

    def close(self) -> Listener | None:
        """Stop starting listeners; the running one, to be closed (in a thread: it joins)."""
        self._closed = True
        listener, self._listener = self._listener, None
        return listener
