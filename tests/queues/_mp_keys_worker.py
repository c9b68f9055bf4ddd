"""A worker process for test_concurrency_proof: a real runner draining keyed items.

Usage: python _mp_keys_worker.py (sqlite PATH | postgres DSN SCHEMA) WORKER_ID OUT_DIR

Signals readiness with OUT_DIR/ready-WORKER_ID and starts when OUT_DIR/go exists (as
_mp_worker does). Its driver sleeps a little per item and appends ``id key start end`` (system-
wide monotonic nanoseconds, comparable across processes) to OUT_DIR/evals-WORKER_ID. It stops,
draining, when OUT_DIR/stop exists.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import trio

import trio_supervise as ts
from trio_supervise.queues import PostgresQueue, SQLiteQueue, WorkItem, WorkQueue


class Recorder:
    name = "keyed"
    spec_ids = ("keyed",)

    def __init__(self, out: Path) -> None:
        self._out = out.open("a")

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        start = time.monotonic_ns()
        await trio.sleep(0.002)
        end = time.monotonic_ns()
        self._out.write(f"{item.id} {item.concurrency_key} {start} {end}\n")
        self._out.flush()
        return ts.Stop()


async def no_context() -> None:
    return None


async def main(argv: list[str]) -> None:
    queue: WorkQueue
    if argv[0] == "sqlite":
        queue = await SQLiteQueue.connect(argv[1], migrate=False)
        rest = argv[2:]
    else:
        queue = await PostgresQueue.connect(argv[1], schema=argv[2], pool_size=3, listen=False)
        rest = argv[3:]
    worker_id, out_dir = rest[0], Path(rest[1])
    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    registry.register(Recorder(out_dir / f"evals-{worker_id}"))
    runner = ts.WorkflowRunner(
        queue=queue,
        registry=registry,
        settings=ts.RunnerSettings(
            worker_id=worker_id,
            lease=60,
            concurrency=3,
            claim_batch=2,
            poll_interval=0.02,
            shutdown_grace=5,
        ),
        build_context=no_context,
        jitter=ts.Jitter(seed=1),
    )
    (out_dir / f"ready-{worker_id}").touch()
    while not (out_dir / "go").exists():  # noqa: ASYNC110 - another process makes the file
        await trio.sleep(0.01)
    async with queue, trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        while not (out_dir / "stop").exists():  # noqa: ASYNC110 - the test makes the file
            await trio.sleep(0.05)
        runner.shutdown.begin()


if __name__ == "__main__":
    trio.run(main, sys.argv[1:])
