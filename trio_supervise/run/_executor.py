"""The executor: evaluators that evaluate the claimed items, each stoppable on its own.

Claimed items are evaluated by a pool of *evaluators*, long-lived tasks that take waiting items
one at a time; an evaluator whose evaluation did not block takes the next waiting item itself,
and one that blocks has woken another for the rest first (the pool grows to the most items
evaluated at once, at most the concurrency; see :class:`Pool`). An evaluator runs its items
inside one cancel scope, and an item's ``scope`` points at it while that item is evaluated:
stopping the item (a lost lease, a cancel request, shutdown) cancels that scope, which holds that
evaluation alone, and the evaluator goes on in a fresh one. So the happy path starts no task and
enters no cancel scope per item. What an evaluation's end writes is the settlement rule's
(``job/_rule.py``); the executor observes it and hands it to the completer.
"""

from __future__ import annotations

import collections
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol

import attrs
import trio

from .._errors import LeaseLost
from .._policy import Jitter
from ..job import (
    SettleKind,
    Settlement,
    StopReason,
    attempts_exhausted,
    describe_failure,
    first_line,
    mark_parentless,
    settlement_after,
    settlement_before,
    start_deadline_passed,
)
from ._drivers import ContextT, DriverRegistry, evaluate_item
from ._flight import Control, Flights, InFlight
from ._observation import Observer, RunnerEventKind, log_dead, log_failure
from ._tracing import end_span, evaluation_span

__all__ = ["Executor", "Pool"]

_LOST = StopReason.LOST
_DEAD = SettleKind.DEAD
_FAILED = (SettleKind.RETRY, SettleKind.DEAD)


class _Completer(Protocol):
    def submit(self, entry: InFlight, settlement: Settlement) -> None: ...


_Evaluate = Callable[[], Awaitable[None]]
"""Starts one more evaluator (see :class:`Pool`)."""


def _context_changed(started: contextvars.Context) -> bool:
    """Whether this task's :mod:`contextvars` context differs from *started*, a copy taken
    before.

    An evaluator runs many items in one task, so a context variable one item's driver sets (a
    logging binding, a tracing span, a ``decimal`` context) would be seen by the next item it
    takes; a task per item would not see it. The evaluator compares its context after each
    evaluation, which costs one copy and, when nothing was set, one identity test of the two
    contexts' variable maps (copies share the map until a variable is set). Values are compared
    only when a variable was set: one whose ``==`` raises counts as a change.
    """
    try:
        return contextvars.copy_context() != started
    except Exception:
        return True


@attrs.define(eq=False)
class Pool:
    """The evaluators: long-lived tasks that take claimed items from one queue of waiting items.

    Claimed items wait in ``waiting``, idle evaluators park in ``idle``. At most one evaluator is
    being woken at a time (``waking``): the woken one takes the first waiting item and, if more
    wait, wakes the next evaluator before it evaluates its own. An evaluator whose evaluation ends
    takes the next waiting item itself. So a batch of evaluations that do not block runs in one
    evaluator with two wake-ups, not one hand-over per item, and a batch of evaluations that
    block gets an evaluator each, woken one after the other; the pool grows to the most items
    evaluated at once (at most the concurrency), and no task is started or ended per item.
    """

    nursery: trio.Nursery
    spawn: _Evaluate | None = None
    """Starts one more evaluator (set once the evaluators' arguments are known)."""
    waiting: collections.deque[InFlight] = attrs.Factory(collections.deque)
    idle: list[trio.lowlevel.Task] = attrs.Factory(list)
    waking: bool = False
    """An evaluator was woken (or started) and has not run yet."""
    closed: bool = False
    """Nothing more is claimed: evaluators end once ``waiting`` is empty."""
    context: contextvars.Context = attrs.Factory(contextvars.copy_context)
    """The context every evaluator starts in, whoever wakes it: a copy of the context the pool
    was opened in (the runner's)."""

    @classmethod
    def open(cls, nursery: trio.Nursery) -> Pool:
        return cls(nursery)

    def put(self, entry: InFlight) -> None:
        """Queue *entry* for evaluation, waking an evaluator unless one is being woken."""
        self.waiting.append(entry)
        if not self.waking:
            self.wake()

    def wake(self) -> None:
        """Wake an idle evaluator, or start one if none is idle."""
        self.waking = True
        if self.idle:
            trio.lowlevel.reschedule(self.idle.pop())
        else:
            assert self.spawn is not None
            # A task copies the context of the code that starts it: start it from the pool's.
            self.context.run(self.nursery.start_soon, self.spawn)

    def close(self) -> None:
        """Nothing more will be put: wake every idle evaluator so that it ends."""
        self.closed = True
        idle, self.idle = self.idle, []
        for task in idle:
            trio.lowlevel.reschedule(task)

    async def park(self) -> None:
        """Wait, idle, until :meth:`wake` or :meth:`close` picks this evaluator."""
        task = trio.lowlevel.current_task()
        self.idle.append(task)

        def abort(_: object) -> trio.lowlevel.Abort:
            self.idle.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)


@attrs.define(eq=False)
class Executor(Generic[ContextT]):
    """Runs the pool's evaluators on one drivers' context; hands each outcome to *completer*."""

    registry: DriverRegistry[ContextT]
    control: Control
    flights: Flights
    observer: Observer
    jitter: Jitter
    completer: _Completer
    context: ContextT
    tracer: Any | None = None
    """An OpenTelemetry tracer: a span per evaluation (see ``_tracing.py``); None: none."""
    failures: int = 0
    """Evaluations that failed (an item error, dead, a lost lease): a due pass's ``failed``."""

    async def evaluate_forever(self, pool: Pool) -> None:
        """Evaluate the pool's waiting items until it is closed and none is waiting.

        The evaluator runs its items inside one cancel scope, which each item's ``scope``
        points at while it is evaluated: stopping that item cancels the scope, the evaluation
        ends, the item is settled after the scope, and the evaluator goes on in a fresh scope.
        The happy path enters no scope per item and starts no task. It starts woken (see
        :class:`Pool`).

        Each item sees the pool's :mod:`contextvars` context (the runner's), as a task per item
        would: an evaluation that leaves the context changed (its driver set a context variable)
        ends its evaluator, and the waiting items go to another one (see
        :func:`_context_changed`).
        """
        waiting = pool.waiting
        woken = True
        started = pool.context
        while True:
            current: InFlight | None = None
            # When this evaluator's last evaluation ended, while it has awaited nothing since:
            # the next one starts then (one clock read per evaluation, not two; see _evaluate).
            ended: float | None = None
            try:
                with trio.CancelScope() as scope:
                    while True:
                        if woken:
                            woken = pool.waking = False
                        if not waiting:
                            if pool.closed:
                                return
                            await pool.park()
                            woken = True
                            ended = None
                            continue
                        entry = current = waiting.popleft()
                        if waiting and not pool.waking:
                            # In case this evaluation blocks: the next item gets an evaluator.
                            pool.wake()
                        entry.scope = scope
                        found = await self._evaluate(entry, ended)
                        ended = self._observe(entry)
                        entry.scope = None
                        current = None
                        self._hand_over(entry, *found)
                        # _context_changed, spelled out: once per evaluation.
                        try:
                            changed = contextvars.copy_context() != started
                        except Exception:
                            changed = True
                        if changed:
                            _retire(pool)
                            return
                        if entry.reason is not None and scope.cancel_called:
                            # Stopped as the evaluation ended (only a stop cancels this scope,
                            # and it sets a reason first): a fresh scope for the next.
                            break
                if current is not None:
                    # Stopped mid-evaluation (lost lease, cancel request, shutdown).
                    entry, current = current, None
                    entry.scope = None
                    self._observe(entry)
                    self._hand_over(entry, None, None, None)
                    if _context_changed(started):
                        _retire(pool)
                        return
            finally:
                if current is not None:
                    # Something escaped the evaluation (a BaseException): the slot is freed.
                    self.flights.free(current)

    def _hand_over(
        self,
        entry: InFlight,
        settlement: Settlement | None,
        error: str | None,
        failure: Exception | None,
    ) -> None:
        """Give the evaluation's outcome to the completer; the slot is freed once it is written
        (at once when there is nothing to write: the lease was lost)."""
        entry.settling = True
        outcome: Settlement | None = None
        try:
            outcome = self._outcome(entry, settlement, error, failure)
        finally:
            if outcome is None:
                self.observer.metrics.flush()  # nothing to write: its evaluation is observed now
                self.flights.free(entry)
            else:
                self.completer.submit(entry, outcome)

    def _observe(self, entry: InFlight) -> float | None:
        """Observe how long *entry*'s driver ran (if it ran); the time it read, if it did."""
        started = entry.evaluating_since
        if started is None:
            return None
        entry.evaluating_since = None
        now = self.control.time()
        self.observer.metrics.observe_evaluation(entry.item.spec_id, now - started)
        return now

    async def _evaluate(
        self, entry: InFlight, since: float | None = None
    ) -> tuple[Settlement | None, str | None, Exception | None]:
        """Run *entry*'s driver (unless it is stopped already, or the rule settles it without
        evaluating it): (settlement, error, the exception). Cancelled when the item is stopped
        meanwhile. The caller observes how long it ran (:meth:`_observe`).

        *since* is when the evaluator's previous evaluation ended, if it has awaited nothing
        since (the clock as it read it there): this evaluation starts then, so that items
        evaluated back to back read the clock once each (under an autojump clock, a read costs
        twice the real clock's; issue 17's P4). Its observed duration then includes the
        runner's own hand-over of the previous outcome, a few microseconds.
        """
        item = entry.item
        settings = self.control.settings
        settlement: Settlement | None = None
        error: str | None = None
        failure: Exception | None = None
        if entry.reason is None and (
            item.cancel_requested
            or (item.attempt > (settings.max_attempts or item.attempt))
            or item.start_by is not None
        ):
            # Not evaluated (the rule's first half): cancelled, claimed after its start
            # deadline, or claimed too often (say, its worker killed mid-evaluation every
            # time): dead. _outcome observes it. (An item with a deadline it met is evaluated.)
            settlement = settlement_before(item, settings)
        if settlement is None and entry.reason is None:
            entry.evaluating_since = self.control.time() if since is None else since
            if self.tracer is not None:
                return await self._evaluate_traced(entry)
            try:
                settlement = await evaluate_item(
                    self.registry.for_spec(item.spec_id),
                    self.context,
                    item,
                    requeue_delay=settings.requeue_delay,
                )
            except Exception as exc:
                if _lost_own_lease(entry, exc):
                    return None, None, None
                error, failure = describe_failure(exc), exc
        return settlement, error, failure

    async def _evaluate_traced(
        self, entry: InFlight
    ) -> tuple[Settlement | None, str | None, Exception | None]:
        """:meth:`_evaluate`'s driver call inside an OpenTelemetry span (see ``_tracing.py``)."""
        item = entry.item
        settlement: Settlement | None = None
        error: str | None = None
        failure: Exception | None = None
        with evaluation_span(self.tracer, item) as span:
            try:
                settlement = await evaluate_item(
                    self.registry.for_spec(item.spec_id),
                    self.context,
                    item,
                    requeue_delay=self.control.settings.requeue_delay,
                )
            except Exception as exc:
                if not _lost_own_lease(entry, exc):
                    error, failure = describe_failure(exc), exc
            finally:
                end_span(span, settlement, error, failure)
        return settlement, error, failure

    def _outcome(
        self,
        entry: InFlight,
        settlement: Settlement | None,
        error: str | None,
        failure: Exception | None,
    ) -> Settlement | None:
        """The settlement to write for *entry*'s evaluation (the rule's), observed; None when
        the lease was lost."""
        item = entry.item
        settings = self.control.settings
        observer = self.observer
        reason = entry.reason
        # Most evaluations end with an outcome and were not stopped: no rule to apply (the
        # rule, settlement_after, returns the outcome itself then).
        if reason is not None or error is not None or settlement is None:
            if reason is _LOST:
                self.failures += 1
                observer.failed(item, f"lease lost: {entry.detail}")
                observer.emit(RunnerEventKind.OUTCOME, item, detail="lease-lost")
                return None
            decided = settlement_after(
                item, settlement, error, reason, entry.detail, settings, self.jitter
            )
            assert decided is not None  # only a lost lease writes nothing
            failed = decided is not settlement and decided.kind in _FAILED
            settlement = decided
            if failed:
                self.failures += 1
                observer.failed(item, first_line(decided.error))
                log_failure(observer.logger, settings, item, decided, None if reason else failure)
        else:
            failed = False
        if settlement.kind is _DEAD and settlement.error is not None and not failed:
            # Failed for good without an error of its own: by the evaluation itself (Discard,
            # a config that cannot fit, an outcome that cannot be stored), or unevaluated (it
            # was claimed more than max_attempts times, or after its start deadline).
            self.failures += 1
            observer.failed(item, first_line(settlement.error))
            expired = item.start_by is not None and start_deadline_passed(item) is not None
            evaluated = attempts_exhausted(item, settings) is None and not expired
            if expired:
                observer.metrics.count_expired(item.spec_id)
            log_dead(
                observer.logger, settings.worker_id, item, settlement.error, evaluated=evaluated
            )
        if item.parent_id is None:
            mark_parentless(settlement, True)
        if observer.on_event is not None:
            detail = str(settlement.kind)
            if settlement.error is not None:
                detail = f"{detail}: {first_line(settlement.error)}"
            observer.emit(RunnerEventKind.OUTCOME, item, detail=detail)
        return settlement


def _lost_own_lease(entry: InFlight, exc: Exception) -> bool:
    """Whether *exc* is a write the driver made under *entry*'s own lease, refused as stale (a
    durable workflow's step record): the lease is lost, as a failed renewal finds, and nothing
    more is written for it."""
    if not isinstance(exc, LeaseLost):
        return False
    item = entry.item
    if exc.item_id != item.id or exc.lease_version != item.lease_version:
        return False
    if entry.reason is None:
        entry.reason, entry.detail = _LOST, str(exc)
    return True


def _retire(pool: Pool) -> None:
    """End an evaluator whose context an evaluation changed: the items waiting go to an idle
    evaluator or a new one, unless another is being woken already."""
    if pool.waiting and not pool.waking:
        pool.wake()
