"""One P7 worker process: a runner on the PostgreSQL queue until the queue is drained.

``python -m benchmarks._worker DSN SCHEMA WORKER_ID``: connects, prints ``ready``, waits for a
line on stdin, then runs until no item is left queued or running (checked every 10 ms), prints
``done <time.perf_counter()> <CPU seconds since go>`` (the system-wide monotonic clock, so the
parent can compare; the process's CPU for :mod:`benchmarks.p7cpu`) and exits. Closing stdin
early also stops it. Bounded: it gives up after 300 s.
"""

from __future__ import annotations

import sys
import time

import trio

import trio_supervise as ts
from trio_supervise.queues import PostgresQueue

from ._common import NoopDriver, no_context, now

CONCURRENCY = 64


async def main(dsn: str, schema: str, worker_id: str) -> None:
    queue = await PostgresQueue.connect(dsn, schema=schema)
    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    registry.register(NoopDriver(on_done=lambda item: None))
    runner = ts.WorkflowRunner(
        queue=queue,
        registry=registry,
        settings=ts.RunnerSettings(
            worker_id=worker_id, concurrency=CONCURRENCY, claim_batch=CONCURRENCY
        ),
        build_context=no_context,
    )
    try:
        print("ready", flush=True)
        line = await trio.to_thread.run_sync(sys.stdin.readline)
        if line.strip() != "go":
            return
        cpu = time.process_time()
        with trio.fail_after(300):
            async with trio.open_nursery() as nursery:
                await nursery.start(runner.run)
                while await queue.next_due_at(["noop"]) is not None:
                    await trio.sleep(0.01)
                print(f"done {now()!r} {time.process_time() - cpu!r}", flush=True)
                runner.shutdown.begin("drained")
    finally:
        await queue.aclose()


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:4])
