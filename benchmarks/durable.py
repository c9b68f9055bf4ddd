"""P12: a durable workflow's steps per second against the runner's items per second, on one
backend (P12s on SQLite, P12p on PostgreSQL).

Ours: items of a workflow of :data:`STEPS` no-op steps, each step one fenced journal write,
through one runner (concurrency 64), counted in steps. The baseline: the same runner's no-op
items per second on the same backend, the "ours" of P3 (SQLite) and P2 (PostgreSQL), measured
in the same run, taking turns with it.
"""

from __future__ import annotations

import gc
import os
import tempfile
from typing import Any

import attrs
import trio

import trio_supervise as ts
from trio_supervise.queues import PostgresQueue, SQLiteQueue

from . import postgres, sqlite
from ._common import Config, Result, best_of, rate, wall
from ._runs import run_until

STEPS = 10
CONCURRENCY = 64


@attrs.frozen
class Empty:
    """The workflow's config: nothing."""


def _workflow(count: int, done: trio.Event) -> ts.DurableWorkflow[Empty]:
    """The measured workflow (spec ``noop``, as the benchmarks' fills enqueue): *STEPS* no-op
    steps, then done; *done* is set once *count* items got through their last step."""
    finished = 0

    def noop() -> None:
        return None

    @ts.durable_workflow("noop", config_type=Empty)
    async def steps(wf: ts.Workflow[None], config: Empty) -> None:
        nonlocal finished
        for n in range(STEPS):
            await wf.step(f"step-{n}", noop)
        finished += 1
        if finished >= count:
            done.set()

    return steps


async def steps_rate(queue: ts.WorkQueue, count: int) -> float:
    """Steps per second for one runner taking *count* prepared items through the workflow."""
    done = trio.Event()
    driver: Any = _workflow(count, done)
    default_settle = ts.RunnerSettings(worker_id="bench").settle_batch
    settings = ts.RunnerSettings(
        worker_id="bench",
        concurrency=CONCURRENCY,
        claim_batch=CONCURRENCY,
        settle_batch=max(default_settle, CONCURRENCY),
    )
    gc.collect()
    with wall() as w:
        await run_until(queue, driver, settings, done)
    return rate(count * STEPS, w.seconds)


def sqlite_steps_rate(directory: str, count: int) -> float:
    path = os.path.join(directory, "steps.db")
    sqlite._fill(path, count)

    async def main() -> float:
        queue = await SQLiteQueue.connect(path)
        try:
            return await steps_rate(queue, count)
        finally:
            await queue.aclose()

    result: float = trio.run(main)
    if sqlite._completed(path) != count:
        raise RuntimeError("SQLite workflow: not every item completed")
    os.remove(path)
    return result


def postgres_steps_rate(dsn: str, schema: str, count: int) -> float:
    postgres.fill(dsn, schema, count)

    async def main() -> float:
        queue = await PostgresQueue.connect(dsn, schema=schema)
        try:
            return await steps_rate(queue, count)
        finally:
            await queue.aclose()

    result: float = trio.run(main)
    if postgres.completed(dsn, schema) != count:
        raise RuntimeError("PostgreSQL workflow: not every item completed")
    return result


def _result(measure: str, backend: str, steps: float, items: float, count: int) -> Result:
    return Result(
        id=measure,
        title=f"durable workflow steps on {backend}, {STEPS} no-op steps an item",
        ours=steps,
        baseline=items,
        baseline_name=f"the runner's no-op items on {backend} (concurrency {CONCURRENCY})",
        better="higher",
        goal=0.8,
        unit="steps/s vs items/s",
        detail={"workflows": count, "steps": count * STEPS},
    )


def p12s(config: Config) -> Result:
    count = config.size(1_000, 300, 20)
    with tempfile.TemporaryDirectory(prefix="trio_supervise_bench_") as directory:
        steps, items = best_of(
            2,
            lambda: sqlite_steps_rate(directory, count),
            lambda: sqlite.runner_rate(directory, count * STEPS),
        )
    return _result("P12s", "SQLite", steps, items, count)


def p12p(config: Config) -> Result:
    assert config.dsn is not None
    count = config.size(1_000, 300, 20)
    schema = postgres.TS_SCHEMA
    with postgres.bench_schema(config.dsn, schema):
        dsn = config.dsn
        steps, items = best_of(
            2,
            lambda: postgres_steps_rate(dsn, schema, count),
            lambda: postgres.runner_rate(dsn, schema, count * STEPS),
        )
    return _result("P12p", "PostgreSQL", steps, items, count)
