"""A tour of the in-memory queue under Trio's virtual clock.

A daily item is claimed, evaluated and rescheduled for a simulated week; the run takes milliseconds
and prints the same lines every time. Run it with ``python examples/memory_queue_tour.py``.
"""

from __future__ import annotations

import datetime as dt

import trio
import trio.testing

from trio_supervise import MemoryQueue


async def tour(days: int = 7) -> list[str]:
    """Run a daily item for *days* virtual days and return what happened, one line per run."""
    queue = MemoryQueue()
    lines = []
    item = await queue.enqueue("daily", config={"run": 0}, subject_id="demo")
    for _ in range(days):
        with trio.fail_after(2 * 86_400):
            await queue.wait_for_work(["daily"])
        [claimed] = await queue.claim_due(["daily"], "tour", lease=30, limit=1)
        run = claimed.config["run"] + 1
        lines.append(
            f"{queue.clock.now():%Y-%m-%d %H:%M} run {run} (lease v{claimed.lease_version})"
        )
        await queue.reschedule(
            claimed.id,
            claimed.lease_version,
            at=queue.clock.now() + dt.timedelta(days=1),
            config={"run": run},
        )
    final = await queue.get(item.id)
    lines.append(f"after {days} days: config={final.config}, state={final.state}")
    return lines


def main() -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    for line in trio.run(tour, clock=clock):
        print(line)


if __name__ == "__main__":
    main()
