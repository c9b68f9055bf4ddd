"""What a periodic schedule is: a spec, a cron expression read in an IANA time zone (by
`cronsim <https://pypi.org/project/cronsim/>`_, Debian cron's rules, DST included), the item each
fire enqueues and its id, and the policy for missed fires. The scheduler (:mod:`._scheduler`)
enqueues the fires; the contract is docs/schedules.md.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
import zoneinfo
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
from cronsim import CronSim, CronSimError

from .._clock import utc
from ..job import (
    DEFAULT_QUEUE,
    MAX_NAME_LENGTH,
    JSONValue,
    check_json,
    check_priority,
    check_queue_name,
    shown_value,
    validate_spec_id,
)

if TYPE_CHECKING:
    from ..run import AnyWorkflowDriver

__all__ = [
    "MAX_CATCH_UP",
    "MissedFires",
    "Schedule",
    "check_schedules",
    "checked_schedules",
    "declared_priority",
    "declared_queue",
    "resolve_schedules",
]

MAX_CATCH_UP = 10_000
"""The largest ``max_catch_up`` a schedule may ask for."""


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
