"""Supervision: run long-lived children in a nursery, observe how each one ends, and act on it.

A child is expected to run for the life of the process. How a run ends is sorted into three
outcomes, and only the first two carry information about the child:

- it *returned*: an **exit**, not a success (a worker that stops working is a problem);
- it raised an :class:`Exception`: a **failure**;
- it was cancelled: says nothing about the child (the supervisor, or something above it, is
  stopping it).

``trio.Cancelled``, :class:`KeyboardInterrupt` and :class:`SystemExit` are never swallowed: the
supervisor catches :class:`Exception` only, and lets everything else through.

What happens next depends on the child's :class:`RestartType` and :class:`RestartPolicy`, and on the
supervisor's :class:`Strategy` (Erlang/OTP's, adapted). Once shutdown has begun, a child's end is a
consequence of it: logged at debug level, recorded as ``stopped``, and nothing else.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping

import attrs
import trio
import trio_util
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from ._errors import WorkerFailed
from ._lifecycle import Shutdown
from ._policy import Jitter, RestartPolicy

__all__ = [
    "ChildSpec",
    "RestartType",
    "Strategy",
    "Supervisor",
    "WorkerState",
    "WorkerStatus",
]

logger = logging.getLogger("trio_supervise.supervisor")

STATE_METRIC = "trio_supervise_worker_state"
RESTARTS_METRIC = "trio_supervise_worker_restarts"  # exposed as ..._total

DEFAULT_SHUTDOWN_GRACE = 5.0

# Virtual time is a sum of float deltas: a run scheduled to last exactly the cap may measure a
# few ulps short. Durations within a nanosecond of the cap count as reaching it.
_TIME_EPSILON = 1e-9


class WorkerState(enum.StrEnum):
    """Where a supervised child is in its life. The values are the labels used in ``/healthz``
    and in the ``trio_supervise_worker_state`` gauge.

    ``failed`` is reserved for terminal failures, and a supervisor with a ``failed`` child is
    always unhealthy: a child that ended and will not be restarted for a *good* reason (a transient
    child that finished, a temporary child, anything ended by shutdown) is ``stopped``.
    """

    STARTING = "starting"
    """Launched, not yet ready (a ``start=True`` child yet to call ``task_status.started``)."""
    RUNNING = "running"
    """Running."""
    BACKING_OFF = "backing-off"
    """Ended; waiting out a backoff before it is restarted (alone, or with its strategy group)."""
    STOPPING = "stopping"
    """Shutdown has begun; the child is inside its grace period."""
    STOPPED = "stopped"
    """Ended for good, and not as a failure: shutdown, a transient child's return, a temporary
    child's end."""
    FAILED = "failed"
    """Ended terminally: no restart policy, or the policy's restart bound was exceeded."""


class RestartType(enum.StrEnum):
    """Which ends of a child lead to a restart (OTP's restart types, adapted).

    A restart needs a :class:`RestartPolicy`; without one, an end that would be restarted takes the
    loud path instead.
    """

    PERMANENT = "permanent"
    """Always restarted. A return is an *exit*, treated like a failure (the default; the seed's)."""
    TRANSIENT = "transient"
    """Restarted only after an exception. A normal return ends it cleanly as ``stopped``: for work
    that may legitimately finish (a one-off migration, a backfill)."""
    TEMPORARY = "temporary"
    """Never restarted. Its end, normal or not, is recorded (``stopped``, with the error text if it
    raised) but never touches health or shutdown. A temporary child takes no restart policy."""


class Strategy(enum.StrEnum):
    """Which siblings are restarted with a child that is restarted (OTP's strategies)."""

    ONE_FOR_ONE = "one_for_one"
    """Only the child that ended (the default; the seed's)."""
    ONE_FOR_ALL = "one_for_all"
    """Every live child is stopped and all are restarted together: for children that only make
    sense as a set."""
    REST_FOR_ONE = "rest_for_one"
    """The child and every live child added after it: for a pipeline where later children depend on
    earlier ones."""


def _check_name(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{attribute.name} must be a str, got {value!r}")
    if not value or "/" in value:
        raise ValueError(f"{attribute.name} must be non-empty and contain no '/', got {value!r}")


def _check_target(
    instance: object, attribute: attrs.Attribute[Callable[..., Awaitable[object]]], value: object
) -> None:
    if not callable(value):
        raise TypeError(f"{attribute.name} must be an async function, got {value!r}")


def _check_restart(
    instance: object, attribute: attrs.Attribute[RestartPolicy | None], value: object
) -> None:
    if value is not None and not isinstance(value, RestartPolicy):
        raise TypeError(f"{attribute.name} must be a RestartPolicy or None, got {value!r}")


def _check_grace(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{attribute.name} must be a number of seconds, got {value!r}")
    if math.isnan(value) or value < 0:
        raise ValueError(f"{attribute.name} must be >= 0 (math.inf waits forever), got {value!r}")


@attrs.frozen
class ChildSpec:
    """What to run under a :class:`Supervisor`, and what to do when it ends.

    :param name: unique among its siblings; no ``/`` (paths of nested supervisors use it).
    :param target: an async function taking no arguments (or only ``task_status``, see *start*).
        A child that wants to finish its work on shutdown closes over the supervisor's
        :class:`Shutdown` and watches it.
    :param restart: the restart policy; ``None`` means an end that would be restarted is terminal.
    :param restart_type: see :class:`RestartType`.
    :param shutdown_grace: seconds the child may keep running after shutdown begins; then it is
        cancelled. ``0`` cancels at once, ``math.inf`` waits for it.
    :param start: the target reports readiness: it is called as ``target(task_status=...)``, like
        a function for :meth:`trio.Nursery.start`, and the child is ``starting`` until it calls
        ``task_status.started()``. The supervisor reports itself ready only once every initial
        child is.
    """

    name: str = attrs.field(validator=_check_name)
    target: Callable[..., Awaitable[object]] = attrs.field(validator=_check_target)
    restart: RestartPolicy | None = attrs.field(
        default=None, kw_only=True, validator=_check_restart
    )
    restart_type: RestartType = attrs.field(
        default=RestartType.PERMANENT, converter=RestartType, kw_only=True
    )
    shutdown_grace: float = attrs.field(
        default=DEFAULT_SHUTDOWN_GRACE, kw_only=True, validator=_check_grace
    )
    start: bool = attrs.field(default=False, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if self.restart_type is RestartType.TEMPORARY and self.restart is not None:
            raise ValueError(
                f"restart must be None for a temporary child (it is never restarted), "
                f"got {self.restart!r} for {self.name!r}"
            )


@attrs.frozen
class WorkerStatus:
    """One row of :meth:`Supervisor.snapshot`: what ``/healthz`` serialises.

    :param worker: the path from the supervisor: ``name`` for its own children, ``sub/name`` for
        the children of a nested supervisor ``sub``.
    :param state: the current state.
    :param restarts: how many times the child was restarted (by its own policy or its group's).
    :param last_error: ``"ExceptionType: message"`` of the last exception it raised, if any.
    :param since: ``trio.current_time()`` when it entered *state* (``None`` before it ever ran).
    """

    worker: str
    state: WorkerState
    restarts: int
    last_error: str | None
    since: float | None


class _Outcome(enum.Enum):
    EXITED = "returned"
    FAILED = "raised"
    CANCELLED = "cancelled"


@attrs.define(eq=False)
class _Restart:
    """A restart waiting out its backoff: one child, or a strategy's group."""

    members: list[_Slot]
    delay: float
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)


@attrs.define(eq=False)
class _Slot:
    """A child and everything the supervisor knows about it.

    A supervisor may hold tens of thousands of idle children, so a slot stays small: the state is
    a plain value, and the ``AsyncValue`` mirroring it (about 1.6 KB with its waiter table) and the
    event marking the end of a run are only created once someone waits on them.
    """

    child: ChildSpec | Supervisor
    _state: WorkerState = WorkerState.STARTING
    _watched: trio_util.AsyncValue[WorkerState] | None = None
    since: float | None = None
    restarts: int = 0
    attempt: int = 0
    last_error: str | None = None
    scope: trio.CancelScope | None = None
    """The current run's cancel scope, while a run is alive."""
    in_run: bool = False
    """A run was launched and has not ended yet."""
    _run_ended: trio.Event | None = None
    """Created by :meth:`wait_run_ended` while a run is alive; set when that run ends."""
    held: bool = False
    """The current run was stopped by the supervisor for its strategy; its outcome is ignored."""
    pending: _Restart | None = None

    @property
    def name(self) -> str:
        return self.child.name

    @property
    def state(self) -> WorkerState:
        return self._state

    def set_state(self, state: WorkerState) -> None:
        self._state = state
        if self._watched is not None:
            self._watched.value = state

    def watch(self) -> trio_util.AsyncValue[WorkerState]:
        """The state as an ``AsyncValue``, created on first use and kept in step from then on."""
        if self._watched is None:
            self._watched = trio_util.AsyncValue(self._state)
        return self._watched

    def begin_run(self) -> None:
        self.in_run = True
        self._run_ended = None

    def end_run(self) -> None:
        self.in_run = False
        if self._run_ended is not None:
            self._run_ended.set()
            self._run_ended = None

    async def wait_run_ended(self) -> None:
        """Return once the current run (if any) has ended; a checkpoint either way."""
        if not self.in_run:
            await trio.lowlevel.checkpoint()
            return
        if self._run_ended is None:
            self._run_ended = trio.Event()
        await self._run_ended.wait()

    @property
    def grace(self) -> float:
        # A nested supervisor bounds its own children by their graces.
        return self.child.shutdown_grace if isinstance(self.child, ChildSpec) else math.inf

    @property
    def restart_type(self) -> RestartType:
        if isinstance(self.child, ChildSpec):
            return self.child.restart_type
        return RestartType.PERMANENT

    @property
    def policy(self) -> RestartPolicy | None:
        return self.child.restart if isinstance(self.child, ChildSpec) else None


class _Readiness(trio.TaskStatus[object]):
    """Wraps a ``task_status`` to mark the child ``running`` when it reports readiness.

    It lets go of the inner status once it is used: that status holds the temporary nursery of
    ``nursery.start`` (with its cancel status, about 1 KB), which would otherwise live as long as
    the child.
    """

    def __init__(self, inner: trio.TaskStatus[None], supervisor: Supervisor, slot: _Slot) -> None:
        self._inner: trio.TaskStatus[None] | None = inner
        self._supervisor = supervisor
        self._slot = slot
        self.reported = False

    def started(self, value: object = None) -> None:
        if self.reported:
            raise RuntimeError("called 'started' twice on the same task status")
        self.reported = True
        self._supervisor._set_state(self._slot, WorkerState.RUNNING)
        self.release()

    def release(self) -> None:
        """Report readiness to the inner status (if not done yet), without marking the child."""
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.started()


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
    return tuple(value)


def _shutdown_or_new(value: Shutdown | None) -> Shutdown:
    return Shutdown() if value is None else value


def _registry_or_private(value: CollectorRegistry | None) -> CollectorRegistry:
    return CollectorRegistry() if value is None else value


def _error_text(error: BaseException) -> str:
    """``"Type: message"``; for an exception group, its leaves' texts joined by ``"; "``."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(_error_text(leaf) for leaf in _leaves(error))
    return f"{type(error).__name__}: {error}"


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


def _single_kind(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception to raise instead of *group*, when nothing would be lost.

    The supervisor's nursery only ever lets through what children must not be caught at:
    cancellation, ``KeyboardInterrupt``, ``SystemExit``. When the group holds nothing else, the
    caller gets the one that matters, unwrapped (``KeyboardInterrupt`` over ``SystemExit`` over
    ``Cancelled``), so it propagates unchanged in kind. Anything else keeps the group whole.
    """
    leaves = list(_leaves(group))
    if not leaves or any(isinstance(leaf, Exception) for leaf in leaves):
        return None
    for kind in (KeyboardInterrupt, SystemExit, trio.Cancelled):
        for leaf in leaves:
            if isinstance(leaf, kind):
                return leaf
    return None


@attrs.define(eq=False, kw_only=True)
class Supervisor:
    """Runs children in a nursery, observes how each one ends, and acts on it.

    Start it with ``await nursery.start(supervisor.run)``: that returns once every initial child
    is running (or ready, for ``start=True`` children). :meth:`run` returns when shutdown has
    begun and every child is done, and raises :class:`WorkerFailed` if the supervisor is unhealthy
    by then (a worker in its tree failed terminally), so a service exits non-zero.

    What happens when a child ends (before shutdown):

    - a ``temporary`` child, or a ``transient`` one that returned: recorded as ``stopped``;
    - no restart policy: a failure marks the child ``failed``, health false, and begins shutdown;
      an exit (a ``permanent`` child returned) marks it ``failed`` and health false, and the others
      keep running;
    - with a policy: the child (and, per :attr:`strategy`, its siblings) is restarted after
      ``policy.backoff(attempt)``, jittered with the key ``(worker path, attempt)``; the state is
      ``backing-off`` meanwhile and health is untouched. A run lasting at least ``policy.cap``
      resets the count; past ``max_restarts`` consecutive restarts, the loud path (``failed``,
      unhealthy, shutdown).

    Siblings stopped by a strategy are cancelled at once (their ``finally`` blocks run); the grace
    period is for shutdown. Health is one-way, like shutdown: once false it stays false, and it
    propagates to every enclosing supervisor.

    A supervisor is a child like any other: put it in another's ``children``. It becomes a
    ``permanent`` child without a restart policy of its parent (its own children's policies absorb
    their failures), its :attr:`shutdown` begins with its parent's, its workers report to its
    parent's registry (unless it was given its own) and appear in its parent's :meth:`snapshot` as
    ``name/child``. When it exhausts a restart policy it shuts its own subtree down and its
    :meth:`run` raises :class:`WorkerFailed`: a failure of the parent's child, which fails upward.

    :param name: the supervisor's name (its name as a child, in paths and logs).
    :param children: :class:`ChildSpec` or nested :class:`Supervisor`, started in this order.
    :param strategy: see :class:`Strategy`.
    :param shutdown: the switch to watch and trigger; a new one by default.
    :param jitter: the keyed jitter for backoffs; by default the parent's, or a random seed.
    :param registry: where the ``trio_supervise_worker_state{worker,state}`` gauge and the
        ``trio_supervise_worker_restarts_total{worker}`` counter are registered; by default a
        private one (never the global registry). Give it to the root supervisor only.
    """

    name: str = attrs.field(validator=_check_name)
    _initial: tuple[ChildSpec | Supervisor, ...] = attrs.field(
        alias="children", default=(), converter=_as_children, repr=False
    )
    strategy: Strategy = attrs.field(default=Strategy.ONE_FOR_ONE, converter=Strategy)
    shutdown: Shutdown = attrs.field(default=None, converter=_shutdown_or_new, repr=False)
    jitter: Jitter | None = attrs.field(default=None, repr=False)
    registry: CollectorRegistry = attrs.field(
        default=None, converter=_registry_or_private, repr=False
    )
    healthy: trio_util.AsyncBool = attrs.field(
        init=False,
        factory=lambda: trio_util.AsyncBool(True),  # type: ignore[no-untyped-call]
        repr=False,
    )
    """True until a worker in this supervisor's tree fails terminally; then false for good."""

    _slots: list[_Slot] = attrs.field(init=False, factory=list, repr=False)
    _by_name: dict[str, _Slot] = attrs.field(init=False, factory=dict, repr=False)
    _parent: Supervisor | None = attrs.field(init=False, default=None, repr=False)
    _fallback_jitter: Jitter = attrs.field(init=False, factory=Jitter, repr=False)
    _nursery: trio.Nursery | None = attrs.field(init=False, default=None, repr=False)
    _running: bool = attrs.field(init=False, default=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.jitter is not None and not isinstance(self.jitter, Jitter):
            raise TypeError(f"jitter must be a Jitter or None, got {self.jitter!r}")
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
        return self._find(name).state

    def watch(self, name: str) -> trio_util.AsyncValue[WorkerState]:
        """The state of the child *name* as an ``AsyncValue``, to wait for a transition."""
        return self._find(name).watch()

    @property
    def states(self) -> Mapping[str, WorkerState]:
        """Every worker's state in this supervisor's tree, by path."""
        return {status.worker: status.state for status in self.snapshot()}

    def snapshot(self) -> list[WorkerStatus]:
        """One record per worker in this supervisor's tree, in start order, depth first."""
        records: list[WorkerStatus] = []
        for slot in self._slots:
            records.append(
                WorkerStatus(
                    worker=self._path(slot),
                    state=slot.state,
                    restarts=slot.restarts,
                    last_error=slot.last_error,
                    since=slot.since,
                )
            )
            if isinstance(slot.child, Supervisor):
                records.extend(slot.child.snapshot())
        return records

    # -- changing the tree -------------------------------------------------------------------

    def add_child(self, child: ChildSpec | Supervisor) -> None:
        """Add a child; while :meth:`run` is in progress it is launched at once (in the background).

        Refused once shutdown has begun.
        """
        if self.shutdown.requested:
            raise RuntimeError(
                f"supervisor {self.name!r} is shutting down; not adding {child.name!r}"
            )
        slot = self._add_slot(child)
        if self._nursery is not None:
            self._nursery.start_soon(self._launch, slot, None)

    async def start_child(self, child: ChildSpec | Supervisor) -> None:
        """Add a child to a running supervisor and return once it is running (or ready)."""
        if self._nursery is None:
            raise RuntimeError(f"supervisor {self.name!r} is not running; use add_child before run")
        if self.shutdown.requested:
            raise RuntimeError(
                f"supervisor {self.name!r} is shutting down; not adding {child.name!r}"
            )
        await self._launch(self._add_slot(child), None)

    def _add_slot(self, child: ChildSpec | Supervisor) -> _Slot:
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
        if isinstance(child, Supervisor):
            child._parent = self
            self.shutdown.adopt(child.shutdown)
        slot = _Slot(child)
        self._slots.append(slot)
        self._by_name[child.name] = slot
        return slot

    # -- running -----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the children until shutdown has begun and all of them are done.

        Reports readiness through *task_status* once every initial child is running (or ready).
        Raises :class:`WorkerFailed` at the end if the supervisor is unhealthy. Cancellation,
        ``KeyboardInterrupt`` and ``SystemExit`` propagate unchanged in kind.
        """
        if self._running:
            raise RuntimeError(f"supervisor {self.name!r} is already running")
        self._running = True
        for slot in self._slots:
            slot.attempt, slot.held, slot.pending = 0, False, None
            slot.end_run()
        logger.info(
            "supervisor starting", extra={"supervisor": self.name, "strategy": str(self.strategy)}
        )
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._stop_on_shutdown)
                for slot in list(self._slots):
                    await self._launch(slot, None)
                task_status.started()
        except BaseExceptionGroup as group:
            single = _single_kind(group)
            if single is None:
                raise
            raise single from group
        finally:
            self._nursery = None
            self._running = False
        logger.info("supervisor stopped", extra={"supervisor": self.name})
        if not self.healthy.value:
            failed = [s.worker for s in self.snapshot() if s.state is WorkerState.FAILED]
            raise WorkerFailed(
                f"supervisor {self.name!r} is unhealthy: failed workers {failed!r}"
                if failed
                else f"supervisor {self.name!r} is unhealthy"
            )

    async def _stop_on_shutdown(self) -> None:
        """Once shutdown begins, give every live child its grace period, then cancel it."""
        await self.shutdown.wait()
        logger.info(
            "supervisor shutting down",
            extra={"supervisor": self.name, "reason": self.shutdown.reason},
        )
        now = trio.current_time()
        for slot in self._slots:
            if slot.scope is not None:
                self._set_state(slot, WorkerState.STOPPING)
                slot.scope.deadline = min(slot.scope.deadline, now + slot.grace)

    async def _launch(self, slot: _Slot, restart: _Restart | None) -> None:
        """Start one run of *slot*, returning once it is running (or ready).

        Only the restart a slot belongs to may launch it, and never while a run is alive.
        """
        if slot.pending is not restart:
            return
        if self.shutdown.requested:
            slot.pending = None
            if slot.scope is None:
                self._set_state(slot, WorkerState.STOPPED)
            return
        if slot.scope is not None:
            return
        slot.pending = None
        assert self._nursery is not None
        scope = trio.CancelScope()
        slot.scope, slot.held = scope, False
        slot.begin_run()
        self._set_state(slot, WorkerState.STARTING)
        await self._nursery.start(self._run_child, slot, scope)

    async def _run_child(
        self,
        slot: _Slot,
        scope: trio.CancelScope,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """One run of a child: observe how it ends, and decide."""
        readiness = _Readiness(task_status, self, slot)
        del task_status  # only through readiness, which lets go of it once used (see _Readiness)
        started_at = trio.current_time()
        outcome = _Outcome.CANCELLED
        error: Exception | None = None
        decided = False
        try:
            try:
                with scope:
                    child = slot.child
                    if isinstance(child, Supervisor):
                        await child.run(task_status=readiness)
                    elif child.start:
                        await child.target(task_status=readiness)
                    else:
                        readiness.started()
                        await child.target()
                    outcome = _Outcome.EXITED
            except Exception as exc:
                outcome, error = _Outcome.FAILED, exc
            slot.scope = None
            self._on_end(slot, outcome, error, trio.current_time() - started_at)
            decided = True
        finally:
            if slot.scope is scope:
                slot.scope = None
            if not decided and not slot.held:
                # Cancelled from above, or KeyboardInterrupt: it is not running any more.
                self._set_state(slot, WorkerState.STOPPED)
            slot.end_run()
        readiness.release()

    def _on_end(
        self, slot: _Slot, outcome: _Outcome, error: Exception | None, ran_for: float
    ) -> None:
        """Act on how a run ended. Synchronous, so decisions never interleave."""
        path = self._path(slot)
        text = outcome.value if error is None else f"raised {_error_text(error)}"
        if error is not None:
            slot.last_error = _error_text(error)
        extra: dict[str, object] = {"supervisor": self.name, "worker": path, "outcome": text}

        if slot.held:
            logger.debug("worker stopped for its strategy group", extra=extra)
            if slot.pending is None or self.shutdown.requested:
                self._set_state(slot, WorkerState.STOPPED)
            return
        if self.shutdown.requested:
            logger.debug("worker ended during shutdown", extra=extra)
            self._set_state(slot, WorkerState.STOPPED)
            return
        if outcome is _Outcome.CANCELLED:
            # Only the supervisor cancels a child's own scope; nothing to learn from it.
            logger.debug("worker cancelled", extra=extra)
            self._set_state(slot, WorkerState.STOPPED)
            return

        restart_type = slot.restart_type
        if restart_type is RestartType.TEMPORARY:
            level = logging.WARNING if error is not None else logging.INFO
            logger.log(level, "temporary worker ended; not restarted", extra=extra)
            self._set_state(slot, WorkerState.STOPPED)
            return
        if restart_type is RestartType.TRANSIENT and outcome is _Outcome.EXITED:
            logger.info("transient worker finished", extra=extra)
            self._set_state(slot, WorkerState.STOPPED)
            return

        policy = slot.policy
        if policy is None:
            if error is None:
                logger.error(
                    "worker exited; workers are expected to run for the life of the process",
                    extra=extra,
                )
                self._fail(slot, escalate=False)
            else:
                logger.error("worker failed", extra=extra, exc_info=error)
                self._fail(slot, escalate=True)
            return

        if ran_for >= policy.cap - _TIME_EPSILON:
            slot.attempt = 0
        slot.attempt += 1
        extra["attempt"] = slot.attempt
        if slot.attempt > policy.max_restarts:
            extra["restarts"] = policy.max_restarts
            logger.error("worker exhausted its restart policy", extra=extra, exc_info=error)
            self._fail(slot, escalate=True)
            return

        delay = policy.backoff(slot.attempt, key=path, jitter=self._effective_jitter())
        extra["backoff"] = delay
        logger.warning("worker ended; restarting after backoff", extra=extra)
        self._schedule_restart(slot, delay)

    def _fail(self, slot: _Slot, *, escalate: bool) -> None:
        self._set_state(slot, WorkerState.FAILED)
        self._mark_unhealthy()
        if escalate:
            self.shutdown.begin(f"worker {self._path(slot)!r} failed")

    def _mark_unhealthy(self) -> None:
        self.healthy.value = False
        if self._parent is not None:
            self._parent._mark_unhealthy()

    def _schedule_restart(self, slot: _Slot, delay: float) -> None:
        """Restart *slot* after *delay*, with the siblings its strategy names."""
        index = self._slots.index(slot)
        if self.strategy is Strategy.ONE_FOR_ALL:
            in_range = self._slots
        elif self.strategy is Strategy.REST_FOR_ONE:
            in_range = self._slots[index:]
        else:
            in_range = [slot]
        members: set[int] = {id(slot)}
        for sibling in in_range:
            if sibling is slot or sibling.state in (WorkerState.FAILED, WorkerState.STOPPED):
                continue
            if sibling.restart_type is RestartType.TEMPORARY:
                # OTP: a temporary sibling is stopped with its group and never restarted.
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
        restart = _Restart(members=ordered, delay=delay)
        for member in ordered:
            member.pending = restart
            if member.scope is not None:
                member.held = True
                member.scope.cancel()
            self._set_state(member, WorkerState.BACKING_OFF)
        assert self._nursery is not None
        self._nursery.start_soon(self._restart_after, restart)

    async def _restart_after(self, restart: _Restart) -> None:
        with restart.scope:
            shutting_down = await self.shutdown.sleep(restart.delay)
            if not shutting_down:
                for member in restart.members:
                    await member.wait_run_ended()
            for member in restart.members:
                if member.pending is not restart:
                    continue
                if not self.shutdown.requested:
                    member.restarts += 1
                    logger.info(
                        "restarting worker",
                        extra={
                            "supervisor": self.name,
                            "worker": self._path(member),
                            "attempt": member.attempt,
                        },
                    )
                await self._launch(member, restart)

    # -- helpers -----------------------------------------------------------------------------

    def _set_state(self, slot: _Slot, state: WorkerState) -> None:
        slot.since = trio.current_time()
        slot.set_state(state)

    def _prefix(self) -> str:
        if self._parent is None:
            return ""
        return f"{self._parent._prefix()}{self.name}/"

    def _path(self, slot: _Slot) -> str:
        return f"{self._prefix()}{slot.name}"

    def _effective_jitter(self) -> Jitter:
        if self.jitter is not None:
            return self.jitter
        if self._parent is not None:
            return self._parent._effective_jitter()
        return self._fallback_jitter

    def _find(self, path: str) -> _Slot:
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
                return slot
        raise KeyError(f"supervisor {self.name!r} has no worker {path!r}")
