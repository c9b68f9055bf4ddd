"""A tour of leased workflow execution under Trio's virtual clock.

A ``WorkflowRunner`` runs two drivers against the in-memory queue for a simulated week:

- ``digest`` sends a daily digest: a typed config (an attrs class), rescheduled a day later each
  time, and stopped after the seventh;
- ``webhook`` calls a flaky endpoint: every call fails, so the item is retried with backoff and is
  dead after three errors.

A third item has a config that does not fit its driver: an item error with a clear message, while
the runner carries on. The week takes milliseconds and prints the same lines every time.
Run it with ``python examples/workflow_tour.py``.
"""

from __future__ import annotations

import datetime as dt
import logging

import attrs
import trio
import trio.testing

from trio_supervise import (
    DriverRegistry,
    JitterMode,
    MemoryQueue,
    Outcome,
    Reschedule,
    RestartPolicy,
    RunnerSettings,
    Stop,
    WorkflowRunner,
    WorkItem,
)


@attrs.define
class Outbox:
    """The drivers' context: where they "send" things (here, lines with a virtual timestamp)."""

    queue: MemoryQueue
    lines: list[str] = attrs.Factory(list)

    def log(self, text: str) -> None:
        self.lines.append(f"{self.queue.clock.now():%Y-%m-%d %H:%M} {text}")


@attrs.frozen
class Digest:
    """A digest item's config: who gets it, and how many were sent so far."""

    recipient: str
    sent: int = 0


class DigestDriver:
    """Sends one digest a day, seven in all."""

    name = "digest"
    spec_ids = ("daily-digest",)
    config_type = Digest

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: Outbox, item: WorkItem, config: Digest) -> Outcome:
        await trio.sleep(30)  # rendering and sending take half a minute
        sent = config.sent + 1
        context.log(f"digest #{sent} sent to {config.recipient}")
        if sent == 7:
            return Stop()
        return Reschedule(item.due_at + dt.timedelta(days=1), attrs.evolve(config, sent=sent))


class WebhookDriver:
    """Calls an endpoint that is down all week."""

    name = "webhook"
    spec_ids = ("webhook",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: Outbox, item: WorkItem) -> Outcome:
        context.log(f"webhook {item.config['url']}: connection refused")
        raise ConnectionRefusedError(item.config["url"])


async def tour(days: int = 7) -> list[str]:
    """Run the drivers for *days* virtual days; return what happened, one line per event."""
    queue = MemoryQueue()
    outbox = Outbox(queue)
    registry: DriverRegistry[Outbox] = DriverRegistry()
    registry.register(DigestDriver()).register(WebhookDriver())
    settings = RunnerSettings(
        worker_id="tour",
        lease=60,
        concurrency=4,
        # The in-memory queue wakes the runner exactly when work is due or enqueued, so polling is
        # only a fallback; a long interval keeps a simulated week to a few hundred wake-ups.
        poll_interval=3600,
        retry=RestartPolicy(60, 3600, jitter=JitterMode.NONE),
        max_errors=3,
    )

    async def build_context() -> Outbox:
        return outbox

    runner = WorkflowRunner(
        queue=queue, registry=registry, settings=settings, build_context=build_context
    )
    await queue.enqueue("daily-digest", item_id="alice", config={"recipient": "alice@example.com"})
    await queue.enqueue("daily-digest", item_id="bob", config={"recipient": 42})
    await queue.enqueue("webhook", item_id="hook", config={"url": "https://example.com/hook"})
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await trio.sleep(days * 86_400)
        runner.shutdown.begin()
    for item in await queue.list_items():
        error = item.last_error.splitlines()[0] if item.last_error else "no error"
        outbox.lines.append(f"{item.id}: {item.state}, {error}")
    return outbox.lines


def main() -> None:
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    clock = trio.testing.MockClock(autojump_threshold=0)
    for line in trio.run(tour, clock=clock):
        print(line)


if __name__ == "__main__":
    main()
