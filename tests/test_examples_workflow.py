"""The workflow tour runs and does what its docstring says."""

from __future__ import annotations

import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import workflow_tour


async def test_workflow_tour_runs_a_week(autojump_clock: trio.testing.MockClock) -> None:
    """Seven digests a day apart, a webhook dead after three backed-off tries, a bad config."""
    lines = await workflow_tour.tour(days=7)
    digests = [line for line in lines if "digest #" in line]
    assert digests == [
        f"2030-01-0{day} 00:00 digest #{day} sent to alice@example.com" for day in range(1, 8)
    ]
    assert [line for line in lines if "webhook" in line] == [
        "2030-01-01 00:00 webhook https://example.com/hook: connection refused",
        "2030-01-01 00:01 webhook https://example.com/hook: connection refused",
        "2030-01-01 00:03 webhook https://example.com/hook: connection refused",
    ]
    assert lines[-3:] == [
        "bob: dead, invalid config for spec 'daily-digest': recipient: expected str, got int",
        "hook: dead, ConnectionRefusedError: https://example.com/hook",
        "alice: completed, no error",
    ]
    assert trio.current_time() == 7 * 86_400
