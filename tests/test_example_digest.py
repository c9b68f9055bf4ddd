"""Example 1, the subscription digest: a month of virtual days in milliseconds, exactly."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from examples.digest import SPEC_ID, DigestContext, DigestDriver, MemoryOutbox, build_service
from trio_supervise.testing import DEFAULT_EPOCH, Harness, History, run_scenario

REPO = Path(__file__).resolve().parents[1]
HOUR, DAY = 3600.0, 86_400.0

# Who subscribes, when their first digest is due (virtual seconds after 2030-01-01 00:00 UTC)
# and their last day: 31, 11 and 5 digests.
SUBSCRIBERS = {
    "alice": (8 * HOUR, "2030-01-31"),
    "bob": (9 * DAY + 18.5 * HOUR, "2030-01-20"),
    "carol": (0.0, "2030-01-05"),
}
EXPECTED = {"alice": 31, "bob": 11, "carol": 5}


async def subscribe(harness: Harness) -> None:
    for name, (first, ends) in SUBSCRIBERS.items():
        await harness.queue.enqueue(
            SPEC_ID,
            item_id=name,
            config={"subscriber": f"{name}@example.com", "ends": ends},
            due_at=harness.at(first),
        )


def finished(harness: Harness) -> bool:
    return len(harness.history.select("settled", detail="complete")) == len(SUBSCRIBERS)


async def month(harness: Harness) -> None:
    """Three subscriptions, run by the digest driver until every one has ended."""
    outbox = MemoryOutbox()
    await harness.run_drivers(
        DigestDriver(), context=DigestContext(outbox=outbox, clock=harness.queue.clock)
    )
    await subscribe(harness)
    await harness.wait_until(lambda: finished(harness), timeout=40 * DAY)
    for digest in outbox.sent:
        harness.note(digest.subscriber, f"digest #{digest.number} for {digest.day}")


async def test_a_month_of_digests_at_exact_times(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """Each subscriber gets one digest a day at its time of day, through their last day."""
    outbox = MemoryOutbox()
    await harness.run_drivers(
        DigestDriver(), context=DigestContext(outbox=outbox, clock=harness.queue.clock)
    )
    await subscribe(harness)
    done_at = await harness.wait_until(lambda: finished(harness), timeout=40 * DAY)
    assert done_at == 30 * DAY + 8 * HOUR  # alice's 31st digest, on January 31st

    for name, (first, ends) in SUBSCRIBERS.items():
        sent = [d for d in outbox.sent if d.subscriber == f"{name}@example.com"]
        assert len(sent) == EXPECTED[name]
        assert [d.number for d in sent] == list(range(1, EXPECTED[name] + 1))
        assert sent[-1].day == dt.date.fromisoformat(ends)
        times = [(d.sent_at - DEFAULT_EPOCH).total_seconds() for d in sent]
        assert times == [first + k * DAY for k in range(EXPECTED[name])]
        # The item's history: claimed, evaluated and settled at the same instants; the last
        # settlement completes it.
        assert harness.history.times("settled", name) == times
        assert harness.history.select("settled", name)[-1].detail == "complete"
        assert (await harness.queue.get(name)).state == "completed"
    assert len(outbox.sent) == sum(EXPECTED.values())


async def test_the_config_carries_the_count(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """Each reschedule writes the typed config back, with the count of digests sent."""
    await harness.run_drivers(
        DigestDriver(), context=DigestContext(outbox=MemoryOutbox(), clock=harness.queue.clock)
    )
    await harness.queue.enqueue(
        SPEC_ID, item_id="dave", config={"subscriber": "dave", "ends": "2030-01-10"}
    )
    await harness.advance(3 * DAY - 1)
    item = await harness.queue.get("dave")
    assert item.config == {"subscriber": "dave", "ends": "2030-01-10", "sent": 3}
    assert item.due_at == DEFAULT_EPOCH + dt.timedelta(days=3)


async def test_days_missed_while_down_are_skipped(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """An item due days ago sends one digest now and is next due at its time tomorrow."""
    await harness.advance(5 * DAY + HOUR)
    outbox = MemoryOutbox()
    await harness.queue.enqueue(
        SPEC_ID,
        item_id="erin",
        config={"subscriber": "erin", "ends": "2030-02-01"},
        due_at=DEFAULT_EPOCH,
    )
    await harness.run_drivers(
        DigestDriver(), context=DigestContext(outbox=outbox, clock=harness.queue.clock)
    )
    await harness.advance(DAY)
    assert [d.day.isoformat() for d in outbox.sent] == ["2030-01-01", "2030-01-07"]
    assert harness.history.times("settled", "erin") == [5 * DAY + HOUR, 6 * DAY]


async def test_a_bad_config_is_an_item_error(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """A config that does not fit the typed Subscription is dead at once, with the field named."""
    await harness.run_drivers(DigestDriver(), context=DigestContext(outbox=MemoryOutbox()))
    await harness.queue.enqueue(SPEC_ID, item_id="bad", config={"subscriber": "x", "ends": 5})
    await harness.advance(1)
    [outcome] = harness.history.select("outcome", "bad")
    assert outcome.detail.startswith("dead: invalid config for spec 'subscription-digest'")
    assert "ends" in outcome.detail


def test_the_month_is_the_same_every_time() -> None:
    """Same scenario, same seed: the same history, entry for entry, time for time."""
    first: History = run_scenario(month)
    second = run_scenario(month)
    assert first == second, first.diff(second)
    assert len(first.select("note")) == sum(EXPECTED.values())


async def test_the_whole_service_in_virtual_time(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """The service as shipped (runner under its supervisor) sends the month, then drains."""
    outbox = MemoryOutbox()
    service = await harness.run_service(build_service(outbox=outbox, clock=harness.queue.clock))
    await subscribe(harness)
    await harness.advance(31 * DAY)
    assert len(outbox.sent) == sum(EXPECTED.values())
    assert service.healthy
    assert [s.state for s in service.workers_status()] == ["running"]
    await harness.stop()
    assert harness.history.select("exited", "digest")[0].detail == "exit code 0"


@pytest.mark.slow
def test_python_m_examples_digest_serves_healthz_and_stops_on_sigterm(tmp_path: Path) -> None:
    """``python -m examples.digest`` on SQLite writes a digest, answers /healthz, exits 0 on
    SIGTERM."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TRIO_SUPERVISE_DATABASE_URL": f"sqlite:///{tmp_path / 'digest.db'}",
        "TRIO_SUPERVISE_HTTP__PORT": "0",
    }
    subprocess.run(
        [sys.executable, "-m", "trio_supervise", "items", "enqueue", SPEC_ID,
         '{"subscriber": "alice@example.com", "ends": "2099-12-31"}', "--key", "alice"],
        cwd=tmp_path, env=env, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    log = tmp_path / "service.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "examples.digest"], cwd=tmp_path, env=env, stderr=stderr
        )
    try:
        port = _bound_port(process, log)
        outbox = tmp_path / "digests.jsonl"
        with httpx.Client(timeout=5) as client:
            for _ in range(100):
                health = client.get(f"http://127.0.0.1:{port}/healthz")
                if outbox.exists() and outbox.read_text():
                    break
                time.sleep(0.1)
        assert health.status_code == 200
        assert health.json()["healthy"] is True
        [line] = outbox.read_text().splitlines()
        assert json.loads(line)["subscriber"] == "alice@example.com"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert "SIGTERM received: draining" in log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _bound_port(process: subprocess.Popen[bytes], log: Path) -> int:
    """The port from the service's "operations HTTP on HOST:PORT" log line."""
    for _ in range(300):
        for line in log.read_text().splitlines():
            if "operations HTTP on" in line:
                return int(line.rstrip().rpartition(":")[2])
        if process.poll() is not None:
            raise AssertionError(f"the service exited ({process.returncode}):\n{log.read_text()}")
        time.sleep(0.1)
    raise AssertionError(f"the service served no HTTP within 30 s:\n{log.read_text()}")


def _enqueue_command(text: str) -> str:
    """The ``trio-supervise items enqueue`` command of a page, its continuation lines joined."""
    joined = text.replace("\\\n", " ")
    command = "trio-supervise items enqueue"
    [line] = [line for line in joined.splitlines() if line.startswith(command)]
    return " ".join(line.split())


def test_the_readme_and_the_tutorial_subscribe_alice_the_same_way() -> None:
    """One command in both (an idempotency key), so following both makes one subscription."""
    readme = _enqueue_command((REPO / "README.md").read_text(encoding="utf-8"))
    tutorial = _enqueue_command((REPO / "docs" / "tutorial.md").read_text(encoding="utf-8"))
    assert readme == tutorial
    assert readme.endswith("--key alice")
    assert "--id" not in readme
