"""A worker process for test_multiprocess: claim and complete items until none are left.

Usage: python _mp_worker.py (sqlite PATH | postgres DSN SCHEMA) WORKER_ID OUT_DIR

Signals readiness with OUT_DIR/ready-WORKER_ID, starts when OUT_DIR/go exists, and appends the
id of every item it completed to OUT_DIR/done-WORKER_ID.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from trio_supervise.queues import ItemState, PostgresQueue, SQLiteQueue, WorkQueue


async def main(argv: list[str]) -> None:
    queue: WorkQueue
    if argv[0] == "sqlite":
        queue = await SQLiteQueue.connect(argv[1], migrate=False)
        rest = argv[2:]
    else:
        queue = await PostgresQueue.connect(argv[1], schema=argv[2], pool_size=2, listen=False)
        rest = argv[3:]
    worker_id, out_dir = rest[0], Path(rest[1])
    (out_dir / f"ready-{worker_id}").touch()
    while not (out_dir / "go").exists():  # noqa: ASYNC110 - another process makes the file
        await trio.sleep(0.01)
    async with queue:
        with (out_dir / f"done-{worker_id}").open("a") as out:
            while True:
                items = await queue.claim_due(["job"], worker_id, 60, 3)
                if not items:
                    counts = await queue.counts()
                    if not any(s in (ItemState.QUEUED, ItemState.RUNNING) for _, s in counts):
                        return
                    await trio.sleep(0.005)
                    continue
                for item in items:
                    await queue.complete(item.id, item.lease_version)
                    out.write(f"{item.id}\n")
                    out.flush()


if __name__ == "__main__":
    trio.run(main, sys.argv[1:])
