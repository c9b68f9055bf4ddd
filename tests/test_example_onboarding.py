"""Example 4, onboarding as a durable workflow: a month of it in virtual time, on the memory
queue and on SQLite (the database in the loop), in well under a second of real time."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from examples.onboarding import SPEC_ID, Directory, build_service, onboard
from trio_supervise import (
    DriverRegistry,
    ItemStateError,
    Shutdown,
    WorkflowRunner,
    WorkQueue,
)
from trio_supervise.testing import (
    DEFAULT_EPOCH,
    harness_runner_settings,
    open_harness,
    open_virtual_sqlite,
)

HOUR, DAY = 3600.0, 86_400.0


async def month(queue: Any, directory: Directory) -> dict[str, Any]:
    """Four users onboarded over 30 virtual days; what each item ended as, and when."""
    start = trio.current_time()

    async def at(seconds: float) -> None:
        await trio.sleep_until(start + seconds)

    for who in ("ann", "bob", "cat", "dan"):
        await queue.enqueue(SPEC_ID, item_id=who, config={"email": f"{who}@example.com"})
    await at(1 * HOUR)
    await queue.send_event("cat", "approved", {"by": "early"})  # before cat waits: kept
    await at(5 * DAY)
    await queue.send_event("ann", "approved", {"by": "ops"})  # while ann waits: due at once
    await at(12 * DAY)
    with pytest.raises(ItemStateError, match="completed"):
        await queue.send_event("dan", "approved", {"by": "late"})  # timed out on day 10
    await at(30 * DAY)
    out = {}
    for who in ("ann", "bob", "cat", "dan"):
        item = await queue.get(who)
        days = (item.updated_at - DEFAULT_EPOCH).total_seconds() / DAY
        out[who] = (str(item.state), item.result, round(days, 3))
    return out


EXPECTED = {
    "ann": ("completed", {"user_id": "u-ann", "approved": True, "approved_by": "ops"}, 5.0),
    "bob": ("completed", {"user_id": "u-bob", "approved": False, "approved_by": None}, 10.0),
    "cat": ("completed", {"user_id": "u-cat", "approved": True, "approved_by": "early"}, 3.0),
    "dan": ("completed", {"user_id": "u-dan", "approved": False, "approved_by": None}, 10.0),
}


def check(directory: Directory, ended: dict[str, Any], took: float) -> None:
    assert ended == EXPECTED
    assert directory.created == 4  # each account created once, over every replay
    assert sorted(directory.welcomed.values()) == ["ann@example.com", "cat@example.com"]
    assert took < 1.0, f"a month took {took:.2f} s of real time"


async def test_a_month_on_the_memory_queue(autojump_clock: trio.testing.MockClock) -> None:
    """Create, sleep three days, wait a week for approval: an early event is kept, an event
    during the wait wakes the item at once, no event times out on day 10, an event for a
    finished item is refused; each account is created and welcomed once."""
    directory = Directory()
    began = time.perf_counter()
    async with open_harness() as harness:
        await harness.run_drivers(onboard, context=directory)
        ended = await month(harness.queue, directory)
    check(directory, ended, time.perf_counter() - began)


@pytest.fixture
async def sqlite_queue(tmp_path: Path) -> AsyncIterator[WorkQueue]:
    async with open_virtual_sqlite(tmp_path / "onboarding.db") as queue:
        yield queue


async def run_beside(
    queue: WorkQueue, directory: Directory, body: Callable[[], Awaitable[Any]]
) -> Any:
    """Run *body* while a runner evaluates the onboarding workflow on *queue*."""
    registry: DriverRegistry[Directory] = DriverRegistry()
    registry.register(onboard)
    shutdown = Shutdown()
    runner: WorkflowRunner[Directory] = WorkflowRunner(
        queue=queue,
        registry=registry,
        settings=harness_runner_settings(),
        build_context=lambda: directory,
        shutdown=shutdown,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        result = await body()
        shutdown.begin()
    return result


async def test_a_month_on_sqlite_in_virtual_time(
    autojump_clock: trio.testing.MockClock, sqlite_queue: WorkQueue
) -> None:
    """The same month with every step, sleep, wait and event written to a SQLite file: the
    same outcome, at the same virtual times, still in well under a second."""
    directory = Directory()
    began = time.perf_counter()
    ended = await run_beside(sqlite_queue, directory, lambda: month(sqlite_queue, directory))
    check(directory, ended, time.perf_counter() - began)
    journal = await sqlite_queue.read_journal("ann")  # type: ignore[attr-defined]
    assert [entry.name for entry in journal.entries] == [
        "create-user",
        "sleep",
        "approved",
        "send-welcome",
    ]


async def test_the_service_onboards_in_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    """``build_service`` (what ``python -m examples.onboarding`` runs) on the harness's queue:
    an approval sent on day 4 welcomes the user then."""
    directory = Directory()
    async with open_harness() as harness:
        await harness.run_service(build_service(directory=directory))
        await harness.queue.enqueue(SPEC_ID, item_id="eve", config={"email": "eve@example.com"})
        await harness.advance(4 * DAY)
        await harness.queue.send_event("eve", "approved", {"by": "ops"})
        await harness.advance(60)
        item = harness.queue.items["eve"]
    assert item.result == {"user_id": "u-eve", "approved": True, "approved_by": "ops"}
    assert item.updated_at == harness.at(4 * DAY)
    [(key, email)] = directory.welcomed.items()
    assert email == "eve@example.com"
    assert key.startswith("eve:")  # the step's idempotency key: item, incarnation, position
    assert key.endswith(":3:send-welcome")
