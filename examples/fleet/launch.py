"""``python -m examples.fleet.launch --processes N``: run N worker processes on this machine.

Each worker is ``python -m examples.fleet`` with its own HTTP port (``--base-port`` + i; 0 lets
each pick a free one) and the same settings otherwise, so they share one queue. The workers run
in their own sessions: Ctrl-C or SIGTERM reaches only this launcher, which sends each worker one
SIGTERM (drain) and waits for them. On several machines, run ``python -m examples.fleet`` under
your own process manager instead (``docs/howto/postgres.md``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

import trio

DRAIN_SECONDS = 60.0
"""How long the workers may take to drain after SIGTERM before they are killed."""


async def launch(processes: int, base_port: int) -> int:
    """Run the workers until they have all exited; return the worst exit code.

    The first SIGINT/SIGTERM sends each worker SIGTERM (they drain); a second one, or
    :data:`DRAIN_SECONDS` without them all gone, kills them.
    """
    workers: list[trio.Process] = []
    for index in range(processes):
        env = dict(os.environ)
        env["TRIO_SUPERVISE_HTTP__PORT"] = str(base_port + index if base_port else 0)
        workers.append(
            await trio.lowlevel.open_process(
                [sys.executable, "-m", "examples.fleet"],
                env=env,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
            )
        )

    def kill_all() -> None:
        for process in workers:
            if process.returncode is None:
                process.kill()

    async def relay_signals(*, task_status: trio.TaskStatus[None]) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
            task_status.started()
            async for signum in received:
                print(f"{signal.Signals(signum).name}: draining the workers", file=sys.stderr)
                for process in workers:
                    if process.returncode is None:
                        process.send_signal(signal.SIGTERM)
                break
            with trio.move_on_after(DRAIN_SECONDS):
                async for _ in received:
                    break
            kill_all()

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(relay_signals)
            async with trio.open_nursery() as waiting:
                for process in workers:
                    waiting.start_soon(process.wait)
            nursery.cancel_scope.cancel()
    finally:
        kill_all()
    return max(process.returncode or 0 for process in workers)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.fleet.launch")
    parser.add_argument("--processes", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument(
        "--base-port", type=int, default=8081, help="first HTTP port; 0: any free ports"
    )
    args = parser.parse_args(argv)
    if args.processes < 1:
        parser.error(f"--processes must be at least 1, got {args.processes}")
    sys.exit(trio.run(launch, args.processes, args.base_port))


if __name__ == "__main__":
    main()
