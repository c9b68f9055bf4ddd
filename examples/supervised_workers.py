"""Supervised workers, under Trio's virtual clock.

A flaky poller is restarted after jittered backoffs until it connects; a heartbeat watches the
shutdown switch and finishes its work when it flips; a small pipeline runs as a nested supervisor.
Thirty virtual seconds pass in milliseconds, and with the jitter seed fixed the output is the same
every time. Run it with ``python examples/supervised_workers.py``.
"""

from __future__ import annotations

import logging

import trio
import trio.testing

from trio_supervise import (
    ChildSpec,
    Jitter,
    RestartPolicy,
    Shutdown,
    Strategy,
    Supervisor,
)

POLLER_POLICY = RestartPolicy(min_backoff=1, max_backoff=30, max_restarts=5)


async def demo(*, seed: int = 7, run_for: float = 30) -> list[str]:
    """Run the service for *run_for* virtual seconds, shut it down, and return what happened."""
    lines: list[str] = []

    def say(text: str) -> None:
        lines.append(f"{trio.current_time():7.3f}s  {text}")

    shutdown = Shutdown()
    connects = 0

    async def poller() -> None:
        nonlocal connects
        connects += 1
        say(f"poller: connecting (run {connects})")
        if connects <= 2:
            raise ConnectionError("upstream refused")
        say("poller: connected")
        await shutdown.wait()  # poll until shutdown; then return, nothing to flush

    async def heartbeat() -> None:
        while not await shutdown.sleep(10):
            say("heartbeat")
        await trio.sleep(0.5)  # flush the last beat
        say("heartbeat: flushed")

    async def fetch() -> None:
        await trio.sleep_forever()

    async def store(*, task_status: trio.TaskStatus[None]) -> None:
        await trio.sleep(2)  # open the database
        say("store: ready")
        task_status.started()
        await trio.sleep_forever()

    pipeline = Supervisor(
        name="pipeline",
        strategy=Strategy.REST_FOR_ONE,
        children=[
            ChildSpec("store", store, start=True, shutdown_grace=1),
            ChildSpec("fetch", fetch, shutdown_grace=1),
        ],
    )
    supervisor = Supervisor(
        name="app",
        shutdown=shutdown,
        jitter=Jitter(seed=seed),  # fixed so the demo repeats; leave it out in production
        children=[
            ChildSpec("poller", poller, restart=POLLER_POLICY),
            ChildSpec("heartbeat", heartbeat, shutdown_grace=5),
            pipeline,
        ],
    )

    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        say(f"supervisor ready, healthy={supervisor.healthy.value}")
        await trio.sleep(run_for)
        shutdown.begin("demo over")

    say(f"supervisor done, healthy={supervisor.healthy.value}")
    for status in supervisor.snapshot():
        say(f"{status.worker}: {status.state} ({status.restarts} restarts)")
    return lines


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)-7s %(name)s: %(message)s")
    clock = trio.testing.MockClock(autojump_threshold=0)
    for line in trio.run(demo, clock=clock):
        print(line)


if __name__ == "__main__":
    main()
