"""Supervision: run long-lived children in a nursery, observe how each one ends, and act on it.

A child is expected to run for the life of the process. How a run ends is sorted into three
outcomes, and only the first two carry information about the child:

- it *returned*: an **exit**, not a success (a worker that stops working is a problem);
- it raised an :class:`Exception`: a **failure**;
- it was cancelled: says nothing about the child (the supervisor, or something above it, is
  stopping it).

``trio.Cancelled``, :class:`KeyboardInterrupt` and :class:`SystemExit` are never swallowed: the
supervisor catches :class:`Exception` only, and lets everything else through.

Where the rules live: the per-child ones (the spec, the states, how one ended run is judged) in
``_child.py``; the group ones (strategy, restart intensity, shutdown order, auto shutdown) in
``_group.py``; this module applies them, runs the children and manages them at run time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import attrs
import trio
import trio_util
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from .._errors import ChildStateError, StartFailed, WorkerFailed
from .._lifecycle import Shutdown
from .._policy import Jitter, RestartPolicy
from ._child import (
    DEFAULT_SHUTDOWN_GRACE,
    Action,
    ChildSpec,
    Outcome,
    Readiness,
    Restart,
    RestartType,
    Slot,
    Verdict,
    WorkerState,
    WorkerStatus,
    check_bool,
    check_child_rules,
    check_name,
    check_restart,
    describe,
    error_text,
    judge,
    leaves,
    to_restart_type,
)
from ._group import (
    AutoShutdown,
    Intensity,
    RestartWindow,
    ShutdownOrder,
    Strategy,
    auto_shutdown_due,
    check_significant,
    ended_for_good,
    never_restarted_with_group,
    restart_group,
    stop_order,
    to_auto_shutdown,
    to_shutdown_order,
    to_strategy,
)

__all__ = [
    "DEFAULT_SHUTDOWN_GRACE",
    "AutoShutdown",
    "ChildCounts",
    "ChildSpec",
    "Intensity",
    "RestartType",
    "ShutdownOrder",
    "Strategy",
    "Supervisor",
    "WorkerState",
    "WorkerStatus",
]

logger = logging.getLogger("trio_supervise.supervisor")

STATE_METRIC = "trio_supervise_worker_state"
RESTARTS_METRIC = "trio_supervise_worker_restarts"  # exposed as ..._total


@attrs.frozen
class ChildCounts:
    """What :meth:`Supervisor.count_children` reports (OTP's ``count_children``).

    :param specs: children listed, running or not.
    :param active: children with a run alive (starting, running or stopping).
    :param supervisors: listed children that are supervisors.
    :param workers: listed children that are workers (:class:`ChildSpec`).
    """

    specs: int
    active: int
    supervisors: int
    workers: int


class _WorkerMetrics:
    """A Prometheus collector reading a supervisor's snapshot at scrape time."""

    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor

    def _families(self) -> tuple[GaugeMetricFamily, CounterMetricFamily]:
        return (
            GaugeMetricFamily(
                STATE_METRIC,
                "Supervised worker state (1 for the state the worker is in).",
                labels=["worker", "state"],
            ),
            CounterMetricFamily(
                RESTARTS_METRIC, "Restarts of a supervised worker.", labels=["worker"]
            ),
        )

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        gauge, counter = self._families()
        for status in self._supervisor.snapshot():
            for state in WorkerState:
                gauge.add_metric([status.worker, state.value], float(state is status.state))
            counter.add_metric([status.worker], float(status.restarts))
        return [gauge, counter]


def _as_children(value: Iterable[ChildSpec | Supervisor]) -> tuple[ChildSpec | Supervisor, ...]:
    if isinstance(value, ChildSpec | Supervisor | str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"children must be an iterable of ChildSpec or Supervisor, got {value!r}")
    return tuple(value)


def _shutdown_or_new(value: Shutdown | None) -> Shutdown:
    if value is None:
        return Shutdown()
    if not isinstance(value, Shutdown):
        raise TypeError(f"shutdown must be a Shutdown or None, got {value!r}")
    return value


def _registry_or_private(value: CollectorRegistry | None) -> CollectorRegistry:
    if value is None:
        return CollectorRegistry()
    if not isinstance(value, CollectorRegistry):
        raise TypeError(
            f"registry must be a prometheus_client CollectorRegistry or None, got {value!r}"
        )
    return value


def _name_of(child: object) -> object:
    return getattr(child, "name", child)


def _check_intensity(
    instance: object, attribute: attrs.Attribute[Intensity | None], value: object
) -> None:
    if value is not None and not isinstance(value, Intensity):
        raise TypeError(f"{attribute.name} must be an Intensity or None, got {value!r}")


def _single_kind(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception to raise instead of *group*, when nothing would be lost.

    The supervisor's nursery only ever lets through what children must not be caught at:
    cancellation, ``KeyboardInterrupt``, ``SystemExit``. When the group holds nothing else, the
    caller gets the one that matters, unwrapped (``KeyboardInterrupt`` over ``SystemExit`` over
    ``Cancelled``), so it propagates unchanged in kind. Anything else keeps the group whole.
    """
    found = list(leaves(group))
    if not found or any(isinstance(leaf, Exception) for leaf in found):
        return None
    for kind in (KeyboardInterrupt, SystemExit, trio.Cancelled):
        for leaf in found:
            if isinstance(leaf, kind):
                return leaf
    return None


@attrs.define(eq=False, kw_only=True)
class Supervisor:
    """Runs children in a nursery, observes how each one ends, and acts on it.

    Start it with ``await nursery.start(supervisor.run)``: that returns once every initial child
    is running (or ready, for ``start=True`` children). A child that fails before it is ready is
    restarted per its policy and waited for; one that fails terminally before it is ready makes
    the start fail with :class:`StartFailed` (OTP fails the supervisor's start), and the
    supervisor never reports itself ready. :meth:`run` returns when shutdown has begun and every
    child is done, and raises :class:`WorkerFailed` if the supervisor is unhealthy by then (a
    worker in its tree failed terminally), so a service exits non-zero.

    What happens when a child ends (before shutdown):

    - a ``temporary`` child, or a ``transient`` one that returned: recorded as ``stopped``
      (and, if it is *significant*, per :attr:`auto_shutdown` the supervisor shuts down cleanly);
    - no restart policy: a failure marks the child ``failed``, health false, and begins shutdown;
      an exit (a ``permanent`` child returned) marks it ``failed`` and health false, and the others
      keep running;
    - with a policy: the child (and, per :attr:`strategy`, its siblings) is restarted after
      ``policy.backoff(attempt)``, jittered with the key ``(worker path, attempt)``; the state is
      ``backing-off`` meanwhile and health is untouched. A run lasting at least ``policy.cap``
      resets the count; past ``max_restarts`` consecutive restarts, or past the supervisor's
      :attr:`intensity`, the loud path (``failed``, unhealthy, shutdown).

    When shutdown begins, children are stopped per :attr:`shutdown_order`: by default one at a
    time, the last started first, each within its own grace. Siblings stopped by a strategy are
    cancelled at once (their ``finally`` blocks run). Health is one-way, like shutdown: once false
    it stays false, and it propagates to every enclosing supervisor (unless this supervisor has a
    restart policy of its own: then its parent decides, when it ends).

    A supervisor is a child like any other: put it in another's ``children``. By default it is a
    ``permanent`` child without a restart policy of its parent (its own children's policies absorb
    their failures); give it *restart* to have its parent restart it. Its :attr:`shutdown` begins
    with its parent's (its children are stopped when its turn comes), its workers report to its
    parent's registry (unless it was given its own) and appear in its parent's :meth:`snapshot` as
    ``name/child``. When it gives up (a policy exhausted, its intensity exceeded) it stops its own
    subtree and its :meth:`run` raises :class:`WorkerFailed`: a failure of the parent's child.

    :param name: the supervisor's name (its name as a child, in paths and logs).
    :param children: :class:`ChildSpec` or nested :class:`Supervisor`, started in this order.
    :param strategy: see :class:`Strategy`.
    :param intensity: at most this many restarts, over all children, within a period (OTP's
        ``intensity``/``period``); ``None`` (the default) bounds restarts per child only.
    :param shutdown_order: see :class:`ShutdownOrder`; ``reverse`` by default.
    :param auto_shutdown: see :class:`AutoShutdown`; ``never`` by default.
    :param shutdown: the switch to watch and trigger; a new one by default.
    :param jitter: the keyed jitter for backoffs; by default the parent's, or a random seed.
    :param registry: where the ``trio_supervise_worker_state{worker,state}`` gauge and the
        ``trio_supervise_worker_restarts_total{worker}`` counter are registered; by default a
        private one (never the global registry). Give it to the root supervisor only.
    :param restart: as a nested child: the parent's restart policy for this supervisor.
    :param restart_type: as a nested child: see :class:`RestartType`.
    :param significant: as a nested child: see :class:`ChildSpec`.
    """

    name: str = attrs.field(validator=check_name)
    _initial: tuple[ChildSpec | Supervisor, ...] = attrs.field(
        alias="children", default=(), converter=_as_children, repr=False
    )
    strategy: Strategy = attrs.field(default=Strategy.ONE_FOR_ONE, converter=to_strategy)
    intensity: Intensity | None = attrs.field(default=None, validator=_check_intensity)
    shutdown_order: ShutdownOrder = attrs.field(
        default=ShutdownOrder.REVERSE, converter=to_shutdown_order
    )
    auto_shutdown: AutoShutdown = attrs.field(
        default=AutoShutdown.NEVER, converter=to_auto_shutdown
    )
    shutdown: Shutdown = attrs.field(default=None, converter=_shutdown_or_new, repr=False)
    jitter: Jitter | None = attrs.field(default=None, repr=False)
    registry: CollectorRegistry = attrs.field(
        default=None, converter=_registry_or_private, repr=False
    )
    restart: RestartPolicy | None = attrs.field(default=None, validator=check_restart)
    restart_type: RestartType = attrs.field(
        default=RestartType.PERMANENT, converter=to_restart_type
    )
    significant: bool = attrs.field(default=False, validator=check_bool)
    healthy: trio_util.AsyncBool = attrs.field(
        init=False,
        factory=lambda: trio_util.AsyncBool(True),  # type: ignore[no-untyped-call]
        repr=False,
    )
    """True until a worker in this supervisor's tree fails terminally; then false for good."""

    _slots: list[Slot] = attrs.field(init=False, factory=list, repr=False)
    _by_name: dict[str, Slot] = attrs.field(init=False, factory=dict, repr=False)
    _parent: Supervisor | None = attrs.field(init=False, default=None, repr=False)
    _fallback_jitter: Jitter = attrs.field(init=False, factory=Jitter, repr=False)
    _nursery: trio.Nursery | None = attrs.field(init=False, default=None, repr=False)
    _running: bool = attrs.field(init=False, default=False, repr=False)
    _halt: Shutdown = attrs.field(init=False, factory=Shutdown, repr=False)
    """This run is stopping its children (shutdown reached it, or its parent terminates it)."""
    _turn: Shutdown | None = attrs.field(init=False, default=None, repr=False)
    """As a nested child: begun by the parent when it is this supervisor's turn to stop."""
    _window: RestartWindow | None = attrs.field(init=False, default=None, repr=False)
    _start_failure: StartFailed | None = attrs.field(init=False, default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.jitter is not None and not isinstance(self.jitter, Jitter):
            raise TypeError(f"jitter must be a Jitter or None, got {self.jitter!r}")
        check_child_rules(self.name, self.restart, self.restart_type, self.significant)
        if self.intensity is not None:
            self._window = RestartWindow(self.intensity)
        for child in self._initial:
            self._add_slot(child)
        try:
            self.registry.register(_WorkerMetrics(self))
        except ValueError as exc:
            raise ValueError(
                f"registry already carries trio_supervise worker metrics; give it to the root "
                f"supervisor only (supervisor {self.name!r})"
            ) from exc

    # -- reading state -----------------------------------------------------------------------

    @property
    def children(self) -> tuple[ChildSpec | Supervisor, ...]:
        """The children, in start order (including those added with :meth:`add_child`)."""
        return tuple(slot.child for slot in self._slots)

    @property
    def failed(self) -> bool:
        """Whether a worker in this supervisor's tree failed terminally (health is false)."""
        return not self.healthy.value

    @property
    def running(self) -> bool:
        """Whether :meth:`run` is in progress."""
        return self._running

    def state(self, name: str) -> WorkerState:
        """The state of the child *name* (a path, ``sub/child``, reaches into nested ones)."""
        return self._locate(name)[1].state

    def watch(self, name: str) -> trio_util.AsyncValue[WorkerState]:
        """The state of the child *name* as an ``AsyncValue``, to wait for a transition."""
        return self._locate(name)[1].watch()

    @property
    def states(self) -> Mapping[str, WorkerState]:
        """Every worker's state in this supervisor's tree, by path."""
        return {status.worker: status.state for status in self.snapshot()}

    def snapshot(self) -> list[WorkerStatus]:
        """One record per worker in this supervisor's tree, in start order, depth first."""
        records: list[WorkerStatus] = []
        for slot in self._slots:
            records.append(self._status(slot))
            if isinstance(slot.child, Supervisor):
                records.extend(slot.child.snapshot())
        return records

    def which_children(self) -> list[WorkerStatus]:
        """One record per *direct* child, in start order (OTP's ``which_children``)."""
        return [self._status(slot) for slot in self._slots]

    def count_children(self) -> ChildCounts:
        """How many direct children are listed, alive, supervisors, workers (OTP's
        ``count_children``)."""
        supervisors = sum(isinstance(slot.child, Supervisor) for slot in self._slots)
        return ChildCounts(
            specs=len(self._slots),
            active=sum(slot.in_run for slot in self._slots),
            supervisors=supervisors,
            workers=len(self._slots) - supervisors,
        )

    def _status(self, slot: Slot) -> WorkerStatus:
        return WorkerStatus(
            worker=self._path(slot),
            state=slot.state,
            restarts=slot.restarts,
            last_error=slot.last_error,
            since=slot.since,
        )

    # -- changing the tree -------------------------------------------------------------------

    def add_child(self, child: ChildSpec | Supervisor) -> None:
        """Add a child; while :meth:`run` is in progress it is launched at once (in the background).

        Refused once shutdown has begun.
        """
        self._refuse_if_stopping(f"not adding {_name_of(child)!r}")
        slot = self._add_slot(child)
        if self._nursery is not None:
            self._nursery.start_soon(self._launch, slot, None)

    async def start_child(self, child: ChildSpec | Supervisor) -> None:
        """Add a child to a running supervisor and return once it is running (or ready).

        A child that raises before it is ready (or a permanent one that returns) is not added,
        and :class:`StartFailed` names it and its cause; the supervisor and its other children
        are untouched (OTP's ``start_child`` returning ``{error, Reason}``). A transient or
        temporary child that returns before it is ready is OTP's ``ignore``: it is added,
        ``stopped``, and this returns.
        """
        self._refuse_unless_running("use add_child before run")
        self._refuse_if_stopping(f"not adding {_name_of(child)!r}")
        slot = self._add_slot(child)
        slot.probation = True
        await self._launch(slot, None)
        slot.probation = False
        if slot.start_ignored:
            return  # OTP's ignore: listed, stopped, no error
        if not slot.ready:
            self._remove_slot(slot)
            raise StartFailed(self._path(slot), slot.ended_how) from slot.last_exception
        self._adopt_health(slot)

    async def terminate_child(self, name: str) -> None:
        """Stop the child *name* within its grace, and return once it has ended.

        It stays listed, ``stopped``, and is not restarted (by its policy or its group) until
        :meth:`restart_child`. A pending restart of it is dropped. Terminating a child that is
        not running does nothing (as OTP's). *name* may be a path into a nested supervisor.
        """
        owner, slot = self._locate(name)
        path = owner._path(slot)
        if slot.pending is not None:
            slot.pending = None  # its restart skips it
            if slot.scope is None:
                slot.set_state(WorkerState.STOPPED)
        if slot.scope is not None:
            slot.held = slot.terminating = True
            slot.ask_to_stop(f"terminate_child({path!r})")
            await slot.wait_run_ended()
        else:
            await trio.lowlevel.checkpoint()
        owner._log(logging.INFO, f"worker {path!r} terminated", slot)

    async def restart_child(self, name: str) -> None:
        """Start the terminated child *name* again, returning once it is running (or ready).

        Refused (:class:`ChildStateError`) while it runs or waits for a restart. If it ends
        before it is ready, :class:`StartFailed` names it and its cause, and it stays
        terminated (but a transient or temporary child's return is OTP's ``ignore``: no error).
        Its restart count towards its policy starts afresh.
        """
        owner, slot = self._locate(name)
        path = owner._path(slot)
        owner._refuse_unless_running(f"cannot restart {path!r}")
        owner._refuse_if_stopping(f"not restarting {path!r}")
        if slot.pending is not None:
            raise ChildStateError(f"worker {path!r} is already restarting (backing off)")
        if not slot.idle:
            raise ChildStateError(f"worker {path!r} is running; terminate it first")
        slot.attempt, slot.probation = 0, True
        await owner._launch(slot, None)
        slot.probation = False
        if slot.start_ignored:
            return  # OTP's ignore: stays stopped, no error
        if not slot.ready:
            raise StartFailed(path, slot.ended_how) from slot.last_exception
        owner._adopt_health(slot)

    def delete_child(self, name: str) -> None:
        """Remove the terminated child *name* from the supervisor (and its metric series).

        Refused (:class:`ChildStateError`) while it runs or waits for a restart:
        :meth:`terminate_child` it first.
        """
        owner, slot = self._locate(name)
        if not slot.idle:
            raise ChildStateError(
                f"worker {owner._path(slot)!r} is running (or restarting); terminate it first"
            )
        owner._remove_slot(slot)
        owner._log(logging.INFO, f"worker {owner._path(slot)!r} deleted", slot)

    def _refuse_if_stopping(self, what: str) -> None:
        if self._stopping:
            raise RuntimeError(f"supervisor {self.name!r} is shutting down; {what}")

    def _refuse_unless_running(self, what: str) -> None:
        if self._nursery is None:
            raise RuntimeError(f"supervisor {self.name!r} is not running; {what}")

    def _add_slot(self, child: ChildSpec | Supervisor) -> Slot:
        if isinstance(child, Supervisor):
            if child._parent is not None:
                raise ValueError(f"supervisor {child.name!r} already has a parent")
            ancestor: Supervisor | None = self
            while ancestor is not None:
                if ancestor is child:
                    raise ValueError(f"supervisor {child.name!r} cannot supervise itself")
                ancestor = ancestor._parent
        elif not isinstance(child, ChildSpec):
            raise TypeError(f"a child must be a ChildSpec or a Supervisor, got {child!r}")
        if child.name in self._by_name:
            raise ValueError(f"supervisor {self.name!r} already has a child named {child.name!r}")
        check_significant(child.name, child.significant, self.auto_shutdown, self.name)
        if isinstance(child, Supervisor):
            child._parent = self
            self.shutdown.adopt(child.shutdown)
        slot = Slot(child)
        self._slots.append(slot)
        self._by_name[child.name] = slot
        return slot

    def _remove_slot(self, slot: Slot) -> None:
        self._slots.remove(slot)
        del self._by_name[slot.name]
        if isinstance(slot.child, Supervisor):
            slot.child._parent = None
            self.shutdown.detach(slot.child.shutdown)

    # -- running -----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the children until shutdown has begun and all of them are done.

        Reports readiness through *task_status* once every initial child is running (or ready);
        raises :class:`StartFailed` instead, without reporting, when one fails terminally before
        it is ready. Raises :class:`WorkerFailed` at the end if the supervisor is unhealthy.
        Cancellation, ``KeyboardInterrupt`` and ``SystemExit`` propagate unchanged in kind.
        """
        if self._running:
            raise RuntimeError(f"supervisor {self.name!r} is already running")
        self._running = True
        self._halt, self._start_failure = Shutdown(), None
        if self._window is not None:
            self._window.reset()
        for slot in self._slots:
            slot.attempt, slot.held, slot.pending, slot.probation = 0, False, None, False
            slot.end_run()
        self._log(logging.INFO, f"supervisor {self.name!r} starting", strategy=str(self.strategy))
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._stop_when_asked)
                if await self._start_initial_children():
                    task_status.started()
        except BaseExceptionGroup as group:
            single = _single_kind(group)
            if single is None:
                raise
            raise single from group
        finally:
            self._nursery = None
            self._running = False
        self._log(logging.INFO, f"supervisor {self.name!r} stopped")
        if self._start_failure is not None:
            raise self._start_failure
        if not self.healthy.value:
            failed = [s.worker for s in self.snapshot() if s.state is WorkerState.FAILED]
            raise WorkerFailed(
                f"supervisor {self.name!r} is unhealthy: failed workers {failed!r}"
                if failed
                else f"supervisor {self.name!r} is unhealthy"
            )

    async def _start_initial_children(self) -> bool:
        """Launch the initial children in order, each once it is ready; False (and shutdown
        begun) when one failed terminally before it was ready: the start failed."""
        initial = list(self._slots)
        for index, slot in enumerate(initial):
            await self._launch(slot, None)
            if await self._became_ready(slot):
                continue
            path = self._path(slot)
            failure = StartFailed(path, slot.ended_how)
            failure.__cause__ = slot.last_exception
            self._start_failure = failure
            self._log(logging.ERROR, f"supervisor {self.name!r} failed to start: {failure}", slot)
            self._mark_unhealthy(escalating=True)
            self.shutdown.begin(f"worker {path!r} failed to start")
            for later in initial[index + 1 :]:
                if later.idle:  # never launched: OTP starts no child after a failed one
                    later.set_state(WorkerState.STOPPED)
            return False
        return True

    async def _became_ready(self, slot: Slot) -> bool:
        """Wait until *slot* is ready (restarted first, if it failed before readiness) or ended
        for good; whether it did not fail terminally before being ready."""
        while not slot.ready and not (ended_for_good(slot) and slot.idle):
            await slot.watch().wait_transition()  # the AsyncValue only for a child not ready
        # A start error whatever the restart type (a temporary child that raised too, as OTP's
        # failing start function); a transient or temporary child's return is OTP's ignore.
        return not slot.start_failed

    @property
    def _stopping(self) -> bool:
        return self.shutdown.requested or self._halt.requested

    async def _stop_when_asked(self) -> None:
        """Once it is this supervisor's time to stop, stop its children in its shutdown order.

        Every live child is marked ``stopping`` as soon as shutdown reaches this supervisor (all
        at once, so the states a history records do not depend on which task Trio runs first);
        each is then asked in turn.
        """
        await trio_util.wait_any(self.shutdown.wait, self._wait_for_turn)  # type: ignore[no-untyped-call]
        for slot in self._slots:
            slot.mark_stopping()
        await self._wait_for_stop()
        reason = self.shutdown.reason or (self._turn.reason if self._turn else None) or "stop"
        self._halt.begin(reason)
        live = [slot for slot in stop_order(self._slots, self.shutdown_order) if slot.scope]
        self._log(
            logging.INFO,
            f"supervisor {self.name!r} shutting down ({reason}): stopping {len(live)} "
            f"worker(s), {self.shutdown_order} order",
            reason=reason,
        )
        for slot in live:
            slot.ask_to_stop(reason)
            if self.shutdown_order is ShutdownOrder.REVERSE:
                await slot.wait_run_ended()

    async def _wait_for_turn(self) -> None:
        if self._turn is None or self._parent is None:
            await trio.sleep_forever()
        else:
            await self._turn.wait()

    async def _wait_for_stop(self) -> None:
        turn = self._turn
        if self._parent is None or turn is None:
            await self.shutdown.wait()
            return
        await trio_util.wait_any(turn.wait, self._wait_for_own_shutdown)  # type: ignore[no-untyped-call]

    async def _wait_for_own_shutdown(self) -> None:
        """A nested supervisor's shutdown that began alone (it gave up, or shut down
        automatically); one begun by its parent's waits for the parent to give it its turn."""
        await self.shutdown.wait()
        if self._parent is not None and self._parent._stopping:
            await trio.sleep_forever()

    def _prepare_nested_run(self, parent: Supervisor, turn: Shutdown) -> None:
        """Called by the parent before each run of this nested supervisor."""
        self._turn = turn
        if self.shutdown.requested and not parent._stopping:
            # Restarted after giving up: a fresh shutdown (the old one stays begun) and health.
            parent.shutdown.detach(self.shutdown)
            self.shutdown = Shutdown()
            parent.shutdown.adopt(self.shutdown)
            self.healthy.value = True

    async def _launch(self, slot: Slot, restart: Restart | None) -> None:
        """Start one run of *slot*, returning once it is running (or ready, or ended).

        Only the restart a slot belongs to may launch it, and never while a run is alive.
        """
        if slot.pending is not restart:
            return
        if self._stopping:
            slot.pending = None
            if slot.scope is None:
                slot.set_state(WorkerState.STOPPED)
            return
        if slot.scope is not None:
            return
        slot.pending = None
        assert self._nursery is not None
        scope = trio.CancelScope()
        slot.scope, slot.held = scope, False
        child = slot.child
        slot.stop = None
        if isinstance(child, Supervisor):
            slot.stop = Shutdown()
            child._prepare_nested_run(self, slot.stop)
        elif child.stop_signal:
            slot.stop = Shutdown()
        slot.begin_run()
        slot.set_state(WorkerState.STARTING)
        await self._nursery.start(self._run_child, slot, scope)

    async def _run_child(
        self,
        slot: Slot,
        scope: trio.CancelScope,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """One run of a child: observe how it ends, and decide."""
        readiness = Readiness(task_status, slot)
        del task_status  # only through readiness, which lets go of it once used (see Readiness)
        started_at = trio.current_time()
        outcome = Outcome.CANCELLED
        error: Exception | None = None
        decided = False
        try:
            try:
                with scope:
                    child = slot.child
                    # Each call spelled out: a per-run kwargs dict would live as long as the run.
                    if isinstance(child, Supervisor):
                        await child.run(task_status=readiness)
                    elif child.stop_signal and child.start:
                        await child.target(task_status=readiness, stop=slot.stop)
                    elif child.stop_signal:
                        readiness.started()
                        await child.target(stop=slot.stop)
                    elif child.start:
                        await child.target(task_status=readiness)
                    else:
                        readiness.started()
                        await child.target()
                    outcome = Outcome.EXITED
            except Exception as exc:
                outcome, error = Outcome.FAILED, exc
            slot.scope = None
            self._on_end(slot, outcome, error, trio.current_time() - started_at)
            decided = True
        finally:
            if slot.scope is scope:
                slot.scope = None
            if not decided and not slot.held:
                # Cancelled from above, or KeyboardInterrupt: it is not running any more.
                slot.set_state(WorkerState.STOPPED)
            slot.end_run()
        readiness.release()

    def _on_end(
        self, slot: Slot, outcome: Outcome, error: Exception | None, ran_for: float
    ) -> None:
        """Act on how a run ended. Synchronous, so decisions never interleave."""
        slot.ended_how = describe(outcome, error)
        slot.stopped_by_supervisor = slot.held or self._stopping
        if error is not None:
            slot.last_error, slot.last_exception = error_text(error), error
        verdict = judge(
            slot,
            self._path(slot),
            outcome,
            error,
            ran_for,
            stopping=self._stopping,
            jitter=self._effective_jitter(),
        )
        if verdict.action is Action.RESTART:
            verdict = self._within_intensity(verdict)
        loud = verdict.level >= logging.ERROR and error is not None
        self._log(
            verdict.level,
            verdict.message,
            slot,
            attempt=verdict.attempt,
            backoff=verdict.backoff,
            error=error,
            exc_info=error if loud else None,
            outcome=outcome.value if error is None else f"raised {error_text(error)}",
        )
        action = verdict.action
        if action is Action.RESTART:
            assert verdict.backoff is not None
            self._schedule_restart(slot, verdict.backoff)
        elif action is Action.FAIL:
            self._fail(slot, escalate=True)
        elif action is Action.FAIL_QUIETLY:
            self._fail(slot, escalate=False)
        elif slot.held and slot.pending is not None and not self._stopping:
            pass  # stopped for its strategy group, which restarts it: stays backing-off
        else:
            slot.set_state(WorkerState.STOPPED)
            if verdict.ends_normally and auto_shutdown_due(self._slots, slot, self.auto_shutdown):
                reason = f"significant worker {self._path(slot)!r} ended ({self.auto_shutdown})"
                self._log(logging.INFO, f"supervisor {self.name!r} shutting down: {reason}", slot)
                self.shutdown.begin(reason)

    def _within_intensity(self, verdict: Verdict) -> Verdict:
        """The restart *verdict* asks for, or giving up if it exceeds the supervisor's
        intensity."""
        window, intensity = self._window, self.intensity
        if window is None or intensity is None or window.admit(trio.current_time()):
            return verdict
        return attrs.evolve(
            verdict,
            action=Action.FAIL,
            level=logging.ERROR,
            backoff=None,
            message=(
                f"{verdict.message.rsplit('; restart ', 1)[0]}; supervisor {self.name!r} exceeded "
                f"its restart intensity ({window.count} restarts within {intensity.period:g} s, "
                f"at most {intensity.max_restarts}): shutting down"
            ),
        )

    def _fail(self, slot: Slot, *, escalate: bool) -> None:
        slot.set_state(WorkerState.FAILED)
        self._mark_unhealthy(escalating=escalate)
        if escalate:
            self.shutdown.begin(f"worker {self._path(slot)!r} failed")

    def _mark_unhealthy(self, *, escalating: bool) -> None:
        self.healthy.value = False
        parent = self._parent
        if parent is None:
            return
        slot = parent._by_name.get(self.name)
        if slot is not None and slot.probation:
            return  # started by start_child/restart_child, not ready yet: that call decides
        if escalating and self.restart is not None:
            return  # this supervisor will end, and its parent decides: restart it or fail
        parent._mark_unhealthy(escalating=escalating)

    def _adopt_health(self, slot: Slot) -> None:
        """After start_child/restart_child: a nested supervisor that became ready unhealthy (a
        worker of it exited meanwhile) makes this one unhealthy too."""
        if isinstance(slot.child, Supervisor) and slot.child.failed:
            self._mark_unhealthy(escalating=False)

    def _schedule_restart(self, slot: Slot, delay: float) -> None:
        """Restart *slot* after *delay*, with the siblings its strategy names."""
        members: set[int] = {id(slot)}
        for sibling in restart_group(self._slots, slot, self.strategy):
            if sibling is slot or ended_for_good(sibling) or sibling.terminating:
                continue  # a child being terminated is as good as terminated: never restarted
            if never_restarted_with_group(sibling):
                if sibling.scope is not None:
                    sibling.held = True
                    sibling.scope.cancel()
                continue
            members.add(id(sibling))
            if sibling.pending is not None:
                # Already waiting for an earlier restart: this one replaces it, with its members.
                sibling.pending.scope.cancel()
                members.update(id(m) for m in sibling.pending.members)
        ordered = [s for s in self._slots if id(s) in members]
        restart = Restart(members=ordered, delay=delay)
        for member in ordered:
            member.pending = restart
            if member.scope is not None:
                member.held = True
                member.scope.cancel()
            member.set_state(WorkerState.BACKING_OFF)
        assert self._nursery is not None
        self._nursery.start_soon(self._restart_after, restart)

    async def _restart_after(self, restart: Restart) -> None:
        with restart.scope:
            with trio.move_on_after(restart.delay):
                await trio_util.wait_any(self._halt.wait, self.shutdown.wait)  # type: ignore[no-untyped-call]
            if not self._stopping:
                for member in restart.members:
                    await member.wait_run_ended()
            for member in restart.members:
                if member.pending is not restart:
                    continue
                if not self._stopping:
                    member.restarts += 1
                    self._log(
                        logging.INFO,
                        f"restarting worker {self._path(member)!r} (attempt {member.attempt})",
                        member,
                        attempt=member.attempt,
                    )
                await self._launch(member, restart)

    # -- helpers -----------------------------------------------------------------------------

    def _log(
        self,
        level: int,
        message: str,
        slot: Slot | None = None,
        *,
        attempt: int | None = None,
        backoff: float | None = None,
        error: BaseException | None = None,
        exc_info: BaseException | None = None,
        **more: object,
    ) -> None:
        """One supervisor log record: the message says what happened, ``extra`` carries
        ``supervisor``, ``child`` (the child's path; ``worker`` is kept for a runner's worker id),
        ``attempt``, ``backoff_s`` and ``error`` on every record."""
        if not logger.isEnabledFor(level):
            return
        extra: dict[str, object] = {
            "supervisor": self.name,
            "child": None if slot is None else self._path(slot),
            "attempt": attempt,
            "backoff_s": backoff,
            "error": None if error is None else error_text(error),
            **more,
        }
        logger.log(level, message, extra=extra, exc_info=exc_info)

    def _prefix(self) -> str:
        if self._parent is None:
            return ""
        return f"{self._parent._prefix()}{self.name}/"

    def _path(self, slot: Slot) -> str:
        return f"{self._prefix()}{slot.name}"

    def _effective_jitter(self) -> Jitter:
        if self.jitter is not None:
            return self.jitter
        if self._parent is not None:
            return self._parent._effective_jitter()
        return self._fallback_jitter

    def _locate(self, path: str) -> tuple[Supervisor, Slot]:
        """The supervisor that holds the child at *path*, and its slot."""
        if not isinstance(path, str):
            raise TypeError(f"a worker name must be a str, got {path!r}")
        supervisor: Supervisor = self
        *parents, last = path.split("/")
        for name in parents:
            parent = supervisor._by_name.get(name)
            if parent is None or not isinstance(parent.child, Supervisor):
                break
            supervisor = parent.child
        else:
            slot = supervisor._by_name.get(last)
            if slot is not None:
                return supervisor, slot
        raise KeyError(f"supervisor {self.name!r} has no worker {path!r}")
