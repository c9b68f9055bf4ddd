"""The clocks: wall time from one injectable object, virtual time under Trio."""

from __future__ import annotations

import datetime as dt

import pytest
import trio

from trio_supervise import SystemClock, TrioClock
from trio_supervise._clock import utc

EPOCH = dt.datetime(2031, 5, 1, tzinfo=dt.UTC)


async def test_trio_clock_follows_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    """A TrioClock reads epoch plus Trio's current time, so it moves with autojump."""
    clock = TrioClock(EPOCH)
    start = clock.now()
    await trio.sleep(86_400 * 30)
    assert clock.now() - start == dt.timedelta(days=30)


def test_trio_clock_refuses_a_naive_epoch() -> None:
    """A naive epoch is refused rather than guessed at."""
    with pytest.raises(ValueError, match="timezone-aware"):
        TrioClock(dt.datetime(2031, 5, 1))


def test_system_clock_is_aware_utc() -> None:
    """The system clock returns timezone-aware UTC datetimes."""
    now = SystemClock().now()
    assert now.utcoffset() == dt.timedelta(0)


def test_utc_converts_offsets() -> None:
    """utc() converts an aware datetime in another zone to UTC without changing the instant."""
    plus_two = dt.timezone(dt.timedelta(hours=2))
    value = dt.datetime(2031, 5, 1, 12, tzinfo=plus_two)
    assert utc(value) == value
    assert utc(value).hour == 10
