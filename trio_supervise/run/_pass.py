"""One due pass (the seed's ``run_due_pass``): a claim, then the runner's own executor and
completer over what it claimed, each item's lease renewed beside its evaluation, until every
outcome is written.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from .._lifecycle import Shutdown
from .._policy import Jitter
from ..job import WorkItem, describe_error, unbuilt_settlement
from ..queues._ports import BatchWrites, WorkerStore
from ._completer import BatchCompleter, SeedCompleter, _Accounts
from ._current import bind_store
from ._drivers import ContextFactory, ContextT, DriverRegistry, open_context, raise_specific
from ._executor import Executor, Pool
from ._flight import Control, Flights
from ._leases import Leases
from ._observation import Observer, RunnerMetrics, RunnerState, log_fields
from ._settings import PassStats, RunnerSettings
from ._tracing import tracer_for

__all__ = ["run_due_pass"]

logger = logging.getLogger("trio_supervise.workflow")


def _takes_settlements(store: object) -> bool:
    """Whether *store* renews and settles in batches (every backend of this package does); a
    store written to the seed's single-item protocol alone is renewed and written with it."""
    return isinstance(store, BatchWrites)


async def run_due_pass(
    queue: WorkerStore | Any,
    registry: DriverRegistry[ContextT],
    settings: RunnerSettings,
    build_context: ContextFactory[ContextT],
    *,
    jitter: Jitter | None = None,
) -> PassStats:
    """Claim due items once, evaluate them all concurrently, write back each outcome.

    Claims at most :attr:`RunnerSettings.claim_limit` items. The context is built once, and only
    when something was claimed (an async context manager is entered, and exited once every
    outcome is written); if building it raises, every claimed item is handed back with the error
    recorded (its attempt taken back, due after ``requeue_delay``; never dead for it) and the
    error propagates. Each item is evaluated in its own cancel scope, its lease renewed every
    :attr:`RunnerSettings.renew_interval` beside it; a failed renewal cancels the evaluation and
    counts as the error ``"lease renewal failed: ..."``.

    What each evaluation's end writes is the settlement rule's, as in the runner (see
    :doc:`/workflows`): a :class:`Continue` releases the item after ``requeue_delay`` (or its
    delay), a :class:`Reschedule` sets its next due time and config, a :class:`Stop` completes it;
    an error (an exception, no driver, a config that does not fit) is retried after
    ``requeue_delay`` (or the ``retry`` backoff), or dead at ``max_errors``; an item claimed more
    than ``max_attempts`` times is dead without evaluation; one claimed with ``cancel_requested``,
    or whose renewal reports it, is cancelled. Every outcome is one fenced settlement
    (``settle_many``); to a store written to the seed's protocol alone (no worker port) it is
    written with the seed's calls (``release``, ``reschedule``, ``complete``, ``mark_error``). A
    write that fails transiently is written again while the lease holds, the lease renewed
    meanwhile. Refused (stale) writes are logged and change nothing.
    """
    jitter = Jitter() if jitter is None else jitter
    claimed_at = trio.current_time()
    items: list[WorkItem] = await queue.claim_due(
        registry.spec_ids(), settings.worker_id, settings.lease, settings.claim_limit
    )
    if not items:
        return PassStats()
    batched = _takes_settlements(queue)
    metrics = RunnerMetrics(CollectorRegistry())
    observer = Observer(settings, metrics, queue.clock, logger) if batched else _observer(settings)
    control = Control(settings, Shutdown(), state=RunnerState.RUNNING)
    flights = Flights(metrics)
    accounts = _Accounts(control, flights, observer, jitter)
    completer: BatchCompleter | SeedCompleter = (
        BatchCompleter(queue, settings.settle_batch, accounts)
        if batched
        else SeedCompleter(queue, accounts)
    )
    async with contextlib.AsyncExitStack() as stack:
        try:
            context = await stack.enter_async_context(open_context(build_context))
        except Exception as error:
            await _release_unbuilt(completer, flights, items, describe_error(error), claimed_at)
            raise
        executor = Executor(registry, control, flights, observer, jitter, completer, context)
        executor.tracer = tracer_for(settings)
        leases = Leases(queue, control, flights, observer, seed=not batched, strict=True)
        try:
            async with trio.open_nursery() as services:
                services.start_soon(completer.run)
                services.start_soon(leases.renew_forever)
                await trio.lowlevel.checkpoint()  # the completer runs before anything is handed
                async with trio.open_nursery() as evaluations:
                    pool = Pool.open(evaluations)
                    bind_store(pool.context, queue, observer.metrics)
                    pool.spawn = lambda: executor.evaluate_forever(pool)
                    for item in items:
                        pool.put(flights.add(item, claimed_at))
                    flights.count.value = len(flights.entries)
                    pool.close()
                await flights.count.wait_value(0)
                services.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            raise_specific(group)
    return PassStats(claimed=len(items), failed=executor.failures)


def _observer(settings: RunnerSettings) -> Observer:
    """A seed store has no clock the pass may read: recent errors are stamped by the system's."""
    from .._clock import SystemClock

    return Observer(settings, RunnerMetrics(CollectorRegistry()), SystemClock(), logger)


async def _release_unbuilt(
    completer: BatchCompleter | SeedCompleter,
    flights: Flights,
    items: list[WorkItem],
    text: str,
    claimed_at: float,
) -> None:
    """The context failed to build: every claimed item is handed back with the error recorded
    (:func:`unbuilt_settlement`), by the pass's completer, before the error propagates."""
    settings = completer.accounts.control.settings
    try:
        if isinstance(completer, SeedCompleter):
            for item in items:  # one after the other, in claim order
                entry = flights.add(item, claimed_at)
                await completer.write(entry, unbuilt_settlement(item, text, settings))
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(completer.run)
            await trio.lowlevel.checkpoint()
            for item in items:
                completer.submit(
                    flights.add(item, claimed_at), unbuilt_settlement(item, text, settings)
                )
            flights.count.value = len(flights.entries)
            await flights.count.wait_value(0)
            nursery.cancel_scope.cancel()
    except Exception as error:
        reason = describe_error(error)
        logger.warning(
            "the context failed to build, and handing its %d items back failed too: %s; "
            "their leases will expire and another claim runs them",
            len(items),
            reason,
            extra=log_fields(settings.worker_id, error=reason),
        )
