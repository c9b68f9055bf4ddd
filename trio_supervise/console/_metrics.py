"""Bounded reads of the queue, and the Prometheus collectors that export them.

A Prometheus collector is called synchronously during exposition, so it cannot ask the queue
itself: ``/metrics`` awaits each collector's ``refresh()`` just before rendering, and the console
reads the same answers. Every read is a :class:`SharedRead`: at most one per
:data:`SCRAPE_CACHE_SECONDS`, however many clients scrape or look, one in flight at a time.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Generic, TypeVar

import attrs
import trio
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from ..maintenance import Schedule, last_fire
from ..queues import ItemState, KeyRateLimitStore, QueueInfo, WorkItem, WorkQueue
from ..queues._ports import Capability, capabilities_of

__all__ = [
    "SCRAPE_CACHE_SECONDS",
    "QueueDepthCollector",
    "QueueRead",
    "QueueReads",
    "ScheduleCollector",
    "SharedRead",
]

logger = logging.getLogger("trio_supervise.http")

T = TypeVar("T")

_QUEUE_TIMEOUT = 5.0
"""Seconds a request waits for the queue before showing what it has without it."""

SCRAPE_CACHE_SECONDS = 1.0
"""How long one read of the queue (counts, the due-soon rows) serves every scrape and page."""

_SCAN_PAGE = 200
_SCAN_ROWS = 1000
"""The most overdue queued items read (in pages of 200) to find a paused queue's oldest."""
_LAST_FIRE_LOOKUPS = 50
"""The most past fires looked up, per schedule and read, to find its last one."""


@attrs.frozen
class _Read(Generic[T]):
    value: T | None
    problem: str | None  # why there is no value: the error, or "timed out"


@attrs.define(eq=False)
class SharedRead(Generic[T]):
    """One read of the queue shared by every request for *max_age* seconds (Trio's clock).

    At most one read is in flight: requests that arrive while it runs wait for it and share its
    answer. A failure (or no answer within 5 s) is shared too, so a struggling queue is not asked
    harder. A cancelled read leaves nothing behind; the next request reads again.
    """

    _read: Callable[[], Awaitable[T]] = attrs.field(alias="read")
    _what: str = attrs.field(alias="what")
    max_age: float = attrs.field(default=SCRAPE_CACHE_SECONDS, kw_only=True)
    reads: int = attrs.field(init=False, default=0)
    """How many times the queue was read (for tests and curiosity)."""
    _last: _Read[T] | None = attrs.field(init=False, default=None)
    _read_at: float = attrs.field(init=False, default=-math.inf)
    _in_flight: trio.Event | None = attrs.field(init=False, default=None)
    _answered: int = attrs.field(init=False, default=0)  # the read whose answer _last is

    async def get(self) -> _Read[T]:
        """The last answer if fresh, else a new one (or the one being read now)."""
        while True:
            if self._last is not None and trio.current_time() - self._read_at < self.max_age:
                await trio.lowlevel.checkpoint()
                return self._last
            if self._in_flight is not None:
                generation = self.reads
                await self._in_flight.wait()
                if self._last is not None and self._answered == generation:
                    return self._last
                continue  # that read was cancelled: read again
            done = self._in_flight = trio.Event()
            try:
                last = self._last = await self._fetch()
                self._read_at = trio.current_time()
                self._answered = self.reads
            finally:
                self._in_flight = None
                done.set()
            return last

    def invalidate(self) -> None:
        """Forget the last answer: the next request reads again (after a change made here, so
        that the page it leads to shows it)."""
        self._last = None

    async def _fetch(self) -> _Read[T]:
        self.reads += 1
        with trio.move_on_after(_QUEUE_TIMEOUT):
            try:
                return _Read(await self._read(), None)
            except Exception as error:
                logger.warning("%s failed", self._what, exc_info=True)
                return _Read(None, f"{type(error).__name__}: {error}")
        return _Read(None, "timed out")


def _label(text: str) -> str:
    """A Prometheus label value that encodes (lone surrogates shown as escapes)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _age(due: dt.datetime | None, now: dt.datetime) -> float:
    """Seconds since *due* (0 when it is None or still to come)."""
    return 0.0 if due is None else max(0.0, (now - due).total_seconds())


@attrs.frozen(kw_only=True)
class QueueRead:
    """One read of the queue's lags: per spec, and per named queue with the queues themselves."""

    spec_lags: Mapping[str, float]
    queues: Sequence[QueueInfo]
    queue_lags: Mapping[str, float]
    scanned_all: bool = True
    """False when a paused queue's oldest item was looked for past the scan's bound."""
    throttled_keys: int | None = None
    """How many concurrency keys their rate limit holds back now (None: the store keeps no
    key rate limits)."""


async def oldest_overdue(
    queue: WorkQueue, queues: set[str], now: dt.datetime
) -> tuple[dict[tuple[str, str], dt.datetime], bool]:
    """The oldest due time of a queued, not waiting item per ``(queue, spec)`` of *queues*,
    among the overdue items read by due time (``list_items``' keyset order, at most
    :data:`_SCAN_ROWS`); and whether every overdue item was read.

    ``next_due_at`` skips paused queues (nothing may be claimed from them), so a paused queue's
    backlog is found here instead.
    """
    found: dict[tuple[str, str], dt.datetime] = {}
    after: str | None = None
    read = 0
    while read < _SCAN_ROWS:
        page = await queue.list_items(states=[ItemState.QUEUED], limit=_SCAN_PAGE, after=after)
        for item in page:
            if item.due_at > now:
                return found, True
            if item.queue in queues and not item.waiting:
                found.setdefault((item.queue, item.spec_id), item.due_at)
        read += len(page)
        if len(page) < _SCAN_PAGE:
            return found, True
        after = page[-1].id
    return found, False


_QUEUE_FAMILIES: dict[str, tuple[str, str, list[str]]] = {
    "items": (
        "trio_supervise_queue_items",
        "Work items in the queue by spec and state, read at scrape time.",
        ["spec", "state"],
    ),
    "lag": (
        "trio_supervise_queue_lag_seconds",
        "Seconds the oldest due, unclaimed item of the spec has waited (0: none overdue).",
        ["spec"],
    ),
    "named": (
        "trio_supervise_named_queue_items",
        "Work items in each named queue by state, read at scrape time.",
        ["queue", "state"],
    ),
    "paused": (
        "trio_supervise_named_queue_paused",
        "1 while the named queue is paused (nothing is claimed from it), else 0.",
        ["queue"],
    ),
    "paused_at": (
        "trio_supervise_named_queue_paused_timestamp_seconds",
        "When the named queue was paused (Unix time); only paused queues have one.",
        ["queue"],
    ),
    "named_lag": (
        "trio_supervise_named_queue_lag_seconds",
        "Seconds the oldest due item of the named queue has waited, paused or not.",
        ["queue"],
    ),
    "limit": (
        "trio_supervise_named_queue_concurrency_limit",
        "How many items of the named queue this service's runner evaluates at once.",
        ["queue"],
    ),
    "throttled": (
        "trio_supervise_named_queue_throttled",
        "1 while the named queue's rate limit holds its items back (its window is full), else 0.",
        ["queue"],
    ),
    "rate_limit": (
        "trio_supervise_named_queue_rate_limit",
        "How many items of the named queue may start in any rate period, fleet-wide.",
        ["queue"],
    ),
    "rate_period": (
        "trio_supervise_named_queue_rate_period_seconds",
        "The period of the named queue's rate limit, in seconds.",
        ["queue"],
    ),
    "throttled_keys": (
        "trio_supervise_throttled_keys",
        "How many concurrency keys their rate limit holds back now (their window is full).",
        [],
    ),
    "up": ("trio_supervise_queue_up", "1 if the queue answered the last scrape, else 0.", []),
}
"""The queue collector's gauges: name, help and labels, in exposition order."""


@attrs.define(eq=False)
class QueueDepthCollector:
    """Exports the queue's counts by spec and state, each spec's lag, and each named queue's
    counts, pause and lag, as last read by :meth:`refresh`.

    The counts come from a :class:`SharedRead` (the status page shares it), the lags and named
    queues from another, so scrapes never read more than once a :data:`SCRAPE_CACHE_SECONDS`.

    Every spec the queue has shown once stays known: its ``queue_items`` series report 0 for
    each state it has no items in (rather than vanishing, which alerting reads as "no data"),
    and its ``queue_lag_seconds`` is how long the oldest due, unclaimed item has been waiting
    (from ``next_due_at([spec])``: a queued item past its due time, or an expired lease
    waiting for rescue; and, in a paused queue, a queued item past its due time), 0 when
    nothing is overdue. Likewise every named queue once seen: ``named_queue_items{queue,state}``,
    ``named_queue_paused{queue}``, ``named_queue_lag_seconds{queue}`` (a paused queue's lag
    keeps growing while its items wait), ``named_queue_throttled{queue}`` (1 while its rate
    limit holds its items back; their lag does not grow meanwhile: they are not due) and, for a
    rate-limited queue, ``named_queue_rate_limit{queue}`` and
    ``named_queue_rate_period_seconds{queue}``; with key rate limits, ``throttled_keys`` (how
    many keys their rate holds back now: a count, not a series per tenant). While the queue
    does not answer, only ``queue_up 0`` is exported: zeros would claim an empty queue.

    :param limits: each queue the service's runner serves, with its concurrency, exported as
        ``named_queue_concurrency_limit{queue}`` (None: no runner here).
    """

    _queue: WorkQueue = attrs.field(alias="queue")
    _source: SharedRead[Mapping[tuple[str, ItemState], int]] | None = attrs.field(
        default=None, alias="source"
    )
    limits: Mapping[str, int] | None = attrs.field(default=None, kw_only=True)
    _counts: Mapping[tuple[str, ItemState], int] = attrs.field(init=False, factory=dict)
    _up: bool = attrs.field(init=False, default=False)
    _specs: set[str] = attrs.field(init=False, factory=set)
    _names: set[str] = attrs.field(init=False, factory=set)
    _lag_source: SharedRead[QueueRead] = attrs.field(init=False)
    _read: QueueRead | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        if self._source is None:
            self._source = SharedRead(self._counts_now, what="queue counts")
        self._lag_source = SharedRead(self._lags_now, what="queue lag")

    async def _counts_now(self) -> Mapping[tuple[str, ItemState], int]:
        return dict(await self._queue.counts())

    async def _lags_now(self) -> QueueRead:
        queue = self._queue
        spec_lags: dict[str, float] = {}
        for spec_id in sorted(self._specs):
            spec_lags[spec_id] = _age(await queue.next_due_at([spec_id]), queue.clock.now())
        infos = await queue.list_queues()
        queue_lags: dict[str, float] = {}
        specs = sorted(self._specs)
        for info in infos:
            if not info.paused:
                due = await queue.next_due_at(specs, queues=[info.name]) if specs else None
                queue_lags[info.name] = _age(due, queue.clock.now())
        paused = {info.name for info in infos if info.paused}
        scanned_all = True
        if paused:
            now = queue.clock.now()
            oldest, scanned_all = await oldest_overdue(queue, paused, now)
            for name in paused:
                queue_lags[name] = 0.0
            for (name, spec_id), due in oldest.items():
                queue_lags[name] = max(queue_lags[name], _age(due, now))
                spec_lags[spec_id] = max(spec_lags.get(spec_id, 0.0), _age(due, now))
        throttled = None
        if Capability.KEY_RATE_LIMITS in capabilities_of(queue) and isinstance(
            queue, KeyRateLimitStore
        ):
            throttled = len(await queue.throttled_keys())
        return QueueRead(
            spec_lags=spec_lags,
            queues=infos,
            queue_lags=queue_lags,
            scanned_all=scanned_all,
            throttled_keys=throttled,
        )

    @property
    def source(self) -> SharedRead[Mapping[tuple[str, ItemState], int]]:
        """Where the counts come from (shared with the status page)."""
        assert self._source is not None
        return self._source

    def invalidate(self) -> None:
        """Read the queue afresh at the next refresh (see :meth:`SharedRead.invalidate`)."""
        self.source.invalidate()
        self._lag_source.invalidate()

    @property
    def read(self) -> QueueRead | None:
        """The lags and named queues as last read (None before the first good read)."""
        return self._read

    async def refresh(self) -> Mapping[tuple[str, ItemState], int]:
        """The counts, read at most once per cache window; on failure report the queue down."""
        read = await self.source.get()
        self._counts = read.value or {}
        self._specs.update(spec_id for spec_id, _ in self._counts)
        lags = await self._lag_source.get() if read.value is not None else None
        self._up = read.value is not None and lags is not None and lags.value is not None
        self._read = None if lags is None else lags.value
        if self._read is not None:
            self._names.update(info.name for info in self._read.queues)
        return self._counts

    def collect(self) -> Iterable[Metric]:
        made = {
            key: GaugeMetricFamily(name, text, labels=labels)
            for key, (name, text, labels) in _QUEUE_FAMILIES.items()
        }
        items, lag, named = made["items"], made["lag"], made["named"]
        paused, paused_at, named_lag, limit = (
            made["paused"],
            made["paused_at"],
            made["named_lag"],
            made["limit"],
        )
        read = self._read
        if self._up and read is not None:
            for spec_id in sorted(self._specs):
                for state in ItemState:
                    count = self._counts.get((spec_id, state), 0)
                    items.add_metric([_label(spec_id), str(state)], count)
                if spec_id in read.spec_lags:
                    lag.add_metric([_label(spec_id)], read.spec_lags[spec_id])
            infos = {info.name: info for info in read.queues}
            for name in sorted(self._names):
                info = infos.get(name, QueueInfo(name=name))
                label = _label(name)
                for state in ItemState:
                    named.add_metric([label, str(state)], info.counts.get(state, 0))
                paused.add_metric([label], 1 if info.paused else 0)
                if info.paused_at is not None and info.paused:
                    paused_at.add_metric([label], info.paused_at.timestamp())
                named_lag.add_metric([label], read.queue_lags.get(name, 0.0))
                made["throttled"].add_metric([label], 0 if info.throttled_until is None else 1)
                if info.rate_limit is not None:
                    made["rate_limit"].add_metric([label], info.rate_limit.limit)
                    made["rate_period"].add_metric([label], info.rate_limit.period)
            if read.throttled_keys is not None:
                made["throttled_keys"].add_metric([], read.throttled_keys)
        for name, concurrency in sorted((self.limits or {}).items()):
            limit.add_metric([_label(name)], concurrency)
        made["up"].add_metric([], 1 if self._up else 0)
        return list(made.values())


@attrs.define(eq=False)
class ScheduleCollector:
    """Exports each schedule's next fire (from its cron and the queue's clock) and last fire
    (found as its scheduler finds fires, looking back at most 50 of them) as Unix timestamps:
    ``trio_supervise_schedule_next_fire_timestamp_seconds{schedule}`` and
    ``..._last_fire_timestamp_seconds{schedule}`` (absent until one is found)."""

    _queue: WorkQueue = attrs.field(alias="queue")
    schedules: Sequence[Schedule]
    cache_for: float = attrs.field(default=SCRAPE_CACHE_SECONDS, kw_only=True)
    _source: SharedRead[Mapping[str, dt.datetime | None]] = attrs.field(init=False)
    _last: Mapping[str, dt.datetime | None] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        self._source = SharedRead(self._last_fires, what="last fires", max_age=self.cache_for)

    async def _last_fires(self) -> Mapping[str, dt.datetime | None]:
        now = self._queue.clock.now()
        return {
            s.name: await last_fire(self._queue, s, now, lookups=_LAST_FIRE_LOOKUPS)
            for s in self.schedules
        }

    def invalidate(self) -> None:
        """Look the last fires up afresh at the next refresh."""
        self._source.invalidate()

    async def refresh(self) -> Mapping[str, dt.datetime | None]:
        """Each schedule's last fire (None: none found), read at most once per cache window;
        empty while the queue does not answer."""
        read = await self._source.get()
        self._last = read.value or {}
        return self._last

    def collect(self) -> Iterable[Metric]:
        upcoming = GaugeMetricFamily(
            "trio_supervise_schedule_next_fire_timestamp_seconds",
            "When the schedule fires next (Unix time).",
            labels=["schedule"],
        )
        last = GaugeMetricFamily(
            "trio_supervise_schedule_last_fire_timestamp_seconds",
            "The latest fire of the schedule that has an item (Unix time).",
            labels=["schedule"],
        )
        now = self._queue.clock.now()
        for schedule in self.schedules:
            label = _label(schedule.name)
            fire = schedule.next_fire(now)
            if fire is not None:
                upcoming.add_metric([label], fire.timestamp())
            found = self._last.get(schedule.name)
            if found is not None:
                last.add_metric([label], found.timestamp())
        return [upcoming, last]


@attrs.define(eq=False, kw_only=True)
class QueueReads:
    """The bounded reads of one queue that ``/metrics`` and the console share: its counts (the
    depth collector's), its due-soon items and its schedules' last fires."""

    depth: QueueDepthCollector
    due: SharedRead[Sequence[WorkItem]]
    fires: ScheduleCollector | None = None

    @classmethod
    def register(
        cls,
        queue: WorkQueue,
        registry: CollectorRegistry,
        *,
        schedules: Sequence[Schedule],
        limits: Mapping[str, int] | None,
        due_limit: int,
        cache_for: float,
    ) -> QueueReads:
        """The reads of *queue*, their collectors registered on *registry* (a schedule
        collector only with *schedules*); one read serves every caller for *cache_for* s."""
        depth = QueueDepthCollector(queue, limits=limits)
        depth.source.max_age = cache_for
        registry.register(depth)
        fires = None
        if schedules:
            fires = ScheduleCollector(queue, schedules, cache_for=cache_for)
            registry.register(fires)

        async def due() -> Sequence[WorkItem]:
            return await queue.list_items(states=[ItemState.QUEUED], limit=due_limit)

        return cls(
            depth=depth,
            due=SharedRead(due, what="status page due items", max_age=cache_for),
            fires=fires,
        )

    def invalidate(self) -> None:
        """Read everything afresh next time (after an action, to show what it changed)."""
        self.depth.invalidate()
        if self.fires is not None:
            self.fires.invalidate()
        self.due.invalidate()
