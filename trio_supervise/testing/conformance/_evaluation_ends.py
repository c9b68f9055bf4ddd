"""How an evaluation's end is written, the same on every backend and through both executors
(issue 29, classes 1 and 4): an outcome that cannot be stored makes its item dead at once and
the driver never runs again for it; a failure counts its attempt in a due pass as in a runner.

The runner and the due pass run under the real clock (the durable backends block threads),
with the injected :class:`ManualClock` moved by hand for due times.
"""

from __future__ import annotations

import collections
import datetime as dt
import math
from typing import Any

import attrs
import pytest
import trio

import trio_supervise as ts

from ...job import MAX_CHILDREN, ItemState, NewItem, WorkItem
from ...queues import MAX_ID_LENGTH, WorkQueue
from ._clock import START, ManualClock

AT = START + dt.timedelta(days=1)

POISON: dict[str, tuple[Any, str]] = {
    "nan": (ts.Stop(math.nan), "the complete outcome could not be stored: result for spec"),
    "inf": (ts.Stop({"x": -math.inf}), "the complete outcome could not be stored: result for"),
    "bytes": (ts.Stop(b"raw"), "the complete outcome could not be stored: result for spec"),
    "set": (ts.Stop({1, 2}), "the complete outcome could not be stored: result for spec"),
    "nul": (ts.Stop({"x": "a\x00b"}), "the complete outcome could not be stored: result for"),
    "surrogate": (ts.Stop(["\udcff"]), "the complete outcome could not be stored: result for"),
    "config": (
        ts.Reschedule(AT, {"x": math.nan}),
        "the reschedule outcome could not be stored: rescheduled config for spec",
    ),
    "child-config": (
        ts.Continue(children=[NewItem(spec_id="leaf", config={"x": object()})]),
        "the continue outcome could not be stored: children[0] of spec",
    ),
    "child-id": (
        ts.Stop(children=[NewItem(spec_id="leaf", item_id="c" * (MAX_ID_LENGTH + 1))]),
        "the complete outcome could not be stored: children[0] of spec",
    ),
    "too-many-children": (
        ts.Continue(children=[NewItem(spec_id="leaf")] * (MAX_CHILDREN + 1)),
        "the continue outcome could not be stored: children: at most",
    ),
    "not-an-outcome": (42, "driver 'poison' returned 42, not Continue, Reschedule or Stop"),
}


@attrs.define
class Counting:
    """Does its work (counted), then returns what *answer* says for the item: an outcome from
    ``POISON`` by its ``case``, or it raises."""

    name: str
    spec_ids: tuple[str, ...]
    answer: Any
    runs: collections.Counter[str] = attrs.Factory(collections.Counter)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: object, item: WorkItem) -> Any:
        self.runs[item.id] += 1
        return self.answer(item)


def _poisoned(item: WorkItem) -> Any:
    return POISON[item.config["case"]][0]


def _planned_failure(item: WorkItem) -> ts.Outcome:
    raise RuntimeError("planned")


def Poison(spec: str = "poison") -> Counting:
    return Counting("poison", (spec,), _poisoned)


def Failing() -> Counting:
    return Counting("failing", ("failing",), _planned_failure)


def _settings(**changes: Any) -> ts.RunnerSettings:
    values: dict[str, Any] = {"worker_id": "w", "poll_interval": 0.05, "concurrency": 20}
    return ts.RunnerSettings(**{**values, **changes})


def _registry(*drivers: Any) -> ts.DriverRegistry[None]:
    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    for driver in drivers:
        registry.register(driver)
    return registry


async def _run_until(
    queue: WorkQueue,
    registry: ts.DriverRegistry[None],
    done: Any,
    settings: ts.RunnerSettings | None = None,
) -> None:
    """Run a runner on *queue* until ``await done()`` is true (20 s at most)."""
    runner = ts.WorkflowRunner(
        queue=queue,
        registry=registry,
        settings=_settings() if settings is None else settings,
        build_context=lambda: None,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        with trio.fail_after(20):
            while not await done():  # noqa: ASYNC110
                await trio.sleep(0.02)  # polling the store: nothing to wait on
        runner.shutdown.begin("done")


async def _states(queue: WorkQueue, item_ids: list[str]) -> list[ItemState]:
    return [(await queue.get(item_id)).state for item_id in item_ids]


@attrs.define
class Parent:
    """Fans out ``config["n"]`` children (waiting for them), then stops with their results."""

    child_config: Any = None
    name: str = "parent"
    spec_ids: tuple[str, ...] = ("parent",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, queue: WorkQueue, item: WorkItem) -> ts.Outcome:
        children = await queue.list_children(item.id)
        if not children:
            return ts.Continue(
                children=[
                    ts.NewItem(spec_id="child", config=self.child_config or {"n": index})
                    for index in range(item.config["n"])
                ],
                wait_for_children=True,
            )
        return ts.Stop(result=[child.result for child in children])


class EvaluationEndsContract:
    """How an evaluation's end is written: attempts counted, unstorable outcomes dead."""

    @pytest.mark.parametrize("executor", ["runner", "due pass"])
    async def test_an_outcome_that_cannot_be_stored_makes_its_item_dead_at_once(
        self, queue: WorkQueue, clock: ManualClock, executor: str
    ) -> None:
        """Every part of an outcome that cannot be stored (a result with NaN, inf, bytes, a set, a
        NUL or a lone surrogate; a rescheduled config; a child's config or id; too many children;
        no outcome at all): the item goes dead at once, saying which part and why, and its driver,
        whose side effects happened, never runs again for it."""
        driver = Poison()
        registry = _registry(driver)
        ids = list(POISON)
        for case in ids:
            await queue.enqueue("poison", item_id=case, config={"case": case})
        if executor == "runner":

            async def all_dead() -> bool:
                return all(state is ItemState.DEAD for state in await _states(queue, ids))

            await _run_until(queue, registry, all_dead)
        else:
            settings = _settings(claim_batch=len(ids))
            stats = await ts.run_due_pass(queue, registry, settings, lambda: None)
            assert stats == ts.PassStats(claimed=len(ids), failed=len(ids))
        clock.advance(3 * 24 * 3600)  # past any retry a failure would have had
        assert await ts.run_due_pass(queue, registry, _settings(), lambda: None) == ts.PassStats()
        for case, (_, reason) in POISON.items():
            item = await queue.get(case)
            assert item.state is ItemState.DEAD, case
            assert item.last_error is not None
            assert item.last_error.startswith(reason), item.last_error
            assert (item.error_count, len(item.errors)) == (1, 1), case
        assert driver.runs == dict.fromkeys(ids, 1)
        assert await queue.list_children("child-config") == []

    async def test_a_waited_for_child_that_cannot_store_its_result_lets_its_parent_fan_in(
        self,
        queue: WorkQueue,
    ) -> None:
        """A child whose result cannot be stored is dead at once, and so finished: its parent's
        fan-in counts it and the parent goes on, rather than waiting for a child re-run for ever."""
        poison = Poison("child")
        registry: ts.DriverRegistry[WorkQueue] = ts.DriverRegistry()
        registry.register(Parent(child_config={"case": "nan"}))
        registry.register(poison)
        await queue.enqueue("parent", item_id="p", config={"n": 1})
        runner = ts.WorkflowRunner(
            queue=queue, registry=registry, settings=_settings(), build_context=lambda: queue
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            with trio.fail_after(20):
                while (await queue.get("p")).state is not ItemState.COMPLETED:  # noqa: ASYNC110
                    await trio.sleep(0.02)  # polling the store: nothing to wait on
            # Before the runner stops: it exits its context (this queue) as it ends.
            assert (await queue.get("p")).result == [None]
            [child] = await queue.list_children("p")
            assert child.state is ItemState.DEAD
            runner.shutdown.begin("done")
        assert list(poison.runs.values()) == [1]

    @pytest.mark.parametrize("executor", ["runner", "due pass"])
    async def test_a_failing_item_counts_its_attempts_and_goes_dead_past_max_attempts(
        self, queue: WorkQueue, clock: ManualClock, executor: str
    ) -> None:
        """Each failed evaluation keeps the attempt its claim counted, in a due pass as in a
        runner: with max_attempts 3 the item fails on attempts 1, 2 and 3, and the fourth claim
        settles it dead without evaluating it."""
        driver = Failing()
        registry = _registry(driver)
        settings = _settings(max_attempts=3, requeue_delay=60, lease=600)
        await queue.enqueue("failing", item_id="f")

        async def dead() -> bool:
            state = (await queue.get("f")).state
            if state is ItemState.QUEUED:
                clock.advance(61)  # the next attempt is due
            return state is ItemState.DEAD

        if executor == "runner":
            await _run_until(queue, registry, dead, settings)
        else:
            for _ in range(4):
                await ts.run_due_pass(queue, registry, settings, lambda: None)
                await dead()
        item = await queue.get("f")
        assert (item.state, item.attempt, item.error_count) == (ItemState.DEAD, 4, 4)
        assert [entry.attempt for entry in item.errors] == [1, 2, 3, 4]
        assert [entry.error.partition("\n")[0] for entry in item.errors] == [
            "RuntimeError: planned"
        ] * 3 + ["exceeded max_attempts (3)"]
        assert driver.runs["f"] == 3

    async def test_a_context_that_fails_to_build_hands_every_claim_back_with_its_error(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A due pass whose context fails to build hands each claimed item back in one write: the
        error recorded (count and history), the attempt taken back, due after requeue_delay; not
        the item's fault, so never dead however often it happens."""
        registry = _registry(Failing())
        settings = _settings(requeue_delay=5, max_errors=3, max_attempts=3)
        await queue.enqueue("failing", item_id="a")
        await queue.enqueue("failing", item_id="b")

        async def broken() -> None:
            raise RuntimeError("no database")

        for _ in range(5):
            with pytest.raises(RuntimeError, match="no database"):
                await ts.run_due_pass(queue, registry, settings, broken)
            clock.advance(5)
        for item_id in ("a", "b"):
            item = await queue.get(item_id)
            assert (item.state, item.attempt, item.error_count) == (ItemState.QUEUED, 0, 5)
            assert item.last_error == "RuntimeError: no database"
            assert [entry.error for entry in item.errors] == ["RuntimeError: no database"] * 5
            assert item.due_at == clock.now()
