"""What the worker processes that run a real runner share (``_mp_keys_worker``,
``_mp_rate_worker``): the queue the command line names, and a runner run from the moment
OUT_DIR/go exists until OUT_DIR/stop does.

Command line: (sqlite PATH | postgres DSN SCHEMA) WORKER_ID OUT_DIR.
"""

from __future__ import annotations

from pathlib import Path

import trio

import trio_supervise as ts
from trio_supervise.queues import PostgresQueue, SQLiteQueue, WorkQueue


async def open_from_argv(argv: list[str], *, listen: bool) -> tuple[WorkQueue, str, Path]:
    """The queue *argv* names, the worker's id and its output directory."""
    queue: WorkQueue
    if argv[0] == "sqlite":
        queue = await SQLiteQueue.connect(argv[1], migrate=False)
        rest = argv[2:]
    else:
        queue = await PostgresQueue.connect(argv[1], schema=argv[2], pool_size=3, listen=listen)
        rest = argv[3:]
    return queue, rest[0], Path(rest[1])


async def no_context() -> None:
    return None


async def run_between_go_and_stop(
    queue: WorkQueue, runner: ts.WorkflowRunner[None], worker_id: str, out_dir: Path
) -> None:
    """Say ready (OUT_DIR/ready-WORKER_ID), wait for OUT_DIR/go, run *runner* until
    OUT_DIR/stop exists, then drain."""
    (out_dir / f"ready-{worker_id}").touch()
    while not (out_dir / "go").exists():  # noqa: ASYNC110 - another process makes the file
        await trio.sleep(0.01)
    async with queue, trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        while not (out_dir / "stop").exists():  # noqa: ASYNC110 - the test makes the file
            await trio.sleep(0.05)
        runner.shutdown.begin()
