"""Leases: renewing the leases of the items in flight, and the loop-lag watchdog beside them."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from ..job import Lease, LeaseStatus, StopReason, describe_error
from ._flight import Control, Flights, InFlight
from ._observation import Observer, RunnerEventKind

__all__ = ["LAG_WARNING_FRACTION", "Leases", "RENEWAL_CHUNK", "lease_risk"]

_LOST = StopReason.LOST
_CANCEL_REQUESTED = StopReason.CANCEL_REQUESTED
_RENEWAL_FAILED = StopReason.RENEWAL_FAILED

RENEWAL_CHUNK = 1000
"""Leases renewed per ``renew_many`` call; a round checkpoints between its calls."""

LAG_WARNING_FRACTION = 1 / 3
"""A loop blocked longer than this fraction of the lease (one renewal interval) is warned about."""

_LAG_CHECKS_PER_RENEWAL = 4


def _busy(in_flight: int) -> bool:
    """Something is in flight (a predicate for ``_count.wait_value``, one object for all)."""
    return in_flight > 0


def _idle(in_flight: int) -> bool:
    """Nothing is in flight."""
    return in_flight == 0


_AT_RISK_NAMED = 10


def lease_risk(
    entries: Sequence[tuple[str, float]], *, woke: float, lag: float, lease: float
) -> str | None:
    """The warning for a loop blocked *lag* seconds until *woke*, or None if it is harmless.

    *entries* are the in-flight items as ``(item id, last renewed at)``. A block longer than
    ``LAG_WARNING_FRACTION`` of *lease* missed at least one renewal round: every item in flight
    was at risk, and those whose lease ran out during the block may be running elsewhere now.
    """
    if lag <= lease * LAG_WARNING_FRACTION:
        return None
    named = []
    for item_id, renewed_at in entries[:_AT_RISK_NAMED]:
        left = renewed_at + lease - woke
        state = f"expired {-left:.3g} s ago" if left <= 0 else f"{left:.3g} s left"
        named.append(f"{item_id!r} ({state})")
    if len(entries) > _AT_RISK_NAMED:
        named.append(f"and {len(entries) - _AT_RISK_NAMED} more")
    at_risk = ", ".join(named) if named else "none in flight"
    return (
        f"event loop blocked for {lag:.3g} s (lease {lease:g} s): leases at risk: {at_risk}; "
        "a driver is blocking the thread (use trio.to_thread for blocking calls)"
    )


@attrs.define(eq=False)
class Leases:
    """Keeps the leases of the items in flight, and watches the event loop that renews them.

    The renewal loop renews every held lease every ``lease / 3``, in ``renew_many`` calls of at
    most :data:`RENEWAL_CHUNK` leases with a checkpoint between (thousands in flight must not
    block the event loop for a whole round); a lost lease cancels that item's evaluation, and so
    does a requested cancellation. A renewal call that fails stops the evaluations whose lease
    would run out before the next round (the others go on while their leases last); with
    *strict* (the seed's due pass), every evaluation whose renewal failed stops at once, a lease
    refused included, as the error ``lease renewal failed: ...``.

    The loop-lag watchdog (while anything is in flight) sleeps a short interval and measures how
    late it wakes: a driver that blocks the thread (``time.sleep``) starves every renewal, so a
    wake-up later than a third of the lease is logged, kept in the recent errors and exported.

    *store* is a :class:`~trio_supervise.queues.WorkerStore`, or with *seed* a store of the seed's
    single writes, renewed one ``renew`` call per lease.
    """

    store: Any
    control: Control
    flights: Flights
    observer: Observer
    seed: bool = False
    strict: bool = False

    async def sleep_while_busy(self, deadline: float) -> bool:
        """Sleep until *deadline* (True), or until nothing is in flight, whichever is first
        (False).

        The renewal loop and the watchdog sleep so: once the last item in flight is settled they
        have nothing to do, and a sleep left to run out would be a wake-up with nothing to do.
        Under an autojump clock every such wake-up is a jump of its own: a simulated day of one
        daily workflow was three jumps (the renewal round's deadline, the watchdog's, the next
        due time) where one does (issue 17's P4).
        """
        with trio.move_on_at(deadline):
            await self.flights.count.wait_value(_idle)
            return False
        return True

    async def renew_forever(self) -> None:
        interval = self.control.settings.renew_interval
        flights = self.flights
        deadline = trio.current_time() + interval
        while True:
            if not flights.entries:
                # Nothing to renew: sleep until something is claimed, then keep the cadence.
                await flights.count.wait_value(_busy)
                now = trio.current_time()
                if deadline <= now:
                    deadline += math.ceil((now - deadline) / interval) * interval
            if not await self.sleep_while_busy(deadline):
                continue  # nothing left to renew: the round is due when something is claimed
            await self._renew_round(interval)
            deadline += interval
            now = trio.current_time()
            if deadline <= now:
                deadline = now + interval

    async def _renew_round(self, interval: float) -> None:
        now = trio.current_time()
        # Renew every lease not lost and not renewed in the last half interval (a lease claimed
        # just before this round waits for the next one).
        due: dict[str, InFlight] = {}
        for entry in list(self.flights.entries.values()):
            if entry.reason is _LOST or now - entry.renewed_at < interval / 2:
                continue
            other = due.get(entry.item.id)
            if other is not None:
                # We hold a newer claim of the same item: the older lease is stale for sure.
                older, entry = sorted((other, entry), key=lambda e: e.item.lease_version)
                self.lose(older, "superseded by a newer claim")
            due[entry.item.id] = entry
        if not due:
            return
        # In chunks, with a checkpoint between: a round over thousands of leases must not block
        # the event loop (the drivers, the watchdog) for its whole length.
        entries = list(due.values())
        is_held = self.flights.is_held
        for start in range(0, len(entries), RENEWAL_CHUNK):
            if start:
                await trio.lowlevel.checkpoint()
            chunk = [e for e in entries[start : start + RENEWAL_CHUNK] if is_held(e)]
            failed = await self._renew_chunk(chunk, interval) if chunk else None
            if failed is not None:
                # The queue failed: the rest of the round would fail the same way.
                rest = [e for e in entries[start:] if is_held(e)]
                self.observer.log(
                    logging.WARNING,
                    "renewing %d leases failed: %s; evaluations go on while their leases last, "
                    "renewing again in %.3g s",
                    len(rest),
                    failed,
                    interval,
                    error=failed,
                )
                self._renewal_failed(rest, failed, interval)
                return

    async def _renew_chunk(self, chunk: list[InFlight], interval: float) -> str | None:
        """Renew *chunk*'s leases in one ``renew_many`` call (with *seed*: one ``renew`` call
        each); the error if the call failed (the caller then accounts for the failure)."""
        settings = self.control.settings
        now = trio.current_time()
        if self.seed:
            statuses = await self._renew_each(chunk)
        else:
            leases = []
            for entry in chunk:
                lease = entry.lease
                if lease is None:
                    item = entry.item
                    lease = entry.lease = Lease(item.id, item.lease_version, settings.worker_id)
                leases.append(lease)
            try:
                statuses = await self.store.renew_many(leases, settings.lease)
            except Exception as error:
                self.control.queue_unreachable(error)
                return describe_error(error)
        self.control.queue_answered()
        emit = self.observer.on_event is not None
        flights = self.flights
        for entry in chunk:
            if flights.entries.get(entry.key) is not entry:
                continue  # written meanwhile
            status = statuses.get(entry.item.id, LeaseStatus.LOST)
            if isinstance(status, Exception):
                self._renewal_failed([entry], describe_error(status), interval)
                continue
            if entry.settling:
                # Being written (perhaps again, after a failed write): a LOST here may be the
                # settlement's own doing, and the write's answer is the truth; a renewal that
                # landed keeps the lease valid for the next attempt.
                if status is not LeaseStatus.LOST:
                    entry.renewed_at = now
                continue
            if status is LeaseStatus.LOST:
                if self.strict:
                    self._renewal_failed([entry], "the lease was lost (renewal refused)", interval)
                else:
                    self.lose(entry, "renewal refused")
                continue
            entry.renewed_at = now
            if emit:
                self.observer.emit(RunnerEventKind.RENEWED, entry.item, detail=str(status))
            if status is LeaseStatus.CANCEL_REQUESTED and entry.reason is not _CANCEL_REQUESTED:
                self.observer.emit(RunnerEventKind.CANCEL_REQUESTED, entry.item)
                entry.stop(_CANCEL_REQUESTED, "cancel requested")
        return None

    async def _renew_each(self, chunk: list[InFlight]) -> dict[str, Any]:
        """The seed's renewals, one ``renew`` call per lease: each one's status, or the
        exception its call raised (a refusal is ``LeaseLost``)."""
        settings = self.control.settings
        statuses: dict[str, Any] = {}
        for entry in chunk:
            item = entry.item
            try:
                statuses[item.id] = await self.store.renew(
                    item.id, settings.worker_id, item.lease_version, settings.lease
                )
            except Exception as error:
                statuses[item.id] = error
        return statuses

    def _renewal_failed(self, entries: list[InFlight], text: str, interval: float) -> None:
        """A renewal failed: count it for *entries*, and stop those whose lease would run out
        before the next round (with *strict*: every one not being written)."""
        lease = self.control.settings.lease
        metrics, observer = self.observer.metrics, self.observer
        for entry in entries:
            metrics.for_spec(metrics.renewals_failed, entry.item.spec_id).inc()
            observer.emit(RunnerEventKind.RENEWAL_FAILED, entry.item, detail=text)
            if entry.settling:
                continue
            if self.strict or entry.renewed_at + lease - trio.current_time() <= interval:
                entry.stop(_RENEWAL_FAILED, text)

    def lose(self, entry: InFlight, detail: str) -> None:
        """*entry*'s lease is gone: its evaluation is cancelled and nothing is written."""
        item = entry.item
        observer = self.observer
        observer.log(
            logging.WARNING,
            "item %r (spec %r) lost its lease v%d (%s); its evaluation is cancelled and "
            "nothing is written (another worker may run it)",
            item.id,
            item.spec_id,
            item.lease_version,
            detail,
            item=item,
            error=f"lease lost: {detail}",
        )
        metrics = observer.metrics
        metrics.for_spec(metrics.renewals_failed, item.spec_id).inc()
        observer.emit(RunnerEventKind.LEASE_LOST, item, detail=detail)
        entry.stop(_LOST, detail)

    async def watch_loop_lag(self) -> None:
        """Measure how late the event loop wakes a short sleep, while anything is in flight.

        ``trio.current_time()`` is the run's clock: in production Trio's default clock, a
        monotonic wall clock, so a driver that blocks the thread (a blocking ten-second sleep)
        shows up as a wake-up 10 s late. Under an autojump clock, time stands still while the
        loop is busy, so the lag is zero unless a test jumps the clock without yielding. The
        watchdog sleeps only while items are in flight (an idle runner under virtual time costs
        nothing), four times per renewal interval.
        """
        settings = self.control.settings
        interval = settings.renew_interval / _LAG_CHECKS_PER_RENEWAL
        lag_metric = self.observer.metrics.loop_lag_seconds
        flights = self.flights
        while True:
            if not flights.entries:
                await flights.count.wait_value(_busy)
            expected = trio.current_time() + interval
            if not await self.sleep_while_busy(expected):
                continue  # idle: nothing a late wake-up could put at risk
            woke = trio.current_time()
            lag = max(0.0, woke - expected)
            lag_metric.observe(lag)
            if lag <= settings.lease * LAG_WARNING_FRACTION:
                continue  # harmless (lease_risk says None): no list of 10,000 entries to build
            entries = [(e.item.id, e.renewed_at) for e in flights.entries.values()]
            warning = lease_risk(entries, woke=woke, lag=lag, lease=settings.lease)
            if warning is not None:
                self.observer.record_error(None, None, warning)
                self.observer.log(logging.WARNING, "%s", warning, error=warning)
