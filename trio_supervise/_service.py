"""A :class:`Service`: drivers, workers, a queue and settings, run under one supervisor.

Data flows one way: settings → service → supervisor → workers (the runner is one, the HTTP
server another) → queue. Kubernetes or systemd stays the outer supervisor: this one's job is to
never look healthy with a dead worker inside, and to drain cleanly when told to stop.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, NoReturn

import attrs
import trio
from prometheus_client import CollectorRegistry

from ._audit import AuditTrail, MemoryAuditTrail
from ._errors import StartFailed, WorkerFailed
from ._lifecycle import Shutdown
from ._logging import configure_logging
from ._policy import Jitter
from ._settings import Settings, load_settings
from .console import ErrorRecord, OperationsApp, bind_http, serve_http
from .maintenance import (
    MaintenanceTask,
    PruneMetrics,
    Pruner,
    Schedule,
    Scheduler,
    check_schedules,
    declared_queue,
    maintenance_children,
    resolve_schedules,
)
from .queues import WorkQueue
from .queues._factory import open_queue, parse_queue_url
from .queues._ports import audit_trail_of
from .run import (
    AnyWorkflowDriver,
    ContextFactory,
    DriverRegistry,
    RunnerEvent,
    RunnerState,
    WorkflowRunner,
)
from .run._runner import FORCED_RELEASE_BOUND
from .supervision import (
    AutoShutdown,
    ChildSpec,
    ShutdownOrder,
    Supervisor,
    WorkerState,
    WorkerStatus,
    to_auto_shutdown,
    to_shutdown_order,
)

__all__ = ["EXIT_FAILED", "EXIT_OK", "Service", "ServiceHandle", "run_service"]

logger = logging.getLogger("trio_supervise.service")

EXIT_OK = 0
"""Shutdown was requested (a signal, or :meth:`Service.stop`) and everything drained."""
EXIT_FAILED = 1
"""A worker failed terminally."""

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_SETTLE_MARGIN = 5.0
"""Seconds the runner gets beyond its own drain grace to write its last outcomes."""


async def _no_context() -> None:
    return None


def _drivers(value: Iterable[AnyWorkflowDriver[Any]]) -> tuple[AnyWorkflowDriver[Any], ...]:
    return tuple(value)


def _workers(value: Iterable[ChildSpec | Supervisor]) -> tuple[ChildSpec | Supervisor, ...]:
    return tuple(value)


def _schedule_tuple(value: Iterable[Schedule]) -> tuple[Schedule, ...]:
    return tuple(value)


def _task_tuple(value: Iterable[MaintenanceTask]) -> tuple[MaintenanceTask, ...]:
    return tuple(value)


def _open_queue(url: str, settings: Settings) -> contextlib.AbstractAsyncContextManager[WorkQueue]:
    """The queue *url* names (:func:`open_queue`); a PostgreSQL one with the connections
    ``settings.postgres`` asks for."""
    if parse_queue_url(url)[0] != "postgres":
        return open_queue(url)

    @contextlib.asynccontextmanager
    async def postgres() -> AsyncIterator[WorkQueue]:
        from .queues import PostgresQueue

        async with await PostgresQueue.connect(url, **attrs.asdict(settings.postgres)) as queue:
            yield queue

    return postgres()


@attrs.frozen(kw_only=True)
class ServiceHandle:
    """What a service's own worker can reach of the service it runs in.

    A :class:`ChildSpec` among :attr:`Service.workers` whose target takes a keyword parameter
    named ``service`` is called with ``service=`` one of these: its worker can then enqueue into
    the service's open queue (the one ``trio-supervise run`` opened from the settings) and
    watch or begin the service's shutdown, without building either itself.
    """

    name: str
    """The service's name."""
    queue: WorkQueue
    """The service's open queue (closed when the service stops)."""
    shutdown: Shutdown
    """The service's shutdown: ``await handle.shutdown.wait()`` to drain with it,
    ``handle.shutdown.begin(reason)`` to stop the whole service (what SIGTERM does)."""
    settings: Settings
    """The service's effective settings (an application's own settings class included)."""


def _takes_service(target: Callable[..., Any]) -> bool:
    """Whether *target* takes a keyword parameter named ``service``."""
    try:
        parameter = inspect.signature(target).parameters.get("service")
    except (TypeError, ValueError):  # no signature to read: call it as before
        return False
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return parameter is not None and parameter.kind in keyword


def _with_handle(worker: ChildSpec | Supervisor, handle: ServiceHandle) -> ChildSpec | Supervisor:
    if isinstance(worker, ChildSpec) and _takes_service(worker.target):
        return attrs.evolve(worker, target=functools.partial(worker.target, service=handle))
    return worker


@attrs.define(eq=False, kw_only=True)
class Service:
    """Turns drivers, workers and a queue into one running, observable service.

    :param drivers: workflow drivers; with any, a :class:`WorkflowRunner` child claims their specs.
    :param workers: extra long-lived children (:class:`ChildSpec` or nested :class:`Supervisor`).
        A child whose target takes a keyword parameter ``service`` is called with
        ``service=`` a :class:`ServiceHandle`: the service's open queue, shutdown and settings.
    :param settings: everything read from the environment; loaded with :func:`load_settings`
        when ``None``.
    :param queue_url: overrides ``settings.database_url``.
    :param queue: an already open queue to use instead of opening one (tests, embedding).
    :param build_context: builds the drivers' context once per runner start: a function
        returning it, an ``async def``, or one returning an async context manager (entered at
        the runner's start, exited when it stops, so a client or pool is closed).
    :param name: the top-level supervisor's name and the status page title.
    :param handle_signals: SIGTERM/SIGINT begin graceful shutdown; a second one cancels every
        evaluation, hands the in-flight leases back (waiting at most ``FORCED_RELEASE_BOUND``,
        2 s) and stops at once, exit code 128 + the signal. Only possible in the main thread;
        off elsewhere.
    :param on_event: passed to the :class:`WorkflowRunner`: called with every
        :class:`RunnerEvent` (claims, outcomes, settlements); it must not block.
    :param shutdown_order: how the top-level supervisor stops its children (see
        :class:`ShutdownOrder`). Children start as: the HTTP server, the runner, then *workers*;
        by default they stop in reverse, so the HTTP server answers through the whole drain.
    :param auto_shutdown: see :class:`AutoShutdown`: with a *significant* worker among *workers*,
        its normal end drains and stops the service with exit code 0.
    :param schedules: periodic :class:`Schedule` s, enqueued by a :class:`Scheduler` child
        (``maintenance-schedules``). Checked here: with drivers, each schedule's spec must be one
        of theirs (a service without drivers may enqueue for another's runner). A schedule's
        ``queue`` and ``priority`` left None become what its spec's driver declares.
    :param maintenance: more :class:`MaintenanceTask` s, each run as the supervised child
        ``maintenance-<name>`` on the service's queue, started last (so stopped first).
    :param audit: where the console records the actions taken from it (an
        :class:`AuditTrail`). None: the queue's own trail when it keeps one
        (``Capability.AUDIT_TRAIL``: every backend here, in the database on SQLite and
        PostgreSQL), else a :class:`MemoryAuditTrail` (this process only).

    With ``settings.retention.enabled`` (off by default), a service with drivers also runs a
    :class:`Pruner` (child ``maintenance-retention``) that deletes old finished items per
    ``settings.retention`` (completed and cancelled items kept 7 days, dead ones 30, unless
    set otherwise); a task named ``"retention"`` among *maintenance* takes its place.
    """

    drivers: Sequence[AnyWorkflowDriver[Any]] = attrs.field(default=(), converter=_drivers)
    workers: Sequence[ChildSpec | Supervisor] = attrs.field(default=(), converter=_workers)
    settings: Settings | None = None
    queue_url: str | None = None
    queue: WorkQueue | None = None
    build_context: ContextFactory[Any] = _no_context
    name: str = "trio_supervise"
    handle_signals: bool = True
    on_event: Callable[[RunnerEvent], None] | None = None
    shutdown_order: ShutdownOrder = attrs.field(
        default=ShutdownOrder.REVERSE, converter=to_shutdown_order
    )
    auto_shutdown: AutoShutdown = attrs.field(
        default=AutoShutdown.NEVER, converter=to_auto_shutdown
    )
    schedules: Sequence[Schedule] = attrs.field(default=(), converter=_schedule_tuple)
    maintenance: Sequence[MaintenanceTask] = attrs.field(default=(), converter=_task_tuple)
    audit: AuditTrail | None = None

    shutdown: Shutdown = attrs.field(init=False, factory=Shutdown)
    """Begin it to drain and stop the service (what SIGTERM does)."""
    registry: CollectorRegistry = attrs.field(init=False, factory=CollectorRegistry)
    """Every metric the service exports on ``/metrics``."""
    supervisor: Supervisor | None = attrs.field(init=False, default=None)
    runner: WorkflowRunner[Any] | None = attrs.field(init=False, default=None)
    http_port: int | None = attrs.field(init=False, default=None)
    """The bound HTTP port once the server is up (useful with port 0)."""
    _http_sockets: Any = attrs.field(init=False, default=None, repr=False)
    _forced_by: int | None = attrs.field(init=False, default=None)
    _prune_metrics: PruneMetrics | None = attrs.field(init=False, default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        specs = [spec for driver in self.drivers for spec in driver.spec_ids]
        check_schedules(self.schedules, specs if self.drivers else None)
        self.schedules = resolve_schedules(self.schedules, self.drivers)

    def unserved_queues(self, settings: Settings) -> list[str]:
        """One warning per driver or schedule whose items land in a queue that the service's
        runner (per *settings*) does not serve: nothing here would ever claim them. Empty for a
        service without drivers (it runs no runner; another service's may serve them)."""
        if not self.drivers:
            return []
        served = settings.runner.queue_limits
        listed = ", ".join(sorted(served))
        found = [
            f"driver {driver.name!r} declares queue {declared_queue(driver)!r}, which the "
            f"runner does not serve (runner.queues: {listed}): its items would wait for ever"
            for driver in self.drivers
            if declared_queue(driver) not in served
        ]
        found.extend(
            f"schedule {schedule.name!r} enqueues into queue {schedule.item_queue!r}, which the "
            f"runner does not serve (runner.queues: {listed}): its items would wait for ever"
            for schedule in resolve_schedules(self.schedules, self.drivers)
            if schedule.item_queue not in served
        )
        return found

    # -- what the HTTP surface reads (StatusSource) --------------------------------------------

    @property
    def healthy(self) -> bool:
        """True while the supervisor runs and no worker failed terminally."""
        return self.supervisor is not None and not self.supervisor.failed

    def workers_status(self) -> list[WorkerStatus]:
        """The supervisor's snapshot; the runner's row says ``backing-off`` while its claims fail.

        A runner whose queue is unreachable keeps running (and retries), so its supervisor sees
        nothing wrong; this row is where ``/healthz`` and the status page show the outage.
        """
        if self.supervisor is None:
            return []
        rows = self.supervisor.snapshot()
        runner = self.runner
        if runner is None or runner.state is not RunnerState.BACKING_OFF:
            return rows
        errors = runner.recent_errors
        last = errors[-1].error if errors else None
        return [
            attrs.evolve(row, state=WorkerState.BACKING_OFF, last_error=last or row.last_error)
            if row.worker == "runner" and row.state is WorkerState.RUNNING
            else row
            for row in rows
        ]

    def recent_errors(self) -> list[ErrorRecord]:
        records: list[ErrorRecord] = []
        if self.runner is not None:
            for error in reversed(self.runner.recent_errors):
                where = "runner" if error.item_id is None else f"{error.spec_id}/{error.item_id}"
                records.append(ErrorRecord(at=error.at, source=where, message=error.error))
        return records

    def stop(self, reason: str = "requested") -> None:
        """Begin graceful shutdown."""
        self.shutdown.begin(reason)

    def main(self) -> NoReturn:
        """Run the service as the process: ``if __name__ == "__main__": service.main()``."""
        sys.exit(run_service(self))

    # -- running -------------------------------------------------------------------------------

    def _effective_settings(self) -> Settings:
        return self.settings if self.settings is not None else load_settings()

    async def run(self, *, task_status: trio.TaskStatus[Service] = trio.TASK_STATUS_IGNORED) -> int:
        """Run until shutdown; return the process exit code.

        ``0`` after a requested shutdown drained (or a significant worker ended, see
        *auto_shutdown*); ``1`` (:data:`EXIT_FAILED`) when a worker failed terminally;
        ``128 + signal`` when a second signal cut the drain short. Reports itself through
        *task_status* once every child is running (and the HTTP port is bound); when a child
        fails terminally before that, ``nursery.start(service.run)`` raises
        :class:`StartFailed` naming it (a plain ``await service.run()`` returns ``1``).
        Settings and queue errors (:class:`SettingsError`, :class:`QueueError`, ``ValueError``)
        are raised before anything starts.
        """
        settings = self._effective_settings()
        url = self.queue_url or settings.database_url
        async with contextlib.AsyncExitStack() as stack:
            queue = self.queue
            if queue is None:
                queue = await stack.enter_async_context(_open_queue(url, settings))
            if settings.http.enabled:  # an address in use is a settings error: raised up front
                sockets = bind_http(settings.http.host, settings.http.port)
                stack.callback(_close_unused, sockets, self)
                self._http_sockets = sockets
            supervisor = self._build(settings, queue)
            return await self._supervise(supervisor, task_status)
        raise AssertionError("unreachable")  # pragma: no cover

    def _build(self, settings: Settings, queue: WorkQueue) -> Supervisor:
        jitter = Jitter() if settings.jitter_seed is None else Jitter(seed=settings.jitter_seed)
        children: list[ChildSpec | Supervisor] = []
        unserved = self.unserved_queues(settings)
        for warning in unserved:
            logger.warning("service %r: %s", self.name, warning)
        if settings.http.enabled:
            # Started first, so it is stopped last (reverse start order): /healthz and /metrics
            # keep answering, with the workers' states, for the whole drain.
            audit = self.audit
            if audit is None:
                audit = audit_trail_of(queue) or MemoryAuditTrail()
            app = OperationsApp(
                _StatusView(self),
                self.registry,
                queue=queue,
                title=self.name,
                refresh=settings.http.refresh,
                owned_specs=(
                    frozenset(spec for driver in self.drivers for spec in driver.spec_ids)
                    if self.drivers
                    else None
                ),
                schedules=resolve_schedules(self.schedules, self.drivers),
                queue_limits=settings.runner.queue_limits if self.drivers else None,
                warnings=unserved,
                token=settings.http.token,
                password_hash=settings.http.password_hash,
                read_only=settings.http.read_only,
                audit=audit,
            )
            children.append(
                ChildSpec(
                    "http",
                    functools.partial(self._serve_http, app, settings),
                    start=True,
                    stop_signal=True,
                    shutdown_grace=settings.http.graceful_timeout + 1.0,
                )
            )
        if self.drivers:
            registry: DriverRegistry[Any] = DriverRegistry()
            for driver in self.drivers:
                registry.register(driver)
            self.runner = WorkflowRunner(
                queue=queue,
                registry=registry,
                settings=settings.runner,
                build_context=self.build_context,
                shutdown=self.shutdown,
                jitter=jitter,
                metrics_registry=self.registry,
                on_event=self.on_event,
            )
            children.append(
                ChildSpec(
                    "runner",
                    self.runner.run,
                    start=True,
                    shutdown_grace=settings.runner.shutdown_grace + _SETTLE_MARGIN,
                )
            )
        handle = ServiceHandle(
            name=self.name, queue=queue, shutdown=self.shutdown, settings=settings
        )
        children.extend(_with_handle(worker, handle) for worker in self.workers)
        children.extend(maintenance_children(self._maintenance_tasks(settings), queue))
        self.supervisor = Supervisor(
            name=self.name,
            children=children,
            shutdown=self.shutdown,
            jitter=jitter,
            registry=self.registry,
            shutdown_order=self.shutdown_order,
            auto_shutdown=self.auto_shutdown,
        )
        return self.supervisor

    def _maintenance_tasks(self, settings: Settings) -> list[MaintenanceTask]:
        schedules = resolve_schedules(self.schedules, self.drivers)
        tasks: list[MaintenanceTask] = [Scheduler(schedules)] if schedules else []
        own = {task.name for task in self.maintenance}
        if self.drivers and settings.retention.enabled and "retention" not in own:
            if self._prune_metrics is None:  # once per service: a registry takes a name once
                self._prune_metrics = PruneMetrics(self.registry)
            tasks.append(
                Pruner(
                    settings=settings.retention,
                    schedules=self.schedules,
                    metrics=self._prune_metrics,
                )
            )
        return tasks + list(self.maintenance)

    async def _serve_http(
        self,
        app: OperationsApp,
        settings: Settings,
        *,
        stop: Shutdown,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """The HTTP server, until the supervisor stops it (its turn, last in the drain)."""
        sockets, self._http_sockets = self._http_sockets, None  # bound by run(), used once
        async with trio.open_nursery() as nursery:
            self.http_port = await nursery.start(
                functools.partial(
                    serve_http,
                    app,
                    settings.http.host,
                    settings.http.port,
                    shutdown=stop,
                    graceful_timeout=settings.http.graceful_timeout,
                    sockets=sockets,
                )
            )
            task_status.started()

    async def _supervise(
        self, supervisor: Supervisor, task_status: trio.TaskStatus[Service]
    ) -> int:
        signals = self.handle_signals and threading.current_thread() is threading.main_thread()
        failed = reported = False
        start_failure: StartFailed | None = None
        try:
            async with trio.open_nursery() as nursery:
                if signals:
                    await nursery.start(self._watch_signals, nursery.cancel_scope)
                await nursery.start(self._run_supervisor, supervisor, nursery.cancel_scope)
                logger.info("service %r running", self.name)
                task_status.started(self)
                reported = True
        except* WorkerFailed as group:
            for error in group.exceptions:
                logger.error("service %r stopping: %s", self.name, error)
                if isinstance(error, StartFailed) and not reported:
                    start_failure = error
            failed = True
        if start_failure is not None and task_status is not trio.TASK_STATUS_IGNORED:
            # Someone waits for readiness (nursery.start): it never came, and they hear why.
            raise start_failure
        if failed:
            return EXIT_FAILED
        if self._forced_by is not None:
            logger.warning("service %r cancelled by a second signal", self.name)
            return 128 + self._forced_by
        logger.info("service %r stopped (%s)", self.name, self.shutdown.reason)
        return EXIT_OK

    @staticmethod
    async def _run_supervisor(
        supervisor: Supervisor,
        scope: trio.CancelScope,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            await supervisor.run(task_status=task_status)
        finally:
            scope.cancel()  # the signal watcher has nothing left to watch

    async def _watch_signals(
        self,
        scope: trio.CancelScope,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with trio.open_signal_receiver(*_SIGNALS) as received:
            task_status.started()
            async for signum in received:
                name = signal.Signals(signum).name
                if not self.shutdown.requested:
                    logger.warning("%s received: draining (send it again to stop at once)", name)
                    self.shutdown.begin(name)
                    continue
                runner = self.runner
                held = 0 if runner is None else len(runner.in_flight)
                logger.warning(
                    "%s received again: stopping now, handing %d in-flight leases back first "
                    "(at most %g s)",
                    name,
                    held,
                    FORCED_RELEASE_BOUND,
                )
                self._forced_by = signum
                if runner is not None and held:
                    await runner.release_in_flight(FORCED_RELEASE_BOUND)
                scope.cancel()
                return


def _close_unused(sockets: Any, service: Service) -> None:
    """Close the HTTP sockets ``run()`` bound if the server never took them."""
    if service._http_sockets is sockets:
        service._http_sockets = None
        for sock in sockets.insecure_sockets:
            sock.close()


@attrs.frozen
class _StatusView:
    """The service as the HTTP surface's :class:`StatusSource`."""

    service: Service

    @property
    def healthy(self) -> bool:
        return self.service.healthy

    def workers(self) -> Sequence[WorkerStatus]:
        return self.service.workers_status()

    def recent_errors(self) -> Sequence[ErrorRecord]:
        return self.service.recent_errors()


def run_service(service: Service) -> int:
    """Run *service* in a new Trio run and return the exit code (the CLI's ``run``).

    Loads the settings first when the service has none, so that a settings error is raised
    before anything starts, and configures logging from them (``log_level`` on the library's
    loggers, and a ``log.format`` handler on stderr unless the application has its own; see
    :func:`~trio_supervise.configure_logging`).
    """
    if service.settings is None:
        service.settings = load_settings()
    configure_logging(service.settings.log_level, service.settings.log.format)
    return trio.run(service.run)
