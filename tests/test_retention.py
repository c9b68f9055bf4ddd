"""Retention: periods, the ``[retention]`` settings, the pruner and its place in a service."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client import generate_latest

from trio_supervise import (
    AuditEntry,
    ItemState,
    MaintenanceTask,
    Pruner,
    QueueUnavailable,
    RateLimit,
    RetentionSettings,
    Schedule,
    Service,
    Settings,
    SettingsError,
    Stop,
    load_settings,
)
from trio_supervise.maintenance import (
    PruneMetrics,
    format_period,
    maintenance_children,
    parse_period,
)
from trio_supervise.queues import MemoryQueue, WorkItem
from trio_supervise.testing import harness_runner_settings

DAY = 86_400.0


class Done:
    """Completes items of spec ``job``; fails items of spec ``bad`` for good."""

    name = "done"
    spec_ids = ("job", "report")

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: object, item: WorkItem) -> Stop:
        return Stop()


# -- periods ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("90s", 90.0),
        ("15m", 900.0),
        ("12h", 43_200.0),
        ("7d", 7 * DAY),
        ("2w", 14 * DAY),
        (" 1.5h ", 5400.0),
        (3600, 3600.0),
        (0.5, 0.5),
        ("600", 600.0),
    ],
)
def test_a_period_is_seconds_or_text_with_a_unit(value: object, seconds: float) -> None:
    """Numbers are seconds; text takes s, m, h, d or w."""
    assert parse_period(value) == seconds


@pytest.mark.parametrize("value", ["none", "forever", "never", 0, "0"])
def test_zero_or_none_keeps_for_ever_where_allowed(value: object) -> None:
    """A retention of 0 / "none" keeps for ever; an interval must be positive."""
    assert parse_period(value, forever=True) == 0.0
    with pytest.raises(ValueError, match="interval must be"):
        parse_period(value, what="interval")


@pytest.mark.parametrize("value", ["7x", "-1", -1, "d", True, None, "400d", float("inf"), [1]])
def test_a_bad_period_names_the_field_and_the_rule(value: object) -> None:
    """Anything else is refused with the field's name and what a period looks like."""
    with pytest.raises(ValueError, match=r"dead must be a number of seconds or text like '90s'"):
        parse_period(value, what="dead", forever=True)


def test_periods_format_in_their_largest_unit() -> None:
    """Log lines say 7d, not 604800."""
    assert [format_period(s) for s in (0, 90, 3600, 7 * DAY, 14 * DAY, 1.5)] == [
        "forever",
        "90s",
        "1h",
        "1w",
        "2w",
        "1.5s",
    ]


# -- settings -----------------------------------------------------------------------------------


def test_the_defaults_keep_dead_items_longest_and_are_off() -> None:
    """Off by default; when on: a week for completed and cancelled, a month for dead."""
    retention = Settings().retention
    assert not retention.enabled
    assert retention.ages() == {
        ItemState.COMPLETED: 7 * DAY,
        ItemState.CANCELLED: 7 * DAY,
        ItemState.DEAD: 30 * DAY,
    }
    assert (retention.interval, retention.batch_size) == (300.0, 1000)


def test_the_retention_table_is_read_from_toml_and_the_environment(tmp_path: Path) -> None:
    """TOML takes text or numbers; the environment overrides; "none" keeps a state for ever."""
    path = tmp_path / "settings.toml"
    path.write_text(
        '[retention]\nenabled = true\ncompleted = "2d"\ncancelled = 3600\ndead = "none"\n'
        'interval = "1m"\nbatch_size = 50\n'
    )
    retention = load_settings(path, env={}).retention
    assert retention.enabled
    assert retention.ages() == {ItemState.COMPLETED: 2 * DAY, ItemState.CANCELLED: 3600.0}
    assert (retention.interval, retention.batch_size) == (60.0, 50)
    env = {"TRIO_SUPERVISE_RETENTION__COMPLETED": "12h"}
    assert load_settings(path, env=env).retention.completed == 43_200.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('completed = "7x"', "retention.completed: must be a number of seconds or text like"),
        ('dead = "400d"', "retention.dead: must be .*at most 365 days, got '400d'"),
        ("interval = 0", "retention.interval: must be positive"),
        ("batch_size = 0", "retention.batch_size: must be an integer from 1 to 100000, got 0"),
        ('completd = "7d"', "retention.completd: unknown setting; did you mean"),
    ],
)
def test_a_bad_retention_setting_names_its_field(tmp_path: Path, text: str, message: str) -> None:
    """Every problem is one line with the field path and the rule."""
    path = tmp_path / "settings.toml"
    path.write_text(f"[retention]\n{text}\n")
    with pytest.raises(SettingsError, match=message):
        load_settings(path, env={})


# -- the pruner ---------------------------------------------------------------------------------


def test_the_pruner_is_a_maintenance_task() -> None:
    """It fits the contract and runs as the child ``maintenance-retention``."""
    pruner = Pruner()
    assert isinstance(pruner, MaintenanceTask)
    [child] = maintenance_children([pruner], MemoryQueue())
    assert child.name == "maintenance-retention"


def test_a_catching_up_schedule_raises_a_shorter_retention_to_its_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Fires are found by their items: a schedule looking 7 days back keeps 7 days of them."""
    catching_up = Schedule(
        name="nightly", spec_id="report", cron="0 2 * * *", missed="all", catch_up_window=7 * DAY
    )
    skipping = Schedule(name="hourly", spec_id="report", cron="0 * * * *", catch_up_window=30 * DAY)
    settings = RetentionSettings(completed="1d", cancelled="10d", dead="none")
    pruner = Pruner(settings=settings, schedules=[catching_up, skipping])
    assert pruner.ages == {ItemState.COMPLETED: 7 * DAY, ItemState.CANCELLED: 10 * DAY}

    async def main() -> None:
        with trio.move_on_after(1):
            await pruner.run(MemoryQueue())

    with caplog.at_level(logging.INFO, "trio_supervise.retention"):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert (
        "retention.completed raised from 1d to 1w: schedule 'nightly' looks back that far "
        "for missed fires" in caplog.messages
    )


async def test_a_pass_deletes_in_batches_and_counts_them(autojump_clock: object) -> None:
    """A pass empties each state's backlog batch by batch; the counter and log say how many."""
    queue = MemoryQueue()
    for n in range(25):
        await queue.enqueue("job", item_id=f"i{n:02}")
    for item in await queue.claim_due(["job"], "w", 30, 25):
        await queue.complete(item.id, item.lease_version)
    await trio.sleep(2 * DAY)
    metrics = PruneMetrics()
    pruner = Pruner(settings=RetentionSettings(completed="1d", batch_size=10), metrics=metrics)
    assert await pruner.prune_once(queue) == {
        ItemState.COMPLETED: 25,
        ItemState.CANCELLED: 0,
        ItemState.DEAD: 0,
    }
    assert queue.items == {}
    prunes = [event for event in queue.events if event.op == "prune"]
    assert [event.detail["counts"]["completed"] for event in prunes] == [10, 10, 5]
    text = generate_latest(metrics.registry).decode()
    assert 'trio_supervise_pruned_items_total{state="completed"} 25.0' in text


async def test_a_pass_forgets_key_logs_no_window_counts(autojump_clock: object) -> None:
    """Every pass forgets, in batches and counted, the logs of keys whose starts no key rate
    window counts any more, whatever the items' retention (one log per key ever started)."""
    queue = MemoryQueue()
    await queue.set_key_rate_limit("{tenant}", RateLimit(1, 60))
    for n in range(3):
        await queue.enqueue("spec", concurrency_key=f"t{n}", concurrency_limit=10)
    assert len(await queue.claim_due(["spec"], "w", 3600, 10)) == 3
    metrics = PruneMetrics()
    forever = RetentionSettings(
        completed="none", cancelled="none", dead="none", audit="none", batch_size=2
    )
    pruner = Pruner(settings=forever, metrics=metrics)
    await pruner.prune_once(queue)
    assert len(await queue.throttled_keys()) == 3  # inside their window: kept
    await trio.sleep(61)
    await pruner.prune_once(queue)
    assert await queue.prune_key_logs() == 0
    text = generate_latest(metrics.registry).decode()
    assert "trio_supervise_pruned_key_logs_total 3.0" in text


async def test_a_pass_prunes_the_stores_audit_trail_past_its_age(autojump_clock: object) -> None:
    """Audit entries older than ``retention.audit`` go with the finished items, in batches,
    counted; ``"none"`` keeps them for ever."""
    queue = MemoryQueue()
    for n in range(5):
        await queue.audit.record(
            AuditEntry(
                at=queue.clock.now(),
                who="alice",
                address="127.0.0.1",
                action="retry",
                target=f"item:{n}",
                ok=True,
                result="done",
            )
        )
        await trio.sleep(DAY)
    await Pruner(settings=RetentionSettings(audit="none")).prune_once(queue)
    assert len(await queue.audit.recent()) == 5
    metrics = PruneMetrics()
    pruner = Pruner(settings=RetentionSettings(audit="3d", batch_size=1), metrics=metrics)
    await pruner.prune_once(queue)
    assert [e.target for e in await queue.audit.recent()] == ["item:4", "item:3"]
    text = generate_latest(metrics.registry).decode()
    assert "trio_supervise_pruned_audit_entries_total 3.0" in text
    assert RetentionSettings().audit == 90 * DAY
    with pytest.raises(ValueError, match="audit must be"):
        RetentionSettings(audit="soon")


async def test_an_unavailable_queue_is_retried_at_the_next_pass(autojump_clock: object) -> None:
    """A QueueUnavailable does not end the task: it logs and tries again one interval later."""

    class Flaky(MemoryQueue):
        failures = 1

        async def prune(self, *args: Any, **kwargs: Any) -> dict[ItemState, int]:
            if self.failures:
                self.failures -= 1
                raise QueueUnavailable("down for a moment")
            return await super().prune(*args, **kwargs)

    queue = Flaky()
    await queue.enqueue("job", item_id="a")
    [item] = await queue.claim_due(["job"], "w", 30, 1)
    await queue.complete(item.id, item.lease_version)
    pruner = Pruner(settings=RetentionSettings(completed=60, interval=300))
    async with trio.open_nursery() as nursery:
        await nursery.start(pruner.run, queue)
        assert "a" in queue.items  # the first pass failed
        await trio.sleep(301)
        assert queue.items == {}
        nursery.cancel_scope.cancel()


# -- in a service -------------------------------------------------------------------------------


def _settings(**retention: Any) -> Settings:
    return Settings(
        runner=harness_runner_settings(), retention=RetentionSettings(enabled=True, **retention)
    )


async def test_a_service_with_retention_on_prunes_as_a_child(
    autojump_clock: object, harness: Any
) -> None:
    """``maintenance-retention`` runs beside the runner: a day after they finished, items of a
    one-day retention are gone, and /metrics' registry counts them."""
    service = Service(drivers=[Done()], settings=_settings(completed="1d", interval="1h"))
    await harness.run_service(service)
    assert "maintenance-retention" in {row.worker for row in service.workers_status()}
    await harness.queue.enqueue("job", item_id="early")
    await harness.advance(12 * 3600)
    await harness.queue.enqueue("job", item_id="late")
    await harness.advance(60)
    assert {item.state for item in harness.queue.items.values()} == {ItemState.COMPLETED}
    await harness.advance(13 * 3600)  # "early" finished more than a day ago, "late" not yet
    assert set(harness.queue.items) == {"late"}
    text = generate_latest(service.registry).decode()
    assert 'trio_supervise_pruned_items_total{state="completed"} 1.0' in text


async def test_retention_is_off_by_default_and_a_service_task_replaces_it(
    autojump_clock: object, harness: Any
) -> None:
    """No pruner unless enabled; an own task named "retention" takes the default's place."""
    plain = Service(drivers=[Done()])
    await harness.run_service(plain)
    assert "maintenance-retention" not in {row.worker for row in plain.workers_status()}
    own = Pruner(settings=RetentionSettings(completed="1h"))
    replaced = Service(drivers=[Done()], settings=_settings())
    replaced.maintenance = (own,)
    tasks = replaced._maintenance_tasks(_settings())
    assert tasks == [own]
