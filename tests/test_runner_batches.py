"""The runner's per-batch bookkeeping: evaluators sharing a batch, metrics counted per batch,
events built only for a subscriber. Everything on the memory queue under virtual time."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry, Histogram

import trio_supervise as ts
from trio_supervise.run._observation import _observe_all

from .test_runner import Kind, Recorder, make_runner, running


def sample(runner: ts.WorkflowRunner[None], name: str) -> float:
    return runner.metrics.registry.get_sample_value(name, {"spec": "job"}) or 0.0


async def test_a_batch_of_blocking_evaluations_runs_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each item of one claimed batch whose evaluation blocks gets its own evaluator: they all
    start at the claim and end together, quick ones mixed in included."""
    queue = ts.MemoryQueue()
    for n in range(12):
        await queue.enqueue("job", item_id=f"i{n:02d}", config={"sleep": 1 if n % 3 else 0})
    recorder = Recorder()
    runner = make_runner(queue, recorder, concurrency=12, claim_batch=12)
    async with running(runner):
        await trio.sleep(5)
    assert recorder.peak == 8  # the 8 that sleep, at once
    assert {starts[0] for starts in recorder.starts.values()} == {0.0}
    assert sorted(set(recorder.ends.values())) == [0.0, 1.0]
    items = queue.items
    assert all(item.state is ts.ItemState.COMPLETED for item in items.values())
    assert len(items) == 12


async def test_quick_evaluations_share_an_evaluator(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Evaluations that never block run one after another in the evaluator that took the first
    of the batch (one more is woken in case it blocks): the pool stays small."""
    tasks: set[trio.lowlevel.Task] = set()

    class Quick:
        name = "quick"
        spec_ids = ("job",)

        def validate_specs(self) -> None:
            pass

        async def evaluate(self, context: None, item: ts.WorkItem) -> ts.Outcome:
            tasks.add(trio.lowlevel.current_task())
            return ts.Stop()

    queue = ts.MemoryQueue()
    for n in range(200):
        await queue.enqueue("job", item_id=f"q{n:03d}")
    runner = make_runner(queue, Quick(), concurrency=64, claim_batch=64)
    async with running(runner):
        await trio.sleep(1)
    assert sample(runner, "trio_supervise_items_completed_total") == 200
    assert len(tasks) <= 4


async def test_batched_metrics_are_exact_at_every_checkpoint(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Counts applied once per claim or write batch are never seen between: at every checkpoint
    another task sees the claims and completions the queue recorded, and the evaluations
    observed lie between the two; once done, each metric counts every item."""
    queue = ts.MemoryQueue()
    count = 150
    for n in range(count):
        await queue.enqueue("job", item_id=f"m{n:03d}", config={"sleep": (n % 4) * 0.25})
    runner = make_runner(queue, Recorder(), concurrency=16, claim_batch=8)
    checks = 0
    async with running(runner):
        while sample(runner, "trio_supervise_items_completed_total") < count:
            # Checkpoints interleave with the runner's tasks at one instant; the sleep lets
            # virtual time move on (it stands still while any task can run).
            for _ in range(20):
                claims = sum(1 for e in queue.events if e.op == "claim")
                completions = sum(1 for e in queue.events if e.op == "settle:complete")
                claimed = sample(runner, "trio_supervise_items_claimed_total")
                completed = sample(runner, "trio_supervise_items_completed_total")
                observed = sample(runner, "trio_supervise_evaluation_seconds_count")
                assert (claimed, completed) == (claims, completions)
                assert completed <= observed <= claimed
                checks += 1
                await trio.lowlevel.checkpoint()
            await trio.sleep(0.05)
    assert checks > count
    assert sample(runner, "trio_supervise_items_claimed_total") == count
    assert sample(runner, "trio_supervise_evaluation_seconds_count") == count
    assert sample(runner, "trio_supervise_evaluation_seconds_sum") == pytest.approx(
        sum((n % 4) * 0.25 for n in range(count))
    )
    le = runner.metrics.registry.get_sample_value(
        "trio_supervise_evaluation_seconds_bucket", {"spec": "job", "le": "0.5"}
    )
    assert le == sum(1 for n in range(count) if (n % 4) * 0.25 <= 0.5)


def test_observing_a_batch_gives_the_samples_one_observe_each_gives() -> None:
    """Bucket bounds included, and the sum to the last bit (added up in the same order)."""
    bounds = (0.01, 0.05, 0.1, 0.5, 1, 5, float("inf"))
    rng = random.Random(7)
    values = [rng.choice([0.0, 0.01, 0.05, 0.1, 1, 5, 1e9, rng.random(), rng.random() / 100])]
    values += [rng.choice([0.0, 0.01, 0.05, 1, rng.random() * 10]) for _ in range(3000)]

    def histogram() -> tuple[CollectorRegistry, Histogram]:
        registry = CollectorRegistry()
        return registry, Histogram("h", "h", ["spec"], registry=registry, buckets=bounds)

    one_by_one, each = histogram()
    batched, batch = histogram()
    child = each.labels("x")
    for value in values:
        child.observe(value)
    for start in range(0, len(values), 37):
        _observe_all(batch.labels("x"), values[start : start + 37])

    def samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
        return [
            (s.name, s.labels, s.value)
            for metric in registry.collect()
            for s in metric.samples
            if not s.name.endswith("_created")
        ]

    assert samples(batched) == samples(one_by_one)


async def test_events_reach_a_subscriber_for_every_item_of_a_batch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Events are built only when someone subscribed; a subscriber gets each item's claim,
    outcome and settlement, in that order, batches or not."""
    queue = ts.MemoryQueue()
    for n in range(20):
        await queue.enqueue("job", item_id=f"e{n:02d}")
    events: list[ts.RunnerEvent] = []
    runner = make_runner(queue, events=events, concurrency=8, claim_batch=8)
    async with running(runner):
        await trio.sleep(1)
    for n in range(20):
        mine = [(e.kind, e.detail) for e in events if e.item_id == f"e{n:02d}"]
        assert mine == [
            (Kind.CLAIMED, ""),
            (Kind.OUTCOME, "complete"),
            (Kind.SETTLED, "complete"),
        ]
