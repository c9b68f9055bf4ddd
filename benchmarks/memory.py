"""P1 (memory-queue runner against a bare nursery) and P4 (a simulated year under autojump)."""

from __future__ import annotations

import datetime as dt
import gc

import trio
import trio.testing

import trio_supervise as ts

from . import _runs
from ._common import Config, Result, best_of, noop_step, rate, wall
from ._runs import noop_rate, run_until

CONCURRENCY = 64


# -- P1 ---------------------------------------------------------------------------------------


def bare_nursery_rate(count: int) -> float:
    """No-op coroutines per second in a bare Trio nursery, 64 at a time."""

    async def main() -> float:
        semaphore = trio.Semaphore(CONCURRENCY)

        async def one() -> None:
            try:
                await noop_step()
            finally:
                semaphore.release()

        with wall() as w, _runs.timed_window():
            async with trio.open_nursery() as nursery:
                for _ in range(count):
                    await semaphore.acquire()
                    nursery.start_soon(one)
        return rate(count, w.seconds)

    return trio.run(main)


def memory_runner_rate(count: int) -> float:
    """Items per second through a runner on a :class:`MemoryQueue` (no-op driver, 64 at once)."""

    async def main() -> float:
        queue = ts.MemoryQueue()
        for _ in range(count):
            await queue.enqueue("noop")
        result = await noop_rate(queue, count, CONCURRENCY)
        completed = sum(
            n for (_, state), n in (await queue.counts()).items() if state is ts.ItemState.COMPLETED
        )
        if completed != count:
            raise RuntimeError(f"P1: {completed} of {count} items completed")
        return result

    return trio.run(main)


def p1(config: Config) -> Result:
    count = config.size(50_000, 20_000, 200)
    baseline, ours = best_of(2, lambda: bare_nursery_rate(count), lambda: memory_runner_rate(count))
    return Result(
        id="P1",
        title="memory-queue runner, no-op, concurrency 64",
        ours=ours,
        baseline=baseline,
        baseline_name="bare Trio nursery, same no-op, 64 at a time",
        better="higher",
        goal=1.0,
        unit="items/s",
        detail={"items": count, "concurrency": CONCURRENCY},
    )


# -- P4 ---------------------------------------------------------------------------------------

_DAY = dt.timedelta(days=1)
_MICROSECOND = dt.timedelta(microseconds=1)


class DailyDriver:
    """Each item reschedules itself *step* (a day) after its due time, ``days`` times, then
    stops."""

    name = "daily"
    spec_ids = ("daily",)

    def __init__(self, days: int, step: dt.timedelta = _DAY) -> None:
        self.days = days
        self.step = step
        self.evaluations = 0
        self.total = 0
        self.done = trio.Event()

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: object, item: ts.WorkItem) -> ts.Outcome:
        await noop_step()
        self.evaluations += 1
        if self.evaluations >= self.total:
            self.done.set()
        done = item.config["done"] + 1
        if done >= self.days:
            return ts.Stop()
        return ts.Reschedule(at=item.due_at + self.step, config={"done": done})


def time_travel(workflows: int, days: int, *, travel: bool = True) -> tuple[float, float]:
    """(evaluations per wall second, virtual days passed) for *workflows* daily workflows run
    for *days* steps each.

    With *travel*, under ``MockClock(autojump_threshold=0)``: each step is due a day later and
    the clock jumps there. Without, the same steps under the real clock, each due 1 us after the
    last (so due again at once): the same items, the same writes and the same claim order (every
    step of every workflow shares its due time, as a day's do), without time travel.

    Timed as P1's runner is (:func:`~benchmarks._runs.noop_rate`): from the runner's start until
    its drain ends, the workflows enqueued before; the wall clock is read inside the run, whose
    own clock is virtual."""
    driver = DailyDriver(days, _DAY if travel else _MICROSECOND)
    total = driver.total = workflows * days
    w = wall()

    async def main() -> float:
        queue = ts.MemoryQueue()
        # One due time for all, as under the virtual clock, which stands still while they are
        # enqueued (and as a day's workflows share theirs).
        due_at = queue.clock.now()
        for _ in range(workflows):
            await queue.enqueue("daily", config={"done": 0}, due_at=due_at)
        settings = ts.RunnerSettings(
            worker_id="bench", concurrency=CONCURRENCY, claim_batch=CONCURRENCY
        )
        start = trio.current_time()
        gc.collect()
        with w:
            await run_until(queue, driver, settings, driver.done, limit=(days + 2) * 86_400.0)
        return (trio.current_time() - start) / 86_400.0

    clock = trio.testing.MockClock(autojump_threshold=0) if travel else None
    virtual_days = trio.run(main, clock=clock)
    if driver.evaluations != total:
        raise RuntimeError(f"P4: {driver.evaluations} of {total} evaluations")
    return rate(total, w.seconds), virtual_days


def p4(config: Config) -> Result:
    workflows = config.size(1_000, 1_000, 20)
    days = config.size(365, 60, 3)
    # The best of three runs on each side, the sides taking turns: one run of each swung the
    # ratio 0.78 to 0.94 on one tree within minutes (issue 17's eighth session), and two of
    # each in blocks 0.68 to 1.02 (the tenth).
    baseline_count = config.size(50_000, 20_000, 200)
    (ours, virtual_days), baseline, (real_clock, _) = best_of(
        3,
        lambda: time_travel(workflows, days),
        lambda: memory_runner_rate(baseline_count),
        lambda: time_travel(workflows, days, travel=False),
    )
    # The ratio is what time travel itself costs: the same steps under the real clock, each
    # due 1 us after the last (issue 34; P1's runner, the ratio before, is in the details).
    return Result(
        id="P4",
        title=f"time travel: {workflows} daily workflows x {days} days, autojump",
        ours=ours,
        baseline=real_clock,
        baseline_name="the same steps under the real clock",
        better="higher",
        goal=0.95,
        unit="evals/s",
        detail={
            "workflows": workflows,
            "days": days,
            "virtual_days": virtual_days,
            "real_clock_evals_per_s": real_clock,
            "vs_real_clock": ours / real_clock,
            "p1_items_per_s": baseline,
            "vs_p1": ours / baseline,
        },
    )
