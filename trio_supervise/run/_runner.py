"""The long-running workflow runner: a supervised child made of the run's parts.

The producer claims (:mod:`._producer`), the executor evaluates (:mod:`._executor`), the
completer writes outcomes (:mod:`._completer`), the leases part renews and watches the loop
(:mod:`._leases`), and everything reports to one observer (:mod:`._observation`); what an
evaluation's end writes is the settlement rule's (``job/_rule.py``). The runner joins them once
per :meth:`WorkflowRunner.run`, then drains on shutdown.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Generic

import attrs
import trio
from prometheus_client import CollectorRegistry

from .._errors import DriverError, QueueError
from .._lifecycle import Shutdown
from .._policy import Jitter
from ..job import RateLimit, StopReason, WorkItem
from ..queues._ports import (
    Capability,
    KeyRateLimitStore,
    RateLimitStore,
    WorkerStore,
    capabilities_of,
)
from ._completer import BatchCompleter, _Accounts
from ._current import bind_store
from ._drivers import ContextFactory, ContextT, DriverRegistry, open_context, raise_specific
from ._executor import Executor, Pool
from ._flight import Control, Flights
from ._leases import Leases
from ._observation import (
    DRAIN_REPORT_INTERVAL,
    Observer,
    RecentError,
    RunnerEvent,
    RunnerEventKind,
    RunnerMetrics,
    RunnerState,
    _DrainLog,
)
from ._producer import Producer
from ._settings import RunnerSettings
from ._tracing import tracer_for

__all__ = ["FORCED_RELEASE_BOUND", "WorkflowRunner"]

logger = logging.getLogger("trio_supervise.runner")

FORCED_RELEASE_BOUND = 2.0
"""Seconds :meth:`WorkflowRunner.release_in_flight` waits at most for leases to be handed back."""

_SHUTDOWN = StopReason.SHUTDOWN


@attrs.define(eq=False, kw_only=True)
class WorkflowRunner(Generic[ContextT]):
    """Claims due items and evaluates them with their drivers until shutdown; a supervised child.

    :param queue: where the items live (a :class:`~trio_supervise.queues.WorkerStore`).
    :param registry: the drivers; the runner claims the registry's spec ids.
    :param settings: leases, concurrency, retries and the rest.
    :param build_context: builds the drivers' context once per :meth:`run` (see
        :data:`~trio_supervise.ContextFactory`); an async context manager it returns is exited
        when :meth:`run` ends, however it ends.
    :param shutdown: when it begins, the runner stops claiming and drains (a private one if None;
        see :attr:`shutdown`).
    :param jitter: the keyed jitter for item retries and claim backoff (a fresh seed if None).
    :param metrics_registry: where the metrics go (a private registry if None).
    :param on_event: called with every :class:`RunnerEvent`; it must not block. An exception from
        it is logged and ignored: observing must not break execution.

    Claim errors: a failing ``claim_due`` is logged, kept in :attr:`recent_errors`, and retried
    after the ``claim_retry`` backoff while :attr:`state` is ``backing-off`` (in-flight items go
    on). Past ``claim_retry.max_restarts`` consecutive failures the runner drains like on shutdown
    and re-raises the queue's error, so its supervisor sees a failure and applies its own policy.
    """

    _queue: WorkerStore = attrs.field(alias="queue")
    _registry: DriverRegistry[ContextT] = attrs.field(alias="registry")
    _settings: RunnerSettings = attrs.field(alias="settings")
    _build_context: ContextFactory[ContextT] = attrs.field(alias="build_context")
    _shutdown: Shutdown = attrs.field(factory=Shutdown, alias="shutdown")
    _jitter: Jitter = attrs.field(factory=Jitter, alias="jitter")
    _metrics_registry: CollectorRegistry | None = attrs.field(
        default=None, alias="metrics_registry"
    )
    _on_event: Callable[[RunnerEvent], None] | None = attrs.field(default=None, alias="on_event")

    _control: Control = attrs.field(init=False)
    _flights: Flights = attrs.field(init=False)
    _observer: Observer = attrs.field(init=False)
    _running: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        registry = self._metrics_registry
        metrics = RunnerMetrics(CollectorRegistry() if registry is None else registry)
        self._control = Control(self._settings, self._shutdown)
        self._flights = Flights(metrics)
        self._observer = Observer(
            self._settings, metrics, self._queue.clock, logger, on_event=self._on_event
        )

    # -- what others read ----------------------------------------------------------------------

    @property
    def settings(self) -> RunnerSettings:
        return self._settings

    @property
    def shutdown(self) -> Shutdown:
        """Begin this to make :meth:`run` drain and return."""
        return self._shutdown

    @property
    def metrics(self) -> RunnerMetrics:
        return self._observer.metrics

    @property
    def state(self) -> RunnerState:
        return self._control.state

    @property
    def claim_failures(self) -> int:
        """Consecutive failed claims (0 once a claim succeeds)."""
        return self._control.claim_failures

    @property
    def in_flight(self) -> list[WorkItem]:
        """The items this runner holds a lease on right now, as claimed."""
        return [entry.item for entry in self._flights.entries.values()]

    @property
    def recent_errors(self) -> list[RecentError]:
        """The last ``settings.error_history`` errors, oldest first."""
        return list(self._observer.errors)

    # -- running -------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until shutdown begins, then drain and return; report readiness via *task_status*.

        Raises :class:`DriverError` before readiness if the registry is empty or a driver's specs
        are invalid, whatever ``build_context`` raises, and the queue's error after too many
        consecutive failed claims. It may be called again after it returns (a restart).
        """
        if self._running:
            raise RuntimeError("this runner is running already")
        self._running = True
        control, observer, flights = self._control, self._observer, self._flights
        # The running clock's own current_time: the same value as trio.current_time without two
        # more frames and its KeyboardInterrupt protection (an evaluation reads the time once or
        # twice; issue 17's P4, under MockClock).
        control.time = trio.lowlevel.current_clock().current_time
        control.state = RunnerState.IDLE
        control.claim_failures = 0
        failed = False
        try:
            if self._registry.is_empty():
                raise DriverError("the registry has no drivers: nothing to run")
            self._registry.validate_all()
            if self._settings.rate_limits:
                await set_rate_limits(self._queue, self._settings.rate_limits)
            if self._settings.key_rate_limits:
                await set_key_rate_limits(self._queue, self._settings.key_rate_limits)
            tracer = tracer_for(self._settings)
            async with open_context(self._build_context) as context:
                fatal: Exception | None = None
                try:
                    fatal = await self._run_parts(context, tracer, task_status)
                except BaseExceptionGroup as group:
                    raise_specific(group)
                if fatal is not None:
                    raise fatal
        except Exception:
            failed = True
            raise
        finally:
            observer.metrics.flush()
            # Cancelled from outside before some outcomes were written: those leases expire.
            flights.clear()
            observer.draining = False
            control.state = RunnerState.FAILED if failed else RunnerState.STOPPED
            self._running = False
            control.time = trio.current_time  # not this run's clock once it returns
            observer.emit(RunnerEventKind.STOPPED, detail=str(control.state))

    async def _run_parts(
        self, context: ContextT, tracer: Any | None, task_status: trio.TaskStatus[None]
    ) -> Exception | None:
        """Join the parts for one run: leases, the watchdog and the completer as services, the
        evaluators in a nursery of their own, the producer's claim loops until shutdown (or a
        fatal claim error, returned), then the drain."""
        control, observer, flights = self._control, self._observer, self._flights
        accounts = _Accounts(control, flights, observer, self._jitter)
        completer = BatchCompleter(self._queue, self._settings.settle_batch, accounts)
        leases = Leases(self._queue, control, flights, observer)
        async with trio.open_nursery() as services:
            async with trio.open_nursery() as evaluations:
                pool = Pool.open(evaluations)
                bind_store(pool.context, self._queue, observer.metrics)
                executor = Executor(
                    self._registry, control, flights, observer, self._jitter, completer, context
                )
                executor.tracer = tracer
                pool.spawn = lambda: executor.evaluate_forever(pool)
                producer = Producer(
                    self._queue, self._registry, control, flights, observer, self._jitter, pool.put
                )
                services.start_soon(producer.watch_shutdown)
                services.start_soon(leases.renew_forever)
                services.start_soon(leases.watch_loop_lag)
                services.start_soon(completer.run)
                completer.write = producer.combined_writes()
                control.state = RunnerState.RUNNING
                observer.start()
                observer.emit(RunnerEventKind.STARTED)
                task_status.started()
                fatal = await producer.claim_loops()
                # Nothing more is claimed: the evaluators end once none is waiting.
                pool.close()
                await self._drain()
            # Every evaluation has ended; the outcomes handed over are written (or fail) before
            # the completer stops.
            await flights.count.wait_value(0)
            observer.log(logging.INFO, "%s", observer.drain.summary(trio.current_time()))
            services.cancel_scope.cancel()
        return fatal

    async def _drain(self) -> None:
        control, observer, flights = self._control, self._observer, self._flights
        control.state = RunnerState.DRAINING
        observer.draining = True
        observer.emit(RunnerEventKind.DRAINING, detail=f"{len(flights.entries)} in flight")
        grace = self._settings.shutdown_grace
        observer.drain = _DrainLog(started=trio.current_time())
        observer.log(
            logging.INFO,
            "draining: %d in flight; they get %g s to finish, then their leases are handed back",
            len(flights.entries),
            grace,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._report_drain, trio.current_time() + grace)
            with trio.move_on_after(grace):
                await flights.count.wait_value(0)
            nursery.cancel_scope.cancel()
        for entry in list(flights.entries.values()):
            entry.stop(_SHUTDOWN, "shutdown grace elapsed")

    async def _report_drain(self, deadline: float) -> None:
        """Every ``DRAIN_REPORT_INTERVAL``: how many are in flight, and the longest running."""
        while True:
            await trio.sleep(DRAIN_REPORT_INTERVAL)
            entries = [e for e in self._flights.entries.values() if not e.settling]
            if not entries:
                continue
            now = trio.current_time()
            longest = min(entries, key=lambda e: e.claimed_at)
            self._observer.log(
                logging.INFO,
                "draining: %d in flight (longest: item %r, %.0f s); the rest are handed back "
                "in %.0f s",
                len(entries),
                longest.item.id,
                now - longest.claimed_at,
                max(0.0, deadline - now),
                item=longest.item,
            )

    async def release_in_flight(self, bound: float = FORCED_RELEASE_BOUND) -> int:
        """Cancel every evaluation now and hand its lease back, waiting at most *bound* seconds.

        Best effort, for a service told to stop at once (a second signal): an evaluation that
        does not end when cancelled, or a write that fails, keeps its lease until it expires.
        Returns how many leases are still held after the wait.
        """
        flights, observer = self._flights, self._observer
        entries = list(flights.entries.values())
        if not entries:
            return 0
        observer.log(
            logging.WARNING,
            "stopping now: cancelling %d evaluations and handing their leases back "
            "(waiting at most %g s)",
            len(entries),
            bound,
        )
        for entry in entries:
            entry.stop(_SHUTDOWN, "stopping now")
        with trio.move_on_after(bound):
            await flights.count.wait_value(0)
        held = [entry.item.id for entry in flights.entries.values()]
        if held:
            observer.log(
                logging.WARNING,
                "stopping now: %d leases still held (%s); they expire within %g s and another "
                "worker runs those items",
                len(held),
                ", ".join(repr(item_id) for item_id in held[:10]),
                self._settings.lease,
            )
        return len(held)


async def set_rate_limits(queue: Any, limits: Mapping[str, RateLimit]) -> None:
    """Set ``RunnerSettings.rate_limits`` on the store (which must keep them)."""
    if Capability.RATE_LIMITS not in capabilities_of(queue) or not isinstance(
        queue, RateLimitStore
    ):
        raise QueueError(
            f"runner.rate_limits needs a store that keeps rate limits; {type(queue).__name__} "
            "does not declare Capability.RATE_LIMITS"
        )
    for name, rate in limits.items():
        await queue.set_rate_limit(name, rate)


async def set_key_rate_limits(queue: Any, limits: Mapping[str, RateLimit]) -> None:
    """Set ``RunnerSettings.key_rate_limits`` on the store (which must keep them)."""
    if Capability.KEY_RATE_LIMITS not in capabilities_of(queue) or not isinstance(
        queue, KeyRateLimitStore
    ):
        raise QueueError(
            f"runner.key_rate_limits needs a store that keeps key rate limits; "
            f"{type(queue).__name__} does not declare Capability.KEY_RATE_LIMITS"
        )
    for key, rate in limits.items():
        await queue.set_key_rate_limit(key, rate)
