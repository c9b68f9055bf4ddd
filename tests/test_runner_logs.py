"""The runner's log records: each message says what happened and what comes next, the same
structured fields ride in ``extra``, a driver's traceback is logged once and stored trimmed, and
a drain reports its progress, each item leaving, and a summary."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import trio_supervise as ts
from trio_supervise._logging import STRUCTURED_FIELDS
from trio_supervise.job import MAX_TRACEBACK_FRAMES, describe_failure, first_line
from trio_supervise.queues import Lease, LeaseStatus, WorkItem

from .test_runner import no_context, running

RUNNER = "trio_supervise.runner"

FIRST_FAILURE = {
    "worker": "w-1",
    "item_id": "probe-1",
    "spec_id": "read",
    "lease_version": 1,
    "attempt": 1,
    "backoff_s": 7.0,
    "error": "OSError: sensor unplugged",
}
"""The structured fields of the first failure of item probe-1 (requeue delay 7 s)."""


def _fail_deep(depth: int) -> None:
    if depth:
        _fail_deep(depth - 1)
    raise OSError("sensor unplugged")


@attrs.define
class Driver:
    """Sleeps ``config["sleep"]`` seconds, then raises if ``config["fail"]``, else stops."""

    name: str = "sensor"
    spec_ids: Sequence[str] = ("read",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> ts.Outcome:
        await trio.sleep(item.config.get("sleep", 0))
        if item.config.get("fail"):
            _fail_deep(item.config.get("depth", 0))
        return ts.Stop()


def make_runner(queue: ts.WorkQueue, **changes: Any) -> ts.WorkflowRunner[None]:
    values: dict[str, Any] = {"worker_id": "w-1", "poll_interval": 1.0, "requeue_delay": 7.0}
    values.update(changes)
    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    registry.register(Driver())
    return ts.WorkflowRunner(
        queue=queue,
        registry=registry,
        settings=ts.RunnerSettings(**values),
        build_context=no_context,
    )


def runner_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == RUNNER]


async def test_a_driver_failure_says_what_failed_why_and_what_comes_next(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """One WARNING names item, spec, attempt, error and the retry delay; fields ride in extra."""
    caplog.set_level(logging.INFO, logger="trio_supervise")
    queue = ts.MemoryQueue()
    await queue.enqueue("read", item_id="probe-1", config={"fail": True})
    async with running(make_runner(queue, max_errors=5)):
        await trio.sleep(1)
    [failure] = [r for r in runner_records(caplog) if r.levelno == logging.WARNING]
    assert failure.getMessage() == (
        "item 'probe-1' (spec 'read') failed on attempt 1: OSError: sensor unplugged; "
        "retrying in 7 s (error 1 of 5)"
    )
    fields = {name: getattr(failure, name) for name in STRUCTURED_FIELDS}
    assert fields == FIRST_FAILURE


async def test_the_last_failure_says_the_item_is_dead_and_how_to_requeue_it(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """At max_errors the message says dead, and names the command that requeues the item."""
    caplog.set_level(logging.WARNING, logger="trio_supervise")
    queue = ts.MemoryQueue()
    await queue.enqueue("read", item_id="probe-1", config={"fail": True})
    async with running(make_runner(queue, max_errors=2)):
        await trio.sleep(10)
    last = [r for r in runner_records(caplog) if r.levelno == logging.WARNING][-1]
    assert last.getMessage() == (
        "item 'probe-1' (spec 'read') failed on attempt 2: OSError: sensor unplugged; "
        "dead after 2 errors; `trio-supervise items retry probe-1` requeues it"
    )
    assert not hasattr(last, "backoff_s")  # no retry comes
    assert (await queue.get("probe-1")).state is ts.ItemState.DEAD


async def test_a_driver_traceback_is_logged_once_and_stored_trimmed(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The failure record carries the traceback; last_error holds the driver's frames only."""
    caplog.set_level(logging.INFO, logger="trio_supervise")
    queue = ts.MemoryQueue()
    await queue.enqueue("read", item_id="deep", config={"fail": True, "depth": 20})
    async with running(make_runner(queue)):
        await trio.sleep(1)
    with_traceback = [r for r in caplog.records if r.exc_info]
    assert [r.getMessage().split(":")[0] for r in with_traceback] == [
        "item 'deep' (spec 'read') failed on attempt 1"
    ]
    assert "_fail_deep" in caplog.text
    assert caplog.text.count('raise OSError("sensor unplugged")') == 1
    stored = (await queue.get("deep")).last_error
    assert stored is not None
    lines = stored.splitlines()
    assert lines[0] == "OSError: sensor unplugged"
    assert lines[1].startswith("Traceback (most recent call last; trio_supervise's frames left")
    # 22 frames of the test's code (evaluate, then _fail_deep 21 times): the innermost 8 kept.
    assert MAX_TRACEBACK_FRAMES == 8
    assert lines[1].endswith(", 14 more above):")
    assert "in evaluate" not in stored
    assert "trio_supervise/run/" not in stored
    assert 'raise OSError("sensor unplugged")' in lines[-1]


async def test_an_error_of_the_librarys_own_making_has_no_traceback(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A spec with no driver is one line, stored and logged without any traceback."""
    caplog.set_level(logging.INFO, logger="trio_supervise")
    queue = ts.MemoryQueue()
    item = await queue.enqueue("read", item_id="x")
    error = ts.DriverError("no driver registered for spec 'read'")
    assert describe_failure(error) == "no driver registered for spec 'read'"
    async with running(make_runner(queue)):
        await trio.sleep(1)
    assert (await queue.get(item.id)).state is ts.ItemState.COMPLETED
    assert not [r for r in caplog.records if r.exc_info]


def test_a_stored_error_keeps_its_summary_first_and_is_storable() -> None:
    """describe_failure's first line is describe_error's; NUL and surrogates are escaped."""

    def fail() -> None:
        raise ValueError("bad \x00 byte \udcff")

    try:
        fail()
    except ValueError as error:
        text = describe_failure(error)
    assert first_line(text) == "ValueError: bad \x00 byte \udcff"
    settlement = ts.queues.Settlement(
        item_id="x", lease_version=1, kind=ts.queues.SettleKind.RETRY, error=text
    )
    assert settlement.error is not None
    assert "\x00" not in settlement.error
    assert settlement.error.startswith("ValueError: bad \\x00 byte \\udcff\nTraceback")


async def test_every_runner_record_carries_the_worker(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Claim failures, item failures, drain lines: every runner record has worker in extra."""
    caplog.set_level(logging.DEBUG, logger="trio_supervise")

    @attrs.define(eq=False)
    class Flaky(ts.MemoryQueue):
        failures: int = 2

        async def claim_due(
            self, spec_ids: Sequence[str], worker_id: str, lease: float, limit: int
        ) -> list[WorkItem]:
            if self.failures:
                self.failures -= 1
                raise ts.QueueUnavailable("connection refused")
            return await super().claim_due(spec_ids, worker_id, lease, limit)

    queue = Flaky()
    await queue.enqueue("read", item_id="probe-1", config={"fail": True})
    async with running(make_runner(queue)):
        await trio.sleep(30)
    records = runner_records(caplog)
    assert records
    assert {r.worker for r in records} == {"w-1"}  # type: ignore[attr-defined]
    claim = records[0]
    assert claim.getMessage().startswith("claim failed: connection refused; claiming again in ")
    assert claim.getMessage().endswith("s (failure 1 of at most 10)")
    assert claim.error == "claim failed: connection refused"  # type: ignore[attr-defined]
    assert claim.backoff_s > 0  # type: ignore[attr-defined]


async def test_a_drain_reports_progress_each_leaving_item_and_a_summary(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Every 5 s: N in flight and the longest; each item leaving once; then the summary."""
    caplog.set_level(logging.INFO, logger="trio_supervise")
    queue = ts.MemoryQueue()
    await queue.enqueue("read", item_id="quick", config={"sleep": 8})
    await queue.enqueue("read", item_id="slow", config={"sleep": 1000})
    runner = make_runner(queue, shutdown_grace=12.0)
    async with running(runner):
        await trio.sleep(2)
    messages = [r.getMessage() for r in runner_records(caplog)]
    assert messages == [
        "draining: 2 in flight; they get 12 s to finish, then their leases are handed back",
        "draining: 2 in flight (longest: item 'quick', 7 s); the rest are handed back in 7 s",
        "draining: item 'quick' (spec 'read') finished (complete) after 8 s",
        "draining: 1 in flight (longest: item 'slow', 12 s); the rest are handed back in 2 s",
        "draining: item 'slow' (spec 'read') handed back (lease released, due again at once) "
        "after 14 s",
        "drained in 12 s: 1 finished (complete 1), 1 handed back, 0 not written; the runner stops",
    ]
    progress = [r for r in runner_records(caplog) if "longest" in r.getMessage()]
    assert [r.item_id for r in progress] == ["quick", "slow"]  # type: ignore[attr-defined]
    assert (await queue.get("slow")).state is ts.ItemState.QUEUED


async def test_release_in_flight_hands_every_lease_back_within_its_bound(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Told to stop now, the runner cancels its evaluations and releases their leases at once."""
    caplog.set_level(logging.INFO, logger="trio_supervise")
    queue = ts.MemoryQueue()
    for n in range(3):
        await queue.enqueue("read", item_id=f"long-{n}", config={"sleep": 1000})
    runner = make_runner(queue, shutdown_grace=600.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await trio.sleep(1)
        runner.shutdown.begin()
        await trio.sleep(1)
        started = trio.current_time()
        assert await runner.release_in_flight(2.0) == 0
        assert trio.current_time() - started < 2.0
    for n in range(3):
        item = await queue.get(f"long-{n}")
        assert (item.state, item.lease_owner) == (ts.ItemState.QUEUED, None)
    assert "stopping now: cancelling 3 evaluations and handing their leases back" in caplog.text


async def test_a_due_pass_logs_failures_the_same_way(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """run_due_pass's failure record: the same message, fields and traceback as the runner's."""
    caplog.set_level(logging.INFO, logger="trio_supervise")
    queue = ts.MemoryQueue()
    await queue.enqueue("read", item_id="probe-1", config={"fail": True})
    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    registry.register(Driver())
    settings = ts.RunnerSettings(worker_id="pass-1", requeue_delay=7.0, max_errors=5)
    assert await ts.run_due_pass(queue, registry, settings, no_context) == ts.PassStats(1, 1)
    [record] = [r for r in caplog.records if r.name == "trio_supervise.workflow"]
    assert record.getMessage() == (
        "item 'probe-1' (spec 'read') failed on attempt 1: OSError: sensor unplugged; "
        "retrying in 7 s (error 1 of 5)"
    )
    assert (record.worker, record.item_id, record.backoff_s) == ("pass-1", "probe-1", 7.0)  # type: ignore[attr-defined]
    assert record.exc_info is not None
    assert first_line((await queue.get("probe-1")).last_error) == "OSError: sensor unplugged"


async def test_a_lost_lease_is_logged_with_what_happens_next(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A renewal refused: one WARNING naming item, spec, version and what happens next."""
    caplog.set_level(logging.INFO, logger="trio_supervise")

    @attrs.define(eq=False)
    class Refusing(ts.MemoryQueue):
        async def renew_many(self, leases: Sequence[Lease], lease: float) -> dict[str, LeaseStatus]:
            await trio.lowlevel.checkpoint()
            return {each.item_id: LeaseStatus.LOST for each in leases}

    queue = Refusing()
    await queue.enqueue("read", item_id="stolen", config={"sleep": 1000})
    async with running(make_runner(queue, lease=30.0)):
        await trio.sleep(25)
    [record] = [r for r in runner_records(caplog) if "lost its lease" in r.getMessage()]
    assert record.getMessage() == (
        "item 'stolen' (spec 'read') lost its lease v1 (renewal refused); its evaluation is "
        "cancelled and nothing is written (another worker may run it)"
    )
    assert (record.item_id, record.lease_version, record.error) == (  # type: ignore[attr-defined]
        "stolen",
        1,
        "lease lost: renewal refused",
    )


async def test_a_failure_as_a_json_line_has_every_field_and_the_traceback(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Through the JSON formatter, a failure record is one object with the fields and traceback."""
    caplog.set_level(logging.INFO, logger="trio_supervise")
    queue = ts.MemoryQueue()
    await queue.enqueue("read", item_id="probe-1", config={"fail": True})
    async with running(make_runner(queue, max_errors=5)):
        await trio.sleep(1)
    [record] = [r for r in runner_records(caplog) if r.levelno == logging.WARNING]
    line = ts.JsonFormatter().format(record)
    assert "\n" not in line
    document = json.loads(line)
    assert {key: document[key] for key in STRUCTURED_FIELDS} == FIRST_FAILURE
    assert document["exception"].endswith("OSError: sensor unplugged")


async def test_settled_outcomes_are_logged_at_info_up_to_a_rate(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Each settled outcome is one INFO line, at most ``outcome_log_rate`` a second: a burst
    past it is counted, and the next line says how many were left out."""
    queue = ts.MemoryQueue()
    for n in range(30):
        await queue.enqueue("read", item_id=f"r{n:02}")
    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    registry.register(Driver())
    settings = ts.RunnerSettings(
        worker_id="w-1", concurrency=30, claim_batch=30, outcome_log_rate=5
    )
    runner = ts.WorkflowRunner(
        queue=queue, registry=registry, settings=settings, build_context=no_context
    )
    with caplog.at_level(logging.INFO, RUNNER):
        async with running(runner):
            await trio.sleep(1)
            await queue.enqueue("read", item_id="later")
            await trio.sleep(1)
    lines = [r for r in caplog.records if r.name == RUNNER and "s after its claim" in r.message]
    assert len(lines) == 6
    assert lines[0].message == "item 'r00' (spec 'read'): complete, 0 s after its claim"
    assert lines[0].outcome == "complete"  # type: ignore[attr-defined]
    assert lines[-1].message == (
        "item 'later' (spec 'read'): complete, 0 s after its claim (25 more outcomes not logged)"
    )


async def test_no_outcome_lines_when_the_rate_is_zero(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """``outcome_log_rate=0`` logs no outcome line at all."""
    queue = ts.MemoryQueue()
    await queue.enqueue("read", item_id="quiet")
    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    registry.register(Driver())
    settings = ts.RunnerSettings(worker_id="w-1", outcome_log_rate=0)
    runner = ts.WorkflowRunner(
        queue=queue, registry=registry, settings=settings, build_context=no_context
    )
    with caplog.at_level(logging.INFO, RUNNER):
        async with running(runner):
            await trio.sleep(1)
    assert not [r for r in caplog.records if "after its claim" in r.message]


@pytest.mark.parametrize("rate", [-1, float("nan"), float("inf"), True, "5"])
def test_a_bad_outcome_log_rate_is_refused_naming_the_field(rate: Any) -> None:
    """The rate is a finite number of lines per second >= 0."""
    with pytest.raises((TypeError, ValueError), match="outcome_log_rate must be"):
        ts.RunnerSettings(worker_id="w", outcome_log_rate=rate)
