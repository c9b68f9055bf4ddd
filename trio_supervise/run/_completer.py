"""Writing outcomes: the completers, which take settlements and write them, retrying what fails
transiently while the lease holds, and account for each once its write answers.

- :class:`BatchCompleter` (a store with the worker port): whatever finished since the last write
  goes in the next ``settle_many`` (or the producer's settle-and-claim) call, one call at a time.
- :class:`SeedCompleter` (a store written to the seed's single-item writes only): each settlement
  becomes the seed's calls (``release``, ``reschedule``, ``complete``, ``mark_error``), written
  in a task of its own, each call retried alone so that an error is counted once.

Both have ``submit(entry, settlement)`` and ``run()``, as River's job completers share one
interface.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import trio

from .._errors import LeaseLost, QueueError, QueueFailed, SuperviseError
from .._policy import Jitter
from ..job import SettleKind, Settlement, describe_error
from ..queues._ports import WorkerStore
from ._flight import Control, Flights, InFlight
from ._observation import Observer, RunnerEventKind, RunnerState
from ._settings import RunnerSettings

__all__ = [
    "BatchCompleter",
    "SeedCompleter",
    "WRITE_RETRY_BOUND",
    "is_transient",
    "write_retry_delay",
]

_BACKING_OFF = RunnerState.BACKING_OFF
_RUNNING = RunnerState.RUNNING
_DRAINING = RunnerState.DRAINING

_PERMANENT_QUEUE_ERRORS: tuple[type[Exception], ...] = (QueueFailed,)
"""Queue errors no retry fixes (``QueueFailed`` and its ``SchemaError``): a write is not retried."""

WRITE_RETRY_BOUND = 60.0
"""Seconds a failing outcome write is retried at most (one lease, if longer), renewals landing."""


def is_transient(error: Exception) -> bool:
    """Whether a failed queue write may succeed if written again: a :class:`QueueError` that is
    not permanent. :class:`QueueUnavailable` (connection lost, SQLite busy or locked, disk full)
    is the transient class; a bare :class:`QueueError` is unclassified and gets the benefit of the
    doubt, bounded by the lease. Anything else (a bug, an unencodable value, :class:`LeaseLost`)
    is not retried."""
    return isinstance(error, QueueError) and not isinstance(error, _PERMANENT_QUEUE_ERRORS)


def write_retry_delay(
    error: Exception,
    *,
    item_id: str,
    attempt: int,
    lease_left: float,
    failing_for: float,
    settings: RunnerSettings,
    jitter: Jitter,
) -> float | None:
    """How long to wait before writing an outcome again after failed *attempt*, or None.

    A transient failure (:func:`is_transient`) is retried while the lease is valid
    (*lease_left* seconds, as last renewed), and for at most ``WRITE_RETRY_BOUND`` seconds (or one
    lease, if longer) of failing writes: renewals that keep landing while writes keep failing mean
    the write itself is at fault, and an outcome is not held forever. The backoff is
    ``claim_retry``'s, keyed by item, capped at half the renewal interval and at the lease's
    expiry, so the last attempt happens as the lease runs out.
    """
    if (
        not is_transient(error)
        or lease_left <= 0
        or failing_for >= max(settings.lease, WRITE_RETRY_BOUND)
    ):
        return None
    delay = settings.claim_retry.backoff(attempt, key=f"settle:{item_id}", jitter=jitter)
    return min(delay, settings.renew_interval / 2, lease_left)


@attrs.define(eq=False)
class _Accounts:
    """What happens once a write answered: the metrics, the log, the slot and the drain."""

    control: Control
    flights: Flights
    observer: Observer
    jitter: Jitter

    def written(
        self, entry: InFlight, settlement: Settlement, applied: bool, error: Exception | None
    ) -> float | None:
        """Account for *entry*'s write and free it; or, when the write failed transiently and
        the lease is still valid, the delay before writing it again (its slot, and its lease,
        renewed meanwhile, stay held till then)."""
        retry: float | None = None
        try:
            retry = self._account(entry, settlement, applied, error)
        finally:
            if retry is None:
                self.flights.free(entry, batched=True)
            else:
                self.flights.retake(entry)
        return retry

    def _account(
        self, entry: InFlight, settlement: Settlement, applied: bool, error: Exception | None
    ) -> float | None:
        control, observer = self.control, self.observer
        item = entry.item
        if error is not None:
            return self._failed(entry, settlement, error)
        if control.state is _BACKING_OFF and not control.claim_failures:  # queue_answered's test
            control.state = _RUNNING
        if applied:
            observer.metrics.tally_settled(settlement.kind, item.spec_id)  # see Flights.written
            if control.state is _DRAINING:
                observer.drained(item, entry.claimed_at, str(settlement.kind))
            elif observer.outcome_lines is not None:
                observer.log_outcome(item, settlement, entry.claimed_at)
            if observer.on_event is not None:
                observer.emit(RunnerEventKind.SETTLED, item, detail=str(settlement.kind))
            return None
        metrics = observer.metrics
        metrics.for_spec(metrics.settlements_refused, item.spec_id).inc()
        observer.drained(item, entry.claimed_at, "not written")
        text = f"{settlement.kind} refused: the lease was lost (another worker may run the item)"
        if entry.write_failures:
            text = f"{text}; after {entry.write_failures} failed attempts, one may have landed"
        observer.record_error(item.id, item.spec_id, text)
        observer.emit(RunnerEventKind.SETTLE_REFUSED, item, detail=str(settlement.kind))
        observer.log_item(logging.WARNING, item, text, "nothing was written")
        return None

    def _failed(self, entry: InFlight, settlement: Settlement, error: Exception) -> float | None:
        observer = self.observer
        item = entry.item
        text = f"writing {settlement.kind} failed: {describe_error(error)}"
        self.control.queue_unreachable(error)
        delay = self.retry_delay(entry, error)
        if delay is not None:
            observer.emit(RunnerEventKind.SETTLE_FAILED, item, detail=f"{text}; retrying")
            observer.log(
                logging.WARNING,
                "item %r (spec %r): %s; writing it again in %.3g s (attempt %d, the lease is held)",
                item.id,
                item.spec_id,
                text,
                delay,
                entry.write_failures + 1,
                item=item,
                error=text,
                backoff_s=delay,
            )
            return delay
        if entry.write_failures > 1:
            text = f"{text} ({entry.write_failures} attempts)"
        metrics = observer.metrics
        metrics.for_spec(metrics.settlements_abandoned, item.spec_id).inc()
        observer.drained(item, entry.claimed_at, "not written")
        observer.record_error(item.id, item.spec_id, text)
        observer.emit(RunnerEventKind.SETTLE_FAILED, item, detail=text)
        observer.log_item(
            logging.ERROR,
            item,
            text,
            "giving up: its lease will expire and another claim runs it again",
        )
        return None

    def retry_delay(self, entry: InFlight, error: Exception) -> float | None:
        """How long to wait before writing *entry*'s outcome again, or None to give up (see
        :func:`write_retry_delay`); the lease as last renewed, by the leases' renewals."""
        now = trio.current_time()
        entry.write_failures += 1
        if entry.first_write_failure is None:
            entry.first_write_failure = now
        if entry.reason is not None and entry.reason >= _LOST:
            return None
        settings = self.control.settings
        return write_retry_delay(
            error,
            item_id=entry.item.id,
            attempt=entry.write_failures,
            lease_left=entry.renewed_at + settings.lease - now,
            failing_for=now - entry.first_write_failure,
            settings=settings,
            jitter=self.jitter,
        )


_LOST = 4  # StopReason.LOST: a write after it is refused anyway

Write = Callable[[list[Settlement]], Awaitable[list[bool]]]
"""Writes a batch of settlements; one result per settlement, True if it applied."""


@attrs.define(eq=False)
class BatchCompleter:
    """Batches outcomes into one write call at a time: whatever is waiting goes in the next call.

    After each call every item's result is accounted for, in submission order. A failed write
    that may be written again is submitted again after its delay (and batched with whatever is
    waiting then).
    """

    store: WorkerStore
    batch: int
    accounts: _Accounts
    write: Write | None = None
    """What writes a batch (the producer's settle-and-claim, see
    :meth:`Producer.write_and_claim`); the store's ``settle_many`` if None."""
    _pending: collections.deque[tuple[InFlight, Settlement]] = attrs.field(
        init=False, factory=collections.deque
    )
    """Submitted, not yet taken for a write, in submission order."""
    _idle: trio.lowlevel.ParkingLot = attrs.field(init=False, factory=trio.lowlevel.ParkingLot)
    """Where the completer waits while nothing is pending (a deque and a parking lot cost a
    fraction of a memory channel's send and receive per outcome)."""

    def submit(self, entry: InFlight, settlement: Settlement) -> None:
        """Queue *settlement* for the next write."""
        self._pending.append((entry, settlement))
        if self._idle:
            self._idle.unpark()

    async def run(self) -> None:
        async with trio.open_nursery() as retries:
            await self._write_forever(retries)

    async def _resubmit(self, entry: InFlight, settlement: Settlement, delay: float) -> None:
        await trio.sleep(delay)
        self.submit(entry, settlement)

    async def _write_forever(self, retries: trio.Nursery) -> None:
        pending = self._pending
        accounts = self.accounts
        written = accounts.written
        flights = accounts.flights
        while True:
            if not pending:
                await self._idle.park()
            # Let the other evaluations that finished at this instant queue up behind it.
            await trio.lowlevel.checkpoint()
            popleft = pending.popleft
            batch = [popleft() for _ in range(min(self.batch, len(pending)))]
            flights.taken(batch)
            try:
                settlements = [settlement for _, settlement in batch]
                if self.write is None:
                    results = await self.store.settle_many(settlements)
                else:
                    results = await self.write(settlements)
                if len(results) != len(batch):
                    raise SuperviseError(
                        f"settle_many returned {len(results)} results for {len(batch)} settlements"
                    )
            except Exception as error:
                for entry, settlement in batch:
                    delay = written(entry, settlement, False, error)
                    if delay is not None:
                        retries.start_soon(self._resubmit, entry, settlement, delay)
            else:
                for (entry, settlement), applied in zip(batch, results, strict=True):
                    written(entry, settlement, applied, None)
            flights.written()


@attrs.define(eq=False)
class SeedCompleter:
    """Writes each settlement with the seed's single-item writes, in a task of its own.

    ``continue`` is ``release(requeue_delay)``, ``reschedule`` is ``reschedule``, ``complete``
    (without a result) is ``complete``, and an error is ``mark_error`` then ``release``, each call
    retried alone after a transient failure while the lease holds (:func:`write_retry_delay`),
    so that an error is counted once; anything else (children, a result, dead, cancel) goes to
    ``settle_many`` as one settlement, which a seed store may offer.
    """

    store: Any
    """A store with the seed's writes (:class:`~trio_supervise.queues.SeedWrites`)."""
    accounts: _Accounts
    _nursery: trio.Nursery | None = attrs.field(init=False, default=None)

    def submit(self, entry: InFlight, settlement: Settlement) -> None:
        assert self._nursery is not None, "submit before run"
        self.accounts.flights.taken([(entry, settlement)])
        self._nursery.start_soon(self.write, entry, settlement)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await trio.sleep_forever()

    async def write(self, entry: InFlight, settlement: Settlement) -> None:
        """Write *settlement* (its calls one after the other), then free *entry*."""
        try:
            for step in self._steps(settlement):
                if not await self._write_step(entry, settlement, step):
                    break  # refused or given up: said by _write_step
        finally:
            flights = self.accounts.flights
            flights.free(entry, batched=True)
            flights.written()

    def _steps(self, s: Settlement) -> Sequence[Callable[[], Awaitable[Any]]]:
        store, item_id, version = self.store, s.item_id, s.lease_version

        def release() -> Awaitable[None]:
            return store.release(item_id, version, s.delay)  # type: ignore[no-any-return]

        def reschedule() -> Awaitable[None]:
            return store.reschedule(item_id, version, s.at, s.config)  # type: ignore[no-any-return]

        def complete() -> Awaitable[None]:
            return store.complete(item_id, version)  # type: ignore[no-any-return]

        def mark_error() -> Awaitable[None]:
            return store.mark_error(item_id, version, s.error)  # type: ignore[no-any-return]

        async def settle() -> None:
            [applied] = await store.settle_many([s])
            if not applied:
                raise LeaseLost(item_id, version, f"{s.kind} refused")

        if s.children or s.wait_for_children:
            return [settle]  # the children are written with the outcome, in one transaction
        kind = s.kind
        if kind is SettleKind.CONTINUE:
            return [release]
        if kind is SettleKind.RESCHEDULE:
            return [reschedule]
        if kind is SettleKind.COMPLETE and s.result is None:
            return [complete]
        if kind is SettleKind.RETRY or (kind is SettleKind.RELEASE and s.error is not None):
            return [mark_error, release]  # each retried alone: an error is counted once
        if kind is SettleKind.RELEASE:
            return [release]
        return [settle]

    async def _write_step(
        self, entry: InFlight, settlement: Settlement, step: Callable[[], Awaitable[Any]]
    ) -> bool:
        """Write one call, again after each transient failure while the lease holds; whether it
        was written (a refusal, or a failure given up, is logged and ends the settlement)."""
        observer = self.accounts.observer
        entry.write_failures = 0
        entry.first_write_failure = None
        while True:
            try:
                await step()
                return True
            except Exception as error:
                text = describe_error(error)
                delay = self.accounts.retry_delay(entry, error)
                item = entry.item
                if isinstance(error, LeaseLost):
                    observer.log(
                        logging.WARNING,
                        "%s of item %r refused: the lease was lost (another worker may run the "
                        "item); nothing was written",
                        settlement.kind,
                        item.id,
                        item=item,
                        error=text,
                    )
                    return False
                if delay is None:
                    observer.log(
                        logging.WARNING,
                        "writing %s for item %r failed: %s; giving up, its lease will expire and "
                        "another claim runs it again",
                        settlement.kind,
                        item.id,
                        text,
                        item=item,
                        error=text,
                    )
                    return False
                observer.log(
                    logging.WARNING,
                    "writing %s for item %r failed (attempt %d): %s; writing it again in %.3g s",
                    settlement.kind,
                    item.id,
                    entry.write_failures,
                    text,
                    delay,
                    item=item,
                    error=text,
                    backoff_s=delay,
                )
                await trio.sleep(delay)
