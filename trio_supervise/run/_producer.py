"""The producer: claim loops that keep each served queue's slots busy, and the waits between.

One claim loop per served queue, each under its own concurrency: it claims as slots free up
(``claim_batch`` at most per claim), hands each claimed item to the executor's pool, and when
the queue has nothing due waits with ``with trio.move_on_after(poll_interval): await
store.wait_for_work(...)`` (without the bound when the store declares ``EXACT_WAKEUPS``). A
failing claim is retried after the ``claim_retry`` backoff; past its bound the loops end with
the error. With a store that declares ``SERIAL_WRITES`` and ``SETTLE_AND_CLAIM`` each batch of
outcomes is written together with the claim of the slots it frees
(:meth:`Producer.write_and_claim`; serving several queues, for the queue with the most free
slots).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import attrs
import trio
import trio_util

from .._errors import QueueFailed
from .._policy import Jitter
from ..job import DEFAULT_QUEUE, Settlement, StopReason, WorkItem, describe_error
from ..queues._ports import Capability, WorkerStore, capabilities_of
from ._drivers import DriverRegistry
from ._flight import Control, Flights
from ._observation import Observer, RunnerEventKind, RunnerState

__all__ = ["Producer"]

_Start = Callable[[Any], None]
"""Puts a claimed item's in-flight entry into the executor's pool."""


@attrs.define(eq=False)
class Producer:
    """Claims for the runner: one loop per served queue (see the module doc)."""

    store: WorkerStore
    registry: DriverRegistry[Any]
    control: Control
    flights: Flights
    observer: Observer
    jitter: Jitter
    start: _Start
    """Hands an in-flight entry to the executor (its pool's ``put``)."""
    _wait_scopes: set[trio.CancelScope] = attrs.field(init=False, factory=set)
    """The waits shutdown must cut short: one per claim loop (one per served queue)."""
    _claims_open: bool = attrs.field(init=False, default=False)
    """While the claim loops run: the completer may claim beside its writes."""
    _claiming: trio_util.AsyncValue[int] = attrs.field(
        init=False, factory=lambda: trio_util.AsyncValue(0)
    )
    """Settle-and-claim calls in flight: the claim loops end once none is (their items go to
    the evaluators' pool, which closes after the loops)."""
    _poll: float = attrs.field(init=False, default=math.inf)
    """How long a wait for work lasts at most: the poll interval, or for ever with a store
    whose wake-ups are exact (read from its capabilities as the loops start)."""

    async def claim_loops(self) -> Exception | None:
        """One claim loop per served queue, each under its own limit, until shutdown; the first
        fatal error ends them all and is returned. Once they end, no settle-and-claim call is
        made, and the one in flight (if any) has started its items."""
        exact = Capability.EXACT_WAKEUPS in capabilities_of(self.store)
        self._poll = math.inf if exact else self.control.settings.poll_interval
        self._claims_open = True
        try:
            return await self._run_claim_loops()
        finally:
            self._claims_open = False
            await self._claiming.wait_value(0)

    async def _run_claim_loops(self) -> Exception | None:
        limits = self.control.settings.queue_limits
        self.flights.serve(limits)
        if len(limits) == 1:
            [(name, limit)] = limits.items()
            return await self._claim_loop(name, limit)
        fatal: list[Exception] = []

        async def one(name: str, limit: int, scope: trio.CancelScope) -> None:
            error = await self._claim_loop(name, limit)
            if error is not None:
                fatal.append(error)
                scope.cancel()

        async with trio.open_nursery() as loops:
            for name, limit in limits.items():
                loops.start_soon(one, name, limit, loops.cancel_scope)
        return fatal[0] if fatal else None

    async def _claim_loop(self, queue: str, concurrency: int) -> Exception | None:
        control = self.control
        settings = control.settings
        shutdown = control.shutdown
        busy = self.flights.busy[queue]
        # A queue other than the default is named; the default keeps the seed's call, so a
        # store written before named queues still serves it.
        named = {} if queue == DEFAULT_QUEUE else {"queue": queue}
        queues = [queue]
        while not shutdown.requested:
            free = concurrency - busy.value
            if free <= 0:
                with self.until_shutdown():
                    await busy.wait_value(lambda n: n < concurrency)
                continue
            spec_ids = self.registry.spec_ids()
            limit = min(settings.claim_batch, free)
            started = trio.current_time()
            # The slots are reserved while the claim runs, so a claim beside a write (see
            # write_and_claim) never takes them too.
            busy.value += limit
            try:
                items = await self.store.claim_due(
                    spec_ids, settings.worker_id, settings.lease, limit, **named
                )
            except Exception as error:
                busy.value -= limit
                fatal = await self._claim_failed(error)
                if fatal is not None:
                    return fatal
                continue
            if control.claim_failures:
                control.claim_failures = 0
            control.queue_answered()
            self._start_all(items, started)
            busy.value -= limit - len(items)
            if len(items) < limit:
                await self._wait_for_work(spec_ids, queues)
        return None

    async def _claim_failed(self, error: Exception) -> Exception | None:
        """Account for a failed claim; the error when the loops must end (permanent, or past
        ``claim_retry``'s bound), else None once its backoff has passed."""
        control, observer = self.control, self.observer
        settings = control.settings
        control.claim_failures += 1
        text = f"claim failed: {describe_error(error)}"
        observer.record_error(None, None, text)
        observer.emit(RunnerEventKind.CLAIM_FAILED, detail=text)
        if isinstance(error, QueueFailed):
            # Permanent (read-only, gone, no permission): no backoff fixes it.
            observer.log(
                logging.ERROR,
                "%s; giving up at once (no retry can fix this): the runner stops",
                text,
                error=text,
            )
            return error
        if control.claim_failures > settings.claim_retry.max_restarts:
            observer.log(
                logging.ERROR,
                "%s; giving up after %d attempts: the runner stops",
                text,
                control.claim_failures,
                error=text,
            )
            return error
        delay = settings.claim_retry.backoff(
            control.claim_failures, key=f"claim:{settings.worker_id}", jitter=self.jitter
        )
        observer.log(
            logging.WARNING,
            "%s; claiming again in %.3g s (failure %d of at most %d)",
            text,
            delay,
            control.claim_failures,
            settings.claim_retry.max_restarts,
            error=text,
            backoff_s=delay,
        )
        control.state = RunnerState.BACKING_OFF
        await control.shutdown.sleep(delay)
        return None

    def _start_all(self, items: Sequence[WorkItem], claimed_at: float) -> None:
        """Put each claimed item in flight and into the executor's pool; count them once."""
        flights, observer, start = self.flights, self.observer, self.start
        metrics = observer.metrics
        shutdown = self.control.shutdown
        emit = observer.on_event is not None
        for item in items:
            entry = flights.add(item, claimed_at)
            metrics.tally_claimed(item.spec_id)
            if emit:
                observer.emit(RunnerEventKind.CLAIMED, item)
            if shutdown.requested:
                entry.stop(StopReason.SHUTDOWN, "claimed during shutdown")
            start(entry)
        metrics.flush()
        if items:
            flights.count.value = len(flights.entries)

    def combined_writes(self) -> Callable[[list[Settlement]], Awaitable[list[bool]]] | None:
        """The completer's write when the store runs its writes one at a time anyway and can
        settle and claim in one call (``SERIAL_WRITES`` and ``SETTLE_AND_CLAIM``); None
        otherwise (the completer calls ``settle_many``). Serving several queues, each write
        claims for the queue with the most free slots (see :meth:`write_and_claim_most_free`)."""
        limits = self.control.settings.queue_limits
        capabilities = capabilities_of(self.store)
        if (
            Capability.SERIAL_WRITES not in capabilities
            or Capability.SETTLE_AND_CLAIM not in capabilities
        ):
            return None
        combined = self.store.settle_and_claim  # type: ignore[attr-defined]
        if len(limits) != 1:
            return functools.partial(self.write_and_claim_most_free, combined, limits)
        [(queue, concurrency)] = limits.items()
        return functools.partial(self.write_and_claim, combined, queue, concurrency)

    async def write_and_claim_most_free(
        self,
        combined: Callable[..., Awaitable[tuple[Sequence[bool], Sequence[WorkItem]]]],
        limits: dict[str, int],
        settlements: list[Settlement],
    ) -> list[bool]:
        """:meth:`write_and_claim` for a runner serving several queues: the claim goes to the
        queue with the most free slots now (the first served on a tie), mostly the one whose
        items the batch just freed. A store that writes one call at a time would otherwise run
        the write and that queue's claim as two calls, two transactions; the other queues'
        claim loops keep claiming on their own, each within its limit."""
        busy = self.flights.busy
        queue = max(limits, key=lambda name: limits[name] - busy[name].value)
        return await self.write_and_claim(combined, queue, limits[queue], settlements)

    async def write_and_claim(
        self,
        combined: Callable[..., Awaitable[tuple[Sequence[bool], Sequence[WorkItem]]]],
        queue: str,
        concurrency: int,
        settlements: list[Settlement],
    ) -> list[bool]:
        """Write *settlements* and, in the same store call, claim the slots free now.

        The completer calls it right after it freed the batch's slots: they are reserved for
        this call's claim (so the claim loop does not claim them too) and what the claim
        leaves unused is given back, waking the claim loop, which then waits for work as after
        any short claim. No claim is made during shutdown, after the claim loops ended, or
        while claims are failing (the claim loop's backoff stays in charge). When the call
        fails nothing was claimed (see ``settle_and_claim``); the completer retries the writes.
        """
        control = self.control
        settings = control.settings
        busy = self.flights.busy[queue]
        free = concurrency - busy.value
        if (
            not self._claims_open
            or control.shutdown.requested
            or control.claim_failures
            or free <= 0
        ):
            return await self.store.settle_many(settlements)
        limit = min(settings.claim_batch, free)
        busy.value += limit
        self._claiming.value += 1
        items: Sequence[WorkItem] = ()
        try:
            started = trio.current_time()
            results, items = await combined(
                settlements,
                self.registry.spec_ids(),
                settings.worker_id,
                settings.lease,
                limit,
                **({} if queue == DEFAULT_QUEUE else {"queue": queue}),
            )
            self._start_all(items, started)
        finally:
            busy.value -= limit - len(items)
            self._claiming.value -= 1
        return list(results)

    @contextlib.contextmanager
    def until_shutdown(self) -> Iterator[None]:
        """A scope that shutdown cancels (cheaper per wait than a nursery)."""
        with trio.CancelScope() as scope:
            if self.control.shutdown.requested:
                scope.cancel()
            self._wait_scopes.add(scope)
            try:
                yield
            finally:
                self._wait_scopes.discard(scope)

    async def watch_shutdown(self) -> None:
        """Cut every wait short once shutdown begins."""
        await self.control.shutdown.wait()
        for scope in list(self._wait_scopes):
            scope.cancel()

    async def _wait_for_work(self, spec_ids: list[str], queues: list[str]) -> None:
        # A store whose wake-ups are exact (EXACT_WAKEUPS) needs no polling: under an autojump
        # clock, polling would wake the runner every poll_interval of virtual time for nothing.
        with trio.move_on_after(self._poll), self.until_shutdown():
            try:
                # Only the served queues: another queue's due items must not wake it.
                await self.store.wait_for_work(spec_ids, queues=queues)
            except Exception as error:
                # The next claim reports the queue's trouble; here, just don't spin.
                text = describe_error(error)
                self.observer.log(
                    logging.DEBUG,
                    "wait_for_work failed: %s; the next claim will tell",
                    text,
                    error=text,
                )
            else:
                return
            await trio.sleep_forever()
