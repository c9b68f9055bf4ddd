"""Typed driver configs at run time, and ``build_context`` as a value, a coroutine or an async
context manager, for the runner and for one due pass."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import trio_supervise as ts
from trio_supervise.queues import WorkItem

EPOCH = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


@attrs.frozen
class Watering:
    """A typed config."""

    litres: float
    rounds: int = 0


@attrs.define
class WateringDriver:
    """A typed driver: ``evaluate`` takes the config as a third argument."""

    name: str = "watering"
    spec_ids: Sequence[str] = ("watering",)
    config_type: type[Watering] = Watering
    seen: list[tuple[Any, Watering]] = attrs.Factory(list)
    contexts: list[object] = attrs.Factory(list)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: object, item: WorkItem, config: Watering) -> ts.Outcome:
        self.seen.append((item.config, config))
        self.contexts.append(context)
        await trio.sleep(1)
        if config.rounds >= 1:
            return ts.Stop()
        return ts.Reschedule(EPOCH, attrs.evolve(config, rounds=config.rounds + 1))


class SubclassedDriver(ts.TypedWorkflowDriver[None, Watering]):
    """A typed driver that subclasses the protocol, inheriting ``validate_specs``."""

    name = "subclassed"
    spec_ids = ("watering",)
    config_type = Watering

    async def evaluate(self, context: None, item: WorkItem, config: Watering) -> ts.Outcome:
        return ts.Stop() if config.litres > 1 else ts.Continue()


def settings(**changes: Any) -> ts.RunnerSettings:
    return ts.RunnerSettings(worker_id="w", lease=30, poll_interval=1, **changes)


def runner_for(
    queue: ts.MemoryQueue, driver: Any, build_context: ts.ContextFactory[Any]
) -> ts.WorkflowRunner[Any]:
    registry: ts.DriverRegistry[Any] = ts.DriverRegistry()
    registry.register(driver)
    return ts.WorkflowRunner(
        queue=queue, registry=registry, settings=settings(), build_context=build_context
    )


async def test_a_typed_driver_gets_its_config_as_an_argument(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``evaluate(context, item, config)`` receives the structured instance (item.config too),
    and a rescheduled instance is stored back as JSON."""
    queue = ts.MemoryQueue()
    driver = WateringDriver()
    await queue.enqueue("watering", item_id="rose", config={"litres": 2.5})
    runner = runner_for(queue, driver, lambda: None)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await trio.sleep(10)
        runner.shutdown.begin()
    assert driver.seen == [
        (Watering(2.5), Watering(2.5)),
        (Watering(2.5, 1), Watering(2.5, 1)),
    ]
    item = await queue.get("rose")
    assert (item.state, item.config) == (ts.ItemState.COMPLETED, {"litres": 2.5, "rounds": 1})


async def test_a_subclass_of_the_typed_protocol_runs_with_the_inherited_validate_specs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Subclassing ``TypedWorkflowDriver`` gives a working driver without a ``validate_specs``."""
    queue = ts.MemoryQueue()
    await queue.enqueue("watering", item_id="fern", config={"litres": 3})
    stats = await ts.run_due_pass(
        queue, ts.DriverRegistry[None]().register(SubclassedDriver()), settings(), lambda: None
    )
    assert stats == ts.PassStats(claimed=1, failed=0)
    assert (await queue.get("fern")).state is ts.ItemState.COMPLETED


def test_a_config_argument_without_a_config_type_is_refused() -> None:
    """A driver whose ``evaluate`` wants a config but declares no ``config_type`` is refused."""

    @attrs.define
    class Untyped:
        name: str = "untyped"
        spec_ids: Sequence[str] = ("x",)

        def validate_specs(self) -> None:
            pass

        async def evaluate(self, context: None, item: WorkItem, config: Any) -> ts.Outcome:
            raise AssertionError("never called")

    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    with pytest.raises(ts.DriverError, match="'untyped': evaluate takes a config argument"):
        registry.register(Untyped())  # type: ignore[call-overload]
    assert registry.is_empty()


async def test_a_bad_config_for_a_typed_driver_is_an_item_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A config that does not fit is the item's error, and ``evaluate`` is never called."""
    queue = ts.MemoryQueue()
    driver = WateringDriver()
    await queue.enqueue("watering", item_id="cactus", config={"litres": "lots"})
    registry = ts.DriverRegistry[None]().register(driver)
    stats = await ts.run_due_pass(queue, registry, settings(), lambda: None)
    assert stats == ts.PassStats(claimed=1, failed=1)
    item = await queue.get("cactus")
    assert item.last_error == "invalid config for spec 'watering': litres: expected float, got str"
    assert driver.seen == []


# -- build_context --------------------------------------------------------------------------


@attrs.define
class Pool:
    """Stands in for an HTTP client or a database pool: records when it is opened and closed."""

    opened: list[float] = attrs.Factory(list)
    closed: list[tuple[float, str | None]] = attrs.Factory(list)
    """When, and with which exception (leaf type names, for a group), or None after a stop."""

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Pool]:
        self.opened.append(trio.current_time())
        try:
            yield self
        except BaseException as error:
            self.closed.append((trio.current_time(), _leaf_names(error)))
            raise
        else:
            self.closed.append((trio.current_time(), None))


def _leaf_names(error: BaseException) -> str:
    if isinstance(error, BaseExceptionGroup):
        return ",".join(sorted({_leaf_names(inner) for inner in error.exceptions}))
    return type(error).__name__


async def _value() -> str:
    await trio.lowlevel.checkpoint()
    return "from a coroutine"


@pytest.mark.parametrize(
    ("build_context", "expected"),
    [
        (lambda: "plain", "plain"),
        (_value, "from a coroutine"),
    ],
    ids=["plain-function", "coroutine-function"],
)
async def test_a_plain_or_coroutine_build_context_still_works(
    autojump_clock: trio.testing.MockClock,
    build_context: Callable[[], Any],
    expected: str,
) -> None:
    """A function returning the context, or an ``async def``, gives the drivers that context."""
    queue = ts.MemoryQueue()
    driver = WateringDriver()
    await queue.enqueue("watering", item_id="a", config={"litres": 1})
    async with trio.open_nursery() as nursery:
        runner = runner_for(queue, driver, build_context)
        await nursery.start(runner.run)
        await trio.sleep(5)
        runner.shutdown.begin()
    assert driver.contexts == [expected, expected]


async def test_an_async_context_manager_is_entered_at_start_and_exited_on_stop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The context manager is entered once per runner start, and exited after the drain."""
    queue = ts.MemoryQueue()
    pool, driver = Pool(), WateringDriver()
    for start in (0, 100):
        await queue.enqueue("watering", item_id=f"at-{start}", config={"litres": 1})
        runner = runner_for(queue, driver, pool.open)
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            await trio.sleep(10)
            runner.shutdown.begin()
        await trio.sleep(90)
    assert pool.opened == [0.0, 100.0]
    assert pool.closed == [(10.0, None), (110.0, None)]
    assert driver.contexts == [pool] * 4


async def test_the_context_manager_is_exited_when_the_runner_is_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Cancelled from outside mid-evaluation, the runner still exits the context manager."""
    queue = ts.MemoryQueue()
    pool = Pool()
    await queue.enqueue("watering", item_id="slow", config={"litres": 1})
    runner = runner_for(queue, WateringDriver(), pool.open)
    for _ in range(2):  # a restart of the same runner opens a fresh one
        with trio.move_on_after(0.5):
            await runner.run()
        assert runner.state is ts.RunnerState.STOPPED
    assert pool.opened == [0.0, 0.5]
    assert pool.closed == [(0.5, "Cancelled"), (1.0, "Cancelled")]


async def test_a_service_closes_its_context_when_it_stops(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``Service(build_context=...)`` with a context manager: open while it runs, closed after
    ``stop()`` drained it."""
    queue, pool = ts.MemoryQueue(), Pool()
    await queue.enqueue("watering", item_id="a", config={"litres": 1})
    service = ts.Service(
        drivers=[WateringDriver()],
        build_context=pool.open,
        queue=queue,
        settings=ts.Settings(http=ts.HttpSettings(enabled=False), runner=settings(), jitter_seed=1),
        handle_signals=False,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await trio.sleep(5)
        assert (pool.opened, pool.closed) == ([0.0], [])
        service.stop()
    assert pool.closed == [(5.0, None)]
    assert (await queue.get("a")).state is ts.ItemState.COMPLETED


async def test_the_context_manager_is_exited_when_the_runner_fails(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A runner that fails (claims failing past their bound) exits the context manager too."""

    @attrs.define(eq=False)
    class Broken(ts.MemoryQueue):
        async def claim_due(self, *args: Any, **kwargs: Any) -> list[WorkItem]:
            raise ts.QueueUnavailable("database is down")

    pool = Pool()
    registry = ts.DriverRegistry[Any]().register(WateringDriver())
    runner = ts.WorkflowRunner(
        queue=Broken(),
        registry=registry,
        settings=settings(
            claim_retry=ts.RestartPolicy(1, 1, max_restarts=2, jitter=ts.JitterMode.NONE)
        ),
        build_context=pool.open,
    )
    with pytest.raises(ts.QueueUnavailable, match="database is down"):
        await runner.run()
    assert runner.state is ts.RunnerState.FAILED
    assert len(pool.opened) == 1
    assert pool.closed == [(pool.opened[0] + 2.0, "QueueUnavailable")]


async def test_a_context_manager_that_fails_to_open_fails_the_start() -> None:
    """An error entering the context manager is raised by ``run``, before readiness."""

    class Refusing:
        async def __aenter__(self) -> None:
            raise ConnectionRefusedError("pool refused")

        async def __aexit__(self, *exc_info: object) -> None:
            raise AssertionError("never entered, so never exited")

    runner = runner_for(ts.MemoryQueue(), WateringDriver(), Refusing)
    with pytest.raises(ConnectionRefusedError, match="pool refused"):
        await runner.run()
    assert runner.state is ts.RunnerState.FAILED


async def test_one_due_pass_opens_and_closes_the_context_around_its_items(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``run_due_pass`` enters the context manager only when it claimed something, and exits it
    once every outcome is written."""
    queue = ts.MemoryQueue()
    pool = Pool()
    registry = ts.DriverRegistry[Any]().register(WateringDriver())
    assert await ts.run_due_pass(queue, registry, settings(), pool.open) == ts.PassStats()
    assert pool.opened == []
    await queue.enqueue("watering", item_id="a", config={"litres": 1})
    assert await ts.run_due_pass(queue, registry, settings(), pool.open) == ts.PassStats(1, 0)
    assert pool.opened == [0.0]
    assert pool.closed == [(1.0, None)]
    item = await queue.get("a")
    assert item.config == {"litres": 1.0, "rounds": 1}
