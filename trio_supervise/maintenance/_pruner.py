"""The pruner, a maintenance task: finished items deleted once older than their state's
retention (:class:`RetentionSettings`, the ``[retention]`` table, and the periods it is written
in), in short batches that never hold claims up, and never younger than a catching-up schedule
looks back. The contract is docs/operations.md ("Retention").
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, NewType, cast

import attrs
import trio
from prometheus_client import CollectorRegistry, Counter

from .._errors import QueueUnavailable
from .._policy import RestartPolicy
from ..queues import ItemState, WorkQueue
from ..queues._ports import AuditStore, Capability, KeyRateLimitStore, capabilities_of
from ._schedule import MissedFires, Schedule

__all__ = [
    "DEFAULT_RETENTION",
    "Period",
    "PruneMetrics",
    "Pruner",
    "RetentionSettings",
    "format_period",
    "parse_period",
]

logger = logging.getLogger("trio_supervise.retention")

Period = NewType("Period", float)
"""A duration in seconds, read from a number of seconds or from text such as ``"90s"``,
``"15m"``, ``"12h"``, ``"7d"`` or ``"2w"`` (:func:`parse_period`)."""

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 7 * 86_400.0}
_PERIOD = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_FOREVER = frozenset({"none", "forever", "never"})
_MAX_PERIOD = 365 * 86_400.0


def parse_period(value: object, *, what: str = "period", forever: bool = False) -> float:
    """*value* (seconds, or text like ``"7d"``) in seconds; ``ValueError`` naming *what*.

    With *forever*, ``0``, ``"0"`` and ``"none"`` / ``"forever"`` / ``"never"`` mean "keep for
    ever" and come back as ``0.0``; without it the period must be positive. At most 365 days.
    """
    rule = (
        "a number of seconds or text like '90s', '15m', '12h', '7d', '2w'"
        + (" ('none' or 0: keep for ever)" if forever else "")
        + ", at most 365 days"
    )
    seconds: float
    if isinstance(value, bool):
        raise ValueError(f"{what} must be {rule}, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        if forever and text in _FOREVER:
            return 0.0
        match = _PERIOD.match(text)
        if match is not None:
            seconds = float(match[1]) * _UNITS[match[2]]
        else:
            try:
                seconds = float(text)
            except ValueError:
                raise ValueError(f"{what} must be {rule}, got {value!r}") from None
    else:
        raise ValueError(f"{what} must be {rule}, got {value!r}")
    if not math.isfinite(seconds) or seconds < 0 or seconds > _MAX_PERIOD:
        raise ValueError(f"{what} must be {rule}, got {value!r}")
    if seconds == 0 and not forever:
        raise ValueError(f"{what} must be positive: {rule}, got {value!r}")
    return seconds


def format_period(seconds: float) -> str:
    """*seconds* in the largest unit that divides it (``604800`` → ``"7d"``); 0 → ``"forever"``."""
    if seconds == 0:
        return "forever"
    for unit in ("w", "d", "h", "m"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _keep_completed(value: object) -> Period:
    return Period(parse_period(value, what="completed", forever=True))


def _keep_cancelled(value: object) -> Period:
    return Period(parse_period(value, what="cancelled", forever=True))


def _keep_dead(value: object) -> Period:
    return Period(parse_period(value, what="dead", forever=True))


def _keep_audit(value: object) -> Period:
    return Period(parse_period(value, what="audit", forever=True))


def _every(value: object) -> Period:
    return Period(parse_period(value, what="interval"))


def _batch(instance: object, attribute: attrs.Attribute[int], given: int) -> None:
    value: object = given
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise ValueError(f"{attribute.name} must be an integer from 1 to 100000, got {value!r}")


_DAY = 86_400.0

DEFAULT_RETENTION = {
    ItemState.COMPLETED: 7 * _DAY,
    ItemState.CANCELLED: 7 * _DAY,
    ItemState.DEAD: 30 * _DAY,
}
"""How long each finished state is kept by default: a week, and a month for dead items (they
are the ones a person may still want to read, fix with ``items edit`` and retry)."""


@attrs.frozen(kw_only=True)
class RetentionSettings:
    """The ``[retention]`` table: how long finished items are kept, and how they are pruned.

    Periods are seconds or text (``"7d"``, ``"12h"``, ``"30m"``); ``"none"`` or ``0`` keeps that
    state for ever. Example::

        [retention]
        enabled = true
        completed = "7d"
        cancelled = "7d"
        dead = "30d"
        audit = "90d"
        interval = "5m"
        batch_size = 1000
    """

    enabled: bool = False
    """Whether a service with drivers runs the pruner (child ``maintenance-retention``). Off by
    default, so that upgrading deletes nothing and a time-travel test still sees every item it
    ran; turn it on in production (``TRIO_SUPERVISE_RETENTION__ENABLED=true``)."""
    completed: Period = attrs.field(
        default=Period(DEFAULT_RETENTION[ItemState.COMPLETED]), converter=_keep_completed
    )
    """How long completed items are kept (default 7 days)."""
    cancelled: Period = attrs.field(
        default=Period(DEFAULT_RETENTION[ItemState.CANCELLED]), converter=_keep_cancelled
    )
    """How long cancelled items are kept (default 7 days)."""
    dead: Period = attrs.field(
        default=Period(DEFAULT_RETENTION[ItemState.DEAD]), converter=_keep_dead
    )
    """How long dead items are kept (default 30 days)."""
    audit: Period = attrs.field(default=Period(90 * _DAY), converter=_keep_audit)
    """How long the console's audit entries are kept, in a store that keeps them
    (``Capability.AUDIT_TRAIL``; default 90 days)."""
    interval: Period = attrs.field(default=Period(300.0), converter=_every)
    """How long the pruner waits between passes (default 5 minutes)."""
    batch_size: int = attrs.field(default=1000, validator=_batch)
    """The most items one batch (one short transaction) deletes, per state (default 1000)."""

    def ages(self) -> dict[ItemState, float]:
        """Each finished state's retention in seconds; states kept for ever are left out."""
        ages = {
            ItemState.COMPLETED: float(self.completed),
            ItemState.CANCELLED: float(self.cancelled),
            ItemState.DEAD: float(self.dead),
        }
        return {state: age for state, age in ages.items() if age > 0}


def structure_period(value: object, _: object) -> Any:
    """The settings converter's hook for :data:`Period` fields: the value as given (text or
    a number), for the field's own converter to parse, so its error names the field."""
    return value


def catch_up_floor(schedules: Iterable[Schedule]) -> tuple[float, str | None]:
    """The longest ``catch_up_window`` among *schedules* that catch missed fires up, and its
    schedule's name (``(0.0, None)`` when none does)."""
    longest, name = 0.0, None
    for schedule in schedules:
        if schedule.missed is not MissedFires.SKIP and schedule.catch_up_window > longest:
            longest, name = schedule.catch_up_window, schedule.name
    return longest, name


@attrs.define(eq=False)
class PruneMetrics:
    """``trio_supervise_pruned_items_total{state}``,
    ``trio_supervise_pruned_audit_entries_total`` and ``trio_supervise_pruned_key_logs_total``,
    on *registry*."""

    registry: CollectorRegistry = attrs.field(factory=CollectorRegistry)
    pruned: Counter = attrs.field(init=False)
    pruned_audit: Counter = attrs.field(init=False)
    pruned_key_logs: Counter = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.pruned = Counter(
            "trio_supervise_pruned_items",
            "Finished items deleted by retention, by state.",
            ["state"],
            registry=self.registry,
        )
        self.pruned_audit = Counter(
            "trio_supervise_pruned_audit_entries",
            "Console audit entries deleted by retention.",
            registry=self.registry,
        )
        self.pruned_key_logs = Counter(
            "trio_supervise_pruned_key_logs",
            "Logs of keys' starts forgotten by retention: no key rate window counts them.",
            registry=self.registry,
        )


def _effective_ages(
    settings: RetentionSettings, schedules: Sequence[Schedule]
) -> tuple[dict[ItemState, float], list[str]]:
    floor, name = catch_up_floor(schedules)
    ages, raised = {}, []
    for state, age in settings.ages().items():
        if age < floor:
            raised.append(
                f"retention.{state} raised from {format_period(age)} to {format_period(floor)}: "
                f"schedule {name!r} looks back that far for missed fires"
            )
            age = floor
        ages[state] = age
    return ages, raised


def _as_tuple(schedules: Iterable[Schedule]) -> tuple[Schedule, ...]:
    return tuple(schedules)


@attrs.define(eq=False, kw_only=True)
class Pruner:
    """The maintenance task that deletes old finished items.

    :param settings: the retention periods, interval and batch size.
    :param schedules: the service's schedules; a retention shorter than the longest
        ``catch_up_window`` of a schedule that catches up is raised to it.
    :param metrics: where deletions are counted (a private registry when None).

    At start it runs one pass (readiness comes after it), then one every ``interval``. A pass
    prunes each state in batches of ``batch_size`` until a batch comes back short. A queue that
    is unavailable is logged and tried again at the next pass; any other error ends the task,
    and its supervisor restarts it. Any number of processes may prune one database at once:
    each item is deleted once.
    """

    settings: RetentionSettings = attrs.field(factory=RetentionSettings)
    schedules: Sequence[Schedule] = attrs.field(default=(), converter=_as_tuple)
    metrics: PruneMetrics = attrs.field(factory=PruneMetrics)
    name: str = "retention"
    restart: RestartPolicy | None = None
    _ages: dict[ItemState, float] = attrs.field(init=False)
    _raised: list[str] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._ages, self._raised = _effective_ages(self.settings, self.schedules)

    @property
    def ages(self) -> Mapping[ItemState, float]:
        """The retention applied per state, in seconds (after the schedules' floor)."""
        return dict(self._ages)

    async def run(
        self, queue: WorkQueue, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Prune *queue* now and then every ``interval`` until cancelled."""
        for line in self._raised:
            logger.info("%s", line)
        keyed = Capability.KEY_RATE_LIMITS in capabilities_of(queue)
        if not self._ages and not self.settings.audit and not keyed:
            logger.info("retention keeps every finished state for ever: nothing to prune")
            task_status.started()
            await trio.sleep_forever()
        await self._pass_logged(queue)
        task_status.started()
        while True:
            await trio.sleep(float(self.settings.interval))
            await self._pass_logged(queue)

    async def _pass_logged(self, queue: WorkQueue) -> None:
        try:
            await self.prune_once(queue)
        except QueueUnavailable as error:
            logger.warning(
                "retention: the queue is unavailable, trying again in %s: %s",
                format_period(float(self.settings.interval)),
                error,
                extra={"error": str(error)},
            )

    async def prune_once(self, queue: WorkQueue) -> dict[ItemState, int]:
        """One pass: every state pruned in batches until none is left; the counts deleted."""
        batch = self.settings.batch_size
        totals: dict[ItemState, int] = {}
        for state, age in self._ages.items():
            total = 0
            while True:
                deleted = (await queue.prune({state: age}, limit=batch)).get(state, 0)
                total += deleted
                if deleted:
                    self.metrics.pruned.labels(str(state)).inc(deleted)
                if deleted < batch:
                    break
                await trio.lowlevel.checkpoint()  # let claims and renewals in between batches
            totals[state] = total
        if any(totals.values()):
            summary = ", ".join(f"{n} {state}" for state, n in totals.items() if n)
            logger.info(
                "retention: deleted %s items",
                summary,
                extra={"pruned": {str(state): n for state, n in totals.items()}},
            )
        await self.prune_audit_once(queue)
        await self.prune_key_logs_once(queue)
        return totals

    async def prune_key_logs_once(self, queue: WorkQueue) -> int:
        """Forget the logs of keys no rate window counts any more, in batches, in a store that
        keeps key rate limits (one log per key ever started under a rule: with a rule per
        tenant or per user, as many as they); how many. Whatever the retention of items: a
        forgotten log is one that could hold no claim back."""
        if Capability.KEY_RATE_LIMITS not in capabilities_of(queue):
            return 0
        store = cast(KeyRateLimitStore, queue)
        total = await self._in_batches(lambda batch: store.prune_key_logs(limit=batch))
        if total:
            self.metrics.pruned_key_logs.inc(total)
            logger.info(
                "retention: forgot the logs of %d keys", total, extra={"pruned_key_logs": total}
            )
        return total

    async def prune_audit_once(self, queue: WorkQueue) -> int:
        """The audit entries older than ``settings.audit`` deleted in batches, in a store that
        keeps them (nothing otherwise, nor when kept for ever); how many."""
        age = float(self.settings.audit)
        if not age or Capability.AUDIT_TRAIL not in capabilities_of(queue):
            return 0
        store = cast(AuditStore, queue)
        total = await self._in_batches(lambda batch: store.prune_audit(age, limit=batch))
        if total:
            self.metrics.pruned_audit.inc(total)
            logger.info("retention: deleted %d audit entries", total, extra={"pruned_audit": total})
        return total

    async def _in_batches(self, prune: Callable[[int], Awaitable[int]]) -> int:
        """*prune* (given a batch size, deleting at most that many) called until a batch
        comes back short, letting claims and renewals in between; the total deleted."""
        batch, total = self.settings.batch_size, 0
        while True:
            deleted = await prune(batch)
            total += deleted
            if deleted < batch:
                return total
            await trio.lowlevel.checkpoint()
