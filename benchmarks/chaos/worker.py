"""One chaos worker process: a real :class:`~trio_supervise.Service` whose runner logs every step.

Usage: ``python worker.py URL WORKER_ID LOG_PATH SLEEP [--http PORT_FILE]``

The service runs one driver (spec ``chaos``) that sleeps *SLEEP* seconds and returns
:class:`~trio_supervise.Stop`. Every runner event that matters for the audit is appended to
*LOG_PATH*, one line each, flushed at once (so a SIGKILL loses nothing the kernel was given):

``<kind> TAB <item id> TAB <lease version> TAB <detail>``

``outcome`` is an attempted settlement (the evaluation's result), ``settled`` one the queue
accepted, ``settle-refused`` a stale one it refused, ``settle-failed`` one whose write failed.
With ``--http`` the operations server listens on a free loopback port, written to *PORT_FILE*
once the service is up. SIGTERM drains and exits 0.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import trio

import trio_supervise as ts

SPEC = "chaos"
LOGGED = frozenset(
    {
        ts.RunnerEventKind.CLAIMED,
        ts.RunnerEventKind.OUTCOME,
        ts.RunnerEventKind.SETTLED,
        ts.RunnerEventKind.SETTLE_REFUSED,
        ts.RunnerEventKind.SETTLE_FAILED,
        ts.RunnerEventKind.LEASE_LOST,
        ts.RunnerEventKind.CLAIM_FAILED,
        ts.RunnerEventKind.RENEWAL_FAILED,
    }
)


class SleepDriver:
    """Sleeps, then stops the item: the smallest driver that is still in flight for a while."""

    name = "chaos"
    spec_ids: Sequence[str] = (SPEC,)

    def __init__(self, sleep: float) -> None:
        self._sleep = sleep

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: ts.WorkItem) -> ts.Outcome:
        await trio.sleep(self._sleep)
        return ts.Stop()


async def main(argv: list[str]) -> int:
    url, worker_id, log_path, sleep = argv[0], argv[1], argv[2], float(argv[3])
    port_file = argv[5] if len(argv) > 5 and argv[4] == "--http" else None
    out = open(log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as we do

    def record(event: ts.RunnerEvent) -> None:
        if event.kind in LOGGED:
            detail = event.detail.replace("\t", " ").replace("\n", " ")
            out.write(f"{event.kind}\t{event.item_id}\t{event.lease_version}\t{detail}\n")
            out.flush()

    settings = ts.Settings(
        database_url=url,
        http=ts.HttpSettings(enabled=port_file is not None, host="127.0.0.1", port=0),
        runner=ts.RunnerSettings(
            worker_id=worker_id,
            lease=3.0,
            concurrency=10,
            claim_batch=10,
            poll_interval=0.5,
            shutdown_grace=2.0,
        ),
    )
    service = ts.Service(
        drivers=[SleepDriver(sleep)],
        settings=settings,
        name=f"chaos-{worker_id}",
        on_event=record,
    )
    code = 0

    async def run(*, task_status: trio.TaskStatus[ts.Service] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal code
        code = await service.run(task_status=task_status)

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(run)
            if port_file is not None:
                tmp = f"{port_file}.tmp"
                with open(tmp, "w", encoding="utf-8") as file:
                    file.write(str(service.http_port))
                os.replace(tmp, port_file)
    finally:
        out.close()
    return code


if __name__ == "__main__":
    sys.exit(trio.run(main, sys.argv[1:]))
