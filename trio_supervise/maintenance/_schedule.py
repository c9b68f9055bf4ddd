"""Periodic schedules: cron expressions in a time zone, each fire enqueued exactly once.

A :class:`Schedule` names a spec, a cron expression and an IANA time zone; a
:class:`Scheduler` (a maintenance task, see :class:`~trio_supervise.MaintenanceTask`) enqueues
one item per fire, in the schedule's queue with its priority (by default the ones the spec's
driver declares, see :func:`resolve_schedules`). The item's id and idempotency key are both
``schedule:<name>:<fire instant in UTC>``, so any number of service processes on one database
enqueue each fire once: the first write wins and the others find it. A fire asked for by hand
(:func:`fire_now`, the console's "fire now") has an id of another shape,
``schedule:<name>:manual:<instant>``, so it never takes a regular fire's place.

Cron expressions are evaluated by `cronsim <https://pypi.org/project/cronsim/>`_, which follows
Debian's cron, daylight saving time included: a job at a fixed local time that falls in the hour
skipped by spring-forward runs at the first instant after the jump (``30 2 * * *`` fires at 03:00
local time that day); in the hour repeated by fall-back a fixed-time job fires once (the first
time), while a job of hourly granularity or finer fires on both passes (``0 * * * *`` fires at
02:00 summer time and again at 02:00 winter time).

Each fire is enqueued with :meth:`WorkQueue.fire_schedule`, which records it as the schedule's
last fire in the same transaction: a fire at or before the last one recorded is never enqueued
again, by any process, even once its item has been pruned.

Missed fires (the process was down, or the database was unreachable at a fire) follow the
schedule's :class:`MissedFires` policy: looking back from now, fire by fire (at most
``catch_up_window`` seconds, and at most :data:`SCAN_LIMIT` fires), the missed ones are those
after the last fire recorded (in a database from before fires were recorded: after the latest
fire that has an item). A schedule with none in that window is taken as new, and nothing is
caught up.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import logging
import math
import zoneinfo
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import trio
from cronsim import CronSim, CronSimError

from .._clock import Clock, TrioClock, utc
from .._errors import DuplicateItem, ItemNotFound, QueueUnavailable
from .._policy import RestartPolicy
from ..job import (
    DEFAULT_QUEUE,
    MAX_NAME_LENGTH,
    JSONValue,
    NewItem,
    WorkItem,
    check_json,
    check_priority,
    check_queue_name,
    shown_value,
    validate_spec_id,
)
from ..queues import WorkQueue

if TYPE_CHECKING:
    from ..run import AnyWorkflowDriver

__all__ = [
    "MissedFires",
    "SCAN_LIMIT",
    "Schedule",
    "Scheduler",
    "check_schedules",
    "declared_priority",
    "declared_queue",
    "fire_now",
    "last_fire",
    "resolve_schedules",
]

logger = logging.getLogger("trio_supervise.schedules")

SCAN_LIMIT = 10_000
"""The most past fires a scheduler reads back (one lookup each) to find missed ones."""
MAX_CATCH_UP = 10_000
"""The largest ``max_catch_up`` a schedule may ask for."""
_MAX_NAP = 60.0
"""With a wall clock other than Trio's, waits are cut into naps of at most this many seconds, so
a wall-clock step (NTP, a suspended laptop) is noticed within a minute."""
_RETRY_MIN, _RETRY_MAX = 1.0, 60.0
_TICK = dt.timedelta(microseconds=1)
_T = TypeVar("_T")


class MissedFires(enum.StrEnum):
    """What a scheduler does with fires that passed while nobody enqueued them."""

    SKIP = "skip"
    """Nothing: the next fire is the next one in the future (Oban's cron; the default)."""
    LATEST = "latest"
    """Enqueue the most recent missed fire only (catch up once)."""
    ALL = "all"
    """Enqueue every missed fire, oldest first, at most ``max_catch_up`` (the most recent)."""


_MISSED = {policy.value: policy for policy in MissedFires}


def _to_missed(value: Any) -> MissedFires:
    """The policy named *value*; anything else is passed on for the schedule to refuse by name."""
    if isinstance(value, str) and value in _MISSED:
        return _MISSED[value]
    return value  # type: ignore[no-any-return]


def _utc_stamp(instant: dt.datetime) -> str:
    return instant.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.frozen(kw_only=True)
class Schedule:
    """Enqueue an item of *spec_id* at every fire of *cron* in *timezone*.

    :param name: unique in the service; part of every fire's item id
        ``schedule:<name>:<fire instant, UTC ISO 8601>``.
    :param spec_id: the spec of the items enqueued.
    :param cron: five fields (minute hour day-of-month month day-of-week), or six with seconds
        first, as `cronsim <https://pypi.org/project/cronsim/>`_ reads them (``MON-FRI``, ``L``,
        ``MON#2`` included).
    :param timezone: the IANA zone the expression is read in (``"Europe/Paris"``).
    :param config: each item's config (JSON), the same for every fire.
    :param missed: the :class:`MissedFires` policy (``"skip"``, ``"latest"`` or ``"all"``).
    :param catch_up_window: seconds back from now in which missed fires are looked for.
    :param max_catch_up: with ``missed="all"``, at most this many (the most recent) are enqueued.
    :param queue: the named queue of its items; None: the one the spec's driver declares in the
        service the schedule belongs to (its ``queue`` attribute), else ``"default"``.
    :param priority: the priority of its items (-100..100, lower first); None: the driver's
        declared ``priority``, else 0.

    Every field is checked here, each error naming the schedule and the field.
    """

    name: str
    spec_id: str
    cron: str
    timezone: str = "UTC"
    config: JSONValue = None
    missed: MissedFires = attrs.field(default=MissedFires.SKIP, converter=_to_missed)
    catch_up_window: float = 7 * 86_400.0
    max_catch_up: int = 100
    queue: str | None = None
    priority: int | None = None
    _zone: zoneinfo.ZoneInfo = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        name: object = self.name  # each field checked as whatever it was given
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_LENGTH:
            # Each fire's item id and key is "schedule:<name>:<time>": a name within the limit
            # keeps them within MAX_ID_LENGTH.
            raise ValueError(
                f"schedule name must be a non-empty string of at most {MAX_NAME_LENGTH} "
                f"characters, got {shown_value(name)}"
            )
        if not self.name.isprintable():
            raise ValueError(f"schedule name must be printable text, got {self.name!r}")
        where = f"schedule {self.name!r}"
        try:
            validate_spec_id(self.spec_id)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
        cron: object = self.cron
        if not isinstance(cron, str):
            raise ValueError(f"{where}: cron must be a string, got {cron!r}")
        try:
            self._expression(dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
        except CronSimError as error:
            raise ValueError(f"{where}: cron {self.cron!r} is not valid: {error}") from None
        try:
            zone = zoneinfo.ZoneInfo(self.timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
            raise ValueError(
                f"{where}: timezone {self.timezone!r} is not a known IANA time zone "
                "(such as 'UTC' or 'Europe/Paris')"
            ) from None
        object.__setattr__(self, "_zone", zone)
        missed: object = self.missed
        if not isinstance(missed, MissedFires):
            choices = ", ".join(m.value for m in MissedFires)
            raise ValueError(f"{where}: missed must be one of {choices}, got {missed!r}")
        object.__setattr__(
            self,
            "config",
            check_json({} if self.config is None else self.config, what=f"{where} config"),
        )
        window: object = self.catch_up_window
        if isinstance(window, bool) or not isinstance(window, int | float):
            raise ValueError(f"{where}: catch_up_window must be seconds, got {window!r}")
        if not (math.isfinite(window) and window > 0):
            raise ValueError(f"{where}: catch_up_window must be positive, got {window!r}")
        count: object = self.max_catch_up
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_CATCH_UP:
            raise ValueError(f"{where}: max_catch_up must be 1..{MAX_CATCH_UP}, got {count!r}")
        if self.next_fire(dt.datetime(2000, 1, 1, tzinfo=dt.UTC)) is None:
            raise ValueError(f"{where}: cron {self.cron!r} never fires")
        try:
            if self.queue is not None:
                check_queue_name(self.queue)
            if self.priority is not None:
                check_priority(self.priority)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None

    def _expression(self, start: dt.datetime, *, reverse: bool = False) -> CronSim:
        return CronSim(self.cron, start, reverse=reverse)

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        """The time zone, looked up."""
        return self._zone

    def fires_after(self, instant: dt.datetime) -> Iterator[dt.datetime]:
        """The fire instants strictly after *instant*, in UTC, in order (for up to 50 years)."""
        for local in self._expression(utc(instant).astimezone(self.zone)):
            yield local.astimezone(dt.UTC)

    def fires_before(self, instant: dt.datetime) -> Iterator[dt.datetime]:
        """The fire instants strictly before *instant*, in UTC, newest first."""
        for local in self._expression(utc(instant).astimezone(self.zone), reverse=True):
            yield local.astimezone(dt.UTC)

    def next_fire(self, instant: dt.datetime) -> dt.datetime | None:
        """The first fire strictly after *instant*, or None if there is none within 50 years."""
        return next(self.fires_after(instant), None)

    def next_fires(self, instant: dt.datetime, count: int) -> list[dt.datetime]:
        """The first *count* fires strictly after *instant* (UTC)."""
        fires: list[dt.datetime] = []
        for fire in self.fires_after(instant):
            if len(fires) >= count:
                break
            fires.append(fire)
        return fires

    def item_id(self, fire: dt.datetime) -> str:
        """The id (and idempotency key) of the item of *fire*: ``schedule:<name>:<UTC ISO>``."""
        return f"schedule:{self.name}:{_utc_stamp(fire)}"

    def manual_item_id(self, at: dt.datetime) -> str:
        """The id of a fire asked for by hand at *at*: ``schedule:<name>:manual:<UTC ISO, µs>``.

        The ``manual:`` part keeps it from ever being a regular fire's id (those end in a
        timestamp), so firing by hand takes no fire's place and is never caught up as one.
        """
        stamp = utc(at).astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return f"schedule:{self.name}:manual:{stamp}"

    @property
    def item_queue(self) -> str:
        """The queue its items go to: ``queue``, or ``"default"`` when it is None."""
        return DEFAULT_QUEUE if self.queue is None else self.queue

    @property
    def item_priority(self) -> int:
        """The priority of its items: ``priority``, or 0 when it is None."""
        return 0 if self.priority is None else self.priority


def check_schedules(schedules: Iterable[Schedule], spec_ids: Iterable[str] | None) -> None:
    """Refuse two schedules with one name, and, given the *spec_ids* the service's drivers
    handle, a schedule whose spec none of them handles."""
    known = None if spec_ids is None else sorted(set(spec_ids))
    names: set[str] = set()
    for schedule in schedules:
        if not isinstance(schedule, Schedule):
            raise TypeError(f"schedules must be Schedule objects, got {schedule!r}")
        if schedule.name in names:
            raise ValueError(f"two schedules are named {schedule.name!r}")
        names.add(schedule.name)
        if known is not None and schedule.spec_id not in known:
            raise ValueError(
                f"schedule {schedule.name!r}: spec_id {schedule.spec_id!r} is not handled by any "
                f"of the service's drivers (they handle: {', '.join(known)})"
            )


def declared_queue(driver: AnyWorkflowDriver[Any]) -> str:
    """The queue *driver* declares for its items (its ``queue`` attribute), else ``"default"``;
    the rule :meth:`DriverRegistry.enqueue` applies."""
    queue: str = getattr(driver, "queue", DEFAULT_QUEUE)
    return queue


def declared_priority(driver: AnyWorkflowDriver[Any]) -> int:
    """The priority *driver* declares for its items (its ``priority`` attribute), else 0."""
    priority: int = getattr(driver, "priority", 0)
    return priority


def resolve_schedules(
    schedules: Iterable[Schedule], drivers: Iterable[AnyWorkflowDriver[Any]]
) -> tuple[Schedule, ...]:
    """*schedules* with each ``queue`` and ``priority`` left None set to what the driver of its
    spec declares (see :func:`declared_queue`); schedules of a spec no driver here owns (a
    service that enqueues for another's runner) keep None, meaning ``"default"`` and 0."""
    owners = {spec: driver for driver in drivers for spec in driver.spec_ids}
    resolved = []
    for schedule in schedules:
        driver = owners.get(schedule.spec_id)
        if driver is not None and (schedule.queue is None or schedule.priority is None):
            schedule = attrs.evolve(
                schedule,
                queue=declared_queue(driver) if schedule.queue is None else schedule.queue,
                priority=(
                    declared_priority(driver) if schedule.priority is None else schedule.priority
                ),
            )
        resolved.append(schedule)
    return tuple(resolved)


def checked_schedules(value: Iterable[Schedule]) -> tuple[Schedule, ...]:
    """*value* as a tuple, checked by :func:`check_schedules` (an attrs converter)."""
    schedules = tuple(value)
    check_schedules(schedules, None)
    return schedules


async def sleep_until_instant(clock: Clock, instant: dt.datetime) -> None:
    """Wait until *clock* reads *instant* or later, with ``trio.sleep_until``.

    With a :class:`TrioClock` one sleep lands on the instant (an autojump clock jumps straight
    there); with another clock the wait is cut into naps of at most a minute, re-reading it.
    """
    virtual = isinstance(clock, TrioClock)
    while True:
        remaining = (instant - clock.now()).total_seconds()
        if remaining <= 0:
            return
        if not virtual:
            remaining = min(remaining, _MAX_NAP)
        await trio.sleep_until(trio.current_time() + remaining)


@attrs.define(eq=False)
class Scheduler:
    """The maintenance task that enqueues *schedules*' fires on a queue, each fire once.

    Each schedule runs in a task of its own: at start it catches up missed fires per its policy,
    then waits for each fire on the queue's clock and enqueues it (due at the fire instant).
    A transient queue error (:class:`QueueUnavailable`) is retried with backoff from 1 s to a
    minute, the deterministic id making the retry safe; fires that pass meanwhile count as
    missed. Any other error ends the task, and its supervisor restarts it.
    """

    schedules: Sequence[Schedule] = attrs.field(converter=checked_schedules)
    name: str = "schedules"
    restart: RestartPolicy | None = None

    async def run(
        self, queue: WorkQueue, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Enqueue every schedule's fires on *queue* until cancelled; ready once each schedule
        has caught up."""
        async with trio.open_nursery() as nursery:
            for schedule in self.schedules:
                await nursery.start(self._run_schedule, queue, schedule)
            task_status.started()

    async def _run_schedule(
        self, queue: WorkQueue, schedule: Schedule, *, task_status: trio.TaskStatus[None]
    ) -> None:
        now = queue.clock.now()
        await self._catch_up(queue, schedule, now)
        task_status.started()
        fires = schedule.fires_after(now - _TICK)  # a fire at exactly "now" is still to come
        fire = next(fires, None)
        while fire is not None:
            await sleep_until_instant(queue.clock, fire)
            await self._enqueue(queue, schedule, fire)
            fire = next(fires, None)
            now = queue.clock.now()
            if fire is not None and fire < now:  # held up past the next fire(s): missed
                await self._catch_up(queue, schedule, now)
                fires = schedule.fires_after(now - _TICK)
                fire = next(fires, None)
        logger.info("schedule %r has no more fires", schedule.name)
        await trio.sleep_forever()

    async def _catch_up(self, queue: WorkQueue, schedule: Schedule, now: dt.datetime) -> None:
        missed = await _retrying(schedule, "looking for missed fires", missed_fires, queue, now)
        for fire in missed:
            logger.info("schedule %r: catching up the fire of %s", schedule.name, fire)
            await self._enqueue(queue, schedule, fire)

    async def _enqueue(self, queue: WorkQueue, schedule: Schedule, fire: dt.datetime) -> None:
        key = schedule.item_id(fire)
        await _retrying(schedule, f"enqueueing {key}", _enqueue_fire, queue, fire)
        logger.debug("schedule %r fired: %s", schedule.name, key, extra={"item_id": key})


async def _retrying(
    schedule: Schedule,
    what: str,
    call: Callable[[WorkQueue, Schedule, dt.datetime], Awaitable[_T]],
    queue: WorkQueue,
    instant: dt.datetime,
) -> _T:
    """``await call(queue, schedule, instant)``, retried while the queue is unavailable (from
    1 s, doubling to a minute); every read and write of a scheduler is safe to repeat."""
    delay = _RETRY_MIN
    while True:
        try:
            return await call(queue, schedule, instant)
        except QueueUnavailable as error:
            logger.warning(
                "schedule %r: %s failed, retrying in %g s: %s",
                schedule.name,
                what,
                delay,
                error,
                extra={"backoff_s": delay, "error": str(error), "spec_id": schedule.spec_id},
            )
        await trio.sleep(delay)
        delay = min(delay * 2, _RETRY_MAX)


async def _enqueue_fire(queue: WorkQueue, schedule: Schedule, fire: dt.datetime) -> None:
    key = schedule.item_id(fire)
    with contextlib.suppress(DuplicateItem):  # another process was first: once all the same
        # Recorded as the schedule's last fire with the item, in one transaction: a fire at or
        # before the last one recorded (another process's, or ours before a restart) is never
        # enqueued again, even once its item is pruned.
        await queue.fire_schedule(schedule.name, fire, _entry(schedule, fire, key))


def _entry(schedule: Schedule, due: dt.datetime, key: str) -> NewItem:
    """One item of *schedule*, due at *due*, whose id and idempotency key are *key*."""
    return NewItem(
        spec_id=schedule.spec_id,
        config=schedule.config,
        due_at=due,
        item_id=key,
        idempotency_key=key,
        queue=schedule.item_queue,
        priority=schedule.item_priority,
    )


async def fire_now(queue: WorkQueue, schedule: Schedule) -> WorkItem:
    """Enqueue an item of *schedule* due now, by hand (the console's "fire now").

    Its id is :meth:`Schedule.manual_item_id` of now, never a regular fire's, and it is not
    recorded as the schedule's last fire: the next regular fire still comes, and a missed one is
    still caught up. Two fires asked for in one microsecond are one (the second raises
    :class:`DuplicateItem`).
    """
    now = queue.clock.now()
    key = schedule.manual_item_id(now)
    [done] = await queue.enqueue_many([_entry(schedule, now, key)])
    if not done.created:
        raise DuplicateItem(key)
    return done.item


async def _exists(queue: WorkQueue, item_id: str) -> bool:
    try:
        await queue.get(item_id)
    except ItemNotFound:
        return False
    return True


async def missed_fires(queue: WorkQueue, schedule: Schedule, now: dt.datetime) -> list[dt.datetime]:
    """The fires before *now* that *schedule*'s policy says to enqueue, oldest first.

    Looking back from *now* (at most ``catch_up_window`` seconds and :data:`SCAN_LIMIT` fires),
    the missed fires are those after the last fire recorded for the schedule
    (:meth:`WorkQueue.last_fires`; a database from before fires were recorded: the latest fire
    that has an item); with none found, nothing was missed (a new schedule does not backfill).
    ``skip`` enqueues none of them, ``latest`` the newest, ``all`` the newest ``max_catch_up``.
    """
    if schedule.missed is MissedFires.SKIP:
        return []
    found, missing = await _look_back(queue, schedule, now, SCAN_LIMIT)
    if found is None:
        return []
    if schedule.missed is MissedFires.LATEST:
        return missing[:1]
    return missing[: schedule.max_catch_up][::-1]


async def last_fire(
    queue: WorkQueue, schedule: Schedule, now: dt.datetime, *, lookups: int = SCAN_LIMIT
) -> dt.datetime | None:
    """The schedule's last fire before *now*, as a scheduler finds it: the one recorded
    (:meth:`WorkQueue.last_fires`), else, in a database from before fires were recorded, the
    latest with an item, looking back fire by fire (at most *lookups* lookups and
    ``catch_up_window`` seconds). None when none is found."""
    found, _ = await _look_back(queue, schedule, now, lookups)
    return found


async def _look_back(
    queue: WorkQueue, schedule: Schedule, now: dt.datetime, lookups: int
) -> tuple[dt.datetime | None, list[dt.datetime]]:
    """Walk *schedule*'s fires back from *now* (newest first, within ``catch_up_window`` and
    *lookups*): the first that has an item, and the fires without one before reaching it."""
    oldest = now - dt.timedelta(seconds=schedule.catch_up_window)
    last = (await queue.last_fires([schedule.name])).get(schedule.name)
    missing: list[dt.datetime] = []
    for fire in schedule.fires_before(now):
        if fire < oldest or len(missing) >= lookups:
            break
        # The last fire recorded is the truth (its items may have been pruned since); before
        # fires were recorded, the fire's item is looked for.
        if (fire <= last) if last is not None else await _exists(queue, schedule.item_id(fire)):
            return fire, missing
        missing.append(fire)
    return None, missing
