"""What a durable workflow's code is handed: :class:`Workflow`, whose steps, sleeps, waits and
version markers are recorded in its item's journal, in order, and replayed from it.

Each call takes the next position of the journal. Recorded there already (an earlier evaluation
of the same item incarnation got that far), it returns what was recorded without running
anything; recorded as something else, the code changed under the item, and it raises
:class:`~trio_supervise.ReplayMismatch`. A sleep or a wait that has to wait ends the evaluation
(:class:`Suspended`) with the item due when it should look again.
"""

from __future__ import annotations

import datetime as dt
import inspect
import typing
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import attrs
import trio

from .._clock import utc
from .._convert import converter, unstructure
from .._errors import ReplayMismatch, StepFailed
from .._policy import Jitter, RestartPolicy
from ..job import (
    WAITING_DUE_AT,
    EntryKind,
    ItemEvent,
    JournalEntry,
    JSONValue,
    WorkItem,
    check_json,
    describe_error,
)
from ..queues._ports import DurableJournal

__all__ = ["Suspended", "Workflow"]

T = TypeVar("T")
ContextT = TypeVar("ContextT")

_RECEIVED = "event"
"""A resolved wait's result: ``{"event": payload}`` when an event came, None on a timeout."""


class Suspended(BaseException):
    """Ends a workflow's evaluation at a sleep or a wait: the item is due again at *at*.

    A ``BaseException``, like :class:`trio.Cancelled`, so that a workflow's own ``except
    Exception`` never swallows it; only the workflow's driver catches it.
    """

    def __init__(self, at: dt.datetime) -> None:
        super().__init__(at)
        self.at = at


def _check_period(value: object, what: str) -> None:
    """Refuse a *what* that is not a ``timedelta`` of at least 0, naming it."""
    if not isinstance(value, dt.timedelta) or value < dt.timedelta(0):
        raise ValueError(f"{what} must be a datetime.timedelta >= 0, got {value!r}")


def _declared_result(fn: Callable[..., Any]) -> Any:
    """The return type *fn* declares (its awaited one for an ``async def``), or None."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return None
    return hints.get("return")


def _restored(stored: JSONValue, wanted: Any) -> Any:
    """A recorded JSON value as *wanted* (structured by the shared converter), or as is."""
    if wanted is type(None):
        return None
    if wanted is None or wanted is Any:
        return stored
    return converter.structure(stored, wanted)


@attrs.define(eq=False)
class Workflow(Generic[ContextT]):
    """One evaluation of a durable workflow: its item, the drivers' context, and the journal
    calls (:meth:`step`, :meth:`sleep`, :meth:`sleep_until`, :meth:`wait_for_event`,
    :meth:`patched`). Made by the workflow's driver, never by hand."""

    name: str
    """The workflow's name (its spec id)."""
    item: WorkItem
    """The item as claimed, its ``config`` structured into the workflow's config type."""
    context: ContextT
    """The drivers' context (what the runner's ``build_context`` made)."""
    _store: DurableJournal = attrs.field(alias="store")
    _clock: Callable[[], dt.datetime] = attrs.field(alias="clock")
    _entries: dict[int, JournalEntry] = attrs.field(alias="entries")
    _events: tuple[ItemEvent, ...] = attrs.field(alias="events")
    _jitter: Jitter = attrs.field(alias="jitter")
    _hook: Callable[[str, str, WorkItem], None] | None = attrs.field(alias="hook", default=None)
    """Called at a step's ``before-record`` (it returned, not recorded yet) and ``after-step``
    (recorded) points with the step's name: the testing harness's crash points."""
    _count: Callable[[str], None] = attrs.field(alias="count", default=lambda outcome: None)
    """Counts a step by outcome: ``ran``, ``replayed``, ``retried``, ``failed`` (the runner's
    ``trio_supervise_workflow_steps_total``)."""
    _position: int = attrs.field(init=False, default=0)

    def now(self) -> dt.datetime:
        """The store's "now" (virtual under the time-travel harness)."""
        return utc(self._clock())

    def step_key(self, name: str) -> str:
        """A stable idempotency key for the step *name* at the workflow's next position: the
        same on every evaluation and retry of this item incarnation, different for another
        incarnation of the id, another position or another name. Give it to an external API
        that deduplicates (a payment, an e-mail), since a step may run more than once."""
        created = int(self.item.created_at.timestamp() * 1_000_000)
        return f"{self.item.id}:{created}:{self._position}:{name}"

    # -- the journal calls -------------------------------------------------------------------

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: RestartPolicy | None = None,
        result_type: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` (a function or an ``async def``) once for this item
        incarnation, record its result, and return it; on a later evaluation, return the
        recorded result without running it.

        The result must be JSON or an attrs instance (unstructured by the shared converter); a
        recorded one is structured back into *result_type*, by default the return type *fn*
        declares. With *retry*, a step that raises is run again after the policy's backoff
        (keyed jitter), at most ``retry.max_restarts`` more times; then, or at once without a
        policy, :class:`~trio_supervise.StepFailed` names the step (an item error).

        At least once: a crash between the function's return and the record runs it again.
        """
        position, recorded = self._take(EntryKind.STEP, name)
        if recorded is not None:
            # The declared type is read on replay only (get_type_hints costs a run of a no-op
            # step several times over: the run returns its value as is).
            wanted = result_type if result_type is not None else _declared_result(fn)
            self._count("replayed")
            return _restored(recorded.result, wanted)
        started = self.now()
        attempt = 0
        while True:
            attempt += 1
            try:
                value = fn(*args, **kwargs)
                if inspect.isawaitable(value):
                    value = await value
                break
            except Exception as error:
                if retry is None or attempt > retry.max_restarts:
                    self._count("failed")
                    raise StepFailed(self.name, name, attempt, describe_error(error)) from error
                self._count("retried")
                key = f"{self.item.id}:{position}:{name}"
                await trio.sleep(retry.backoff(attempt, key=key, jitter=self._jitter))
        stored = check_json(unstructure(value), what=f"step {name!r} result")
        if self._hook is not None:
            self._hook("before-record", name, self.item)
        await self._record(
            position,
            EntryKind.STEP,
            name,
            result=stored,
            attempts=attempt,
            started_at=started,
            finished_at=self.now(),
        )
        self._count("ran")
        if self._hook is not None:
            self._hook("after-step", name, self.item)
        return value

    async def sleep(self, duration: dt.timedelta, *, name: str = "sleep") -> None:
        """Sleep durably for *duration*: the evaluation ends with the item due at the wake
        time (nothing is held meanwhile), and the next one goes on from here."""
        _check_period(duration, "duration")
        await self._sleep(name, lambda now: now + duration)

    async def sleep_until(self, when: dt.datetime, *, name: str = "sleep") -> None:
        """Sleep durably until *when* (timezone-aware); see :meth:`sleep`."""
        wake = utc(when)
        await self._sleep(name, lambda now: wake)

    async def wait_for_event(
        self,
        name: str,
        *,
        timeout: dt.timedelta | None = None,  # noqa: ASYNC109 (a durable deadline, no wait here)
        payload_type: Any = None,
    ) -> Any:
        """The payload of the next event *name* sent to this item (``send_event``), or None
        once *timeout* has passed without one (None: no timeout).

        Events sent before the workflow waits are kept, and taken in the order sent, one per
        wait of that name. Until one comes the item is suspended (nothing held), due at the
        deadline (without a timeout, never: ``WAITING_DUE_AT``); an event's arrival makes it
        due at once. The payload is structured into *payload_type* if given (a JSON ``null``
        payload reads as None, as a timeout does).
        """
        if timeout is not None:
            _check_period(timeout, "timeout")
        position, recorded = self._take(EntryKind.WAIT, name)
        if recorded is not None and not recorded.pending:
            return self._received(recorded.result, payload_type)
        now = self.now()
        if recorded is None:
            deadline = None if timeout is None else now + timeout
            started = now
            await self._record(position, EntryKind.WAIT, name, started_at=now, wake_at=deadline)
            # Read again once the wait is recorded: an event sent since this evaluation began
            # is seen here, and one sent from now on finds the wait and wakes the item.
            events = (await self._store.read_journal(self.item.id)).events
        else:
            deadline, started, events = recorded.wake_at, recorded.started_at, self._events
        event = self._next_event(name, position, events)
        if event is not None and (deadline is None or event.sent_at <= deadline):
            result: JSONValue = {_RECEIVED: event.payload}
        elif deadline is not None and now >= deadline:
            result = None
        else:
            raise Suspended(WAITING_DUE_AT if deadline is None else deadline)
        await self._record(
            position,
            EntryKind.WAIT,
            name,
            result=result,
            started_at=started,
            finished_at=now,
            wake_at=deadline,
        )
        return self._received(result, payload_type)

    async def patched(self, patch_id: str) -> bool:
        """A version marker: True where the code after this call is the patched one.

        On new ground (nothing recorded here yet) the marker is recorded and True returned; an
        item whose journal has this marker here replays True; an item whose journal has
        something else here was run by the code before the patch: False, and nothing is taken,
        so its old path replays. Keep both paths until no item of the old code is in flight.
        """
        position = self._position
        recorded = self._entries.get(position)
        if recorded is not None and not (
            recorded.kind is EntryKind.PATCH and recorded.name == patch_id
        ):
            return False
        self._position += 1
        if recorded is None:
            now = self.now()
            await self._record(position, EntryKind.PATCH, patch_id, started_at=now, finished_at=now)
        return True

    # -- internals ---------------------------------------------------------------------------

    def _take(self, kind: EntryKind, name: str) -> tuple[int, JournalEntry | None]:
        """The next position and what is recorded there (None: nothing), checked against what
        the code asks for now."""
        position = self._position
        recorded = self._entries.get(position)
        if recorded is not None and (recorded.kind is not kind or recorded.name != name):
            raise ReplayMismatch(
                f"workflow {self.name!r} (item {self.item.id!r}) asks for {kind} {name!r} at "
                f"journal position {position}, but the journal recorded {recorded.kind} "
                f"{recorded.name!r} there: its code changed under the item without a version "
                "marker (Workflow.patched)"
            )
        self._position += 1
        return position, recorded

    async def _record(self, position: int, kind: EntryKind, name: str, **fields: Any) -> None:
        """Record the entry at *position* (fenced by this evaluation's lease) and remember it."""
        entry = JournalEntry(position=position, kind=kind, name=name, **fields)
        await self._store.record_entry(self.item.id, self.item.lease_version, entry)
        self._entries[position] = entry

    async def _sleep(self, name: str, wake_at: Callable[[dt.datetime], dt.datetime]) -> None:
        position, recorded = self._take(EntryKind.SLEEP, name)
        now = self.now()
        if recorded is not None and recorded.wake_at is not None:
            wake = recorded.wake_at
        else:
            wake = wake_at(now)
            await self._record(
                position, EntryKind.SLEEP, name, started_at=now, finished_at=wake, wake_at=wake
            )
        if wake > now:
            raise Suspended(wake)

    def _next_event(
        self, name: str, position: int, events: tuple[ItemEvent, ...]
    ) -> ItemEvent | None:
        """The event the wait at *position* takes: the first of *name* that no earlier wait of
        that name took (each took one, in the order sent)."""
        taken = sum(
            1
            for entry in self._entries.values()
            if entry.position < position
            and entry.kind is EntryKind.WAIT
            and entry.name == name
            and entry.result is not None
        )
        named = [event for event in events if event.name == name]
        return named[taken] if taken < len(named) else None

    @staticmethod
    def _received(result: JSONValue, payload_type: Any) -> Any:
        if not isinstance(result, dict) or _RECEIVED not in result:
            return None
        return _restored(result[_RECEIVED], payload_type)
