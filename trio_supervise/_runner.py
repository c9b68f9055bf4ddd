"""The long-running workflow runner: a pipelined, supervised child.

Three tasks share the runner's state:

- the *claim loop* keeps up to ``concurrency`` evaluations in flight, claiming as slots free up,
  and when the queue has nothing due waits with
  ``with trio.move_on_after(poll_interval): await queue.wait_for_work(spec_ids)`` (without the
  bound when the queue's ``exact_wakeups`` is true: see the queue protocol);
- the *renewal loop* renews every held lease every ``lease / 3``, in ``renew_many`` calls of at
  most ``RENEWAL_CHUNK`` leases with a checkpoint between (thousands in flight must not block the
  event loop for a whole round); a lost lease cancels that item's evaluation, a requested
  cancellation cancels it too;
- the *settler* writes outcomes with ``settle_many``, taking everything that finished since its
  last write in one call. Taking a batch frees its slots (the counts the claim loops wait on
  change once per batch), so the next claim runs beside the write instead of after it; the
  items stay in flight, their leases renewed, until the write answers, and since one batch is
  written at a time a queue holds at most its concurrency plus ``settle_batch`` items. Then it
  does each item's bookkeeping. A write that fails transiently (the queue unreachable, SQLite
  busy or locked, a full disk) is written again after a backoff while the item's lease is
  valid, the renewal loop renewing it meanwhile: the item takes a slot again while it waits
  and keeps its lease until the write lands or the lease is really gone;
- the *loop-lag watchdog* (while anything is in flight) sleeps a short interval and measures how
  late it wakes: a driver that blocks the thread (``time.sleep``) starves every renewal, so a
  wake-up later than a third of the lease is logged, kept in the recent errors and exported.

Claimed items are evaluated by a pool of *evaluators*, long-lived tasks that take waiting items
one at a time; an evaluator whose evaluation did not block takes the next waiting item itself,
and one that blocks has woken another for the rest first (the pool grows to the most items
evaluated at once, at most the concurrency; see :class:`_Pool`). An evaluator runs its items
inside one cancel scope, and an item's ``scope`` points at it while that item is evaluated:
stopping the item (a lost lease, a cancel request, shutdown) cancels that scope, which holds that
evaluation alone, and the evaluator goes on in a fresh one. So the happy path starts no task and
enters no cancel scope per item. An item holds its slot until its outcome is taken for a write,
and its lease (which keeps being renewed) until the write answers; its evaluator hands the
outcome to the settler and moves on, nothing waiting per item for the write.

Metrics: the counts of a claim's items and of a write's results are added once per spec and
kind as the batch ends (no checkpoint in between, so no other task sees a partial count), and
evaluation durations are observed as their outcomes are taken for a write; runner events are
built only when ``on_event`` is set.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import contextvars
import datetime as dt
import enum
import functools
import logging
import math
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Generic

import attrs
import trio
import trio_util
from prometheus_client import CollectorRegistry, Counter, Histogram

from ._errors import DriverError, QueueFailed, QueueUnavailable, SuperviseError
from ._lifecycle import Shutdown
from ._policy import Jitter
from ._workflow import (
    ContextFactory,
    ContextT,
    DriverRegistry,
    RunnerSettings,
    evaluate_item,
    log_dead,
    log_failure,
    log_fields,
    open_context,
    raise_specific,
    write_retry_delay,
)
from .job import (
    DEFAULT_QUEUE,
    Lease,
    LeaseStatus,
    SettleKind,
    Settlement,
    StopReason,
    WorkItem,
    attempts_exhausted,
    describe_error,
    describe_failure,
    first_line,
    settlement_after,
    settlement_before,
)
from .queues._ports import (
    Capability,
    WorkQueue,
    capabilities_of,
)

_S_PARENTLESS: Callable[[Settlement, bool], None] = Settlement._parentless.__set__  # type: ignore[attr-defined]
"""Marks a runner's settlement of an item without a parent (see ``Settlement._parentless``)."""

__all__ = [
    "RunnerEventKind",
    "RecentError",
    "RunnerEvent",
    "RunnerMetrics",
    "RunnerState",
    "WorkflowRunner",
    "lease_risk",
]

logger = logging.getLogger("trio_supervise.runner")


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


# Members the per-item paths test for, as module names: in Python 3.11 reading an enum member
# off its class costs about 45 ns, a module name next to nothing (issue 17).
_DRAINING = RunnerState.DRAINING
_BACKING_OFF = RunnerState.BACKING_OFF
_RUNNING = RunnerState.RUNNING
_DEAD = SettleKind.DEAD


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


# Workflow steps run from milliseconds to many minutes.
_EVALUATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, float("inf"))
# How late the event loop woke the watchdog: healthy loops stay in the first buckets.
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
    renewals_failed: Counter = attrs.field(init=False)
    settlements_refused: Counter = attrs.field(init=False)
    settlements_abandoned: Counter = attrs.field(init=False)
    evaluation_seconds: Histogram = attrs.field(init=False)
    loop_lag_seconds: Histogram = attrs.field(init=False)
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


_Reason = StopReason
_LOST = StopReason.LOST
_FAILED = (SettleKind.RETRY, SettleKind.DEAD)


@attrs.define(eq=False, init=False)
class _InFlight:
    """An item this runner holds a lease on, from claim until its outcome is written."""

    item: WorkItem
    renewed_at: float
    key: tuple[str, int]
    """``(item id, lease version)``: its key in the runner's in-flight set."""
    scope: trio.CancelScope | None
    """The evaluator's scope while it evaluates this item (None before and after): cancelling it
    stops this evaluation and nothing else."""
    reason: _Reason | None
    detail: str
    settling: bool
    """The outcome is being written: from now on the write's result, not a renewal, is the truth."""
    write_failures: int
    """Failed attempts at writing the outcome so far."""
    first_write_failure: float | None
    claimed_at: float
    evaluating_since: float | None
    """When its driver started, while it runs."""
    lease: Lease | None
    """The lease the renewals send, built at the first renewal."""

    def __init__(self, item: WorkItem, renewed_at: float) -> None:
        # Spelled out, one per claimed item: attrs' own would call a factory for claimed_at,
        # and a key property would build its tuple at every look-up (issue 17).
        self.item = item
        self.renewed_at = self.claimed_at = renewed_at
        self.key = (item.id, item.lease_version)
        self.scope = None
        self.reason = None
        self.detail = ""
        self.settling = False
        self.write_failures = 0
        self.first_write_failure = None
        self.evaluating_since = None
        self.lease = None

    def stop(self, reason: _Reason, detail: str = "") -> None:
        if self.reason is None or reason > self.reason:
            self.reason = reason
            self.detail = detail
        if self.scope is not None:
            self.scope.cancel()


DRAIN_REPORT_INTERVAL = 5.0
"""Seconds between the "draining: N in flight" lines while a runner drains."""
FORCED_RELEASE_BOUND = 2.0
"""Seconds :meth:`WorkflowRunner.release_in_flight` waits at most for leases to be handed back."""


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


_Evaluate = Callable[[], Awaitable[None]]
"""Starts one more evaluator (see :class:`_Pool`)."""

_Written = Callable[[_InFlight, Settlement, bool, Exception | None], float | None]
"""Called by the settler once per item after its write: (entry, settlement, applied, error).

It returns None when the item is accounted for, or (after a failed write) a delay in seconds
after which the settler submits the same settlement again."""


@attrs.define(eq=False)
class _Settler:
    """Batches outcomes into ``settle_many`` calls: whatever is waiting goes in the next call.

    After each call it reports every item's result to *written*, in submission order; *written*
    must not raise. A failed write that *written* asks to retry is submitted again after the delay
    it returned (and batched with whatever is waiting then).
    """

    queue: WorkQueue
    batch: int
    written: _Written
    flushed: Callable[[], None] = lambda: None
    """Called after each call's results are all reported (the per-batch bookkeeping)."""
    taken: Callable[[list[tuple[_InFlight, Settlement]]], None] = lambda batch: None
    """Called with each batch as it is taken for a call, before the call (the slots it frees)."""
    write: Callable[[list[Settlement]], Awaitable[list[bool]]] | None = None
    """What writes a batch (the runner's settle-and-claim, see
    :meth:`WorkflowRunner._write_and_claim`); ``queue.settle_many`` if None."""
    _pending: collections.deque[tuple[_InFlight, Settlement]] = attrs.field(
        init=False, factory=collections.deque
    )
    """Submitted, not yet taken for a write, in submission order."""
    _idle: trio.lowlevel.ParkingLot = attrs.field(init=False, factory=trio.lowlevel.ParkingLot)
    """Where the settler waits while nothing is pending (a deque and a parking lot cost a
    fraction of a memory channel's send and receive per outcome)."""

    def submit(self, entry: _InFlight, settlement: Settlement) -> None:
        """Queue *settlement* for the next write; *written* reports how it went."""
        self._pending.append((entry, settlement))
        if self._idle:
            self._idle.unpark()

    async def run(self) -> None:
        async with trio.open_nursery() as retries:
            await self._write_forever(retries)

    async def _resubmit(self, entry: _InFlight, settlement: Settlement, delay: float) -> None:
        await trio.sleep(delay)
        self.submit(entry, settlement)

    async def _write_forever(self, retries: trio.Nursery) -> None:
        pending = self._pending
        while True:
            if not pending:
                await self._idle.park()
            # Let the other evaluations that finished at this instant queue up behind it.
            await trio.lowlevel.checkpoint()
            popleft = pending.popleft
            batch = [popleft() for _ in range(min(self.batch, len(pending)))]
            self.taken(batch)
            try:
                settlements = [settlement for _, settlement in batch]
                if self.write is None:
                    results = await self.queue.settle_many(settlements)
                else:
                    results = await self.write(settlements)
                if len(results) != len(batch):
                    raise SuperviseError(
                        f"settle_many returned {len(results)} results for {len(batch)} settlements"
                    )
            except Exception as error:
                for entry, settlement in batch:
                    delay = self.written(entry, settlement, False, error)
                    if delay is not None:
                        retries.start_soon(self._resubmit, entry, settlement, delay)
            else:
                for (entry, settlement), applied in zip(batch, results, strict=True):
                    self.written(entry, settlement, applied, None)
            self.flushed()


def _context_changed(started: contextvars.Context) -> bool:
    """Whether this task's :mod:`contextvars` context differs from *started*, a copy taken
    before.

    An evaluator runs many items in one task, so a context variable one item's driver sets (a
    logging binding, a tracing span, a ``decimal`` context) would be seen by the next item it
    takes; a task per item would not see it. The evaluator compares its context after each
    evaluation, which costs one copy and, when nothing was set, one identity test of the two
    contexts' variable maps (copies share the map until a variable is set). Values are compared
    only when a variable was set: one whose ``==`` raises counts as a change.
    """
    try:
        return contextvars.copy_context() != started
    except Exception:
        return True


@attrs.define(eq=False)
class _Pool:
    """The evaluators: long-lived tasks that take claimed items from one queue of waiting items.

    Claimed items wait in ``waiting``, idle evaluators park in ``idle``. At most one evaluator is
    being woken at a time (``waking``): the woken one takes the first waiting item and, if more
    wait, wakes the next evaluator before it evaluates its own. An evaluator whose evaluation ends
    takes the next waiting item itself. So a batch of evaluations that do not block runs in one
    evaluator with two wake-ups, not one hand-over per item, and a batch of evaluations that
    block gets an evaluator each, woken one after the other; the pool grows to the most items
    evaluated at once (at most the concurrency), and no task is started or ended per item.
    """

    nursery: trio.Nursery
    spawn: _Evaluate | None = None
    """Starts one more evaluator (set once the evaluators' arguments are known)."""
    waiting: collections.deque[_InFlight] = attrs.Factory(collections.deque)
    idle: list[trio.lowlevel.Task] = attrs.Factory(list)
    waking: bool = False
    """An evaluator was woken (or started) and has not run yet."""
    closed: bool = False
    """Nothing more is claimed: evaluators end once ``waiting`` is empty."""
    context: contextvars.Context = attrs.Factory(contextvars.copy_context)
    """The context every evaluator starts in, whoever wakes it: a copy of the context the pool
    was opened in (the runner's)."""

    @classmethod
    def open(cls, nursery: trio.Nursery) -> _Pool:
        return cls(nursery)

    def put(self, entry: _InFlight) -> None:
        """Queue *entry* for evaluation, waking an evaluator unless one is being woken."""
        self.waiting.append(entry)
        if not self.waking:
            self.wake()

    def wake(self) -> None:
        """Wake an idle evaluator, or start one if none is idle."""
        self.waking = True
        if self.idle:
            trio.lowlevel.reschedule(self.idle.pop())
        else:
            assert self.spawn is not None
            # A task copies the context of the code that starts it: start it from the pool's.
            self.context.run(self.nursery.start_soon, self.spawn)

    def close(self) -> None:
        """Nothing more will be put: wake every idle evaluator so that it ends."""
        self.closed = True
        idle, self.idle = self.idle, []
        for task in idle:
            trio.lowlevel.reschedule(task)

    async def park(self) -> None:
        """Wait, idle, until :meth:`wake` or :meth:`close` picks this evaluator."""
        task = trio.lowlevel.current_task()
        self.idle.append(task)

        def abort(_: object) -> trio.lowlevel.Abort:
            self.idle.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)


@attrs.define(eq=False, kw_only=True)
class WorkflowRunner(Generic[ContextT]):
    """Claims due items and evaluates them with their drivers until shutdown; a supervised child.

    :param queue: where the items live.
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

    _queue: WorkQueue = attrs.field(alias="queue")
    _registry: DriverRegistry[ContextT] = attrs.field(alias="registry")
    _settings: RunnerSettings = attrs.field(alias="settings")
    _build_context: ContextFactory[ContextT] = attrs.field(alias="build_context")
    _shutdown: Shutdown = attrs.field(factory=Shutdown, alias="shutdown")
    _jitter: Jitter = attrs.field(factory=Jitter, alias="jitter")
    _metrics_registry: CollectorRegistry | None = attrs.field(
        default=None, alias="metrics_registry"
    )
    _on_event: Callable[[RunnerEvent], None] | None = attrs.field(default=None, alias="on_event")

    _metrics: RunnerMetrics = attrs.field(init=False)
    _state: RunnerState = attrs.field(init=False, default=RunnerState.IDLE)
    _in_flight: dict[tuple[str, int], _InFlight] = attrs.field(init=False, factory=dict)
    _count: trio_util.AsyncValue[int] = attrs.field(
        init=False, factory=lambda: trio_util.AsyncValue(0)
    )
    _busy: dict[str, trio_util.AsyncValue[int]] = attrs.field(init=False, factory=dict)
    """Per served queue, its items in flight (each queue has its own limit)."""
    _errors: collections.deque[RecentError] = attrs.field(init=False)
    _claim_failures: int = attrs.field(init=False, default=0)
    _running: bool = attrs.field(init=False, default=False)
    _wait_scopes: set[trio.CancelScope] = attrs.field(init=False, factory=set)
    """The waits shutdown must cut short: one per claim loop (one per served queue)."""
    _drain_log: _DrainLog = attrs.field(init=False, factory=lambda: _DrainLog(0.0))
    _freed: collections.Counter[str] = attrs.field(init=False, factory=collections.Counter)
    """Slots freed per queue by the batch the settler takes (see _taken)."""
    _claims_open: bool = attrs.field(init=False, default=False)
    """While the claim loops run: the settler may claim beside its writes (_write_and_claim)."""
    _claiming: trio_util.AsyncValue[int] = attrs.field(
        init=False, factory=lambda: trio_util.AsyncValue(0)
    )
    """Settle-and-claim calls in flight: the claim loops end once none is (their items go to
    the evaluators' pool, which closes after the loops)."""
    _time: Callable[[], float] = attrs.field(init=False, default=trio.current_time, repr=False)
    """``trio.current_time``, as the running clock's own ``current_time`` during :meth:`run`
    (the same value: Trio's is that call behind two more frames and its KeyboardInterrupt
    protection, and an evaluation reads the time once or twice; issue 17's P4, under
    ``MockClock``)."""

    def __attrs_post_init__(self) -> None:
        registry = self._metrics_registry
        self._metrics = RunnerMetrics(CollectorRegistry() if registry is None else registry)
        self._errors = collections.deque(maxlen=self._settings.error_history)

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
        return self._metrics

    @property
    def state(self) -> RunnerState:
        return self._state

    @property
    def claim_failures(self) -> int:
        """Consecutive failed claims (0 once a claim succeeds)."""
        return self._claim_failures

    @property
    def in_flight(self) -> list[WorkItem]:
        """The items this runner holds a lease on right now, as claimed."""
        return [entry.item for entry in self._in_flight.values()]

    @property
    def recent_errors(self) -> list[RecentError]:
        """The last ``settings.error_history`` errors, oldest first."""
        return list(self._errors)

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
        self._time = trio.lowlevel.current_clock().current_time
        self._state = RunnerState.IDLE
        self._claim_failures = 0
        failed = False
        try:
            if self._registry.is_empty():
                raise DriverError("the registry has no drivers: nothing to run")
            self._registry.validate_all()
            async with open_context(self._build_context) as context:
                settler = _Settler(
                    self._queue,
                    self._settings.settle_batch,
                    self._written,
                    self._flush_freed,
                    self._taken,
                )
                fatal: Exception | None = None
                try:
                    async with trio.open_nursery() as services:
                        services.start_soon(self._watch_shutdown)
                        services.start_soon(self._renewal_loop)
                        services.start_soon(self._watch_loop_lag)
                        services.start_soon(settler.run)
                        async with trio.open_nursery() as evaluations:
                            pool = _Pool.open(evaluations)
                            self._state = RunnerState.RUNNING
                            self._emit(RunnerEventKind.STARTED)
                            task_status.started()
                            evaluate = functools.partial(self._evaluator, pool, context, settler)
                            pool.spawn = evaluate
                            settler.write = self._combined_writes(pool, evaluate)
                            fatal = await self._claim_loops(pool, evaluate)
                            # Nothing more is claimed: the evaluators end once none is waiting.
                            pool.close()
                            await self._drain()
                        # Every evaluation has ended; the outcomes handed over are written (or
                        # fail) before the settler stops.
                        await self._count.wait_value(0)
                        self._log(logging.INFO, "%s", self._drain_log.summary(trio.current_time()))
                        services.cancel_scope.cancel()
                except BaseExceptionGroup as group:
                    raise_specific(group)
                if fatal is not None:
                    raise fatal
        except Exception:
            failed = True
            raise
        finally:
            self._metrics.flush()
            # Cancelled from outside before some outcomes were written: those leases expire.
            self._in_flight.clear()
            self._freed.clear()
            self._count.value = 0
            for busy in self._busy.values():
                busy.value = 0
            self._state = RunnerState.FAILED if failed else RunnerState.STOPPED
            self._running = False
            self._time = trio.current_time  # not this run's clock once it returns
            self._emit(RunnerEventKind.STOPPED, detail=str(self._state))

    async def _claim_loops(self, pool: _Pool, evaluate: _Evaluate) -> Exception | None:
        """One claim loop per served queue, each under its own limit; the first fatal error
        ends them all. Once they end, no settle-and-claim call is made, and the one in flight
        (if any) has started its items."""
        self._claims_open = True
        try:
            return await self._run_claim_loops(pool, evaluate)
        finally:
            self._claims_open = False
            await self._claiming.wait_value(0)

    async def _run_claim_loops(self, pool: _Pool, evaluate: _Evaluate) -> Exception | None:
        limits = self._settings.queue_limits
        for name in limits:
            self._busy.setdefault(name, trio_util.AsyncValue(0))
        if len(limits) == 1:
            [(name, limit)] = limits.items()
            return await self._claim_loop(pool, evaluate, name, limit)
        fatal: list[Exception] = []

        async def one(name: str, limit: int, scope: trio.CancelScope) -> None:
            error = await self._claim_loop(pool, evaluate, name, limit)
            if error is not None:
                fatal.append(error)
                scope.cancel()

        async with trio.open_nursery() as loops:
            for name, limit in limits.items():
                loops.start_soon(one, name, limit, loops.cancel_scope)
        return fatal[0] if fatal else None

    async def _claim_loop(
        self, pool: _Pool, evaluate: _Evaluate, queue: str, concurrency: int
    ) -> Exception | None:
        settings = self._settings
        busy = self._busy[queue]
        # A queue other than the default is named; the default keeps the seed's call, so a
        # WorkQueue written before named queues still serves it.
        named = {} if queue == DEFAULT_QUEUE else {"queue": queue}
        queues = [queue]
        while not self._shutdown.requested:
            free = concurrency - busy.value
            if free <= 0:
                with self._until_shutdown():
                    await busy.wait_value(lambda n: n < concurrency)
                continue
            spec_ids = self._registry.spec_ids()
            limit = min(settings.claim_batch, free)
            started = trio.current_time()
            # The slots are reserved while the claim runs, so a claim beside a write (see
            # _write_and_claim) never takes them too.
            busy.value += limit
            try:
                items = await self._queue.claim_due(
                    spec_ids, settings.worker_id, settings.lease, limit, **named
                )
            except Exception as error:
                busy.value -= limit
                self._claim_failures += 1
                text = f"claim failed: {describe_error(error)}"
                self._record_error(None, None, text)
                self._emit(RunnerEventKind.CLAIM_FAILED, detail=text)
                if isinstance(error, QueueFailed):
                    # Permanent (read-only, gone, no permission): no backoff fixes it.
                    self._log(
                        logging.ERROR,
                        "%s; giving up at once (no retry can fix this): the runner stops",
                        text,
                        error=text,
                    )
                    return error
                if self._claim_failures > settings.claim_retry.max_restarts:
                    self._log(
                        logging.ERROR,
                        "%s; giving up after %d attempts: the runner stops",
                        text,
                        self._claim_failures,
                        error=text,
                    )
                    return error
                delay = settings.claim_retry.backoff(
                    self._claim_failures, key=f"claim:{settings.worker_id}", jitter=self._jitter
                )
                self._log(
                    logging.WARNING,
                    "%s; claiming again in %.3g s (failure %d of at most %d)",
                    text,
                    delay,
                    self._claim_failures,
                    settings.claim_retry.max_restarts,
                    error=text,
                    backoff_s=delay,
                )
                self._state = RunnerState.BACKING_OFF
                await self._shutdown.sleep(delay)
                continue
            if self._claim_failures:
                self._claim_failures = 0
            self._queue_answered()
            for item in items:
                self._start(pool, evaluate, item, started)
            self._metrics.flush()
            self._count.value = len(self._in_flight)
            busy.value -= limit - len(items)
            if len(items) < limit:
                await self._wait_for_work(spec_ids, queues)
        return None

    def _combined_writes(
        self, pool: _Pool, evaluate: _Evaluate
    ) -> Callable[[list[Settlement]], Awaitable[list[bool]]] | None:
        """The settler's write when the queue runs its writes one at a time anyway and can
        settle and claim in one call (its capabilities ``SERIAL_WRITES`` and
        ``SETTLE_AND_CLAIM``), and the runner serves one queue."""
        limits = self._settings.queue_limits
        capabilities = capabilities_of(self._queue)
        if (
            Capability.SERIAL_WRITES not in capabilities
            or Capability.SETTLE_AND_CLAIM not in capabilities
            or len(limits) != 1
        ):
            return None
        combined = self._queue.settle_and_claim  # type: ignore[attr-defined]
        [(queue, concurrency)] = limits.items()
        return functools.partial(
            self._write_and_claim, combined, pool, evaluate, queue, concurrency
        )

    async def _write_and_claim(
        self,
        combined: Callable[..., Awaitable[tuple[Sequence[bool], Sequence[WorkItem]]]],
        pool: _Pool,
        evaluate: _Evaluate,
        queue: str,
        concurrency: int,
        settlements: list[Settlement],
    ) -> list[bool]:
        """Write *settlements* and, in the same queue call, claim the slots free now.

        The settler calls it right after :meth:`_taken` freed the batch's slots: they are
        reserved for this call's claim (so the claim loop does not claim them too) and what the
        claim leaves unused is given back, waking the claim loop, which then waits for work as
        after any short claim. No claim is made during shutdown, after the claim loops ended,
        or while claims are failing (the claim loop's backoff stays in charge). When the call
        fails nothing was claimed (see ``settle_and_claim``); the settler retries the writes.
        """
        settings = self._settings
        busy = self._busy[queue]
        free = concurrency - busy.value
        if not self._claims_open or self._shutdown.requested or self._claim_failures or free <= 0:
            return await self._queue.settle_many(settlements)
        limit = min(settings.claim_batch, free)
        busy.value += limit
        self._claiming.value += 1
        items: Sequence[WorkItem] = ()
        try:
            started = trio.current_time()
            results, items = await combined(
                settlements,
                self._registry.spec_ids(),
                settings.worker_id,
                settings.lease,
                limit,
                **({} if queue == DEFAULT_QUEUE else {"queue": queue}),
            )
            for item in items:
                self._start(pool, evaluate, item, started)
            self._metrics.flush()
        finally:
            if items:
                self._count.value = len(self._in_flight)
            busy.value -= limit - len(items)
            self._claiming.value -= 1
        return list(results)

    @contextlib.contextmanager
    def _until_shutdown(self) -> Iterator[None]:
        """A scope that the shutdown watcher cancels (cheaper per wait than a nursery)."""
        with trio.CancelScope() as scope:
            if self._shutdown.requested:
                scope.cancel()
            self._wait_scopes.add(scope)
            try:
                yield
            finally:
                self._wait_scopes.discard(scope)

    async def _watch_shutdown(self) -> None:
        await self._shutdown.wait()
        for scope in list(self._wait_scopes):
            scope.cancel()

    async def _wait_for_work(self, spec_ids: list[str], queues: list[str]) -> None:
        # A queue whose wake-ups are exact (see the protocol) needs no polling: under an autojump
        # clock, polling would wake the runner every poll_interval of virtual time for nothing.
        exact = Capability.EXACT_WAKEUPS in capabilities_of(self._queue)
        with trio.move_on_after(math.inf if exact else self._settings.poll_interval):
            with self._until_shutdown():
                try:
                    # Only the served queues: another queue's due items must not wake it.
                    await self._queue.wait_for_work(spec_ids, queues=queues)
                except Exception as error:
                    # The next claim reports the queue's trouble; here, just don't spin.
                    text = describe_error(error)
                    self._log(
                        logging.DEBUG,
                        "wait_for_work failed: %s; the next claim will tell",
                        text,
                        error=text,
                    )
                else:
                    return
                await trio.sleep_forever()

    def _start(self, pool: _Pool, evaluate: _Evaluate, item: WorkItem, claimed_at: float) -> None:
        entry = _InFlight(item, renewed_at=claimed_at)
        self._in_flight[entry.key] = entry  # the caller updates _count after the batch
        self._metrics.tally_claimed(item.spec_id)  # the caller flushes after the batch
        if self._on_event is not None:
            self._emit(RunnerEventKind.CLAIMED, item)
        if self._shutdown.requested:
            entry.stop(_Reason.SHUTDOWN, "claimed during shutdown")
        pool.put(entry)

    async def _drain(self) -> None:
        self._state = RunnerState.DRAINING
        self._emit(RunnerEventKind.DRAINING, detail=f"{len(self._in_flight)} in flight")
        grace = self._settings.shutdown_grace
        self._drain_log = _DrainLog(started=trio.current_time())
        self._log(
            logging.INFO,
            "draining: %d in flight; they get %g s to finish, then their leases are handed back",
            len(self._in_flight),
            grace,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._report_drain, trio.current_time() + grace)
            with trio.move_on_after(grace):
                await self._count.wait_value(0)
            nursery.cancel_scope.cancel()
        for entry in list(self._in_flight.values()):
            entry.stop(_Reason.SHUTDOWN, "shutdown grace elapsed")

    async def _report_drain(self, deadline: float) -> None:
        """Every ``DRAIN_REPORT_INTERVAL``: how many are in flight, and the longest running."""
        while True:
            await trio.sleep(DRAIN_REPORT_INTERVAL)
            entries = [e for e in self._in_flight.values() if not e.settling]
            if not entries:
                continue
            now = trio.current_time()
            longest = min(entries, key=lambda e: e.claimed_at)
            self._log(
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
        entries = list(self._in_flight.values())
        if not entries:
            return 0
        self._log(
            logging.WARNING,
            "stopping now: cancelling %d evaluations and handing their leases back "
            "(waiting at most %g s)",
            len(entries),
            bound,
        )
        for entry in entries:
            entry.stop(_Reason.SHUTDOWN, "stopping now")
        with trio.move_on_after(bound):
            await self._count.wait_value(0)
        held = [entry.item.id for entry in self._in_flight.values()]
        if held:
            self._log(
                logging.WARNING,
                "stopping now: %d leases still held (%s); they expire within %g s and another "
                "worker runs those items",
                len(held),
                ", ".join(repr(item_id) for item_id in held[:10]),
                self._settings.lease,
            )
        return len(held)

    # -- one item ------------------------------------------------------------------------------

    async def _evaluator(self, pool: _Pool, context: ContextT, settler: _Settler) -> None:
        """Evaluate the pool's waiting items until it is closed and none is waiting.

        The evaluator runs its items inside one cancel scope, which each item's ``scope`` points
        at while it is evaluated: stopping that item cancels the scope, the evaluation ends, the
        item is settled after the scope, and the evaluator goes on in a fresh scope. The happy
        path enters no scope per item and starts no task. It starts woken (see :class:`_Pool`).

        Each item sees the pool's :mod:`contextvars` context (the runner's), as a task per item
        would: an evaluation that leaves the context changed (its driver set a context variable)
        ends its evaluator, and the waiting items go to another one (see
        :func:`_context_changed`).
        """
        waiting = pool.waiting
        woken = True
        started = pool.context
        while True:
            current: _InFlight | None = None
            # When this evaluator's last evaluation ended, while it has awaited nothing since:
            # the next one starts then (one clock read per evaluation, not two; see _evaluate).
            ended: float | None = None
            try:
                with trio.CancelScope() as scope:
                    while True:
                        if woken:
                            woken = pool.waking = False
                        if not waiting:
                            if pool.closed:
                                return
                            await pool.park()
                            woken = True
                            ended = None
                            continue
                        entry = current = waiting.popleft()
                        if waiting and not pool.waking:
                            # In case this evaluation blocks: the next item gets an evaluator.
                            pool.wake()
                        entry.scope = scope
                        found = await self._evaluate(entry, context, ended)
                        ended = self._observe(entry)
                        entry.scope = None
                        current = None
                        self._hand_over(entry, settler, *found)
                        # _context_changed, spelled out: once per evaluation.
                        try:
                            changed = contextvars.copy_context() != started
                        except Exception:
                            changed = True
                        if changed:
                            self._retire(pool)
                            return
                        if entry.reason is not None and scope.cancel_called:
                            # Stopped as the evaluation ended (only a stop cancels this scope,
                            # and it sets a reason first): a fresh scope for the next.
                            break
                if current is not None:
                    # Stopped mid-evaluation (lost lease, cancel request, shutdown).
                    entry, current = current, None
                    entry.scope = None
                    self._observe(entry)
                    self._hand_over(entry, settler, None, None, None)
                    if _context_changed(started):
                        self._retire(pool)
                        return
            finally:
                if current is not None:
                    # Something escaped the evaluation (a BaseException): the slot is freed.
                    self._free(current)

    @staticmethod
    def _retire(pool: _Pool) -> None:
        """End an evaluator whose context an evaluation changed: the items waiting go to an idle
        evaluator or a new one, unless another is being woken already."""
        if pool.waiting and not pool.waking:
            pool.wake()

    def _hand_over(
        self,
        entry: _InFlight,
        settler: _Settler,
        settlement: Settlement | None,
        error: str | None,
        failure: Exception | None,
    ) -> None:
        """Give the evaluation's outcome to the settler; the slot is freed once it is written
        (at once when there is nothing to write: the lease was lost)."""
        entry.settling = True
        outcome: Settlement | None = None
        try:
            outcome = self._outcome(entry, settlement, error, failure)
        finally:
            if outcome is None:
                self._metrics.flush()  # nothing to write: its evaluation is observed now
                self._free(entry)
            else:
                settler.submit(entry, outcome)

    def _free(self, entry: _InFlight, *, batched: bool = False) -> None:
        """Drop *entry* from the in-flight set. Unless *batched* (the settler's results, whose
        slots :meth:`_taken` freed already) it frees its slot too; a batch's results update the
        in-flight count once, in :meth:`_flush_freed`."""
        if self._in_flight.pop(entry.key, None) is not None:
            if batched:
                return
            busy = self._busy.get(entry.item.queue)
            if busy is not None and busy.value > 0:
                busy.value -= 1
        self._count.value = len(self._in_flight)

    def _taken(self, batch: list[tuple[_InFlight, Settlement]]) -> None:
        """The settler took *batch* for a write: free its slots, once per queue (waking the
        claim loops once), so that the next claim runs beside the write.

        An item being written is no longer evaluated; it stays in flight (its lease renewed,
        drain waiting for it) until the write's answer. At most one batch is being written at
        a time, so a queue holds at most its concurrency plus one settle batch of items.
        """
        self._metrics.flush()  # the batch's evaluations are observed as it is taken
        if len(self._busy) == 1:
            [busy] = self._busy.values()
            busy.value = max(0, busy.value - len(batch))
            return
        freed = self._freed
        for entry, _ in batch:
            freed[entry.item.queue] += 1
        for queue, n in freed.items():
            slots = self._busy.get(queue)
            if slots is not None:
                slots.value = max(0, slots.value - n)
        freed.clear()

    def _flush_freed(self) -> None:
        """After a written batch's results: apply its counts, update the in-flight count once."""
        self._metrics.flush()
        self._count.value = len(self._in_flight)

    def _observe(self, entry: _InFlight) -> float | None:
        """Observe how long *entry*'s driver ran (if it ran); the time it read, if it did."""
        started = entry.evaluating_since
        if started is None:
            return None
        entry.evaluating_since = None
        now = self._time()
        self._metrics.observe_evaluation(entry.item.spec_id, now - started)
        return now

    async def _evaluate(
        self, entry: _InFlight, context: ContextT, since: float | None = None
    ) -> tuple[Settlement | None, str | None, Exception | None]:
        """Run *entry*'s driver (unless it is stopped already or out of attempts): (settlement,
        error, the exception). Cancelled when the item is stopped meanwhile. The caller
        observes how long it ran (:meth:`_observe`).

        *since* is when the evaluator's previous evaluation ended, if it has awaited nothing
        since (the clock as it read it there): this evaluation starts then, so that items
        evaluated back to back read the clock once each (under an autojump clock, a read costs
        twice the real clock's; issue 17's P4). Its observed duration then includes the
        runner's own hand-over of the previous outcome, a few microseconds.
        """
        item = entry.item
        settlement: Settlement | None = None
        error: str | None = None
        failure: Exception | None = None
        if entry.reason is None and (
            item.cancel_requested or (item.attempt > (self._settings.max_attempts or item.attempt))
        ):
            # Not evaluated (the rule's first half): cancelled, or claimed too often (say, its
            # worker killed mid-evaluation every time): dead. _outcome observes it.
            settlement = settlement_before(item, self._settings)
        elif entry.reason is None:
            entry.evaluating_since = self._time() if since is None else since
            try:
                settlement = await evaluate_item(
                    self._registry.for_spec(item.spec_id),
                    context,
                    item,
                    requeue_delay=self._settings.requeue_delay,
                )
            except Exception as exc:
                error, failure = describe_failure(exc), exc
        return settlement, error, failure

    def _outcome(
        self,
        entry: _InFlight,
        settlement: Settlement | None,
        error: str | None,
        failure: Exception | None,
    ) -> Settlement | None:
        """The settlement to write for *entry*'s evaluation, or None when the lease was lost."""
        item = entry.item
        settings = self._settings
        reason = entry.reason
        # Most evaluations end with an outcome and were not stopped: no rule to apply (the
        # rule, settlement_after, returns the outcome itself then).
        if reason is not None or error is not None or settlement is None:
            if reason is _LOST:
                self._metrics.for_spec(self._metrics.failed, item.spec_id).inc()
                self._record_error(item.id, item.spec_id, f"lease lost: {entry.detail}")
                self._emit(RunnerEventKind.OUTCOME, item, detail="lease-lost")
                return None
            decided = settlement_after(
                item, settlement, error, reason, entry.detail, settings, self._jitter
            )
            assert decided is not None  # only a lost lease writes nothing
            failed = decided is not settlement and decided.kind in _FAILED
            settlement = decided
            if failed:
                self._metrics.for_spec(self._metrics.failed, item.spec_id).inc()
                self._record_error(item.id, item.spec_id, first_line(decided.error))
                log_failure(logger, settings, item, decided, None if reason else failure)
        else:
            failed = False
        if settlement.kind is _DEAD and settlement.error is not None and not failed:
            # Failed for good without an error of its own: by the evaluation itself (Discard,
            # a config that cannot fit, an outcome that cannot be stored), or unevaluated (it
            # was claimed more than max_attempts times).
            self._metrics.for_spec(self._metrics.failed, item.spec_id).inc()
            self._record_error(item.id, item.spec_id, first_line(settlement.error))
            evaluated = attempts_exhausted(item, settings) is None
            log_dead(logger, settings.worker_id, item, settlement.error, evaluated=evaluated)
        if item.parent_id is None:
            _S_PARENTLESS(settlement, True)
        if self._on_event is not None:
            detail = str(settlement.kind)
            if settlement.error is not None:
                detail = f"{detail}: {first_line(settlement.error)}"
            self._emit(RunnerEventKind.OUTCOME, item, detail=detail)
        return settlement

    def _written(
        self, entry: _InFlight, settlement: Settlement, applied: bool, error: Exception | None
    ) -> float | None:
        """The settler wrote (or failed to write) the outcome: account for it, free the slot.

        Returns the delay before writing it again, when the write failed transiently and the
        lease is still valid: the slot (and the lease, renewed meanwhile) stays held till then.
        """
        retry: float | None = None
        try:
            retry = self._account(entry, settlement, applied, error)
        finally:
            if retry is None:
                self._free(entry, batched=True)
            else:
                # Waiting to be written again: the item takes a slot again meanwhile (the next
                # batch that takes it frees it), so failing writes cannot grow the in-flight set.
                busy = self._busy.get(entry.item.queue)
                if busy is not None:
                    busy.value += 1
        return retry

    def _account(
        self, entry: _InFlight, settlement: Settlement, applied: bool, error: Exception | None
    ) -> float | None:
        item = entry.item
        if error is not None:
            text = f"writing {settlement.kind} failed: {describe_error(error)}"
            self._queue_unreachable(error)
            delay = self._write_retry_delay(entry, error)
            if delay is not None:
                self._emit(RunnerEventKind.SETTLE_FAILED, item, detail=f"{text}; retrying")
                self._log(
                    logging.WARNING,
                    "item %r (spec %r): %s; writing it again in %.3g s (attempt %d, the lease "
                    "is held)",
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
            self._metrics.for_spec(self._metrics.settlements_abandoned, item.spec_id).inc()
            self._drained(entry, "not written")
            self._record_error(item.id, item.spec_id, text)
            self._emit(RunnerEventKind.SETTLE_FAILED, item, detail=text)
            self._log(
                logging.ERROR,
                "item %r (spec %r): %s; giving up: its lease will expire and another claim "
                "runs it again",
                item.id,
                item.spec_id,
                text,
                item=item,
                error=text,
            )
            return None
        if self._state is _BACKING_OFF and not self._claim_failures:  # _queue_answered's test
            self._state = _RUNNING
        if applied:
            self._metrics.tally_settled(settlement.kind, item.spec_id)  # see _flush_freed
            if self._state is _DRAINING:
                self._drained(entry, str(settlement.kind))
            if self._on_event is not None:
                self._emit(RunnerEventKind.SETTLED, item, detail=str(settlement.kind))
            return None
        self._metrics.for_spec(self._metrics.settlements_refused, item.spec_id).inc()
        self._drained(entry, "not written")
        text = f"{settlement.kind} refused: the lease was lost (another worker may run the item)"
        if entry.write_failures:
            text = f"{text}; after {entry.write_failures} failed attempts, one may have landed"
        self._record_error(item.id, item.spec_id, text)
        self._emit(RunnerEventKind.SETTLE_REFUSED, item, detail=str(settlement.kind))
        self._log(
            logging.WARNING,
            "item %r (spec %r): %s; nothing was written",
            item.id,
            item.spec_id,
            text,
            item=item,
            error=text,
        )
        return None

    def _drained(self, entry: _InFlight, outcome: str) -> None:
        """While draining, log each item once as it leaves, and count it for the summary."""
        if self._state is not RunnerState.DRAINING:
            return
        self._drain_log.outcomes[outcome] += 1
        item = entry.item
        ran = trio.current_time() - entry.claimed_at
        if outcome == "release":
            what = "handed back (lease released, due again at once)"
        elif outcome == "not written":
            what = "left without its outcome written (see above)"
        else:
            what = f"finished ({outcome})"
        self._log(
            logging.INFO,
            "draining: item %r (spec %r) %s after %.3g s",
            item.id,
            item.spec_id,
            what,
            ran,
            item=item,
        )

    def _write_retry_delay(self, entry: _InFlight, error: Exception) -> float | None:
        """How long to wait before writing *entry*'s outcome again, or None to give up (see
        :func:`write_retry_delay`); the lease as last renewed, by this runner's renewal loop."""
        now = trio.current_time()
        entry.write_failures += 1
        if entry.first_write_failure is None:
            entry.first_write_failure = now
        if entry.reason is _Reason.LOST:
            return None
        return write_retry_delay(
            error,
            item_id=entry.item.id,
            attempt=entry.write_failures,
            lease_left=entry.renewed_at + self._settings.lease - now,
            failing_for=now - entry.first_write_failure,
            settings=self._settings,
            jitter=self._jitter,
        )

    # -- renewals ------------------------------------------------------------------------------

    async def _sleep_while_busy(self, deadline: float) -> bool:
        """Sleep until *deadline* (True), or until nothing is in flight, whichever is first
        (False).

        The renewal loop and the loop-lag watchdog sleep so: once the last item in flight is
        settled they have nothing to do, and a sleep left to run out would be a wake-up with
        nothing to do. Under an autojump clock every such wake-up is a jump of its own: a
        simulated day of one daily workflow was three jumps (the renewal round's deadline, the
        watchdog's, the next due time) where one does (issue 17's P4).
        """
        with trio.move_on_at(deadline):
            await self._count.wait_value(_idle)
            return False
        return True

    async def _renewal_loop(self) -> None:
        interval = self._settings.renew_interval
        deadline = trio.current_time() + interval
        while True:
            if not self._in_flight:
                # Nothing to renew: sleep until something is claimed, then keep the cadence.
                await self._count.wait_value(_busy)
                now = trio.current_time()
                if deadline <= now:
                    deadline += math.ceil((now - deadline) / interval) * interval
            if not await self._sleep_while_busy(deadline):
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
        due: dict[str, _InFlight] = {}
        for entry in list(self._in_flight.values()):
            if entry.reason is _Reason.LOST or now - entry.renewed_at < interval / 2:
                continue
            other = due.get(entry.item.id)
            if other is not None:
                # We hold a newer claim of the same item: the older lease is stale for sure.
                older, entry = sorted((other, entry), key=lambda e: e.item.lease_version)
                self._lose(older, "superseded by a newer claim")
            due[entry.item.id] = entry
        if not due:
            return
        # In chunks, with a checkpoint between: a round over thousands of leases must not block
        # the event loop (the drivers, the watchdog) for its whole length.
        entries = list(due.values())
        for start in range(0, len(entries), RENEWAL_CHUNK):
            if start:
                await trio.lowlevel.checkpoint()
            chunk = [e for e in entries[start : start + RENEWAL_CHUNK] if self._is_held(e)]
            failed = await self._renew_chunk(chunk, interval) if chunk else None
            if failed is not None:
                # The queue failed: the rest of the round would fail the same way.
                rest = [e for e in entries[start:] if self._is_held(e)]
                self._log(
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

    def _is_held(self, entry: _InFlight) -> bool:
        """Whether *entry* is still in flight (not written and freed meanwhile)."""
        return self._in_flight.get(entry.key) is entry

    async def _renew_chunk(self, chunk: list[_InFlight], interval: float) -> str | None:
        """Renew *chunk*'s leases in one ``renew_many`` call; the error if the call failed (the
        caller then accounts for the failure)."""
        settings = self._settings
        now = trio.current_time()
        leases = []
        for entry in chunk:
            lease = entry.lease
            if lease is None:
                item = entry.item
                lease = entry.lease = Lease(item.id, item.lease_version, settings.worker_id)
            leases.append(lease)
        try:
            statuses = await self._queue.renew_many(leases, settings.lease)
        except Exception as error:
            self._queue_unreachable(error)
            return describe_error(error)
        self._queue_answered()
        emit = self._on_event is not None
        for entry in chunk:
            if self._in_flight.get(entry.key) is not entry:
                continue  # written meanwhile
            status = statuses.get(entry.item.id, LeaseStatus.LOST)
            if entry.settling:
                # Being written (perhaps again, after a failed write): a LOST here may be the
                # settlement's own doing, and the write's answer is the truth; a renewal that
                # landed keeps the lease valid for the next attempt.
                if status is not LeaseStatus.LOST:
                    entry.renewed_at = now
                continue
            if status is LeaseStatus.LOST:
                self._lose(entry, "renewal refused")
                continue
            entry.renewed_at = now
            if emit:
                self._emit(RunnerEventKind.RENEWED, entry.item, detail=str(status))
            if status is LeaseStatus.CANCEL_REQUESTED and entry.reason is not (
                _Reason.CANCEL_REQUESTED
            ):
                self._emit(RunnerEventKind.CANCEL_REQUESTED, entry.item)
                entry.stop(_Reason.CANCEL_REQUESTED, "cancel requested")
        return None

    def _renewal_failed(self, entries: list[_InFlight], text: str, interval: float) -> None:
        """A renewal call failed: count it for *entries*, and stop those whose lease would run
        out before the next round (the others keep evaluating while their leases last)."""
        lease = self._settings.lease
        for entry in entries:
            self._metrics.for_spec(self._metrics.renewals_failed, entry.item.spec_id).inc()
            self._emit(RunnerEventKind.RENEWAL_FAILED, entry.item, detail=text)
            if not entry.settling and (entry.renewed_at + lease - trio.current_time() <= interval):
                entry.stop(_Reason.RENEWAL_FAILED, text)

    # -- the loop-lag watchdog ------------------------------------------------------------------

    async def _watch_loop_lag(self) -> None:
        """Measure how late the event loop wakes a short sleep, while anything is in flight.

        ``trio.current_time()`` is the run's clock: in production Trio's default clock, a
        monotonic wall clock, so a driver that blocks the thread (a blocking ten-second sleep) shows
        up as a wake-up 10 s late. Under an autojump clock, time stands still while the loop is
        busy, so the lag is zero unless a test jumps the clock without yielding. The watchdog
        sleeps only while items are in flight (an idle runner under virtual time costs
        nothing), four times per renewal interval.
        """
        settings = self._settings
        interval = settings.renew_interval / _LAG_CHECKS_PER_RENEWAL
        lag_metric = self._metrics.loop_lag_seconds
        while True:
            if not self._in_flight:
                await self._count.wait_value(_busy)
            expected = trio.current_time() + interval
            if not await self._sleep_while_busy(expected):
                continue  # idle: nothing a late wake-up could put at risk
            woke = trio.current_time()
            lag = max(0.0, woke - expected)
            lag_metric.observe(lag)
            if lag <= settings.lease * LAG_WARNING_FRACTION:
                continue  # harmless (lease_risk says None): no list of 10,000 entries to build
            entries = [(e.item.id, e.renewed_at) for e in self._in_flight.values()]
            warning = lease_risk(entries, woke=woke, lag=lag, lease=settings.lease)
            if warning is not None:
                self._record_error(None, None, warning)
                self._log(logging.WARNING, "%s", warning, error=warning)

    def _queue_unreachable(self, error: Exception) -> None:
        """A renewal or write found the queue unreachable: show it until a call succeeds."""
        if isinstance(error, QueueUnavailable) and self._state is RunnerState.RUNNING:
            self._state = RunnerState.BACKING_OFF

    def _queue_answered(self) -> None:
        if self._state is _BACKING_OFF and not self._claim_failures:
            self._state = _RUNNING

    def _lose(self, entry: _InFlight, detail: str) -> None:
        item = entry.item
        self._log(
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
        self._metrics.for_spec(self._metrics.renewals_failed, entry.item.spec_id).inc()
        self._emit(RunnerEventKind.LEASE_LOST, entry.item, detail=detail)
        entry.stop(_Reason.LOST, detail)

    # -- bookkeeping ---------------------------------------------------------------------------

    def _log(
        self,
        level: int,
        message: str,
        *args: object,
        item: WorkItem | None = None,
        error: str | None = None,
        backoff_s: float | None = None,
    ) -> None:
        """One runner log record: the message says what happened and what comes next; ``extra``
        carries the structured fields (see :func:`log_fields`)."""
        logger.log(
            level,
            message,
            *args,
            stacklevel=2,
            extra=log_fields(self._settings.worker_id, item, error=error, backoff_s=backoff_s),
        )

    def _record_error(self, item_id: str | None, spec_id: str | None, error: str) -> None:
        self._errors.append(
            RecentError(item_id=item_id, spec_id=spec_id, error=error, at=self._queue.clock.now())
        )

    def _emit(
        self, kind: RunnerEventKind, item: WorkItem | None = None, *, detail: str = ""
    ) -> None:
        if self._on_event is None:
            return
        event = RunnerEvent(
            kind=kind,
            item_id=None if item is None else item.id,
            spec_id=None if item is None else item.spec_id,
            lease_version=None if item is None else item.lease_version,
            detail=detail,
        )
        try:
            self._on_event(event)
        except Exception:
            logger.exception(
                "on_event callback failed for %s; the runner goes on",
                event,
                extra=log_fields(self._settings.worker_id, item),
            )
