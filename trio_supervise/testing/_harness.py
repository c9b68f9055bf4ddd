"""The time-travel harness: run drivers, workers or a whole service in Trio's virtual time.

Everything runs against a :class:`~trio_supervise.MemoryQueue` whose "now" follows Trio's clock.
Under ``MockClock(autojump_threshold=0)`` (pytest-trio's ``autojump_clock``) the clock jumps
straight to the next deadline whenever every task is waiting, so a month of daily work, restarts and
backoffs passes in milliseconds, the same way every time.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs
import trio
import trio.testing
import trio_util

from .._clock import TrioClock
from .._errors import WorkerFailed
from .._policy import Jitter, RestartPolicy
from .._service import Service
from .._settings import Settings
from ..queues import MemoryQueue
from ..run import (
    AnyWorkflowDriver,
    ContextFactory,
    DriverRegistry,
    RunnerEvent,
    RunnerEventKind,
    RunnerSettings,
    WorkflowRunner,
    raise_specific,
)
from ..supervision import ChildSpec, Supervisor, WorkerState
from ._history import Entry, History

__all__ = [
    "DEFAULT_EPOCH",
    "DEFAULT_JITTER_SEED",
    "Harness",
    "harness_runner_settings",
    "open_harness",
    "run_scenario",
]

logger = logging.getLogger("trio_supervise.testing")

DEFAULT_JITTER_SEED = 7
"""The jitter seed a harness uses unless told otherwise (the ``jitter_seed`` fixture's value)."""

DEFAULT_EPOCH = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
"""What the harness's queue clock reads when the harness opens."""

_HARNESS_POLL_INTERVAL = 3600.0
_SETTLE_MARGIN = 5.0


def harness_runner_settings(**changes: Any) -> RunnerSettings:
    """:class:`~trio_supervise.RunnerSettings` for a harness run, with *changes* applied.

    The defaults, except ``worker_id="harness"`` and an hour-long ``poll_interval``: the memory
    queue wakes a waiting runner at the next due time by itself, and a month of one-second polls
    would be millions of needless wake-ups.
    """
    values: dict[str, Any] = {"worker_id": "harness", "poll_interval": _HARNESS_POLL_INTERVAL}
    values.update(changes)
    return RunnerSettings(**values)


def _check_virtual_clock() -> None:
    clock = trio.lowlevel.current_clock()
    if not isinstance(clock, trio.testing.MockClock) or math.isinf(clock.autojump_threshold):
        raise RuntimeError(
            "the time-travel harness needs Trio's virtual clock with autojump: request "
            "pytest-trio's `autojump_clock` fixture in the test, or run under "
            "trio.run(..., clock=trio.testing.MockClock(autojump_threshold=0))"
        )


@attrs.define(eq=False, kw_only=True)
class Harness:
    """Runs drivers, workers or a :class:`~trio_supervise.Service` in virtual time and records
    a :class:`History`. Open one with :func:`open_harness` (or the ``harness`` fixture).

    Drivers and workers run as children of :attr:`root` (a root supervisor named ``harness``,
    with the harness's jitter), so their restarts and states are recorded like a service's; a
    service run with :meth:`run_service` runs under its own supervisor, which :attr:`supervisor`
    then is. Every entry's time is virtual seconds since the harness opened.
    """

    queue: MemoryQueue
    """The queue every runner started here claims from; enqueue the scenario's items on it."""
    jitter_seed: int
    """The seed of :attr:`jitter`; a service run here gets it as its ``jitter_seed``."""
    history: History = attrs.field(factory=History)
    """What happened so far."""
    root: Supervisor = attrs.field(init=False)
    """The harness's own supervisor (named ``harness``): :meth:`run_drivers` and
    :meth:`run_workers` add their children to it."""

    _nursery: trio.Nursery = attrs.field(alias="nursery")
    _started_at: float = attrs.field(factory=trio.current_time, alias="started_at")
    _watchers: contextlib.ExitStack = attrs.field(init=False, factory=contextlib.ExitStack)
    _watched: set[tuple[int, str]] = attrs.field(init=False, factory=set)
    _roots: list[tuple[Supervisor, str]] = attrs.field(init=False, factory=list)
    _running: list[trio.Event] = attrs.field(init=False, factory=list)
    _services: list[Service] = attrs.field(init=False, factory=list)
    _changes: trio_util.AsyncValue[int] = attrs.field(
        init=False, factory=lambda: trio_util.AsyncValue(0)
    )

    def __attrs_post_init__(self) -> None:
        self.root = Supervisor(name="harness", jitter=self.jitter)

    @property
    def supervisor(self) -> Supervisor:
        """The supervisor of what this harness runs, to assert on (``healthy``, ``state``).

        After :meth:`run_service`, the service's own supervisor (its runner, HTTP server,
        workers and maintenance tasks are its children); otherwise :attr:`root`. With two
        services run here, which one is meant is ambiguous: read each one's
        ``service.supervisor`` instead (this raises ``RuntimeError`` saying so).
        """
        if not self._services:
            return self.root
        if len(self._services) > 1:
            names = ", ".join(repr(service.name) for service in self._services)
            raise RuntimeError(
                f"this harness runs {len(self._services)} services ({names}): "
                "read each one's service.supervisor"
            )
        supervisor = self._services[0].supervisor
        if supervisor is None:  # run_service returned before the service built it
            raise RuntimeError(f"service {self._services[0].name!r} never started")
        return supervisor

    # -- time ----------------------------------------------------------------------------------

    @property
    def jitter(self) -> Jitter:
        """The keyed jitter of every supervisor and runner started here (fixed seed)."""
        return Jitter(seed=self.jitter_seed)

    @property
    def now(self) -> float:
        """Virtual seconds since the harness opened."""
        return trio.current_time() - self._started_at

    def at(self, seconds: float) -> dt.datetime:
        """The queue-clock datetime *seconds* of virtual time after the harness opened."""
        return self.queue.clock.now() + dt.timedelta(seconds=seconds - self.now)

    async def advance(self, duration: float) -> float:
        """Let *duration* seconds of virtual time pass (everything runs meanwhile); return
        :attr:`now`."""
        if isinstance(duration, bool) or not isinstance(duration, int | float):
            raise TypeError(f"duration must be a number of seconds, got {duration!r}")
        if math.isnan(duration) or math.isinf(duration) or duration < 0:
            raise ValueError(f"duration must be a finite number >= 0, got {duration!r}")
        await trio.sleep_until(trio.current_time() + duration)
        self._rescan()
        return self.now

    async def wait_until(
        self,
        predicate: Callable[[], bool],
        *,
        timeout: float,  # noqa: ASYNC109 (the message carries the history's tail)
        poll: float | None = None,
    ) -> float:
        """Wait until ``predicate()`` is true; return :attr:`now` at that moment.

        The predicate is checked at once, after every new history entry, and every *poll*
        seconds if given (for conditions that no entry follows). Raises :class:`TimeoutError`,
        with the last entries in the message, if *timeout* seconds of virtual time pass first.
        """
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise TypeError(f"timeout must be a number of seconds, got {timeout!r}")
        if math.isnan(timeout) or timeout < 0:
            raise ValueError(f"timeout must be >= 0, got {timeout!r}")
        if poll is not None and not poll > 0:
            raise ValueError(f"poll must be positive, got {poll!r}")
        deadline = trio.current_time() + timeout
        while True:
            self._rescan()
            if predicate():
                return self.now
            now = trio.current_time()
            if now >= deadline:
                tail = "\n".join(str(entry) for entry in self.history.entries[-20:])
                raise TimeoutError(
                    f"condition {predicate!r} still false after {timeout:g} s of virtual time "
                    f"(now {self.now:.3f} s); last entries:\n{tail}"
                )
            wake = deadline if poll is None else min(deadline, now + poll)
            with trio.move_on_at(wake):
                await self._changes.wait_transition()

    def note(self, subject: str, detail: str = "") -> None:
        """Record a ``note`` entry: what the scenario itself did (``"sent"``, ``"fault"``)."""
        self._record("note", subject, detail)

    # -- running things ------------------------------------------------------------------------

    async def run_drivers(
        self,
        *drivers: AnyWorkflowDriver[Any],
        context: object = None,
        build_context: ContextFactory[Any] | None = None,
        settings: RunnerSettings | None = None,
        name: str = "runner",
        restart: RestartPolicy | None = None,
    ) -> WorkflowRunner[Any]:
        """Start a :class:`~trio_supervise.WorkflowRunner` over *drivers* on :attr:`queue`.

        It runs as the supervised child *name* (with *restart* as its policy) and records every
        :class:`~trio_supervise.RunnerEvent`. The drivers get *context* (or what *build_context*
        returns). *settings* default to :func:`harness_runner_settings`. Returns once the runner
        is claiming.
        """
        registry: DriverRegistry[Any] = DriverRegistry()
        for driver in drivers:
            registry.register(driver)
        if build_context is None:

            def build_context() -> object:
                return context

        settings = harness_runner_settings() if settings is None else settings
        runner: WorkflowRunner[Any] = WorkflowRunner(
            queue=self.queue,
            registry=registry,
            settings=settings,
            build_context=build_context,
            shutdown=self.root.shutdown,
            jitter=self.jitter,
            on_event=functools.partial(self._on_runner_event, name),
        )
        await self._add(
            ChildSpec(
                name,
                runner.run,
                start=True,
                restart=restart,
                shutdown_grace=settings.shutdown_grace + _SETTLE_MARGIN,
            )
        )
        return runner

    async def run_workers(self, *children: ChildSpec | Supervisor) -> Supervisor:
        """Add *children* to :attr:`root`, one after the other, each once it is ready (or has
        ended); return :attr:`root`."""
        for child in children:
            await self._add(child)
        return self.root

    async def run_service(self, service: Service, *, http: bool = False) -> Service:
        """Run a whole :class:`~trio_supervise.Service` on :attr:`queue`; return it once ready.

        The harness fills in what the service leaves open: :attr:`queue` when it has none, and
        settings when it has none (the defaults, with :func:`harness_runner_settings`' runner).
        Its ``jitter_seed`` becomes the harness's when unset, its HTTP server is off unless
        *http* (it would wait on real sockets), and it handles no signals. Its workers' states
        are recorded from when it is ready, and its runner's events (claims, outcomes, renewals)
        as they happen, beside any ``on_event`` hook the service already has.
        """
        settings = service.settings
        if settings is None:
            settings = Settings(runner=harness_runner_settings())
        if settings.jitter_seed is None:
            settings = attrs.evolve(settings, jitter_seed=self.jitter_seed)
        if not http and settings.http.enabled:
            settings = attrs.evolve(settings, http=attrs.evolve(settings.http, enabled=False))
        service.settings = settings
        if service.queue is None:
            service.queue = self.queue
        service.on_event = _chain(
            service.on_event, functools.partial(self._on_runner_event, "runner")
        )
        service.handle_signals = False
        done = trio.Event()
        self._running.append(done)
        self._services.append(service)
        await self._nursery.start(self._run_service, service, done)
        if service.supervisor is not None:
            self._roots.append((service.supervisor, ""))
        self._rescan()
        return service

    async def stop(self) -> None:
        """Begin graceful shutdown of everything started here and wait until it has ended.

        Called by :func:`open_harness` on the way out; a worker that failed terminally is
        recorded (an ``exited`` entry), not raised.
        """
        for service in self._services:
            service.stop("harness stopped")
        self.root.shutdown.begin("harness stopped")
        for done in self._running:
            await done.wait()
        self._rescan()

    # -- internals -----------------------------------------------------------------------------

    async def _add(self, child: ChildSpec | Supervisor) -> None:
        self.root.add_child(child)
        self._rescan()
        await self.root.watch(child.name).wait_value(
            lambda state: state is not WorkerState.STARTING
        )

    async def _run_root(self, *, task_status: trio.TaskStatus[None]) -> None:
        done = trio.Event()
        self._running.append(done)
        self._roots.append((self.root, ""))
        try:
            await self.root.run(task_status=task_status)
        except WorkerFailed as error:
            self._record("exited", self.root.name, f"failed: {error}")
        else:
            self._record("exited", self.root.name, "ok")
        finally:
            done.set()

    async def _run_service(
        self, service: Service, done: trio.Event, *, task_status: trio.TaskStatus[None]
    ) -> None:
        relay = _Relay(task_status)
        try:
            code = await service.run(task_status=relay)
            self._record("exited", service.name, f"exit code {code}")
        finally:
            done.set()
            if not relay.reported:
                task_status.started()

    def _on_runner_event(self, name: str, event: RunnerEvent) -> None:
        detail = event.detail
        if event.kind is RunnerEventKind.CLAIMED:
            detail = f"lease {event.lease_version}"
        subject = name if event.item_id is None else event.item_id
        self.history.record(
            Entry(
                at=event.at - self._started_at, kind=str(event.kind), subject=subject, detail=detail
            )
        )
        self._changes.value += 1

    def _record(self, kind: str, subject: str, detail: str = "") -> None:
        self.history.record(Entry(at=self.now, kind=kind, subject=subject, detail=detail))
        self._changes.value += 1

    def _rescan(self) -> None:
        """Start recording every worker of every watched supervisor not recorded yet."""
        for supervisor, prefix in list(self._roots):
            for status in supervisor.snapshot():
                key = (id(supervisor), status.worker)
                if key in self._watched:
                    continue
                self._watched.add(key)
                observer = _StateObserver(self, supervisor, status.worker, prefix + status.worker)
                self._watchers.enter_context(
                    supervisor.watch(status.worker).open_transform(observer)
                )

    def _on_state(
        self,
        supervisor: Supervisor,
        path: str,
        subject: str,
        old: WorkerState | None,
        new: WorkerState,
    ) -> None:
        status = next((s for s in supervisor.snapshot() if s.worker == path), None)
        if old is WorkerState.BACKING_OFF and new is WorkerState.STARTING and status is not None:
            self._record("restart", subject, f"restart {status.restarts}")
        detail = str(new)
        if (
            new in (WorkerState.BACKING_OFF, WorkerState.FAILED)
            and status is not None
            and status.last_error
        ):
            detail = f"{detail}: {status.last_error}"
        self._record("state", subject, detail)
        self._rescan()


@attrs.define(eq=False)
class _StateObserver:
    """Called synchronously by a worker's state ``AsyncValue`` on every change."""

    harness: Harness
    supervisor: Supervisor
    path: str
    subject: str
    last: WorkerState | None = None

    def __call__(self, state: WorkerState) -> None:
        try:
            self.harness._on_state(self.supervisor, self.path, self.subject, self.last, state)
        except Exception:
            logger.exception("recording the state of %r failed", self.subject)
        self.last = state


class _Relay(trio.TaskStatus[Service]):
    """Relays a service's readiness to a ``task_status`` that takes no value."""

    def __init__(self, inner: trio.TaskStatus[None]) -> None:
        self._inner = inner
        self.reported = False

    def started(self, value: Service | None = None) -> None:
        self.reported = True
        self._inner.started()


@contextlib.asynccontextmanager
async def open_harness(
    *,
    queue: MemoryQueue | None = None,
    jitter_seed: int = DEFAULT_JITTER_SEED,
    epoch: dt.datetime = DEFAULT_EPOCH,
) -> AsyncIterator[Harness]:
    """Open a :class:`Harness`; on the way out, shut down what it started, gracefully.

    Needs Trio's virtual clock with autojump (pytest-trio's ``autojump_clock``). Without a
    *queue*, a fresh :class:`~trio_supervise.MemoryQueue` whose clock reads *epoch* when the
    harness opens, so that two harnesses opened one after the other in one test see the same
    datetimes at the same virtual offsets.
    """
    _check_virtual_clock()
    if queue is None:
        opened = dt.timedelta(seconds=trio.current_time())
        queue = MemoryQueue(clock=TrioClock(epoch=epoch - opened))
    try:
        async with trio.open_nursery() as nursery:
            harness = Harness(queue=queue, jitter_seed=jitter_seed, nursery=nursery)
            with harness._watchers:
                await nursery.start(harness._run_root)
                yield harness
                await harness.stop()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise_specific(group)


def run_scenario(
    scenario: Callable[[Harness], Awaitable[object]],
    *,
    jitter_seed: int = DEFAULT_JITTER_SEED,
    epoch: dt.datetime = DEFAULT_EPOCH,
) -> History:
    """Run ``await scenario(harness)`` in a fresh Trio run under a fresh autojump clock, stop the
    harness, and return its history.

    Each call starts at virtual time 0, so two calls are comparable entry for entry: that is how
    a test checks that a scenario is deterministic (from a synchronous test; a Trio run cannot
    be nested in another)::

        def test_the_month_is_deterministic():
            first, second = run_scenario(month), run_scenario(month)
            assert first == second, first.diff(second)
    """

    async def main() -> History:
        async with open_harness(jitter_seed=jitter_seed, epoch=epoch) as harness:
            await scenario(harness)
        return harness.history

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def _chain(
    first: Callable[[RunnerEvent], None] | None, then: Callable[[RunnerEvent], None]
) -> Callable[[RunnerEvent], None]:
    """One event hook that calls *first* (when there is one), then *then*."""
    if first is None:
        return then

    def both(event: RunnerEvent) -> None:
        first(event)
        then(event)

    return both
