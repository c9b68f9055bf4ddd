"""Drive a :class:`~trio_supervise.WorkflowRunner` over a prepared queue until told to stop."""

from __future__ import annotations

import trio

import trio_supervise as ts

from ._common import no_context


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
    with trio.fail_after(limit):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            await done.wait()
            runner.shutdown.begin("benchmark done")
