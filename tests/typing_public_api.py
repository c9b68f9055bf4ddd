"""What ``mypy --strict`` sees of the public API (checked by the ``type`` tox env and by
``tests/test_typing.py``); never run.

Each ``assert_type`` is a promise to users: change one only with a changelog entry.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import AsyncIterator, Mapping
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
