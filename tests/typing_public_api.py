"""What ``mypy --strict`` sees of the public API (checked by the ``type`` tox env and by
``tests/test_typing.py``); never run.

Each ``assert_type`` is a promise to users: change one only with a changelog entry.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, assert_type

import attrs
import trio

import trio_supervise as ts
from trio_supervise.queues import SQLiteQueue, WorkItem


@attrs.frozen
class Watering:
    litres: float
    rounds: int = 0


@attrs.frozen
class Garden:
    name: str


class WateringDriver:
    """Typed: the config is the third argument of ``evaluate``, a ``Watering`` to mypy."""

    name = "watering"
    spec_ids = ("watering",)
    config_type = Watering

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: Garden, item: WorkItem, config: Watering) -> ts.Outcome:
        assert_type(config, Watering)
        assert_type(config.litres, float)
        assert_type(context.name, str)
        assert_type(item.due_at, dt.datetime)
        if config.rounds > 3:
            return ts.Stop()
        return ts.Reschedule(item.due_at + dt.timedelta(days=1), attrs.evolve(config, rounds=4))


class SubclassedDriver(ts.TypedWorkflowDriver[Garden, Watering]):
    """Typed by subclassing the protocol: mismatches are reported at the class itself."""

    name = "subclassed"
    spec_ids = ("watering-2",)
    config_type = Watering

    async def evaluate(self, context: Garden, item: WorkItem, config: Watering) -> ts.Outcome:
        assert_type(config, Watering)
        return ts.Continue()


class JsonDriver:
    """Untyped, as before typed configs: ``item.config`` is plain JSON (``Any``)."""

    name = "json"
    spec_ids = ("json",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: Garden, item: WorkItem, /) -> ts.Outcome:
        url: str = item.config["url"]
        return ts.Stop() if url else ts.Continue()


@asynccontextmanager
async def open_garden() -> AsyncIterator[Garden]:
    yield Garden("kitchen")


async def garden() -> Garden:
    return Garden("roof")


async def drivers_and_runner(queue: ts.WorkQueue) -> None:
    registry: ts.DriverRegistry[Garden] = ts.DriverRegistry()
    chained = registry.register(WateringDriver()).register(SubclassedDriver())
    assert_type(chained.register(JsonDriver()), ts.DriverRegistry[Garden])
    assert_type(registry.for_spec("watering"), ts.AnyWorkflowDriver[Garden] | None)

    settings = ts.RunnerSettings(worker_id="w")
    for build in (open_garden, garden, lambda: Garden("plain")):
        runner = ts.WorkflowRunner(
            queue=queue, registry=registry, settings=settings, build_context=build
        )
        assert_type(runner, ts.WorkflowRunner[Garden])
    assert_type(runner.state, ts.RunnerState)
    assert_type(runner.in_flight, list[WorkItem])
    assert_type(runner.recent_errors, list[ts.RecentError])
    assert_type(await ts.run_due_pass(queue, registry, settings, open_garden), ts.PassStats)

    service = ts.Service(drivers=[WateringDriver(), JsonDriver()], build_context=open_garden)
    assert_type(service.runner, ts.WorkflowRunner[Any] | None)
    assert_type(await service.run(), int)


def outcomes(when: dt.datetime) -> None:
    outcome: ts.Outcome = ts.Reschedule(when, {"any": "json"})
    assert_type(outcome, ts.Continue | ts.Reschedule | ts.Stop)
    if isinstance(outcome, ts.Reschedule):
        assert_type(outcome.at, dt.datetime)


async def queue_api() -> None:
    async with ts.open_queue("memory://") as queue:
        assert_type(queue, ts.WorkQueue)
        item = await queue.enqueue("watering", config={"litres": 2})
        assert_type(item, WorkItem)
        assert_type(item.state, ts.ItemState)
        assert_type(item.lease, ts.Lease)
        keyed = await queue.enqueue("watering", concurrency_key="tenant:a", concurrency_limit=2)
        assert_type(keyed.concurrency_key, str | None)
        assert_type(keyed.concurrency_limit, int | None)
        assert_type(await queue.get(item.id), WorkItem)
        assert_type(await queue.list_items(states=[ts.ItemState.DEAD]), list[WorkItem])
        assert_type(await queue.counts(), Mapping[tuple[str, ts.ItemState], int])
        assert_type(await queue.settle_many([]), list[bool])
        entry = ts.NewItem(spec_id="watering", idempotency_key="bed-1", unique="unfinished")
        [done] = await queue.enqueue_many([entry])
        assert_type(done, ts.Enqueued)
        assert_type(done.created, bool)
        assert_type(await queue.get_by_key("bed-1"), WorkItem)
        await queue.enqueue("watering", idempotency_key="k", unique=dt.timedelta(hours=1))
    memory = ts.MemoryQueue()
    assert_type(memory.clock, ts.Clock)
    assert_type(await ts.migrate("sqlite:///x.db"), int)


async def outbox_api(conn: sqlite3.Connection) -> None:
    async with await SQLiteQueue.connect("x.db") as queue:
        assert_type(queue.enqueue_on(conn, "watering", config={"litres": 2}), WorkItem)
        entries = [ts.NewItem(spec_id="watering", idempotency_key="k")]
        assert_type(queue.enqueue_many_on(conn, entries), list[ts.Enqueued])


async def supervision() -> None:
    async def worker() -> None:
        await trio.sleep_forever()

    policy = ts.RestartPolicy(1.0, 30.0)
    assert_type(policy.backoff(1, key="worker", jitter=ts.Jitter(seed=1)), float)
    supervisor = ts.Supervisor(
        children=[ts.ChildSpec("worker", worker, restart=policy)], name="top"
    )
    assert_type(supervisor.state("worker"), ts.WorkerState)
    assert_type(supervisor.snapshot(), list[ts.WorkerStatus])
    assert_type(supervisor.failed, bool)
    assert_type(supervisor.shutdown, ts.Shutdown)
    await supervisor.run()


async def harness_api() -> None:
    from trio_supervise.testing import Harness, open_harness

    async with open_harness() as harness:
        assert_type(harness, Harness)
        runner = await harness.run_drivers(
            WateringDriver(), JsonDriver(), build_context=open_garden
        )
        assert_type(runner, ts.WorkflowRunner[Any])
        assert_type(await harness.advance(60), float)


def settings() -> None:
    loaded = ts.load_settings()
    assert_type(loaded, ts.Settings)
    assert_type(loaded.runner, ts.RunnerSettings)
    assert_type(loaded.log_level, ts.LogLevel)

    @attrs.frozen(kw_only=True)
    class AppSettings(ts.Settings):
        greeting: str = "hello"

    assert_type(ts.load_settings(cls=AppSettings), AppSettings)
    assert_type(ts.load_settings("app.toml", cls=AppSettings).greeting, str)


async def fan_out(queue: ts.MemoryQueue, item: WorkItem) -> ts.Outcome:
    children = await queue.list_children(item.id)
    assert_type(children, list[WorkItem])
    assert_type(children[0].parent_id, str | None)
    assert_type(item.waiting_children, int)
    if not children:
        return ts.Continue(
            children=[ts.NewItem(spec_id="thumbnail", config={"n": 1})], wait_for_children=True
        )
    return ts.Stop(result=[child.result for child in children], children=[])


class Status:
    """A StatusSource of one's own (what the HTTP surface reads)."""

    @property
    def healthy(self) -> bool:
        return True

    def workers(self) -> Sequence[ts.WorkerStatus]:
        return []

    def recent_errors(self) -> Sequence[ts.ErrorRecord]:
        return []


async def every_constructor_argument(queue: ts.WorkQueue, when: dt.datetime) -> None:
    """Every public class built with every argument its constructor takes, as users write
    them (lists where a sequence is asked for): ``tests/test_typing.py`` checks that none is
    left out, so a parameter typed in a way mypy --strict refuses fails here first."""
    from prometheus_client import CollectorRegistry

    from trio_supervise.maintenance import PruneMetrics

    async def worker() -> None:
        await trio.sleep_forever()

    registry = CollectorRegistry()
    policy = ts.RestartPolicy(1.0, 30.0, max_restarts=5, jitter=ts.JitterMode.FULL)
    jitter = ts.Jitter(seed=7)
    shutdown = ts.Shutdown()
    child = ts.ChildSpec(
        "worker",
        worker,
        restart=policy,
        restart_type=ts.RestartType.TRANSIENT,
        shutdown_grace=2.0,
        start=True,
        stop_signal=False,
        significant=True,
    )
    supervisor = ts.Supervisor(
        name="top",
        children=[child],
        strategy=ts.Strategy.ONE_FOR_ALL,
        intensity=ts.Intensity(max_restarts=3, period=10.0),
        shutdown_order=ts.ShutdownOrder.PARALLEL,
        auto_shutdown=ts.AutoShutdown.ANY_SIGNIFICANT,
        shutdown=shutdown,
        jitter=jitter,
        registry=registry,
        restart=policy,
        restart_type=ts.RestartType.PERMANENT,
        significant=False,
    )
    assert_type(ts.ChildCounts(specs=1, active=1, supervisors=0, workers=1).active, int)
    runner_settings = ts.RunnerSettings(
        worker_id="w",
        lease=30.0,
        requeue_delay=1.0,
        claim_batch=5,
        concurrency=5,
        poll_interval=0.5,
        shutdown_grace=5.0,
        retry=policy,
        max_errors=3,
        max_attempts=5,
        claim_retry=policy,
        settle_batch=50,
        error_history=10,
        queues={"default": 5, "mail": 2},
        rate_limits={"mail": ts.RateLimit(100, 60.0)},
        key_rate_limits={"partner:{tenant}": ts.RateLimit(100, 60.0)},
        outcome_log_rate=2.5,
        tracing=False,
    )
    http = ts.HttpSettings(
        enabled=True,
        host="127.0.0.1",
        port=0,
        refresh=5.0,
        graceful_timeout=3.0,
        token="console-token-0123456789",
        password_hash=None,
        read_only=True,
    )
    retention = ts.RetentionSettings(
        enabled=True,
        completed="7d",
        cancelled=3600,
        dead=30.0,
        audit="90d",
        interval="5m",
        batch_size=500,
    )
    settings = ts.Settings(
        database_url="memory://",
        log_level=ts.LogLevel.WARNING,
        log=ts.LogSettings(format=ts.LogFormat.JSON),
        jitter_seed=1,
        http=http,
        runner=runner_settings,
        retention=retention,
        postgres=ts.PostgresSettings(
            pool_size=4, worker_pool_size=4, read_pool_size=2, connect_timeout=10.0
        ),
    )
    schedule = ts.Schedule(
        name="nightly",
        spec_id="watering",
        cron="0 3 * * *",
        timezone="Europe/Paris",
        config={"litres": 2},
        missed=ts.MissedFires.LATEST,
        catch_up_window=86_400.0,
        max_catch_up=5,
        queue="garden",
        priority=-5,
    )
    scheduler = ts.Scheduler(schedules=[schedule], name="schedules", restart=policy)
    pruner = ts.Pruner(
        settings=retention,
        schedules=[schedule],
        metrics=PruneMetrics(registry),
        name="retention",
        restart=policy,
    )
    audit = ts.MemoryAuditTrail(max_entries=100)
    producer = ts.Producer(schema="jobs", clock=ts.SystemClock())
    assert_type(producer.enqueue("sqlite:///garden.db", "water", priority=1), ts.WorkItem)
    service = ts.Service(
        drivers=[WateringDriver(), JsonDriver()],
        workers=[child, supervisor],
        settings=settings,
        queue_url="memory://",
        queue=queue,
        build_context=open_garden,
        name="garden",
        handle_signals=False,
        on_event=print,
        shutdown_order=ts.ShutdownOrder.REVERSE,
        auto_shutdown=ts.AutoShutdown.ALL_SIGNIFICANT,
        schedules=[schedule],
        maintenance=[scheduler, pruner],
        audit=audit,
    )
    assert_type(service.schedules, Sequence[ts.Schedule])
    ts.ServiceHandle(name="garden", queue=queue, shutdown=shutdown, settings=settings)
    registry_of: ts.DriverRegistry[Garden] = ts.DriverRegistry()
    ts.WorkflowRunner(
        queue=queue,
        registry=registry_of,
        settings=runner_settings,
        build_context=garden,
        shutdown=shutdown,
        jitter=jitter,
        metrics_registry=registry,
        on_event=print,
    )
    ts.RunnerMetrics(registry=registry)
    ts.OperationsApp(
        Status(),
        registry,
        queue=queue,
        title="garden",
        refresh=5.0,
        due_limit=10,
        cache_for=1.0,
        owned_specs=frozenset({"watering"}),
        schedules=[schedule],
        queue_limits={"default": 5},
        warnings=["queue 'garden' is served by no runner here"],
        token="console-token-0123456789",
        password_hash=ts.hash_password("s3cret"),
        read_only=False,
        audit=audit,
    )
    entry = ts.AuditEntry(
        at=when,
        who="alice",
        address="10.0.0.1",
        action="retry",
        target="item:x",
        ok=True,
        result="requeued x",
    )
    await audit.record(entry)
    assert_type(await audit.recent(10), list[ts.AuditEntry])
    ts.ErrorRecord(at=when, source="runner", message="boom")
    ts.RecentError(item_id="x", spec_id="watering", error="boom", at=when)
    ts.WorkerStatus(
        worker="w", state=ts.WorkerState.RUNNING, restarts=0, last_error=None, since=0.0
    )
    ts.RunnerEvent(
        kind=ts.RunnerEventKind.CLAIMED,
        item_id="x",
        spec_id="watering",
        lease_version=1,
        detail="",
        at=0.0,
    )
    ts.PassStats(claimed=1, failed=0)
    ts.JsonFormatter(fmt=None, datefmt=None, style="%", validate=True, defaults=None)
    ts.MemoryQueue(clock=ts.TrioClock(epoch=when))
    guard = ts.StepGuard(ts.SystemClock(), hold=60.0)
    assert_type(guard.now(hold=90.0), dt.datetime)
    assert_type(guard.clock, ts.WallClock)
    new = ts.NewItem(
        spec_id="watering",
        config={"litres": 1},
        tenant_id="t",
        subject_id="s",
        due_at=when,
        item_id="x",
        idempotency_key="k",
        priority=-1,
        queue="garden",
        evaluation_timeout=30.0,
        unique="unfinished",
        concurrency_key="t",
        concurrency_limit=2,
        tags=["garden", "daily"],
        traceparent=None,
        start_by=when,
        debounce=False,
    )
    item = ts.WorkItem(
        id="x",
        spec_id="watering",
        tenant_id="t",
        subject_id="s",
        config={},
        cancel_requested=False,
        lease_version=1,
        state=ts.ItemState.QUEUED,
        due_at=when,
        error_count=0,
        last_error=None,
        lease_owner=None,
        lease_expires_at=None,
        idempotency_key="k",
        created_at=when,
        updated_at=when,
        attempt=0,
        priority=0,
        queue="garden",
        timeout=None,
        result=None,
        errors=(ts.ErrorEntry(at=when, worker="w", attempt=1, error="boom"),),
        parent_id=None,
        waiting_children=0,
        unique_scope="forever",
        unique_until=None,
        released_key=None,
        concurrency_key=None,
        concurrency_limit=None,
        tags=("garden",),
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        start_by=None,
    )
    ts.Enqueued(item=item, created=True, replaced=False)
    error = ts.ItemError(
        item_id="x",
        spec_id="water",
        queue="garden",
        position=0,
        entry=ts.ErrorEntry(at=when, worker="w", attempt=1, error="boom"),
    )
    assert_type(error.cursor, str)
    rate: ts.RateLimit = ts.RateLimit(limit=100, period=60.0)
    assert rate == ts.RateLimit.parse("100/60s")
    ts.QueueInfo(
        name="garden",
        paused=True,
        paused_at=when,
        counts={ts.ItemState.QUEUED: 1},
        rate_limit=rate,
        throttled_until=when,
    )
    ts.Lease(item_id="x", version=1, worker_id="w")
    ts.Settlement(
        item_id="x",
        lease_version=1,
        kind=ts.SettleKind.RESCHEDULE,
        delay=0.0,
        at=when,
        config={},
        result=None,
        error=None,
        children=[new],
        wait_for_children=False,
    )
    outcomes: list[ts.Outcome] = [
        ts.Continue(delay=5.0, children=[new], wait_for_children=True),
        ts.Reschedule(when, {"litres": 3}, children=[new]),
        ts.Stop(result={"ok": True}, children=[new]),
    ]
    assert_type(outcomes[0], ts.Continue | ts.Reschedule | ts.Stop)


@ts.durable_workflow("water", config_type=Watering, queue="garden", priority=1, timeout=60.0)
async def water(wf: ts.Workflow[Garden], config: Watering) -> float:
    """A durable workflow: the decorator makes the driver, typed by its config."""
    litres = await wf.step("measure", lambda: config.litres, retry=ts.RestartPolicy(1, 10))
    assert_type(litres, Any)
    await wf.sleep(dt.timedelta(hours=1))
    await wf.sleep_until(wf.now() + dt.timedelta(hours=1), name="again")
    payload = await wf.wait_for_event("rain", timeout=dt.timedelta(days=1), payload_type=Garden)
    if await wf.patched("more-water"):
        litres = litres * 2
    assert_type(wf.step_key("measure"), str)
    assert_type(wf.context, Garden)
    return float(litres) if payload is None else 0.0


def durable_records(store: ts.DurableJournal, item: WorkItem) -> None:
    """The durable workflow's driver and journal records, built with every argument."""
    assert_type(water, ts.DurableWorkflow[Watering])
    registry: ts.DriverRegistry[Garden] = ts.DriverRegistry()
    registry.register(water)
    when = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    entry = ts.JournalEntry(
        position=0,
        kind=ts.EntryKind.STEP,
        name="measure",
        result=3.0,
        attempts=1,
        started_at=when,
        finished_at=when,
        wake_at=None,
    )
    event = ts.ItemEvent(name="rain", payload={"mm": 4}, sent_at=when)
    journal = ts.Journal(entries=(entry,), events=(event,))
    assert_type(journal.entries[0].pending, bool)
    ts.DurableWorkflow(
        name="water",
        config_type=Watering,
        function=water.function,
        queue="garden",
        priority=0,
        timeout=None,
        jitter=ts.Jitter(seed=1),
        store=store,
        hook=None,
    )
    ts.Workflow(
        name="water",
        item=item,
        context=Garden(name="g"),
        store=store,
        clock=store.clock.now,
        entries={0: entry},
        events=(event,),
        jitter=ts.Jitter(seed=1),
        hook=None,
        count=lambda outcome: None,
    )
