"""Outcomes with children, end to end: the outcome fields, the runner's and a due pass's
write of them, and fan-in under the runner's settle batching, in virtual time."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing

import trio_supervise as ts
from trio_supervise.queues import ItemState, WorkItem, WorkQueue
from trio_supervise.testing import Harness, harness_runner_settings
from trio_supervise.testing.conformance._evaluation_ends import Parent


class Child:
    name = "child"
    spec_ids = ("child",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, queue: WorkQueue, item: WorkItem) -> ts.Outcome:
        await trio.sleep(1 + item.config["n"])
        return ts.Stop(result=item.config["n"] * 10)


def test_continue_refuses_a_delay_with_a_wait() -> None:
    """The waiting parent is due when its children finish: a delay would be ignored, so it is
    refused."""
    with pytest.raises(ValueError, match="delay cannot be given with wait_for_children"):
        ts.Continue(5, wait_for_children=True)


def test_outcomes_refuse_children_that_are_not_new_items() -> None:
    """Children are NewItem records; a string or a dict is a TypeError naming the position."""
    with pytest.raises(TypeError, match=r"children\[1\] must be a NewItem"):
        ts.Stop(children=[ts.NewItem(spec_id="a"), {"spec_id": "b"}])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="children must be a sequence of NewItem"):
        ts.Continue(children="abc")  # type: ignore[arg-type]


async def test_many_parents_fan_in_under_the_runner(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """Twenty parents of three children each, settled in shared batches: each is evaluated again
    exactly when its slowest child finishes (3 s) and reads every child's result in order."""
    settings = attrs.evolve(harness_runner_settings(), concurrency=100, claim_batch=100)
    await harness.run_drivers(Parent(), Child(), context=harness.queue, settings=settings)
    for index in range(20):
        await harness.queue.enqueue("parent", item_id=f"p{index}", config={"n": 3})
    await harness.wait_until(
        lambda: len(harness.history.select("settled", detail="complete")) == 80, timeout=60
    )
    for index in range(20):
        parent = await harness.queue.get(f"p{index}")
        assert (parent.state, parent.result) == (ItemState.COMPLETED, [0, 10, 20])
        assert harness.history.times("settled", f"p{index}") == [0.0, 3.0]


async def test_a_bad_child_is_the_parents_item_error(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """A child whose config is not JSON makes the parent's outcome unstorable: the parent ran,
    so it goes dead at once (never evaluated again for it), the reason naming the child; no
    child is written and the runner keeps running."""
    runner = await harness.run_drivers(Parent(child_config={"x": object()}), context=harness.queue)
    await harness.queue.enqueue("parent", item_id="p", config={"n": 2})
    await harness.wait_until(lambda: harness.history.select("settled", "p", "dead"), timeout=60)
    parent = await harness.queue.get("p")
    assert parent.state is ItemState.DEAD
    assert parent.last_error is not None
    assert parent.last_error.startswith(
        "the continue outcome could not be stored: children[0] of spec 'parent': config is not "
        "JSON-compatible"
    )
    assert len(harness.history.select("claimed", "p")) == 1
    assert await harness.queue.list_children("p") == []
    assert runner.state is ts.RunnerState.RUNNING


async def test_a_due_pass_writes_children_with_the_outcome(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """run_due_pass writes an outcome with children in one settle_many: the parent waits."""
    queue = ts.MemoryQueue()
    registry: ts.DriverRegistry[WorkQueue] = ts.DriverRegistry()
    registry.register(Parent())
    await queue.enqueue("parent", item_id="p", config={"n": 2})
    settings = ts.RunnerSettings(worker_id="w")
    stats = await ts.run_due_pass(queue, registry, settings, lambda: queue)
    assert stats == ts.PassStats(claimed=1, failed=0)
    parent = await queue.get("p")
    assert (parent.state, parent.waiting_children) == (ItemState.QUEUED, 2)
    assert [child.parent_id for child in await queue.list_children("p")] == ["p", "p"]


async def test_the_status_page_says_a_parent_waits_for_its_children(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A waiting parent's due column reads "waiting for 2 children", not the year 9999."""
    from prometheus_client import CollectorRegistry

    from trio_supervise.queues import NewItem, SettleKind, Settlement

    from .test_http import FakeSource, asgi_get

    queue = ts.MemoryQueue()
    await queue.enqueue("parent", item_id="p")
    [parent] = await queue.claim_due(["parent"], "w", 30, 1)
    settlement = Settlement(
        item_id="p",
        lease_version=parent.lease_version,
        kind=SettleKind.CONTINUE,
        children=[NewItem(spec_id="child"), NewItem(spec_id="child")],
        wait_for_children=True,
    )
    assert await queue.settle_many([settlement]) == [True]
    app = ts.OperationsApp(FakeSource(), CollectorRegistry(), queue=queue)
    page = (await asgi_get(app, "/"))[1].decode()
    assert "<td>waiting for 2 children</td>" in page
    assert "9999" not in page
