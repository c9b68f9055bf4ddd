"""A service process for test_schedules: run one scheduler on a shared queue, then exit.

Usage: python _schedule_worker.py (sqlite PATH | postgres DSN SCHEMA) WORKER_ID OUT_DIR

Signals readiness with OUT_DIR/ready-WORKER_ID and waits for OUT_DIR/go, which holds the wall
time (seconds since the epoch) that every process maps to the minute boundary 2030-01-01 09:00
UTC. From then on its queue's clock reads that mapping, it runs a scheduler of an every-minute
schedule (``missed="all"``), and it exits 1.5 seconds after the boundary.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from pathlib import Path

import attrs
import trio

from trio_supervise import Schedule, Scheduler
from trio_supervise.queues import PostgresQueue, SQLiteQueue, WorkQueue

BOUNDARY = dt.datetime(2030, 1, 1, 9, tzinfo=dt.UTC)
SCHEDULE = Schedule(name="minutely", spec_id="report", cron="* * * * *", missed="all")


@attrs.define
class SharedClock:
    """The machine's wall clock, shifted so that the wall time *boundary_at* reads BOUNDARY."""

    boundary_at: float = 0.0

    def now(self) -> dt.datetime:
        return BOUNDARY + dt.timedelta(seconds=time.time() - self.boundary_at)


async def main(argv: list[str]) -> None:
    kind, rest = argv[0], argv[1:]
    out_dir = Path(rest[-1])
    worker_id = rest[-2]
    clock = SharedClock()
    queue: WorkQueue
    if kind == "sqlite":
        queue = await SQLiteQueue.connect(rest[0], clock=clock, migrate=False)
    else:
        queue = await PostgresQueue.connect(
            rest[0], schema=rest[1], clock=clock, pool_size=2, listen=False
        )
    async with queue:  # connected before the race starts
        (out_dir / f"ready-{worker_id}").touch()
        go = out_dir / "go"
        while not go.exists():  # noqa: ASYNC110 - another process makes it
            await trio.sleep(0.005)
        clock.boundary_at = float(go.read_text())
        with trio.move_on_after(clock.boundary_at + 1.5 - time.time()):
            await Scheduler([SCHEDULE]).run(queue)


if __name__ == "__main__":
    trio.run(main, sys.argv[1:])
