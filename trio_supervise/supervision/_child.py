"""One supervised child: what it is, what state it is in, and how one of its runs is judged.

Everything here is about a single child and knows nothing of its siblings: the spec
(:class:`ChildSpec`), the states (:class:`WorkerState`), the record a snapshot holds
(:class:`WorkerStatus`), the slot a supervisor keeps per child (``_Slot``), and the one rule that
turns how a run ended into what happens next (:func:`judge`): stopped, failed, or restarted after
a backoff. The group rules (strategy, intensity, shutdown order) live in ``_group.py``.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

import attrs
import trio
import trio_util

from .._lifecycle import Shutdown
from .._policy import Jitter, RestartPolicy

if TYPE_CHECKING:
    from ._supervisor import Supervisor

__all__ = ["ChildSpec", "RestartType", "WorkerState", "WorkerStatus"]

DEFAULT_SHUTDOWN_GRACE = 5.0

# Virtual time is a sum of float deltas: a run scheduled to last exactly the cap may measure a
# few ulps short. Durations within a nanosecond of the cap count as reaching it.
TIME_EPSILON = 1e-9


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
    """Shutdown has reached its supervisor (or :meth:`Supervisor.terminate_child` was called):
    waiting for its turn to be asked to stop, or inside its grace period."""
    STOPPED = "stopped"
    """Ended for good, and not as a failure: shutdown, a transient child's return, a temporary
    child's end, :meth:`Supervisor.terminate_child`."""
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
    raised) but never touches health or shutdown; only an exception before it is ready is a start
    failure, as for every restart type (OTP's failing start function). A temporary child takes no
    restart policy."""


_E = TypeVar("_E", bound=enum.StrEnum)


def choice(kind: type[_E], field: str, value: object) -> _E:
    """*value* as a member of *kind*; the error names the field and the allowed values."""
    try:
        return kind(value)  # type: ignore[arg-type]
    except ValueError:
        allowed = ", ".join(repr(member.value) for member in kind)
        raise ValueError(
            f"{field} must be a {kind.__name__} (one of {allowed}), got {value!r}"
        ) from None


def to_restart_type(value: object) -> RestartType:
    return choice(RestartType, "restart_type", value)


def check_name(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{attribute.name} must be a str, got {value!r}")
    if not value or "/" in value:
        raise ValueError(f"{attribute.name} must be non-empty and contain no '/', got {value!r}")


def _check_target(
    instance: object, attribute: attrs.Attribute[Callable[..., Awaitable[object]]], value: object
) -> None:
    if not callable(value):
        raise TypeError(f"{attribute.name} must be an async function, got {value!r}")


def check_restart(
    instance: object, attribute: attrs.Attribute[RestartPolicy | None], value: object
) -> None:
    if value is not None and not isinstance(value, RestartPolicy):
        raise TypeError(f"{attribute.name} must be a RestartPolicy or None, got {value!r}")


def check_bool(instance: object, attribute: attrs.Attribute[bool], value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{attribute.name} must be a bool, got {value!r}")


def _check_grace(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{attribute.name} must be a number of seconds, got {value!r}")
    if math.isnan(value) or value < 0:
        raise ValueError(f"{attribute.name} must be >= 0 (math.inf waits forever), got {value!r}")


def check_child_rules(
    name: str, restart: RestartPolicy | None, restart_type: RestartType, significant: bool
) -> None:
    """OTP's rules tying a child's restart type to its policy and significance."""
    if restart_type is RestartType.TEMPORARY and restart is not None:
        raise ValueError(
            f"restart must be None for a temporary child (it is never restarted), "
            f"got {restart!r} for {name!r}"
        )
    if significant and restart_type is RestartType.PERMANENT:
        raise ValueError(
            f"significant must be False for a permanent child (only a transient or temporary "
            f"child may end normally), got significant=True for {name!r}"
        )


@attrs.frozen
class ChildSpec:
    """What to run under a :class:`Supervisor`, and what to do when it ends.

    :param name: unique among its siblings; no ``/`` (paths of nested supervisors use it).
    :param target: an async function taking no arguments (or only ``task_status``, see *start*,
        and ``stop``, see *stop_signal*). A child that wants to finish its work on shutdown closes
        over the supervisor's :class:`Shutdown` and watches it.
    :param restart: the restart policy; ``None`` means an end that would be restarted is terminal.
    :param restart_type: see :class:`RestartType`.
    :param shutdown_grace: seconds the child may keep running once it is asked to stop (its turn
        in shutdown, or :meth:`Supervisor.terminate_child`); then it is cancelled. ``0`` cancels at
        once, ``math.inf`` waits for it.
    :param start: the target reports readiness: it is called as ``target(task_status=...)``, like
        a function for :meth:`trio.Nursery.start`, and the child is ``starting`` until it calls
        ``task_status.started()``. The supervisor reports itself ready only once every initial
        child is.
    :param stop_signal: the target is also called with ``stop=``, a :class:`Shutdown` of this run
        alone, begun when the supervisor asks *this* child to stop: its turn in the shutdown order
        (so a child started first keeps working while later ones drain) or
        :meth:`Supervisor.terminate_child`.
    :param significant: its normal end (a transient child's return, a temporary child's end)
        counts towards its supervisor's ``auto_shutdown``. Only for transient and temporary
        children, under a supervisor whose ``auto_shutdown`` is not ``never`` (OTP's rules).
    """

    name: str = attrs.field(validator=check_name)
    target: Callable[..., Awaitable[object]] = attrs.field(validator=_check_target)
    restart: RestartPolicy | None = attrs.field(default=None, kw_only=True, validator=check_restart)
    restart_type: RestartType = attrs.field(
        default=RestartType.PERMANENT,
        converter=to_restart_type,
        kw_only=True,
    )
    shutdown_grace: float = attrs.field(
        default=DEFAULT_SHUTDOWN_GRACE, kw_only=True, validator=_check_grace
    )
    start: bool = attrs.field(default=False, kw_only=True, validator=check_bool)
    stop_signal: bool = attrs.field(default=False, kw_only=True, validator=check_bool)
    significant: bool = attrs.field(default=False, kw_only=True, validator=check_bool)

    def __attrs_post_init__(self) -> None:
        check_child_rules(self.name, self.restart, self.restart_type, self.significant)


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


class Outcome(enum.Enum):
    """How one run ended."""

    EXITED = "returned"
    FAILED = "raised"
    CANCELLED = "cancelled"


@attrs.define(eq=False)
class Restart:
    """A restart waiting out its backoff: one child, or a strategy's group."""

    members: list[Slot]
    delay: float
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)


@attrs.define(eq=False)
class Slot:
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
    last_exception: BaseException | None = None
    """The exception that ended the last run (``None`` if it returned or was cancelled)."""
    ended_how: str = ""
    """How the last run ended, in words ("returned", "failed (OSError: ...)")."""
    stopped_by_supervisor: bool = False
    """The last run ended while its supervisor was stopping it (shutdown, its strategy group,
    terminate_child): its end says nothing about the child."""
    scope: trio.CancelScope | None = None
    """The current run's cancel scope, while a run is alive."""
    stop: Shutdown | None = None
    """The current run's own stop signal (its turn in shutdown, or terminate_child)."""
    in_run: bool = False
    """A run was launched and has not ended yet."""
    ready: bool = False
    """The current (or last) run reported readiness."""
    _run_ended: trio.Event | None = None
    """Created by :meth:`wait_run_ended` while a run is alive; set when that run ends."""
    held: bool = False
    """The current run was stopped by the supervisor (its strategy, or terminate_child); its
    outcome is ignored."""
    terminating: bool = False
    """terminate_child is stopping the current run: no restart (its policy's or its group's)
    takes it, as none takes a terminated child."""
    probation: bool = False
    """Launched by start_child/restart_child: an end before readiness is that call's error,
    never a restart or a failure of the supervisor."""
    pending: Restart | None = None

    @property
    def name(self) -> str:
        return self.child.name

    @property
    def state(self) -> WorkerState:
        return self._state

    def set_state(self, state: WorkerState) -> None:
        self._state = state
        self.since = trio.current_time()
        if self._watched is not None:
            self._watched.value = state

    def watch(self) -> trio_util.AsyncValue[WorkerState]:
        """The state as an ``AsyncValue``, created on first use and kept in step from then on."""
        if self._watched is None:
            self._watched = trio_util.AsyncValue(self._state)
        return self._watched

    def begin_run(self) -> None:
        self.in_run = True
        self.terminating = False
        self.ready = False
        self.last_exception = None
        self.ended_how = ""
        self.stopped_by_supervisor = False
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
    def start_ignored(self) -> bool:
        """The last run returned before it was ready, and its restart type makes that OTP's
        ``ignore`` (a transient or temporary child): not started, and not an error."""
        return (
            not self.ready
            and self.ended_how == describe(Outcome.EXITED, None)
            and self.restart_type is not RestartType.PERMANENT
        )

    @property
    def start_failed(self) -> bool:
        """The last run ended before it was ready in a way that is a start error (OTP's
        ``{error, Reason}``): it raised (whatever its restart type), or it is ``failed``."""
        if self.ready or self.start_ignored or self.stopped_by_supervisor:
            return False
        return self.last_exception is not None or self.state is WorkerState.FAILED

    @property
    def idle(self) -> bool:
        """No run alive and no restart waiting: terminated (OTP's word), so it may be restarted
        or deleted."""
        return not self.in_run and self.scope is None and self.pending is None

    def mark_stopping(self) -> None:
        """Record that this live run is being stopped (once: its ``since`` stays put)."""
        if self.scope is not None and self._state is not WorkerState.STOPPING:
            self.set_state(WorkerState.STOPPING)

    def ask_to_stop(self, reason: str) -> None:
        """Begin this run's stop signal and give it its grace, from now."""
        if self.scope is None:
            return
        self.mark_stopping()
        if self.stop is not None:
            self.stop.begin(reason)
        self.scope.deadline = min(self.scope.deadline, trio.current_time() + self.grace)

    @property
    def grace(self) -> float:
        # A nested supervisor bounds its own children by their graces.
        return self.child.shutdown_grace if isinstance(self.child, ChildSpec) else math.inf

    @property
    def restart_type(self) -> RestartType:
        return self.child.restart_type

    @property
    def policy(self) -> RestartPolicy | None:
        return self.child.restart

    @property
    def significant(self) -> bool:
        return self.child.significant


class Readiness(trio.TaskStatus[object]):
    """Wraps a ``task_status`` to mark the child ``running`` when it reports readiness.

    It lets go of the inner status once it is used: that status holds the temporary nursery of
    ``nursery.start`` (with its cancel status, about 1 KB), which would otherwise live as long as
    the child.
    """

    def __init__(self, inner: trio.TaskStatus[None], slot: Slot) -> None:
        self._inner: trio.TaskStatus[None] | None = inner
        self._slot = slot
        self.reported = False

    def started(self, value: object = None) -> None:
        if self.reported:
            raise RuntimeError("called 'started' twice on the same task status")
        self.reported = True
        self._slot.ready = True
        self._slot.probation = False
        self._slot.set_state(WorkerState.RUNNING)
        self.release()

    def release(self) -> None:
        """Report readiness to the inner status (if not done yet), without marking the child."""
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.started()


# -- judging one run -------------------------------------------------------------------------


class Action(enum.Enum):
    """What the supervisor does with a child whose run ended."""

    STOP = "stop"
    """Record it ``stopped``; nothing else."""
    FAIL = "fail"
    """Record it ``failed``, mark the tree unhealthy, and begin shutdown."""
    FAIL_QUIETLY = "fail quietly"
    """Record it ``failed`` and mark the tree unhealthy; the others keep running (an exit)."""
    RESTART = "restart"
    """Restart it (with its strategy group) after :attr:`Verdict.backoff` seconds."""
    START_FAILED = "start failed"
    """It ended before readiness under start_child/restart_child: that call's error."""


@attrs.frozen
class Verdict:
    """The decision about one ended run, with the log line that says what happened."""

    action: Action
    message: str
    level: int
    attempt: int | None = None
    backoff: float | None = None
    ends_normally: bool = False
    """A normal end for its restart type (counts towards ``auto_shutdown``)."""


def error_text(error: BaseException) -> str:
    """``"Type: message"``; for an exception group, its leaves' texts joined by ``"; "``."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(error_text(leaf) for leaf in leaves(error))
    return f"{type(error).__name__}: {error}"


def leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from leaves(inner)
    else:
        yield error


def describe(outcome: Outcome, error: BaseException | None) -> str:
    """How a run ended, in words: "returned", "failed (OSError: ...)", "was cancelled"."""
    if outcome is Outcome.CANCELLED:
        return "was cancelled"
    return "returned" if error is None else f"failed ({error_text(error)})"


def _seconds(value: float) -> str:
    return f"{value:.3g} s" if value < 100 else f"{value:.0f} s"


def judge(
    slot: Slot,
    path: str,
    outcome: Outcome,
    error: Exception | None,
    ran_for: float,
    *,
    stopping: bool,
    jitter: Jitter,
) -> Verdict:
    """How the run of *slot* that ended with *outcome* is acted on: the per-child rules.

    Updates the slot's attempt count (a run lasting at least the policy's cap resets it).
    *stopping*: its supervisor is shutting down (or being terminated).
    """
    what = f"worker {path!r}"
    happened = describe(outcome, error)
    if slot.probation and not slot.ready:
        if outcome is Outcome.EXITED and slot.restart_type is not RestartType.PERMANENT:
            return Verdict(
                Action.STOP,
                f"{slot.restart_type} {what} returned before it was ready; not started "
                f"(OTP's ignore)",
                logging.INFO,
            )
        return Verdict(
            Action.START_FAILED,
            f"{what} {happened} before it was ready; not started",
            logging.WARNING,
        )
    if slot.held:
        return Verdict(Action.STOP, f"{what} stopped by its supervisor", logging.DEBUG)
    if stopping:
        return Verdict(Action.STOP, f"{what} {happened} during shutdown", logging.DEBUG)
    if outcome is Outcome.CANCELLED:
        # Only the supervisor cancels a child's own scope; nothing to learn from it.
        return Verdict(Action.STOP, f"{what} was cancelled", logging.DEBUG)

    restart_type = slot.restart_type
    if restart_type is RestartType.TEMPORARY:
        level = logging.WARNING if error is not None else logging.INFO
        return Verdict(
            Action.STOP, f"temporary {what} {happened}; not restarted", level, ends_normally=True
        )
    if restart_type is RestartType.TRANSIENT and error is None:
        return Verdict(
            Action.STOP,
            f"transient {what} finished; not restarted",
            logging.INFO,
            ends_normally=True,
        )

    policy = slot.policy
    if policy is None:
        if error is None:
            return Verdict(
                Action.FAIL_QUIETLY,
                f"{what} returned; workers are expected to run for the life of the process "
                f"(no restart policy): marked failed, the others keep running",
                logging.ERROR,
            )
        return Verdict(
            Action.FAIL, f"{what} {happened}; no restart policy: shutting down", logging.ERROR
        )

    if ran_for >= policy.cap - TIME_EPSILON:
        slot.attempt = 0
    slot.attempt += 1
    if slot.attempt > policy.max_restarts:
        return Verdict(
            Action.FAIL,
            f"{what} {happened}; no restarts left ({policy.max_restarts} of "
            f"{policy.max_restarts} used): shutting down",
            logging.ERROR,
            attempt=slot.attempt,
        )
    delay = policy.backoff(slot.attempt, key=path, jitter=jitter)
    return Verdict(
        Action.RESTART,
        f"{what} {happened}; restart {slot.attempt} of {policy.max_restarts} in {_seconds(delay)}",
        logging.WARNING,
        attempt=slot.attempt,
        backoff=delay,
    )
