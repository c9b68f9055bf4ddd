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
from tests.queues._mp_runner import no_context, open_from_argv, run_between_go_and_stop
from trio_supervise.queues import WorkItem


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


async def main(argv: list[str]) -> None:
    queue, worker_id, out_dir = await open_from_argv(argv, listen=False)
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
    await run_between_go_and_stop(queue, runner, worker_id, out_dir)


if __name__ == "__main__":
    trio.run(main, sys.argv[1:])
