"""Each item's evaluation runs in a :mod:`contextvars` context of its own, as a task per item
would: what one item's driver sets is never seen by another item, on the long-running runner
(whose evaluators run many items one after the other in one task) and in one due pass."""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import trio_supervise as ts
from trio_supervise.queues import WorkItem

from .test_runner import FaultyQueue, make_runner, running

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


@attrs.define
class Setter:
    """Records what each item sees of ``VAR`` on entry, after a checkpoint and at its end, and
    sets ``VAR`` to the item's id (on entry, or only after its first await)."""

    name: str = "setter"
    spec_ids: tuple[str, ...] = ("job",)
    seen: dict[str, list[str]] = attrs.Factory(dict)
    ended: dict[str, str] = attrs.Factory(dict)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        seen = self.seen.setdefault(item.id, [])
        seen.append(VAR.get())
        if item.config.get("late"):
            await trio.sleep(item.config.get("sleep", 0))
        VAR.set(item.id)
        try:
            await trio.sleep(item.config.get("sleep", 0))
            seen.append(VAR.get())
            if item.config.get("thread"):
                seen.append(await trio.to_thread.run_sync(VAR.get))
        finally:
            self.ended[item.id] = VAR.get()
        return ts.Stop()


async def _enqueue(queue: ts.WorkQueue, count: int, **config: Any) -> list[str]:
    ids = [f"i{n}" for n in range(count)]
    for item_id in ids:
        await queue.enqueue("job", item_id=item_id, config=config)
    return ids


async def _run_runner(queue: ts.WorkQueue, driver: Setter, concurrency: int) -> None:
    async with running(make_runner(queue, driver, concurrency=concurrency)):
        # Step by step: the autojump clock jumps while a driver waits for a thread.
        for _ in range(1000):
            await trio.sleep(1)
            if len(driver.ended) == 6 and not await queue.list_items(states=[ts.ItemState.RUNNING]):
                break


async def _run_pass(queue: ts.WorkQueue, driver: Setter, concurrency: int) -> None:
    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    registry.register(driver)
    settings = ts.RunnerSettings(worker_id="a", lease=30)
    await ts.run_due_pass(queue, registry, settings, lambda: None)


RUNS: dict[str, Callable[[ts.WorkQueue, Setter, int], Awaitable[None]]] = {
    "runner": _run_runner,
    "due pass": _run_pass,
}


@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize(
    "config",
    [{}, {"sleep": 1}, {"late": True, "sleep": 1}, {"thread": True}],
    ids=["no-await", "awaits", "sets-after-await", "thread"],
)
async def test_what_a_driver_sets_is_not_seen_by_the_next_item(
    autojump_clock: trio.testing.MockClock, run: str, concurrency: int, config: dict[str, Any]
) -> None:
    """Back to back in one evaluator (concurrency 1, drivers that never block), or interleaved,
    or setting only after their first await: every item starts from the runner's context, keeps
    what it set across its own awaits and in a thread it starts, and leaves nothing behind."""
    if config.get("thread"):
        # A thread's return takes real time, and at a threshold of 0 the clock jumps the moment
        # every task waits for one: _run_runner's thousand virtual seconds could pass before
        # the third item's thread came back (about 1 run in 20). Jump only after 50 ms of real
        # idleness, as the service supervision tests do.
        autojump_clock.autojump_threshold = 0.05
    queue = ts.MemoryQueue()
    ids = await _enqueue(queue, 6, **config)
    driver = Setter()
    await RUNS[run](queue, driver, concurrency)
    assert sorted(driver.seen) == ids
    for item_id in ids:
        expected = ["unset", item_id] + ([item_id] if config.get("thread") else [])
        assert driver.seen[item_id] == expected
        assert driver.ended[item_id] == item_id
    assert VAR.get() == "unset"


async def test_a_driver_sees_the_context_the_runner_was_started_in(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Values set around the runner reach every item, as they would reach a task per item."""
    queue = ts.MemoryQueue()
    ids = await _enqueue(queue, 3)
    driver = Setter()
    token = VAR.set("outer")
    try:
        await _run_runner(queue, driver, 1)
    finally:
        VAR.reset(token)
    assert [driver.seen[item_id][0] for item_id in ids] == ["outer"] * 3


async def test_a_stopped_evaluation_ends_in_its_own_context(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A cancel request cancels the driver mid-await: its ``finally`` still sees what it set,
    the item is settled cancelled, and the next item the evaluator takes starts clean."""
    queue = FaultyQueue()
    await queue.enqueue("job", item_id="slow", config={"sleep": 1000})
    driver = Setter()
    runner = make_runner(queue, driver, concurrency=1, lease=30)
    async with running(runner):
        await trio.sleep(5)
        await queue.request_cancel("slow")
        await trio.sleep(30)
        await queue.enqueue("job", item_id="next")
        await trio.sleep(5)
    assert driver.ended["slow"] == "slow"
    assert driver.seen["next"] == ["unset", "next"]
    slow = await queue.get("slow")
    assert slow is not None
    assert slow.state is ts.ItemState.CANCELLED


class _Foreign:
    """An awaitable from another event loop: Trio throws a TypeError into whoever awaits it."""

    def __await__(self) -> Generator[Any, Any, None]:
        yield "not a trio trap"


@attrs.define
class ForeignAwaiter:
    name: str = "foreign"
    spec_ids: tuple[str, ...] = ("job",)
    caught: list[str] = attrs.Factory(list)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        VAR.set(item.id)
        try:
            await _Foreign()
        except TypeError:
            self.caught.append(VAR.get())
        return ts.Stop()


async def test_an_error_trio_throws_in_reaches_the_driver_in_its_context(
    autojump_clock: trio.testing.MockClock,
) -> None:
    queue = ts.MemoryQueue()
    ids = await _enqueue(queue, 2)
    driver = ForeignAwaiter()
    async with running(make_runner(queue, driver, concurrency=1)):
        await trio.sleep(5)
    assert driver.caught == ids
    for item_id in ids:
        item = await queue.get(item_id)
        assert item is not None
        assert item.state is ts.ItemState.COMPLETED


class _Incomparable:
    def __eq__(self, other: object) -> bool:
        raise TypeError("no comparing")

    __hash__ = object.__hash__


ODD: contextvars.ContextVar[object] = contextvars.ContextVar("ODD", default=None)


@attrs.define
class OddSetter:
    """Sets ``ODD`` to a value whose ``==`` raises, starting from one such value already set."""

    name: str = "odd"
    spec_ids: tuple[str, ...] = ("job",)
    seen: list[object] = attrs.Factory(list)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        self.seen.append(ODD.get())
        ODD.set(_Incomparable())
        return ts.Stop()


async def test_a_value_that_cannot_be_compared_still_leaves_with_its_item(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Telling whether a driver changed the context compares values only when a variable was
    set anew; a value whose ``==`` raises counts as a change, and no evaluator fails on it."""
    queue = ts.MemoryQueue()
    ids = await _enqueue(queue, 4)
    driver = OddSetter()
    outer = _Incomparable()
    token = ODD.set(outer)
    try:
        async with running(make_runner(queue, driver, concurrency=1)):
            await trio.sleep(5)
    finally:
        ODD.reset(token)
    assert driver.seen == [outer] * 4
    for item_id in ids:
        item = await queue.get(item_id)
        assert item is not None
        assert item.state is ts.ItemState.COMPLETED
