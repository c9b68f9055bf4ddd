"""The scheduler, a maintenance task: each schedule's fires enqueued once across any number of
processes (the item id is the fire's, and the fire is recorded with its item in one
transaction), missed fires caught up per the schedule's policy, and "fire now" by hand. The
contract is docs/schedules.md.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import attrs
import trio

from .._clock import Clock, TrioClock
from .._errors import DuplicateItem, ItemNotFound, QueueUnavailable
from .._policy import RestartPolicy
from ..job import NewItem, WorkItem
from ..queues import WorkQueue
from ._schedule import MissedFires, Schedule, checked_schedules

__all__ = ["SCAN_LIMIT", "Scheduler", "fire_now", "last_fire", "missed_fires"]

logger = logging.getLogger("trio_supervise.schedules")

SCAN_LIMIT = 10_000
"""The most past fires a scheduler reads back (one lookup each) to find missed ones."""
_MAX_NAP = 60.0
"""With a wall clock other than Trio's, waits are cut into naps of at most this many seconds, so
a wall-clock step (NTP, a suspended laptop) is noticed within a minute."""
_RETRY_MIN, _RETRY_MAX = 1.0, 60.0
_TICK = dt.timedelta(microseconds=1)
_T = TypeVar("_T")


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
