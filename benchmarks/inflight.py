"""P11: one runner holding ``ITEMS`` long-running items in flight (each driver sleeping until
told to finish), on a :class:`~trio_supervise.MemoryQueue`.

- ``P11``: a renewal round's duration (median of the rounds that renewed every lease; the
  slowest in the details) against the renewal interval. Lease 3 s, so the interval is the
  1 s minimum; the round is timed around the runner's ``_renew_round`` (a private hook: a
  redesign that renames it must rename it here; without it the measure times the queue's
  ``renew_many`` alone and says so). Goal <= 0.1.
- ``P11m``: memory per in-flight item (``tracemalloc``, own subprocess), from the moment the
  items are enqueued (so the queue's own records of them are not counted) until every driver
  sleeps, against a bare Trio task sleeping forever (P5's baseline, own subprocess). What is
  counted: the item's evaluator (a task and its scope) in the runner, its in-flight record,
  the claimed copy of the item, the queue's lease bookkeeping. Goal <= 3.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import statistics
import sys
import tracemalloc
from collections.abc import Iterator
from typing import Any

import trio
import trio.testing

import trio_supervise as ts
from trio_supervise.run import _leases, _runner

from . import supervision
from ._common import Config, Result, no_context, now, run_json

LEASE = 3.0
CLAIM_BATCH = 1000
ROUNDS = 3


class SleepingDriver:
    """Each evaluation sleeps until :attr:`release` is set, then stops."""

    name = "sleeper"
    spec_ids = ("sleeper",)

    def __init__(self, count: int) -> None:
        self.count = count
        self.started = 0
        self.all_started = trio.Event()
        self.release = trio.Event()

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: object, item: ts.WorkItem) -> ts.Outcome:
        self.started += 1
        if self.started >= self.count:
            self.all_started.set()
        await self.release.wait()
        return ts.Stop()


class TimedRunner(ts.WorkflowRunner[None]):
    """A runner whose leases part records each renewal round's wall duration and how many were
    in flight (see :class:`_TimedLeases`)."""

    rounds: list[tuple[float, int]]


class _TimedLeases(_leases.Leases):
    """The runner's leases part, timing each renewal round into ``ROUNDS_INTO``."""

    async def _renew_round(self, interval: float) -> None:
        in_flight = len(self.flights.entries)
        started = now()
        await super()._renew_round(interval)
        ROUNDS_INTO[-1].append((now() - started, in_flight))


ROUNDS_INTO: list[list[tuple[float, int]]] = []
"""Where the current timed run's rounds go (its runner's ``rounds``)."""


@contextlib.contextmanager
def _timed_leases() -> Iterator[None]:
    """The runner builds its leases part from ``_runner.Leases``: a timed one meanwhile."""
    original = _runner.Leases
    _runner.Leases = _TimedLeases  # type: ignore[misc]
    try:
        yield
    finally:
        _runner.Leases = original  # type: ignore[misc]


async def _in_flight(count: int, on_all_started: Any, before_start: Any = lambda: None) -> Any:
    """Run *count* sleeping items in one runner; call ``before_start()`` once they are enqueued,
    ``await on_all_started(runner)`` once all sleep, then release them and shut down. Returns
    what *on_all_started* returned."""
    queue = ts.MemoryQueue()
    for _ in range(count):
        await queue.enqueue("sleeper")
    driver = SleepingDriver(count)
    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    registry.register(driver)
    settings = ts.RunnerSettings(
        worker_id="bench", concurrency=count, claim_batch=CLAIM_BATCH, lease=LEASE
    )
    runner = TimedRunner(
        queue=queue, registry=registry, settings=settings, build_context=no_context
    )
    runner.rounds = []
    ROUNDS_INTO.append(runner.rounds)
    before_start()
    with trio.fail_after(300), _timed_leases():
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            await driver.all_started.wait()
            result = await on_all_started(runner)
            driver.release.set()
            runner.shutdown.begin("benchmark done")
    return result


class _Counted(logging.Handler):
    """Counts the runner's warnings instead of printing 10,000 item ids."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lag_warnings = 0
        self.other: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("event loop blocked"):
            self.lag_warnings += 1
        else:
            self.other.append(message[:200])


def renewal_rounds(count: int, wanted: int = ROUNDS) -> tuple[list[float], float, _Counted]:
    """(durations of rounds that renewed all *count* leases, the renewal interval, the runner's
    warnings meanwhile)."""

    async def watch(runner: TimedRunner) -> list[float]:
        interval = runner.settings.renew_interval
        full: list[float] = []
        with trio.move_on_after(max(interval * (wanted + 3), 30.0)):
            while len(full) < wanted:
                await trio.sleep(interval / 4)
                full = [seconds for seconds, held in runner.rounds if held >= count]
        return full

    logger = logging.getLogger("trio_supervise")
    counted = _Counted()
    logger.addHandler(counted)
    propagate, logger.propagate = logger.propagate, False
    try:
        # From a collected heap, as every throughput measure starts (what earlier measures in
        # the same process left for the collector is not this runner's cost).
        gc.collect()
        rounds: list[float] = trio.run(_in_flight, count, watch)
    finally:
        logger.removeHandler(counted)
        logger.propagate = propagate
    return rounds, ts.RunnerSettings(worker_id="x", lease=LEASE).renew_interval, counted


def measure_here(count: int) -> float:
    """Bytes per in-flight item, measured in this process (tracemalloc)."""

    def start() -> None:
        gc.collect()
        tracemalloc.start()

    async def measure(runner: TimedRunner) -> int:
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    used: int = trio.run(_in_flight, count, measure, start)
    tracemalloc.stop()
    return used / count


def p11(config: Config) -> list[Result]:
    count = config.size(10_000, 10_000, 50)
    rounds, interval, warnings = renewal_rounds(count, config.size(ROUNDS, 2, 1))
    results = []
    if rounds:
        results.append(
            Result(
                id="P11",
                title=f"renewal round with {count:,} items in flight, memory queue",
                ours=statistics.median(rounds),
                baseline=interval,
                baseline_name="the renewal interval (lease 3 s / 3)",
                better="lower",
                goal=0.1,
                unit="s",
                detail={
                    "items": count,
                    "rounds": rounds,
                    "slowest": max(rounds),
                    "loop_lag_warnings": warnings.lag_warnings,
                    "other_warnings": warnings.other[:5],
                },
            )
        )
    else:
        print("P11: no renewal round renewed every lease in time", file=sys.stderr)
    # Bytes per item hardly depend on the count, and tracing 10,000 claims takes half a minute:
    # the quick run measures memory at 2,000 items in flight.
    traced = config.size(10_000, 2_000, 50)
    bare = supervision.measure("bare", traced)
    ours = _subprocess(traced)
    results.append(
        Result(
            id="P11m",
            title=f"memory per in-flight item ({traced:,} in flight), memory queue",
            ours=ours,
            baseline=bare,
            baseline_name="a bare Trio task sleeping forever",
            better="lower",
            goal=3.0,
            unit="bytes",
            detail={"items": traced, "method": "tracemalloc, one subprocess per side"},
        )
    )
    return results


def _subprocess(count: int) -> float:
    return float(run_json("benchmarks.inflight", count)["bytes_per_item"])


if __name__ == "__main__":
    print(json.dumps({"bytes_per_item": measure_here(int(sys.argv[1]))}))
