"""One chaos worker process: a real :class:`~trio_supervise.Service` whose runner logs every step.

Usage: ``python worker.py URL WORKER_ID LOG_PATH SLEEP [--http PORT_FILE] [--block SECONDS]
[--poison ITEM_ID] [--max-attempts N] [--requeue-delay SECONDS]``

The service runs one driver (spec ``chaos``) that sleeps *SLEEP* seconds and returns
:class:`~trio_supervise.Stop`. Every runner event that matters for the audit is appended to
*LOG_PATH*, one line each, flushed at once (so a SIGKILL loses nothing the kernel was given):

``<kind> TAB <item id> TAB <lease version> TAB <detail>``

``outcome`` is an attempted settlement (the evaluation's result), ``settled`` one the queue
accepted, ``settle-refused`` a stale one it refused, ``settle-failed`` one whose write failed.
With ``--http`` the operations server listens on a free loopback port, written to *PORT_FILE*
once the service is up. SIGTERM drains and exits 0.

The fault options (R7, R8): ``--block`` makes the first evaluation of this process block the
thread (``time.sleep``) for that long after its sleep, so the event loop stops (and with
``--release PATH``, until that file exists too: 60 s at most); ``--poison``
makes evaluating that item raise an error whose text holds a lone surrogate (``"\\udcff"``);
``--max-attempts`` bounds the claims per item (the ``max_attempts`` setting where this build has
it, else ``max_errors``, which is said on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import attrs
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
    """Sleeps, then stops the item: the smallest driver that is still in flight for a while.

    With *block*, the first evaluation blocks the thread that long after its sleep; with
    *poison*, that item's evaluation raises an error whose text cannot be encoded as UTF-8.
    """

    name = "chaos"
    spec_ids: Sequence[str] = (SPEC,)

    def __init__(
        self,
        sleep: float,
        *,
        block: float = 0.0,
        release: str | None = None,
        poison: str | None = None,
    ) -> None:
        self._sleep = sleep
        self._block = block
        self._release = release
        self._poison = poison

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: ts.WorkItem) -> ts.Outcome:
        await trio.sleep(self._sleep)
        if self._block:
            block, self._block = self._block, 0.0
            # The fault under test: a driver blocking the loop (for at least *block* seconds,
            # and until the release file exists, if one is named: 60 s at most).
            until = time.monotonic() + block
            bound = time.monotonic() + 60.0
            while time.monotonic() < until or (
                self._release is not None
                and not os.path.exists(self._release)
                and time.monotonic() < bound
            ):
                time.sleep(0.05)
        if item.id == self._poison:
            raise ValueError(f"poison data \udcff in {item.id}")
        return ts.Stop()


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="worker.py")
    parser.add_argument("url")
    parser.add_argument("worker_id")
    parser.add_argument("log_path")
    parser.add_argument("sleep", type=float)
    parser.add_argument("--http", metavar="PORT_FILE")
    parser.add_argument("--block", type=float, default=0.0)
    parser.add_argument("--release", metavar="PATH")
    parser.add_argument("--poison")
    parser.add_argument("--max-attempts", type=int)
    parser.add_argument("--requeue-delay", type=float, default=5.0)
    return parser.parse_args(argv)


def _bounds(max_attempts: int | None) -> dict[str, Any]:
    """The runner settings that bound claims per item on this build."""
    if max_attempts is None:
        return {}
    if "max_attempts" in attrs.fields_dict(ts.RunnerSettings):
        return {"max_attempts": max_attempts}
    print(
        "chaos worker: max_attempts not available on this build; using max_errors", file=sys.stderr
    )
    return {"max_errors": max_attempts}


async def main(argv: list[str]) -> int:
    args = _arguments(argv)
    port_file = args.http
    out = open(args.log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as we do

    def record(event: ts.RunnerEvent) -> None:
        if event.kind in LOGGED:
            detail = event.detail.replace("\t", " ").replace("\n", " ")
            detail = detail.encode("utf-8", "backslashreplace").decode("utf-8")
            out.write(f"{event.kind}\t{event.item_id}\t{event.lease_version}\t{detail}\n")
            out.flush()

    settings = ts.Settings(
        database_url=args.url,
        http=ts.HttpSettings(enabled=port_file is not None, host="127.0.0.1", port=0),
        runner=ts.RunnerSettings(
            worker_id=args.worker_id,
            lease=3.0,
            concurrency=10,
            claim_batch=10,
            poll_interval=0.5,
            shutdown_grace=2.0,
            requeue_delay=args.requeue_delay,
            **_bounds(args.max_attempts),
        ),
    )
    service = ts.Service(
        drivers=[
            SleepDriver(args.sleep, block=args.block, release=args.release, poison=args.poison)
        ],
        settings=settings,
        name=f"chaos-{args.worker_id}",
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
