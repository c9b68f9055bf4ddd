"""P6's producer in a process of its own, as an application's producer would be.

``python -m benchmarks._producer DSN SCHEMA SAMPLES``: connects a queue (no listener), prints
``ready``, waits for a line on stdin, then enqueues SAMPLES no-op items ``lat-NNNNN`` one at a
time, spaced as :func:`benchmarks.postgres.latency` spaces them, and prints, as JSON on its last
line, each item's id and the ``time.perf_counter()`` just before its ``enqueue`` was called (the
system-wide monotonic clock, so the parent can compare it with its own). Closing stdin early
stops it. Bounded: it gives up after 120 s.
"""

from __future__ import annotations

import json
import sys

import trio

from trio_supervise.queues import PostgresQueue

from ._common import now

SPACING = 0.013
"""Seconds between two enqueues: off the poll grid, so every sample starts from an idle wait."""


async def main(dsn: str, schema: str, samples: int) -> None:
    producer = await PostgresQueue.connect(dsn, schema=schema, listen=False)
    sent: dict[str, float] = {}
    try:
        print("ready", flush=True)
        line = await trio.to_thread.run_sync(sys.stdin.readline)
        if line.strip() != "go":
            return
        with trio.fail_after(120):
            for n in range(samples):
                item_id = f"lat-{n:05d}"
                before = now()
                await producer.enqueue("noop", item_id=item_id)
                sent[item_id] = before
                await trio.sleep(SPACING)
    finally:
        await producer.aclose()
    print(json.dumps(sent), flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
