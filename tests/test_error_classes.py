"""Error classes and snoozes: Discard and unfit configs go dead at once; Continue(delay) snoozes."""

from __future__ import annotations

import datetime as dt

import attrs
import pytest
import trio
import trio.testing

import trio_supervise as ts
from trio_supervise.queues import WorkItem


@attrs.frozen
class Watering:
    litres: float


class Gardener:
    """Discards what it cannot water, snoozes when told, and finishes otherwise."""

    name = "gardener"
    spec_ids = ("water",)
    config_type = Watering

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem, config: Watering) -> ts.Outcome:
        if config.litres < 0:
            raise ts.Discard(f"cannot water {config.litres} litres")
        if config.litres == 0:
            return ts.Continue(delay=3600)
        return ts.Stop()


def _settings() -> ts.RunnerSettings:
    return ts.RunnerSettings(worker_id="w", lease=30, requeue_delay=5)


async def _pass(queue: ts.MemoryQueue) -> ts.PassStats:
    registry = ts.DriverRegistry[None]().register(Gardener())
    return await ts.run_due_pass(queue, registry, _settings(), lambda: None)


async def test_discard_sends_the_item_straight_to_dead(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Discard(reason) is dead at the first error, with the reason, whatever max_errors says."""
    queue = ts.MemoryQueue()
    await queue.enqueue("water", item_id="desert", config={"litres": -1.0})
    assert await _pass(queue) == ts.PassStats(claimed=1, failed=1)
    item = await queue.get("desert")
    assert (item.state, item.error_count) == (ts.ItemState.DEAD, 1)
    assert item.last_error == "discarded: cannot water -1.0 litres"


async def test_a_config_that_can_never_fit_is_dead_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A config that does not structure into config_type is dead at once, naming the field."""
    queue = ts.MemoryQueue()
    await queue.enqueue("water", item_id="typo", config={"litre": 1})
    await _pass(queue)
    item = await queue.get("typo")
    assert item.state is ts.ItemState.DEAD
    assert item.last_error is not None
    assert item.last_error.startswith("invalid config for spec 'water': ")


async def test_continue_with_a_delay_snoozes_without_an_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Continue(delay=3600) makes the item due an hour later, its error count and attempts 0."""
    queue = ts.MemoryQueue()
    before = queue.clock.now()
    await queue.enqueue("water", item_id="rainy", config={"litres": 0.0})
    assert await _pass(queue) == ts.PassStats(claimed=1, failed=0)
    item = await queue.get("rainy")
    assert (item.state, item.error_count, item.attempt) == (ts.ItemState.QUEUED, 0, 0)
    assert (item.due_at - before).total_seconds() == 3600


def test_continue_delay_is_checked() -> None:
    """A negative, infinite or non-number snooze is refused when the outcome is made."""
    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="Continue delay must be from 0"):
            ts.Continue(delay=bad)
    with pytest.raises(TypeError, match="Continue delay must be a number"):
        ts.Continue(delay="soon")  # type: ignore[arg-type]
    assert ts.Continue().delay is None


async def test_enqueue_accepts_an_attrs_config(autojump_clock: trio.testing.MockClock) -> None:
    """An instance of a driver's config_type is unstructured by the shared converter."""
    queue = ts.MemoryQueue()
    item = await queue.enqueue("water", config=Watering(litres=2.5))
    assert item.config == {"litres": 2.5}
    assert await _pass(queue) == ts.PassStats(claimed=1, failed=0)
    assert (await queue.get(item.id)).state is ts.ItemState.COMPLETED


async def test_a_driver_with_an_out_of_range_default_priority_is_refused() -> None:
    """A driver's default priority or queue is checked when it is registered."""

    class Shouty(Gardener):
        name = "shouty"
        priority = 1000

    with pytest.raises(ts.DriverError, match="driver 'shouty': priority must be an integer"):
        ts.DriverRegistry[None]().register(Shouty())


class Sleeper:
    """Sleeps as long as the config says; the driver's timeout is 45 s."""

    name = "sleeper"
    spec_ids = ("nap",)
    timeout = 45

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        await trio.sleep(item.config["sleep"])
        return ts.Stop()


async def test_an_evaluation_past_its_timeout_is_an_item_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """At the driver's timeout the evaluation is cancelled: `timed out after 45 s`, retried;
    the 30 s lease kept being renewed meanwhile, so nobody else took the item."""
    queue = ts.MemoryQueue()
    await queue.enqueue("nap", item_id="long", config={"sleep": 100})
    await queue.enqueue("nap", item_id="short", config={"sleep": 1})
    registry = ts.DriverRegistry[None]().register(Sleeper())
    settings = ts.RunnerSettings(worker_id="w", lease=30, requeue_delay=500)
    runner = ts.WorkflowRunner(
        queue=queue, registry=registry, settings=settings, build_context=lambda: None
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await trio.sleep(46)
        runner.shutdown.begin()
    long = await queue.get("long")
    assert (long.state, long.error_count, long.last_error) == (
        ts.ItemState.QUEUED,
        1,
        "timed out after 45 s",
    )
    assert long.lease_version == 1  # claimed once: the lease never lapsed while it ran
    assert (await queue.get("short")).state is ts.ItemState.COMPLETED
    renewals = [e for e in queue.events if e.op == "renew" and e.item_id == "long"]
    assert [e.at - queue.events[0].at for e in renewals][:2] == [
        dt.timedelta(seconds=10),
        dt.timedelta(seconds=20),
    ]


async def test_an_item_timeout_overrides_the_drivers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """enqueue(evaluation_timeout=2) bounds that item's evaluations at 2 s, not the driver's 45."""
    queue = ts.MemoryQueue()
    item = await queue.enqueue("nap", config={"sleep": 10}, evaluation_timeout=2)
    assert item.timeout == 2.0
    registry = ts.DriverRegistry[None]().register(Sleeper())
    await ts.run_due_pass(queue, registry, _settings(), lambda: None)
    assert (await queue.get(item.id)).last_error == "timed out after 2 s"
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        await queue.enqueue("nap", evaluation_timeout=0)


class Reporter:
    """Stops with a result."""

    name = "reporter"
    spec_ids = ("report",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        return ts.Stop(result=Watering(litres=4.0))


async def test_stop_with_a_result_stores_it(autojump_clock: trio.testing.MockClock) -> None:
    """Stop(result=...) stores the (unstructured) result with the completed item."""
    queue = ts.MemoryQueue()
    item = await queue.enqueue("report")
    registry = ts.DriverRegistry[None]().register(Reporter())
    await ts.run_due_pass(queue, registry, _settings(), lambda: None)
    done = await queue.get(item.id)
    assert (done.state, done.result) == (ts.ItemState.COMPLETED, {"litres": 4.0})
