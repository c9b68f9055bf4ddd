"""Start deadlines: an item claimed after its ``start_by`` is never evaluated but settled dead,
saying so, and counted; a driver's ``start_within`` sets it by default."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import trio
import trio.testing

import trio_supervise as ts

from .queues.test_cli_reads import run
from .test_runner import Recorder, make_runner, running, sample


async def test_an_item_claimed_after_its_start_by_goes_dead_unstarted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """One slot, a 10 s item first: the item due now with 5 s to start is claimed at 10 and
    goes dead, never evaluated, saying why; the one with 20 s starts at 10 and completes."""
    queue = ts.MemoryQueue()
    driver = Recorder()
    now = queue.clock.now()
    await queue.enqueue("job", item_id="first", priority=-1, config={"sleep": 10})
    await queue.enqueue("job", item_id="late", start_by=now + dt.timedelta(seconds=5))
    await queue.enqueue("job", item_id="in-time", start_by=now + dt.timedelta(seconds=20))
    runner = make_runner(queue, driver, concurrency=1, claim_batch=1)
    async with running(runner):
        await trio.sleep(15)
    assert sorted(driver.starts) == ["first", "in-time"]
    late = await queue.get("late")
    assert late.state is ts.ItemState.DEAD
    assert late.last_error is not None
    assert late.last_error.startswith("start deadline passed: start_by 2030-01-01T00:00:05")
    assert late.last_error.endswith("never started")
    assert (await queue.get("in-time")).state is ts.ItemState.COMPLETED
    assert sample(runner, "trio_supervise_items_expired_total") == 1.0
    assert sample(runner, "trio_supervise_items_dead_total") == 1.0


async def test_a_drivers_start_within_sets_start_by(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``start_within`` on the driver: start_by that long after due_at (or now); an explicit
    start_by wins; a bad one is refused at registration, naming it."""

    class Hasty(Recorder):
        start_within = 30.0

    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    registry.register(Hasty())
    queue = ts.MemoryQueue()
    now = queue.clock.now()
    due = now + dt.timedelta(hours=1)
    plain = await registry.enqueue(queue, "job", item_id="a")
    assert plain.start_by == now + dt.timedelta(seconds=30)
    later = await registry.enqueue(queue, "job", item_id="b", due_at=due)
    assert later.start_by == due + dt.timedelta(seconds=30)
    given = await registry.enqueue(queue, "job", item_id="c", start_by=due)
    assert given.start_by == due

    class Bad(Recorder):
        start_within = -1

    with pytest.raises(ts.DriverError, match="start_within must be a positive number"):
        registry.register(Bad(name="bad", spec_ids=("bad",)))


@pytest.mark.parametrize(
    ("start_by", "rule"),
    [
        ("soon", "start_by must be a datetime"),
        (dt.datetime(2030, 1, 1), "start_by must be a timezone-aware datetime"),
        (dt.datetime(2029, 1, 1, tzinfo=dt.UTC), "start_by must not be before due_at"),
    ],
)
async def test_a_bad_start_by_is_refused_naming_the_rule(start_by: object, rule: str) -> None:
    """A start_by that is no aware datetime, or before due_at, is a ValueError; nothing stored."""
    queue = ts.MemoryQueue()
    with pytest.raises(ValueError, match=rule):
        await queue.enqueue("job", start_by=start_by, due_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC))  # type: ignore[arg-type]
    assert queue.items == {}


def test_the_cli_enqueues_and_shows_a_start_deadline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``items enqueue --start-by`` stores it (``+SECONDS`` from now, or ISO 8601), ``items
    show`` prints it; one before the due time is refused naming the rule (exit 1)."""
    url = f"sqlite:///{tmp_path}/q.db"
    code, out, _ = run(
        capsys, "items", "enqueue", "job", "--id", "a", "--start-by", "2030-01-01T00:00:00+00:00",
        "--database-url", url, "--json",
    )  # fmt: skip
    assert code == 0
    assert json.loads(out)["start_by"] == "2030-01-01T00:00:00+00:00"
    code, out, _ = run(capsys, "items", "show", "a", "--database-url", url)
    assert any(
        line.split() == ["start", "by", "2030-01-01", "00:00:00", "UTC"]
        for line in out.splitlines()
    )
    code, _, err = run(
        capsys, "items", "enqueue", "job", "--due", "+60", "--start-by", "+30",
        "--database-url", url,
    )  # fmt: skip
    assert code == 1
    assert "start_by must not be before due_at" in err
