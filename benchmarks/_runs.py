"""Drive a :class:`~trio_supervise.WorkflowRunner` over a prepared queue until told to stop."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable

import trio

import trio_supervise as ts

from ._common import NoopDriver, no_context, rate, wall

timed_window: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext
"""Entered around each :func:`run_until` (the runner's start to its drain's end): what
:mod:`benchmarks.instructions` counts. Nothing by default."""


async def run_until(
    queue: ts.WorkQueue,
    driver: ts.WorkflowDriver[None],
    settings: ts.RunnerSettings,
    done: trio.Event,
    *,
    limit: float = 180.0,
) -> None:
    """Run a runner on *queue* until *done* is set, then shut it down and wait for it to drain.

    The caller times the whole call: from the runner's start until every outcome is written.
    Gives up (raises ``TooSlowError``) after *limit* seconds of Trio time.
    """
    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    registry.register(driver)
    runner = ts.WorkflowRunner(
        queue=queue, registry=registry, settings=settings, build_context=no_context
    )
    with timed_window(), trio.fail_after(limit):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            await done.wait()
            runner.shutdown.begin("benchmark done")


async def noop_rate(
    queue: ts.WorkQueue, count: int, concurrency: int, claim_batch: int | None = None
) -> float:
    """Items per second for one runner evaluating *count* prepared no-op items on *queue*.

    Timed from the runner's start until every outcome is written; the same shape for every
    backend, so the throughput measures differ only in the queue they are given. The claim
    batch is *claim_batch*, or the concurrency if None.
    """
    evaluated = 0
    done = trio.Event()

    def on_done(item: ts.WorkItem) -> None:
        nonlocal evaluated
        evaluated += 1
        if evaluated >= count:
            done.set()

    # A user who raises the concurrency raises the batches with it: the claim batch to the
    # concurrency (unless told), and the settle batch so that one write takes a whole claim's
    # outcomes.
    default_settle = ts.RunnerSettings(worker_id="bench").settle_batch
    settings = ts.RunnerSettings(
        worker_id="bench",
        concurrency=concurrency,
        claim_batch=concurrency if claim_batch is None else claim_batch,
        settle_batch=max(default_settle, concurrency),
    )
    gc.collect()
    with wall() as w:
        await run_until(queue, NoopDriver(on_done=on_done), settings, done)
    return rate(count, w.seconds)
