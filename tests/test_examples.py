"""The examples run and do what their docstrings say."""

from __future__ import annotations

import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import memory_queue_tour


async def test_memory_queue_tour_runs_a_week(autojump_clock: trio.testing.MockClock) -> None:
    """The tour runs seven daily evaluations a day apart in virtual time."""
    lines = await memory_queue_tour.tour(days=7)
    assert len(lines) == 8
    assert lines[0].startswith("2030-01-01 00:00 run 1")
    assert lines[6].startswith("2030-01-07 00:00 run 7")
    assert lines[-1] == "after 7 days: config={'run': 7}, state=queued"
    assert trio.current_time() == 6 * 86_400
