"""A worker process for test_rate_limit_proof: a real runner draining a rate-limited queue, a
free one and one whose items' keys are rate-limited.

Usage: python _mp_rate_worker.py (sqlite PATH | postgres DSN SCHEMA) WORKER_ID OUT_DIR

Signals readiness with OUT_DIR/ready-WORKER_ID and starts when OUT_DIR/go exists (as
_mp_worker does). Its driver returns at once. It stops, draining, when OUT_DIR/stop exists.
"""

from __future__ import annotations

import sys

import trio

import trio_supervise as ts
from tests.queues._mp_runner import no_context, open_from_argv, run_between_go_and_stop
from trio_supervise.queues import WorkItem


class Quick:
    name = "quick"
    spec_ids = ("quick",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        await trio.sleep(0.001)
        return ts.Stop()


async def main(argv: list[str]) -> None:
    queue, worker_id, out_dir = await open_from_argv(argv, listen=True)
    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    registry.register(Quick())
    runner = ts.WorkflowRunner(
        queue=queue,
        registry=registry,
        settings=ts.RunnerSettings(
            worker_id=worker_id,
            lease=60,
            claim_batch=4,
            queues={"rated": 4, "free": 2, "keyed": 4},
            poll_interval=1,
            shutdown_grace=5,
        ),
        build_context=no_context,
        jitter=ts.Jitter(seed=1),
    )
    await run_between_go_and_stop(queue, runner, worker_id, out_dir)


if __name__ == "__main__":
    trio.run(main, sys.argv[1:])
