"""Periodic schedules: exact fire instants in virtual time, DST, missed fires, exactly once."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
import uuid
import zoneinfo
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_supervise import (
    ItemState,
    MaintenanceTask,
    MissedFires,
    QueueUnavailable,
    Schedule,
    Scheduler,
    Service,
    Settings,
    Stop,
    TrioClock,
)
from trio_supervise._cli import main
from trio_supervise.maintenance import (
    MAINTENANCE_RESTART,
    fire_now,
    last_fire,
    maintenance_children,
    missed_fires,
)
from trio_supervise.queues import (
    Enqueued,
    MemoryQueue,
    NewItem,
    PostgresQueue,
    SQLiteQueue,
    WorkItem,
    WorkQueue,
)
from trio_supervise.testing import harness_runner_settings

from .queues.conftest import pg_schema

WORKER = Path(__file__).with_name("_schedule_worker.py")
PARIS = zoneinfo.ZoneInfo("Europe/Paris")
UTC = dt.UTC
EPOCH = dt.datetime(2030, 1, 1, tzinfo=UTC)  # the harness's clock at virtual time 0 (a Tuesday)


class Done:
    """A driver that finishes every item it is given."""

    name = "done"
    spec_ids = ("report",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: object, item: WorkItem) -> Stop:
        return Stop()


def paris(*args: int, fold: int = 0) -> dt.datetime:
    """A Paris wall-clock time, as the UTC instant it names."""
    return dt.datetime(*args, tzinfo=PARIS, fold=fold).astimezone(UTC)  # type: ignore[misc]


async def items_of(queue: WorkQueue, spec_id: str = "report") -> list[WorkItem]:
    return await queue.list_items(spec_ids=[spec_id], limit=10_000)


async def start_scheduler(
    nursery: trio.Nursery, queue: WorkQueue, *schedules: Schedule
) -> trio.CancelScope:
    """Run a scheduler over *schedules* on *queue* in a scope of its own; return the scope."""
    scope = trio.CancelScope()

    async def run(*, task_status: trio.TaskStatus[None]) -> None:
        with scope:
            await Scheduler(schedules).run(queue, task_status=task_status)

    await nursery.start(run)
    return scope


# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cron": "61 * * * *"}, "schedule 'daily': cron '61 * * * *' is not valid: Bad minute"),
        ({"cron": "0 9 * *"}, "cron '0 9 * *' is not valid: Wrong number of fields"),
        ({"cron": "0 0 31 2 *"}, "cron '0 0 31 2 *' is not valid"),
        ({"timezone": "Europe/Pariss"}, "timezone 'Europe/Pariss' is not a known IANA time zone"),
        ({"timezone": "../../etc/passwd"}, "is not a known IANA time zone"),
        ({"spec_id": ""}, "schedule 'daily': spec_id must be a non-empty string"),
        ({"missed": "sometimes"}, "missed must be one of skip, latest, all, got 'sometimes'"),
        ({"catch_up_window": 0}, "catch_up_window must be positive"),
        ({"max_catch_up": 0}, "max_catch_up must be 1..10000"),
        ({"config": {"when": dt.date(2030, 1, 1)}}, "schedule 'daily' config is not JSON"),
        ({"name": " "}, "schedule name must be a non-empty string"),
        # Each fire's item id and key is "schedule:<name>:<time>", so the name is bounded.
        ({"name": "n" * 201}, "schedule name must be a non-empty string of at most 200 characters"),
        ({"spec_id": "s" * 201}, "spec_id must be a non-empty string of at most 200 characters"),
    ],
)
def test_a_bad_field_is_refused_by_name(changes: dict[str, Any], message: str) -> None:
    """Each bad field raises ValueError naming the schedule, the field and the rule."""
    fields: dict[str, Any] = {"name": "daily", "spec_id": "report", "cron": "0 9 * * *"}
    fields.update(changes)
    with pytest.raises(ValueError, match=re.escape(message)):
        Schedule(**fields)


def test_a_service_refuses_a_schedule_no_driver_handles() -> None:
    """A service with drivers refuses, at construction, a schedule for a spec none handles."""
    schedule = Schedule(name="daily", spec_id="reprot", cron="0 9 * * *")
    with pytest.raises(ValueError, match=r"spec_id 'reprot' is not handled .*handle: report\)"):
        Service(drivers=[Done()], schedules=[schedule])


def test_a_service_without_drivers_may_schedule_any_spec() -> None:
    """A producer-only service (no drivers) enqueues for another service's runner."""
    service = Service(schedules=[Schedule(name="daily", spec_id="elsewhere", cron="0 9 * * *")])
    assert [s.name for s in service.schedules] == ["daily"]


def test_two_schedules_with_one_name_are_refused() -> None:
    """Schedule names are the items' ids: two with one name are refused up front."""
    schedule = Schedule(name="daily", spec_id="report", cron="0 9 * * *")
    with pytest.raises(ValueError, match="two schedules are named 'daily'"):
        Service(drivers=[Done()], schedules=[schedule, schedule])


def test_fire_ids_are_deterministic() -> None:
    """A fire's item id and key is ``schedule:<name>:<UTC ISO>``, whatever the zone."""
    schedule = Schedule(name="daily", spec_id="report", cron="0 9 * * *", timezone="Europe/Paris")
    fire = schedule.next_fire(EPOCH)
    assert fire == paris(2030, 1, 1, 9)
    assert schedule.item_id(fire) == "schedule:daily:2030-01-01T08:00:00Z"


# -- a month under the time-travel harness ------------------------------------------------------


async def test_a_month_of_weekday_mornings(autojump_clock: object, harness: Any) -> None:
    """Under the harness a month of a weekday 09:00 Paris schedule fires at exactly 09:00 each
    weekday, and the service's runner claims each item at that instant."""
    schedule = Schedule(
        name="morning",
        spec_id="report",
        cron="0 9 * * MON-FRI",
        timezone="Europe/Paris",
        config={"kind": "daily"},
    )
    await harness.run_service(Service(drivers=[Done()], schedules=[schedule]))
    await harness.advance(31 * 86_400)

    expected = [
        paris(2030, 1, day, 9)
        for day in range(1, 32)
        if dt.date(2030, 1, day).weekday() < 5  # Monday..Friday
    ]
    assert len(expected) == 23
    assert expected[0] == dt.datetime(2030, 1, 1, 8, tzinfo=UTC)  # 09:00 CET is 08:00 UTC
    items = await items_of(harness.queue)
    assert [item.due_at for item in items] == expected
    assert [item.created_at for item in items] == expected  # enqueued at the fire instant
    assert {item.state for item in items} == {ItemState.COMPLETED}
    assert {item.config["kind"] for item in items} == {"daily"}
    claimed = [harness.history.for_item(item.id)[0] for item in items]
    assert [entry.kind for entry in claimed] == ["claimed"] * 23
    assert [entry.at for entry in claimed] == [(f - EPOCH).total_seconds() for f in expected]


# -- daylight saving time -----------------------------------------------------------------------


@pytest.fixture
async def nursery() -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as nursery:
        yield nursery
        nursery.cancel_scope.cancel()


def queue_at(instant: dt.datetime) -> MemoryQueue:
    """A memory queue whose clock reads *instant* now and follows Trio's (virtual) clock."""
    return MemoryQueue(clock=TrioClock(epoch=instant - dt.timedelta(seconds=trio.current_time())))


async def test_spring_forward_runs_the_skipped_time_at_the_jump(
    autojump_clock: object, nursery: trio.Nursery
) -> None:
    """``30 2 * * *`` in Paris fires at 03:00 CEST on the spring-forward day (02:30 never
    happens there), and at 02:30 the days around it."""
    queue = queue_at(paris(2030, 3, 29, 12))
    schedule = Schedule(name="night", spec_id="report", cron="30 2 * * *", timezone="Europe/Paris")
    await start_scheduler(nursery, queue, schedule)
    await trio.sleep(3 * 86_400)
    assert [item.due_at for item in await items_of(queue)] == [
        dt.datetime(2030, 3, 30, 1, 30, tzinfo=UTC),  # 02:30 CET
        dt.datetime(2030, 3, 31, 1, 0, tzinfo=UTC),  # 03:00 CEST, the first instant after 02:00
        dt.datetime(2030, 4, 1, 0, 30, tzinfo=UTC),  # 02:30 CEST
    ]


async def test_fall_back_fires_hourly_jobs_on_both_passes(
    autojump_clock: object, nursery: trio.Nursery
) -> None:
    """Across fall-back an hourly schedule fires every UTC hour (02:00 CEST and 02:00 CET
    both), while a fixed 02:30 schedule fires once, at the first 02:30."""
    queue = queue_at(paris(2030, 10, 26, 23, 30))
    hourly = Schedule(name="hourly", spec_id="report", cron="0 * * * *", timezone="Europe/Paris")
    night = Schedule(name="night", spec_id="night", cron="30 2 * * *", timezone="Europe/Paris")
    await start_scheduler(nursery, queue, hourly, night)
    await trio.sleep(5 * 3600)
    assert [item.due_at for item in await items_of(queue)] == [
        paris(2030, 10, 27, 0),
        paris(2030, 10, 27, 1),
        paris(2030, 10, 27, 2, fold=0),  # 02:00 CEST = 00:00 UTC
        paris(2030, 10, 27, 2, fold=1),  # 02:00 CET = 01:00 UTC
        paris(2030, 10, 27, 3),
    ]
    assert [(i.due_at.hour, i.due_at.minute) for i in await items_of(queue)] == [
        (22, 0),
        (23, 0),
        (0, 0),
        (1, 0),
        (2, 0),
    ]
    assert [item.due_at for item in await items_of(queue, "night")] == [
        dt.datetime(2030, 10, 27, 0, 30, tzinfo=UTC)  # 02:30 CEST only, not 02:30 CET
    ]


# -- missed fires -------------------------------------------------------------------------------


def _daily(**changes: Any) -> Schedule:
    fields: dict[str, Any] = {"name": "daily", "spec_id": "report", "cron": "0 9 * * *"}
    fields.update(changes)
    return Schedule(**fields)


async def _run_with_downtime(schedule: Schedule, queue: MemoryQueue) -> list[dt.datetime]:
    """Fire Jan 1 and 2 at 09:00 UTC, be down from Jan 2 12:00 to Jan 6 12:00, then run a day."""
    async with trio.open_nursery() as nursery:
        scope = await start_scheduler(nursery, queue, schedule)
        await trio.sleep_until(_at(dt.datetime(2030, 1, 2, 12, tzinfo=UTC)))
        scope.cancel()
        await trio.sleep_until(_at(dt.datetime(2030, 1, 6, 12, tzinfo=UTC)))
        await start_scheduler(nursery, queue, schedule)
        await trio.sleep_until(_at(dt.datetime(2030, 1, 7, 12, tzinfo=UTC)))
        nursery.cancel_scope.cancel()
    return [item.due_at for item in await items_of(queue)]


def _at(instant: dt.datetime) -> float:
    return (instant - EPOCH).total_seconds()


def _jan(*days: int) -> list[dt.datetime]:
    return [dt.datetime(2030, 1, day, 9, tzinfo=UTC) for day in days]


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"missed": "skip"}, _jan(1, 2, 7)),
        ({"missed": "latest"}, _jan(1, 2, 6, 7)),
        ({"missed": "all"}, _jan(1, 2, 3, 4, 5, 6, 7)),
        ({"missed": "all", "max_catch_up": 2}, _jan(1, 2, 5, 6, 7)),
        ({"missed": "all", "catch_up_window": 2.5 * 86_400}, _jan(1, 2, 7)),
    ],
    ids=["skip", "latest", "all", "all-bounded", "beyond-the-window"],
)
async def test_missed_fires_follow_the_policy(
    autojump_clock: object, changes: dict[str, Any], expected: list[dt.datetime]
) -> None:
    """After four days down, ``skip`` enqueues none of the missed fires, ``latest`` the newest,
    ``all`` each (at most ``max_catch_up``); with no fire found in the window nothing is missed."""
    queue = MemoryQueue(clock=TrioClock(epoch=EPOCH))
    assert await _run_with_downtime(_daily(**changes), queue) == expected


async def test_missed_fires_are_enqueued_due_at_their_fire(autojump_clock: object) -> None:
    """A caught-up fire keeps its own instant as due time and its deterministic id."""
    queue = MemoryQueue(clock=TrioClock(epoch=EPOCH))
    await _run_with_downtime(_daily(missed=MissedFires.ALL), queue)
    item = await queue.get("schedule:daily:2030-01-04T09:00:00Z")
    assert item.due_at == dt.datetime(2030, 1, 4, 9, tzinfo=UTC)
    assert item.created_at == dt.datetime(2030, 1, 6, 12, tzinfo=UTC)


async def test_a_new_schedule_does_not_backfill(autojump_clock: object) -> None:
    """A schedule that never fired before catches nothing up, even with ``missed="all"``."""
    queue = MemoryQueue(clock=TrioClock(epoch=EPOCH + dt.timedelta(days=10)))
    async with trio.open_nursery() as nursery:
        await start_scheduler(nursery, queue, _daily(missed="all"))
        nursery.cancel_scope.cancel()
    assert await items_of(queue) == []


@settings(deadline=None)
@given(
    existing=st.sets(st.integers(0, 47)),
    window_hours=st.integers(1, 60),
    minutes_past=st.integers(0, 59),
    missed=st.sampled_from(list(MissedFires)),
    max_catch_up=st.integers(1, 50),
)
def test_missed_fires_are_the_ones_after_the_latest_enqueued(
    existing: set[int], window_hours: int, minutes_past: int, missed: MissedFires, max_catch_up: int
) -> None:
    """Whatever fires have items, the missed fires are those after the newest one with an item
    (within the window), oldest first, cut down by the policy; with none in the window, none."""
    schedule = _daily(
        cron="0 * * * *",
        missed=missed,
        catch_up_window=window_hours * 3600.0,
        max_catch_up=max_catch_up,
    )
    now = EPOCH + dt.timedelta(hours=48, minutes=minutes_past, seconds=1)
    fires = [EPOCH + dt.timedelta(hours=n) for n in range(49)]  # hour 48 is before *now* too
    window = [f for f in fires if now - dt.timedelta(hours=window_hours) <= f < now]

    async def run() -> list[dt.datetime]:
        queue = MemoryQueue(clock=TrioClock(epoch=now))
        for n in existing:
            await queue.enqueue("report", item_id=schedule.item_id(fires[n]))
        return await missed_fires(queue, schedule, now)

    result = trio.run(run)
    enqueued = [f for n, f in enumerate(fires) if n in existing and f in window]
    if not enqueued or missed is MissedFires.SKIP:
        assert result == []
        return
    after = [f for f in window if f > max(enqueued)]
    expected = {
        MissedFires.LATEST: after[-1:],
        MissedFires.ALL: after[-max_catch_up:],
    }[missed]
    assert result == expected


# -- outages ------------------------------------------------------------------------------------


class FlakyQueue(MemoryQueue):
    """A memory queue whose enqueues fail as unreachable in the virtual-time span ``down``."""

    down: tuple[float, float] = (0.0, 0.0)

    def _check_up(self) -> None:
        if self.down[0] <= trio.current_time() < self.down[1]:
            raise QueueUnavailable("connection refused")

    async def enqueue(self, spec_id: str, **kwargs: Any) -> WorkItem:
        self._check_up()
        return await super().enqueue(spec_id, **kwargs)

    async def get(self, item_id: str) -> WorkItem:
        self._check_up()
        return await super().get(item_id)

    async def fire_schedule(self, name: str, fire: dt.datetime, entry: NewItem) -> Enqueued | None:
        self._check_up()
        return await super().fire_schedule(name, fire, entry)

    async def last_fires(self, names: Sequence[str]) -> dict[str, dt.datetime]:
        self._check_up()
        return await super().last_fires(names)


async def test_a_fire_is_retried_until_the_database_is_back(
    autojump_clock: object, nursery: trio.Nursery
) -> None:
    """An enqueue refused as unavailable is retried after 1, 2, 4, 8 s: the fire's item lands
    once the database answers, still due at the fire instant."""
    queue = FlakyQueue(clock=TrioClock(epoch=EPOCH))
    fire = dt.datetime(2030, 1, 1, 9, tzinfo=UTC)
    queue.down = (_at(fire), _at(fire) + 10)
    await start_scheduler(nursery, queue, _daily())
    await trio.sleep_until(_at(fire) + 60)
    [item] = await items_of(queue)
    assert item.due_at == fire
    assert item.created_at == fire + dt.timedelta(seconds=1 + 2 + 4 + 8)


async def test_catching_up_waits_for_the_database(autojump_clock: object) -> None:
    """A scheduler starting while the database is down retries its look-back, then catches up."""
    queue = FlakyQueue(clock=TrioClock(epoch=EPOCH))
    schedule = _daily(missed="latest")
    first = dt.datetime(2030, 1, 1, 9, tzinfo=UTC)
    await queue.enqueue("report", due_at=first, item_id=schedule.item_id(first))
    await trio.sleep_until(_at(dt.datetime(2030, 1, 3, 12, tzinfo=UTC)))
    queue.down = (trio.current_time(), trio.current_time() + 5)
    async with trio.open_nursery() as nursery:
        await start_scheduler(nursery, queue, schedule)
        ready_at = trio.current_time()
        nursery.cancel_scope.cancel()
    assert ready_at == _at(dt.datetime(2030, 1, 3, 12, tzinfo=UTC)) + 1 + 2 + 4
    assert [item.due_at for item in await items_of(queue)] == _jan(1, 3)


@pytest.mark.parametrize(
    ("missed", "expected"),
    [("skip", ["10:00", "13:00"]), ("latest", ["10:00", "12:00", "13:00"])],
)
async def test_fires_passed_during_an_outage_follow_the_policy(
    autojump_clock: object, nursery: trio.Nursery, missed: str, expected: list[str]
) -> None:
    """Fires that pass while a held-up fire is retried count as missed: the policy decides."""
    queue = FlakyQueue(clock=TrioClock(epoch=EPOCH))
    queue.down = (_at(dt.datetime(2030, 1, 1, 9, 30, tzinfo=UTC)), _at(_jan(1)[0]) + 3.5 * 3600)
    await trio.sleep_until(_at(dt.datetime(2030, 1, 1, 8, 30, tzinfo=UTC)))
    await start_scheduler(nursery, queue, _daily(cron="0 * * * *", missed=missed))
    await trio.sleep_until(_at(dt.datetime(2030, 1, 1, 13, 30, tzinfo=UTC)))
    fired = [item.due_at.strftime("%H:%M") for item in await items_of(queue)]
    assert fired == ["09:00", *expected]


# -- exactly once across processes --------------------------------------------------------------


BOUNDARY = dt.datetime(2030, 1, 1, 9, tzinfo=UTC)


async def _race(queues: Sequence[WorkQueue]) -> None:
    """Several schedulers, one per queue connection, race through catch-up and one live fire.

    Each queue's clock reads a little before the minute :data:`BOUNDARY` now; the fire three
    minutes back has an item, so each scheduler catches up two missed fires and then fires the
    boundary, all at once with the others.
    """
    schedule = _daily(name="minutely", cron="* * * * *", missed="all")
    known = BOUNDARY - dt.timedelta(minutes=3)
    try:
        await queues[0].enqueue("report", due_at=known, item_id=schedule.item_id(known))
        ids = await _run_race(queues, schedule, known)
    finally:
        for queue in queues:
            await queue.aclose()
    assert ids[-1] == "schedule:minutely:2030-01-01T09:00:00Z"


async def _run_race(
    queues: Sequence[WorkQueue], schedule: Schedule, known: dt.datetime
) -> list[str]:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for queue in queues:
                nursery.start_soon(Scheduler([schedule]).run, queue)
            while len(await items_of(queues[0])) < 4:  # noqa: ASYNC110 (another connection's writes)
                await trio.sleep(0.05)
            await trio.sleep(0.2)  # any duplicate write would have landed by now
            nursery.cancel_scope.cancel()
    items = await items_of(queues[0])
    assert [item.due_at for item in items] == [known + dt.timedelta(minutes=n) for n in range(4)]
    return [item.id for item in items]


def _clock_before_boundary(offset: float) -> TrioClock:
    """A clock (Trio's, real time) that reads *offset* seconds before :data:`BOUNDARY` now."""
    return TrioClock(epoch=BOUNDARY - dt.timedelta(seconds=offset + trio.current_time()))


async def test_several_schedulers_on_one_sqlite_file_enqueue_each_fire_once(
    tmp_path: Path,
) -> None:
    """Four schedulers, each with its own connection to one SQLite file, enqueue each fire once."""
    clock = _clock_before_boundary(0.5)
    path = tmp_path / "queue.db"
    await _race([await SQLiteQueue.connect(path, clock=clock) for _ in range(4)])


@pytest.mark.postgres
async def test_several_schedulers_on_postgres_enqueue_each_fire_once() -> None:
    """Four schedulers, each with its own PostgreSQL pool, enqueue each fire once."""
    clock = _clock_before_boundary(0.5)
    with pg_schema() as (dsn, schema):
        await _race(
            [
                await PostgresQueue.connect(
                    dsn, clock=clock, schema=schema, migrate=True, pool_size=2
                )
                for _ in range(4)
            ]
        )


def _run_service_processes(args: list[str], out_dir: Path, processes: int = 3) -> None:
    """Start *processes* scheduler processes on one queue and let them race one fire."""
    # The checkout under test, not whatever trio_supervise the interpreter would find first.
    env = dict(os.environ, PYTHONPATH=str(WORKER.parent.parent))
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), *args, f"p{n}", str(out_dir)], env=env)
        for n in range(processes)
    ]
    try:
        deadline = time.monotonic() + 60
        while len(list(out_dir.glob("ready-*"))) < processes:
            assert time.monotonic() < deadline, "the processes did not start"
            assert all(p.poll() is None for p in procs), "a process died while starting"
            time.sleep(0.02)
        (out_dir / "go.tmp").write_text(repr(time.time() + 1.0))
        (out_dir / "go.tmp").rename(out_dir / "go")
        for proc in procs:
            assert proc.wait(timeout=60) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def _seed_and_check(queue: WorkQueue, run: list[str], out_dir: Path) -> None:
    """Seed the fire three minutes before the boundary, run the processes, expect 4 fires."""
    schedule = _daily(name="minutely", cron="* * * * *")
    known = BOUNDARY - dt.timedelta(minutes=3)
    async with queue:
        await queue.enqueue("report", due_at=known, item_id=schedule.item_id(known))
        await trio.to_thread.run_sync(_run_service_processes, run, out_dir)
        items = await items_of(queue)
    assert [item.id for item in items] == [
        schedule.item_id(known + dt.timedelta(minutes=n)) for n in range(4)
    ]


@pytest.mark.slow
async def test_service_processes_on_one_sqlite_file_enqueue_each_fire_once(
    tmp_path: Path,
) -> None:
    """Three OS processes scheduling on one SQLite file catch up and fire: one item per fire."""
    path = tmp_path / "queue.db"
    await _seed_and_check(await SQLiteQueue.connect(path), ["sqlite", str(path)], tmp_path)


@pytest.mark.slow
@pytest.mark.postgres
async def test_service_processes_on_postgres_enqueue_each_fire_once(tmp_path: Path) -> None:
    """Three OS processes scheduling on one PostgreSQL schema: one item per fire."""
    with pg_schema() as (dsn, schema):
        queue = await PostgresQueue.connect(dsn, schema=schema, migrate=True, pool_size=2)
        await _seed_and_check(queue, ["postgres", dsn, schema], tmp_path)


# -- the maintenance contract -------------------------------------------------------------------


def test_the_scheduler_is_a_maintenance_task() -> None:
    """A :class:`Scheduler` fits the maintenance contract and runs as ``maintenance-schedules``
    with the default restart policy."""
    scheduler = Scheduler([_daily()])
    assert isinstance(scheduler, MaintenanceTask)
    [child] = maintenance_children([scheduler], MemoryQueue())
    assert child.name == "maintenance-schedules"
    assert child.restart == MAINTENANCE_RESTART
    assert child.start


def test_two_maintenance_tasks_with_one_name_are_refused() -> None:
    """Maintenance task names are unique in a service."""
    with pytest.raises(ValueError, match="two maintenance tasks are named 'schedules'"):
        maintenance_children([Scheduler([_daily()]), Scheduler([_daily()])], MemoryQueue())


async def test_a_service_runs_its_schedules_as_a_supervised_child(
    autojump_clock: object, harness: Any
) -> None:
    """The scheduler is the service's child ``maintenance-schedules``, running beside the runner."""
    service = Service(drivers=[Done()], schedules=[_daily()])
    await harness.run_service(service)
    assert service.supervisor is not None
    assert "maintenance-schedules" in {row.worker for row in service.workers_status()}
    await harness.advance(86_400)
    assert [item.id for item in await items_of(harness.queue)] == [
        "schedule:daily:2030-01-01T09:00:00Z"
    ]


# -- queues and priorities ----------------------------------------------------------------------


class Reminders:
    """A driver whose items go to queue "reminders" with priority -3."""

    name = "reminders"
    spec_ids = ("remind",)
    queue = "reminders"
    priority = -3

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: object, item: WorkItem) -> Stop:
        return Stop()


def _reminders_settings() -> Settings:
    return Settings(runner=harness_runner_settings(queues={"reminders": 2}))


async def test_a_schedule_takes_its_drivers_queue_and_priority(
    autojump_clock: object, harness: Any
) -> None:
    """A schedule without queue or priority enqueues where its spec's driver declares, so a
    runner serving only that queue runs the fires."""
    schedule = Schedule(name="nightly", spec_id="remind", cron="0 3 * * *")
    service = Service(drivers=[Reminders()], schedules=[schedule], settings=_reminders_settings())
    assert [(s.queue, s.priority) for s in service.schedules] == [("reminders", -3)]
    await harness.run_service(service)
    await harness.advance(4 * 3600)
    [item] = await items_of(harness.queue, "remind")
    assert (item.queue, item.priority, item.state) == ("reminders", -3, ItemState.COMPLETED)


def test_a_schedules_own_queue_and_priority_win_and_are_checked() -> None:
    """Given queue and priority are kept; bad ones are refused naming the schedule."""
    mine = Schedule(name="n", spec_id="remind", cron="0 3 * * *", queue="urgent", priority=-50)
    service = Service(drivers=[Reminders()], schedules=[mine])
    assert [(s.queue, s.priority) for s in service.schedules] == [("urgent", -50)]
    with pytest.raises(ValueError, match="schedule 'n': priority must be an integer from -100"):
        Schedule(name="n", spec_id="remind", cron="0 3 * * *", priority=101)
    with pytest.raises(ValueError, match="schedule 'n': queue must be a non-empty string"):
        Schedule(name="n", spec_id="remind", cron="0 3 * * *", queue="")


async def test_a_service_warns_at_start_of_queues_its_runner_does_not_serve(
    autojump_clock: object, harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A driver (and so its schedule) declaring a queue the runner does not serve is named in a
    warning at start: its items would wait for ever."""
    schedule = Schedule(name="nightly", spec_id="remind", cron="0 3 * * *")
    service = Service(drivers=[Reminders()], schedules=[schedule], name="app")
    await harness.run_service(service)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert (
        "service 'app': driver 'reminders' declares queue 'reminders', which the runner does not "
        "serve (runner.queues: default): its items would wait for ever"
    ) in warnings
    assert (
        "service 'app': schedule 'nightly' enqueues into queue 'reminders', which the runner "
        "does not serve (runner.queues: default): its items would wait for ever"
    ) in warnings
    assert Service(drivers=[Reminders()]).unserved_queues(_reminders_settings()) == []


async def test_firing_by_hand_takes_no_regular_fires_place(autojump_clock: object) -> None:
    """fire_now enqueues an item due now under a manual id, in the schedule's queue: the
    regular fire still comes, and last_fire (found as the scheduler finds fires) ignores it."""
    queue = MemoryQueue(clock=TrioClock(epoch=EPOCH))
    schedule = _daily(queue="mail")
    item = await fire_now(queue, schedule)
    assert item.id == "schedule:daily:manual:2030-01-01T00:00:00.000000Z"
    assert (item.queue, item.due_at) == ("mail", EPOCH)
    assert await last_fire(queue, schedule, EPOCH + dt.timedelta(days=2)) is None
    async with trio.open_nursery() as nursery:
        scope = await start_scheduler(nursery, queue, schedule)
        await trio.sleep(86_400)
        scope.cancel()
    fire = EPOCH + dt.timedelta(hours=9)
    assert await last_fire(queue, schedule, EPOCH + dt.timedelta(days=1)) == fire
    assert (await queue.get(schedule.item_id(fire))).queue == "mail"


# -- the CLI ------------------------------------------------------------------------------------

APP = """
from trio_supervise import Schedule, Service, Stop


class Reports:
    name = "reports"
    spec_ids = ("report",)

    def validate_specs(self):
        pass

    async def evaluate(self, context, item):
        return Stop()


def build(settings):
    return Service(
        drivers=[Reports()],
        settings=settings,
        schedules=[
            Schedule(name="morning", spec_id="report", cron="0 9 * * MON-FRI",
                     timezone="Europe/Paris"),
            Schedule(name="night", spec_id="report", cron="30 2 * * *",
                     timezone="Europe/Paris", missed="latest"),
        ],
    )


service = build(None)
empty = Service()
broken = 42
"""


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of an application with two schedules, importable from the working directory."""
    name = f"schedapp_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(APP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_schedules_list_shows_the_next_fires(app: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``schedules list`` prints each schedule with its next fires in its zone and in UTC,
    across the spring-forward night (02:30 Paris becomes 03:00 CEST)."""
    code = main(["schedules", "list", f"{app}:service", "--at", "2030-03-29T12:00:00Z"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines() == [
        "NAME     SPEC    CRON             TIMEZONE      MISSED  NEXT (LOCAL)"
        "               NEXT (UTC)",
        "morning  report  0 9 * * MON-FRI  Europe/Paris  skip    2030-04-01 09:00:00 +0200"
        "  2030-04-01T07:00:00Z",
        "                                                        2030-04-02 09:00:00 +0200"
        "  2030-04-02T07:00:00Z",
        "                                                        2030-04-03 09:00:00 +0200"
        "  2030-04-03T07:00:00Z",
        "night    report  30 2 * * *       Europe/Paris  latest  2030-03-30 02:30:00 +0100"
        "  2030-03-30T01:30:00Z",
        "                                                        2030-03-31 03:00:00 +0200"
        "  2030-03-31T01:00:00Z",
        "                                                        2030-04-01 02:30:00 +0200"
        "  2030-04-01T00:30:00Z",
    ]


def test_schedules_list_json_from_a_factory(app: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A factory target is called with settings, as ``run`` does; ``--json`` prints UTC fires."""
    code = main(
        ["schedules", "list", f"{app}:build", "--json", "--count", "1", "--at", "2030-01-01T00:00Z"]
    )
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [(s["name"], s["next"]) for s in document] == [
        ("morning", ["2030-01-01T08:00:00Z"]),
        ("night", ["2030-01-01T01:30:00Z"]),
    ]
    assert {(s["queue"], s["priority"]) for s in document} == {("default", 0)}


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["{app}:empty"], 0, ""),
        (["{app}:broken"], 1, "is not a Service, nor a callable returning one"),
        (["{app}:missing"], 1, "has no attribute 'missing'"),
        (["nosuchmodule_k15:service"], 1, "cannot import module 'nosuchmodule_k15'"),
        (["{app}:service", "--at", "tomorrow"], 1, "expected an ISO 8601 datetime"),
        (["{app}:service", "--count", "0"], 2, "--count: must be 1..100"),
    ],
)
def test_schedules_list_errors_are_one_line(
    app: str, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    """Bad targets and options exit 1 (usage errors 2) with one line naming the problem."""
    args = [arg.replace("{app}", app) for arg in argv]
    if code == 2:
        with pytest.raises(SystemExit) as exit_info:
            main(["schedules", "list", *args])
        assert exit_info.value.code == 2
    else:
        assert main(["schedules", "list", *args]) == code
    captured = capsys.readouterr()
    assert message in captured.err
    assert "Traceback" not in captured.err
    if code == 0:
        assert captured.out == "service 'trio_supervise' has no schedules\n"
