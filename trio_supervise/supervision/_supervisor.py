"""The supervisor: the public face of supervision (the contract is docs/supervision.md).

A :class:`Supervisor` holds its settings, its children table (:mod:`._children`) and its health,
answers what is asked of it (states, snapshots, children added, terminated, restarted, deleted at
run time) and runs. It joins two parts once, at construction: the restarter
(:mod:`._restarts`) launches each run of a child and acts on how it ended, the stopper
(:mod:`._stopping`) stops the children in the shutdown order. The rules they apply are in
:mod:`._child` (one child) and :mod:`._group` (its siblings).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import attrs
import trio
import trio_util
from prometheus_client import CollectorRegistry

from .._errors import ChildStateError, StartFailed, WorkerFailed
from .._lifecycle import Shutdown
from .._policy import Jitter, RestartPolicy
from ._child import (
    ChildSpec,
    RestartType,
    Slot,
    WorkerState,
    WorkerStatus,
    check_bool,
    check_child_rules,
    check_name,
    check_restart,
    leaves,
    to_restart_type,
)
from ._children import ChildCounts, ChildTable, WorkerMetrics, status_of
from ._group import (
    AutoShutdown,
    Intensity,
    RestartWindow,
    ShutdownOrder,
    Strategy,
    ended_for_good,
    to_auto_shutdown,
    to_shutdown_order,
    to_strategy,
)
from ._restarts import Restarter
from ._stopping import Stopper

__all__ = ["Supervisor"]

logger = logging.getLogger("trio_supervise.supervisor")


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

    _table: ChildTable = attrs.field(init=False, repr=False)
    _parent: Supervisor | None = attrs.field(init=False, default=None, repr=False)
    _fallback_jitter: Jitter = attrs.field(init=False, factory=Jitter, repr=False)
    _nursery: trio.Nursery | None = attrs.field(init=False, default=None, repr=False)
    _running: bool = attrs.field(init=False, default=False, repr=False)
    _stopper: Stopper = attrs.field(init=False, repr=False)
    _restarter: Restarter = attrs.field(init=False, repr=False)
    _start_failure: StartFailed | None = attrs.field(init=False, default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.jitter is not None and not isinstance(self.jitter, Jitter):
            raise TypeError(f"jitter must be a Jitter or None, got {self.jitter!r}")
        check_child_rules(self.name, self.restart, self.restart_type, self.significant)
        self._table = ChildTable(self.name)
        self._stopper = Stopper(self)
        window = None if self.intensity is None else RestartWindow(self.intensity)
        self._restarter = Restarter(self, self._stopper, window)
        for child in self._initial:
            self._add_slot(child)
        try:
            self.registry.register(WorkerMetrics(self.snapshot))
        except ValueError as exc:
            raise ValueError(
                f"registry already carries trio_supervise worker metrics; give it to the root "
                f"supervisor only (supervisor {self.name!r})"
            ) from exc

    # -- reading state -----------------------------------------------------------------------

    @property
    def children(self) -> tuple[ChildSpec | Supervisor, ...]:
        """The children, in start order (including those added with :meth:`add_child`)."""
        return tuple(slot.child for slot in self._table)

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
        for slot in self._table:
            records.append(self._status(slot))
            if isinstance(slot.child, Supervisor):
                records.extend(slot.child.snapshot())
        return records

    def which_children(self) -> list[WorkerStatus]:
        """One record per *direct* child, in start order (OTP's ``which_children``)."""
        return [self._status(slot) for slot in self._table]

    def count_children(self) -> ChildCounts:
        """How many direct children are listed, alive, supervisors, workers (OTP's
        ``count_children``)."""
        return self._table.counts()

    def _status(self, slot: Slot) -> WorkerStatus:
        return status_of(slot, self._path(slot))

    # -- changing the tree -------------------------------------------------------------------

    def add_child(self, child: ChildSpec | Supervisor) -> None:
        """Add a child; while :meth:`run` is in progress it is launched at once (in the background).

        Refused once shutdown has begun.
        """
        self._refuse_if_stopping(f"not adding {_name_of(child)!r}")
        slot = self._add_slot(child)
        if self._nursery is not None:
            self._nursery.start_soon(self._restarter.launch, slot, None)

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
        await self._restarter.launch(slot, None)
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
        await owner._stopper.terminate(slot)

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
        await owner._restarter.launch(slot, None)
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
        self._table.check_new(child.name, child.significant, self.auto_shutdown)
        if isinstance(child, Supervisor):
            child._parent = self
            self.shutdown.adopt(child.shutdown)
        return self._table.add(child)

    def _remove_slot(self, slot: Slot) -> None:
        self._table.remove(slot)
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
        self._stopper.reset()
        self._start_failure = None
        self._restarter.reset()
        for slot in self._table:
            slot.attempt, slot.held, slot.pending, slot.probation = 0, False, None, False
            slot.end_run()
        self._log(logging.INFO, f"supervisor {self.name!r} starting", strategy=str(self.strategy))
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._stopper.stop_when_asked)
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
        initial = list(self._table)
        for index, slot in enumerate(initial):
            await self._restarter.launch(slot, None)
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
        return self._stopper.stopping

    # -- health ------------------------------------------------------------------------------

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
        slot = parent._table.get(self.name)
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

    # -- helpers -----------------------------------------------------------------------------

    def _log(self, level: int, message: str, slot: Slot | None = None, **fields: object) -> None:
        """One supervisor log record: the message says what happened, ``extra`` carries
        ``supervisor``, ``child`` (the child's path; ``worker`` is kept for a runner's worker id),
        ``attempt``, ``backoff_s`` and ``error`` on every record (None unless given), and the
        other *fields*; an exception given as ``exc_info`` comes with its traceback."""
        if not logger.isEnabledFor(level):
            return
        exc_info = fields.pop("exc_info", None)
        extra: dict[str, object] = {
            "supervisor": self.name,
            "child": None if slot is None else self._path(slot),
            "attempt": None,
            "backoff_s": None,
            "error": None,
            **fields,
        }
        if not isinstance(exc_info, BaseException):
            exc_info = None
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
            parent = supervisor._table.get(name)
            if parent is None or not isinstance(parent.child, Supervisor):
                break
            supervisor = parent.child
        else:
            slot = supervisor._table.get(last)
            if slot is not None:
                return supervisor, slot
        raise KeyError(f"supervisor {self.name!r} has no worker {path!r}")
