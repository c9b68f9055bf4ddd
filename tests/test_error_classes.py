"""Error classes and snoozes: Discard and unfit configs go dead at once; Continue(delay) snoozes."""

from __future__ import annotations

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
