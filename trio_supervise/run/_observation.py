"""What a runner shows of itself: its state, metrics, events, recent errors and log lines.

Every part of a runner reports through one :class:`Observer`; nothing here decides anything.
"""

from __future__ import annotations

import bisect
import collections
import datetime as dt
import enum
import logging
import math
from collections.abc import Callable
from typing import Any

import attrs
import trio
from prometheus_client import CollectorRegistry, Counter, Histogram

from .._clock import Clock
from ..job import SettleKind, Settlement, WorkItem, application_frames, first_line
from ._settings import RunnerSettings

__all__ = [
    "DRAIN_REPORT_INTERVAL",
    "Observer",
    "RecentError",
    "RunnerEvent",
    "RunnerEventKind",
    "RunnerMetrics",
    "RunnerState",
    "log_dead",
    "log_failure",
    "log_fields",
]


class RunnerState(enum.StrEnum):
    """What a runner is doing."""

    IDLE = "idle"
    """Not started yet."""
    RUNNING = "running"
    """Claiming and evaluating."""
    BACKING_OFF = "backing-off"
    """The queue is failing: claims wait before the next attempt; renewals or writes found it
    unreachable (until the next queue call succeeds)."""
    DRAINING = "draining"
    """Shutdown began (or claims failed for good): letting in-flight items finish."""
    STOPPED = "stopped"
    """``run`` returned."""
    FAILED = "failed"
    """``run`` raised: claims failed more than ``claim_retry.max_restarts`` times in a row."""


class RunnerEventKind(enum.StrEnum):
    """What a :class:`RunnerEvent` records."""

    STARTED = "started"
    CLAIMED = "claimed"
    CLAIM_FAILED = "claim-failed"
    RENEWED = "renewed"
    RENEWAL_FAILED = "renewal-failed"
    LEASE_LOST = "lease-lost"
    CANCEL_REQUESTED = "cancel-requested"
    OUTCOME = "outcome"
    SETTLED = "settled"
    SETTLE_REFUSED = "settle-refused"
    SETTLE_FAILED = "settle-failed"
    DRAINING = "draining"
    STOPPED = "stopped"


@attrs.frozen(kw_only=True)
class RunnerEvent:
    """One thing a runner did, for histories and tests (``on_event``).

    ``detail`` is, for ``outcome``, the settlement kind (``continue``, ``reschedule``,
    ``complete``, ``cancel``, ``retry: <error>``, ``dead: <error>``, ``release``) or
    ``lease-lost``; for ``renewed`` the lease status; otherwise a short text. ``at`` is
    ``trio.current_time()``.
    """

    kind: RunnerEventKind
    item_id: str | None = None
    spec_id: str | None = None
    lease_version: int | None = None
    detail: str = ""
    at: float = attrs.field(factory=trio.current_time)


@attrs.frozen(kw_only=True)
class RecentError:
    """An error a runner met, for the status page. ``item_id`` is None for claim errors."""

    item_id: str | None
    spec_id: str | None
    error: str
    at: dt.datetime


_EVALUATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, float("inf"))

_LAG_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, float("inf"))


@attrs.define(eq=False)
class RunnerMetrics:
    """A runner's Prometheus metrics, on *registry* (a private one when None; never the global)."""

    registry: CollectorRegistry = attrs.field(factory=CollectorRegistry)
    claimed: Counter = attrs.field(init=False)
    completed: Counter = attrs.field(init=False)
    continued: Counter = attrs.field(init=False)
    rescheduled: Counter = attrs.field(init=False)
    released: Counter = attrs.field(init=False)
    failed: Counter = attrs.field(init=False)
    cancelled: Counter = attrs.field(init=False)
    dead: Counter = attrs.field(init=False)
    expired: Counter = attrs.field(init=False)
    renewals_failed: Counter = attrs.field(init=False)
    settlements_refused: Counter = attrs.field(init=False)
    settlements_abandoned: Counter = attrs.field(init=False)
    evaluation_seconds: Histogram = attrs.field(init=False)
    loop_lag_seconds: Histogram = attrs.field(init=False)
    workflow_steps: Counter = attrs.field(init=False)
    """Durable workflow steps by ``workflow`` and ``outcome`` (see ``docs/durable.md``)."""
    _children: dict[tuple[int, str], Any] = attrs.field(init=False, factory=dict)
    _settled: dict[SettleKind, Counter] = attrs.field(init=False)
    _tallied: dict[tuple[SettleKind | None, str], int] = attrs.field(init=False, factory=dict)
    """Counts not applied yet, by (settlement kind, or None for a claim; spec id): see
    :meth:`tally_claimed`."""
    _observed: dict[str, list[float]] = attrs.field(init=False, factory=dict)
    """Evaluation seconds not observed yet, per spec id (see :meth:`observe_evaluation`)."""

    def __attrs_post_init__(self) -> None:
        def counter(name: str, documentation: str) -> Counter:
            return Counter(
                f"trio_supervise_{name}_total", documentation, ["spec"], registry=self.registry
            )

        self.claimed = counter("items_claimed", "Items claimed under a lease.")
        self.completed = counter("items_completed", "Items completed (Stop).")
        self.continued = counter("items_continued", "Items evaluated and due again (Continue).")
        self.rescheduled = counter("items_rescheduled", "Items rescheduled (Reschedule).")
        self.released = counter("items_released", "Leases handed back unevaluated (shutdown).")
        self.failed = counter("items_failed", "Evaluations that failed (an item error).")
        self.cancelled = counter("items_cancelled", "Items cancelled on request.")
        self.dead = counter("items_dead", "Items dead after too many errors.")
        self.expired = counter(
            "items_expired", "Items claimed after their start deadline: dead, never started."
        )
        self.renewals_failed = counter(
            "lease_renewals_failed", "Lease renewals that failed or found the lease lost."
        )
        self.settlements_refused = counter(
            "settlements_refused",
            "Outcomes the queue refused because the lease was lost: the item may run twice.",
        )
        self.settlements_abandoned = counter(
            "settlements_abandoned",
            "Outcomes never written: the queue kept failing until the lease ran out.",
        )
        self.workflow_steps = Counter(
            "trio_supervise_workflow_steps_total",
            "Durable workflow steps: ran (run and recorded), replayed (the recorded result "
            "returned), retried (an attempt failed, tried again), failed (out of attempts).",
            ["workflow", "outcome"],
            registry=self.registry,
        )
        self.evaluation_seconds = Histogram(
            "trio_supervise_evaluation_seconds",
            "How long driver evaluations took.",
            ["spec"],
            registry=self.registry,
            buckets=_EVALUATION_BUCKETS,
        )
        self.loop_lag_seconds = Histogram(
            "trio_supervise_event_loop_lag_seconds",
            "How late the runner's watchdog woke: time the event loop was blocked.",
            registry=self.registry,
            buckets=_LAG_BUCKETS,
        )

        self._settled = {
            SettleKind.COMPLETE: self.completed,
            SettleKind.CONTINUE: self.continued,
            SettleKind.RESCHEDULE: self.rescheduled,
            SettleKind.RELEASE: self.released,
            SettleKind.CANCEL: self.cancelled,
            SettleKind.DEAD: self.dead,
        }

    def for_spec(self, metric: Counter | Histogram, spec_id: str) -> Any:
        """``metric.labels(spec_id)``, remembered: the lookup costs more than the count itself."""
        key = (id(metric), spec_id)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(spec_id)
        return child

    def count_settled(self, kind: SettleKind, spec_id: str) -> None:
        """Count a settlement the queue applied."""
        counter = self._settled.get(kind)
        if counter is not None:
            self.for_spec(counter, spec_id).inc()

    def count_expired(self, spec_id: str) -> None:
        """Count an item settled dead for its start deadline (it is counted dead too)."""
        self.for_spec(self.expired, spec_id).inc()

    def tally_claimed(self, spec_id: str) -> None:
        """Count a claim at the next :meth:`flush`.

        For a batch handled without a checkpoint (a claim's items, a write's results): the
        batch's counts are applied once per spec and kind when it ends, so no other task, and
        no reader of the registry in this thread, sees a count between the two.
        """
        key = (None, spec_id)
        tallied = self._tallied
        tallied[key] = tallied.get(key, 0) + 1

    def tally_settled(self, kind: SettleKind, spec_id: str) -> None:
        """Count a settlement the queue applied, at the next :meth:`flush`."""
        key = (kind, spec_id)
        tallied = self._tallied
        tallied[key] = tallied.get(key, 0) + 1

    def observe_evaluation(self, spec_id: str, seconds: float) -> None:
        """Observe an evaluation's duration in ``evaluation_seconds`` at the next :meth:`flush`
        (the runner flushes as it takes the outcome for a write, or drops it)."""
        observed = self._observed.get(spec_id)
        if observed is None:
            observed = self._observed[spec_id] = []
        observed.append(seconds)

    def flush(self) -> None:
        """Apply the tallied counts and the pending observations."""
        tallied = self._tallied
        if tallied:
            for (kind, spec_id), n in tallied.items():
                counter = self.claimed if kind is None else self._settled.get(kind)
                if counter is not None:
                    self.for_spec(counter, spec_id).inc(n)
            tallied.clear()
        observed = self._observed
        if observed:
            for spec_id, values in observed.items():
                _observe_all(self.for_spec(self.evaluation_seconds, spec_id), values)
            observed.clear()


def _observe_all(child: Any, values: list[float]) -> None:
    """``child.observe(value)`` for each of *values*, into a histogram's labelled *child*.

    ``prometheus_client`` observes one value at a time (a lock per bucket and sum, a scan of the
    buckets): when the child has the layout it has had for years (``_upper_bounds``,
    ``_buckets``, ``_sum``), the bucket counts are added once per bucket and the sum is added up
    in the same order ``observe`` would, so the samples are the same to the last bit; otherwise,
    one ``observe`` each.
    """
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if (
        not isinstance(bounds, list)
        or not isinstance(buckets, list)
        or len(bounds) != len(buckets)
        or not bounds
        or bounds[-1] != math.inf
        or total is None
        or not all(hasattr(value, "inc") for value in (total, *buckets))
        or not hasattr(total, "get")
        or not hasattr(total, "set")
    ):
        for value in values:
            child.observe(value)
        return
    counts = [0] * len(bounds)
    running = total.get()
    for value in values:
        # bisect_left finds the first bound >= value, the bucket observe counts it in.
        counts[bisect.bisect_left(bounds, value)] += 1
        running += value
    total.set(running)
    for bucket, n in zip(buckets, counts, strict=True):
        if n:
            bucket.inc(n)


def log_fields(worker: str, item: WorkItem | None = None, **more: object) -> dict[str, object]:
    """The ``extra`` of a runner's log record: ``worker``, the item's ``item_id``, ``spec_id``,
    ``lease_version`` and ``attempt``, then *more* (``backoff_s``, ``error``, or the item's
    fields when there is no *item*) where not None."""
    fields: dict[str, object] = {"worker": worker}
    if item is not None:
        fields.update(
            item_id=item.id,
            spec_id=item.spec_id,
            lease_version=item.lease_version,
            attempt=item.attempt,
        )
    fields.update((name, value) for name, value in more.items() if value is not None)
    return fields


def next_step(item: WorkItem, settlement: Settlement, settings: RunnerSettings) -> str:
    """What comes next for a failed *item*, in words, for the log line that reports it."""
    errors = item.error_count + 1
    of = "" if settings.max_errors is None else f" of {settings.max_errors}"
    if settlement.kind is SettleKind.DEAD:
        return f"dead after {errors} errors; `trio-supervise items retry {item.id}` requeues it"
    return f"retrying in {settlement.delay:.3g} s (error {errors}{of})"


def log_failure(
    log: logging.Logger,
    settings: RunnerSettings,
    item: WorkItem,
    settlement: Settlement,
    failure: Exception | None,
) -> None:
    """Log an item's failure once on *log*: what failed, why, what comes next, and *failure*'s
    traceback when the application's code raised it (the stored error holds it trimmed); an
    error of the library's own making (a config that does not fit) is its message alone."""
    error = first_line(str(settlement.error))
    if failure is not None and not application_frames(failure):
        failure = None
    log.warning(
        "item %r (spec %r) failed on attempt %d: %s; %s",
        item.id,
        item.spec_id,
        item.attempt,
        error,
        next_step(item, settlement, settings),
        exc_info=failure,
        stacklevel=2,
        extra=log_fields(
            settings.worker_id,
            item,
            error=error,
            backoff_s=settlement.delay if settlement.kind is SettleKind.RETRY else None,
        ),
    )


def log_dead(
    log: logging.Logger, worker: str, item: WorkItem, error: str, *, evaluated: bool = False
) -> None:
    """Log that *item* went dead: without evaluation (say, it exceeded ``max_attempts``), or,
    *evaluated*, failed for good by its evaluation (``Discard``, a config that cannot fit)."""
    log.warning(
        "item %r (spec %r) is dead%s: %s; `trio-supervise items retry %s` requeues it",
        item.id,
        item.spec_id,
        "" if evaluated else " without evaluation",
        first_line(error),
        item.id,
        stacklevel=2,
        extra=log_fields(worker, item, error=error),
    )


DRAIN_REPORT_INTERVAL = 5.0
"""Seconds between the "draining: N in flight" lines while a runner drains."""


@attrs.define(eq=False)
class _DrainLog:
    """What a drain did, for its per-item lines and its summary."""

    started: float
    outcomes: collections.Counter[str] = attrs.Factory(collections.Counter)

    def summary(self, now: float) -> str:
        finished = sum(
            n for kind, n in self.outcomes.items() if kind not in ("release", "not written")
        )
        kinds = ", ".join(
            f"{kind} {n}"
            for kind, n in sorted(self.outcomes.items())
            if kind not in ("release", "not written")
        )
        return (
            f"drained in {now - self.started:.3g} s: {finished} finished"
            + (f" ({kinds})" if kinds else "")
            + f", {self.outcomes['release']} handed back"
            + f", {self.outcomes['not written']} not written; the runner stops"
        )


@attrs.define(eq=False)
class _OutcomeLines:
    """At most *rate* INFO lines a second about settled outcomes (a token bucket of one second's
    worth), counting the ones left out for the next line to mention."""

    rate: float
    tokens: float = 0.0
    at: float = 0.0
    left_out: int = 0

    def allow(self, now: float) -> bool:
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        self.left_out += 1
        return False


@attrs.define(eq=False)
class Observer:
    """Where a runner's parts report: its metrics, its ``on_event`` hook, its recent errors and
    its log lines (each with the structured fields of :func:`log_fields`).

    :param on_event: called with every :class:`RunnerEvent`; an exception from it is logged and
        ignored (observing must not break execution).
    """

    settings: RunnerSettings
    metrics: RunnerMetrics
    clock: Clock
    logger: logging.Logger
    on_event: Callable[[RunnerEvent], None] | None = None
    errors: collections.deque[RecentError] = attrs.field(init=False)
    drain: _DrainLog = attrs.field(init=False, factory=lambda: _DrainLog(0.0))
    draining: bool = False
    """While true, items leaving are logged one by one and counted for the drain's summary."""
    outcome_lines: _OutcomeLines | None = attrs.field(init=False, default=None)
    """Set by :meth:`start` when outcomes are logged at INFO (see ``outcome_log_rate``)."""

    def start(self) -> None:
        """A run starts: log its settled outcomes at INFO if the logger shows them."""
        rate = self.settings.outcome_log_rate
        enabled = rate > 0 and self.logger.isEnabledFor(logging.INFO)
        self.outcome_lines = _OutcomeLines(rate, rate, trio.current_time()) if enabled else None

    def log_outcome(self, item: WorkItem, settlement: Settlement, claimed_at: float) -> None:
        """One INFO line for a settled outcome, while the rate allows (see :meth:`start`)."""
        lines = self.outcome_lines
        assert lines is not None
        now = trio.current_time()
        if not lines.allow(now):
            return
        more = f" ({lines.left_out} more outcomes not logged)" if lines.left_out else ""
        lines.left_out = 0
        after = ""
        if settlement.kind is SettleKind.RESCHEDULE and settlement.at is not None:
            after = f", due {settlement.at.isoformat()}"
        elif settlement.kind in (SettleKind.CONTINUE, SettleKind.RETRY, SettleKind.RELEASE):
            after = f", due in {settlement.delay:.3g} s"
        self.logger.info(
            "item %r (spec %r): %s%s, %.3g s after its claim%s",
            item.id,
            item.spec_id,
            settlement.kind,
            after,
            now - claimed_at,
            more,
            extra=log_fields(self.settings.worker_id, item, outcome=str(settlement.kind)),
        )

    def __attrs_post_init__(self) -> None:
        self.errors = collections.deque(maxlen=self.settings.error_history)

    def log(
        self,
        level: int,
        message: str,
        *args: object,
        item: WorkItem | None = None,
        error: str | None = None,
        backoff_s: float | None = None,
    ) -> None:
        """One log record: the message says what happened and what comes next; ``extra``
        carries the structured fields (see :func:`log_fields`)."""
        self.logger.log(
            level,
            message,
            *args,
            stacklevel=2,
            extra=log_fields(self.settings.worker_id, item, error=error, backoff_s=backoff_s),
        )

    def log_item(self, level: int, item: WorkItem, text: str, then: str) -> None:
        """``item 'x' (spec 's'): <text>; <then>``, *text* as its structured error."""
        self.logger.log(
            level,
            "item %r (spec %r): %s; %s",
            item.id,
            item.spec_id,
            text,
            then,
            stacklevel=2,
            extra=log_fields(self.settings.worker_id, item, error=text),
        )

    def record_error(self, item_id: str | None, spec_id: str | None, error: str) -> None:
        """Keep *error* among the recent errors (the status page's)."""
        self.errors.append(
            RecentError(item_id=item_id, spec_id=spec_id, error=error, at=self.clock.now())
        )

    def emit(
        self, kind: RunnerEventKind, item: WorkItem | None = None, *, detail: str = ""
    ) -> None:
        """Hand a :class:`RunnerEvent` to ``on_event``, if there is one."""
        if self.on_event is None:
            return
        event = RunnerEvent(
            kind=kind,
            item_id=None if item is None else item.id,
            spec_id=None if item is None else item.spec_id,
            lease_version=None if item is None else item.lease_version,
            detail=detail,
        )
        try:
            self.on_event(event)
        except Exception:
            self.logger.exception(
                "on_event callback failed for %s; the runner goes on",
                event,
                extra=log_fields(self.settings.worker_id, item),
            )

    def failed(self, item: WorkItem, text: str) -> None:
        """Count and keep an item error (its one-line *text*)."""
        self.metrics.for_spec(self.metrics.failed, item.spec_id).inc()
        self.record_error(item.id, item.spec_id, text)

    def drained(self, item: WorkItem, claimed_at: float, outcome: str) -> None:
        """While draining, log each item once as it leaves, and count it for the summary."""
        if not self.draining:
            return
        self.drain.outcomes[outcome] += 1
        ran = trio.current_time() - claimed_at
        if outcome == "release":
            what = "handed back (lease released, due again at once)"
        elif outcome == "not written":
            what = "left without its outcome written (see above)"
        else:
            what = f"finished ({outcome})"
        self.log(
            logging.INFO,
            "draining: item %r (spec %r) %s after %.3g s",
            item.id,
            item.spec_id,
            what,
            ran,
            item=item,
        )
