"""The digest service: a typed config, a driver, two outboxes and the service that runs them."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Protocol

import attrs
import trio

from trio_supervise import (
    Clock,
    Outcome,
    Reschedule,
    Service,
    Settings,
    Stop,
    SystemClock,
    WorkItem,
)

SPEC_ID = "subscription-digest"
"""The spec id of a subscription's item."""

DAY = dt.timedelta(days=1)


@attrs.frozen
class Subscription:
    """An item's config: who gets the digest, the last day they get one, how many were sent."""

    subscriber: str
    ends: dt.date
    sent: int = 0


@attrs.frozen
class Digest:
    """One digest as sent."""

    subscriber: str
    number: int
    day: dt.date
    sent_at: dt.datetime

    def to_json(self) -> str:
        return json.dumps(
            {
                "subscriber": self.subscriber,
                "number": self.number,
                "day": self.day.isoformat(),
                "sent_at": self.sent_at.isoformat(),
            }
        )


class Outbox(Protocol):
    """Where digests go."""

    async def send(self, digest: Digest) -> None: ...


@attrs.define
class MemoryOutbox:
    """Keeps the digests in a list (tests)."""

    sent: list[Digest] = attrs.Factory(list)

    async def send(self, digest: Digest) -> None:
        await trio.lowlevel.checkpoint()
        self.sent.append(digest)


@attrs.define
class FileOutbox:
    """Appends each digest to a JSON-lines file, in a worker thread."""

    path: Path = Path("digests.jsonl")
    _lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)

    async def send(self, digest: Digest) -> None:
        line = digest.to_json() + "\n"
        async with self._lock:
            await trio.to_thread.run_sync(self._append, line)

    def _append(self, line: str) -> None:
        with self.path.open("a", encoding="utf-8") as file:
            file.write(line)


@attrs.frozen
class DigestContext:
    """What the driver needs besides the item: an outbox, and what time it is."""

    outbox: Outbox
    clock: Clock = attrs.Factory(SystemClock)


class DigestDriver:
    """Sends a subscription's digest once a day until its end date, then stops."""

    name = "digest"
    spec_ids = (SPEC_ID,)
    config_type = Subscription

    def validate_specs(self) -> None:
        pass

    async def evaluate(
        self, context: DigestContext, item: WorkItem, subscription: Subscription
    ) -> Outcome:
        day = item.due_at.date()
        if day > subscription.ends:
            return Stop()
        number = subscription.sent + 1
        await context.outbox.send(
            Digest(subscription.subscriber, number, day, sent_at=context.clock.now())
        )
        # The next digest is due at the same time tomorrow; days missed while the service was
        # down are skipped, not sent in a burst.
        due = item.due_at + DAY
        now = context.clock.now()
        while due <= now:
            due += DAY
        if due.date() > subscription.ends:
            return Stop()
        return Reschedule(due, attrs.evolve(subscription, sent=number))


def build_service(
    *,
    outbox: Outbox | None = None,
    clock: Clock | None = None,
    settings: Settings | None = None,
) -> Service:
    """The digest service: the driver, and a context with *outbox* (a :class:`FileOutbox` on
    ``digests.jsonl`` in the working directory by default). *settings* default to the
    environment's (``TRIO_SUPERVISE_*``, SQLite in ``trio_supervise.db``)."""
    context = DigestContext(
        outbox=FileOutbox() if outbox is None else outbox,
        clock=SystemClock() if clock is None else clock,
    )

    async def build_context() -> DigestContext:
        await trio.lowlevel.checkpoint()
        return context

    return Service(
        drivers=[DigestDriver()], build_context=build_context, settings=settings, name="digest"
    )
