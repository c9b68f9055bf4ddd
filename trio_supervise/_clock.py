"""Wall-clock time, from one injectable object.

Durations and waits go through Trio (``trio.current_time``, ``trio.sleep``). Timestamps that are
stored (due times, lease expiries) are timezone-aware UTC datetimes read from a :class:`Clock`.
:class:`TrioClock` maps Trio's clock onto a datetime epoch, so under ``autojump_clock`` due times
and leases follow virtual time.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Protocol, runtime_checkable

import attrs
import trio

__all__ = ["Clock", "StepGuard", "SystemClock", "TrioClock", "WallClock", "utc"]

_UTC = dt.UTC


def utc(value: dt.datetime) -> dt.datetime:
    """Return *value* in UTC; a naive datetime is refused rather than guessed at."""
    if value.tzinfo is _UTC:
        return value  # the common case, and what astimezone would return: the same object
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"datetime must be timezone-aware, got naive {value.isoformat()}")
    return value.astimezone(_UTC)


@runtime_checkable
class Clock(Protocol):
    """Something that says what time it is, as a timezone-aware UTC datetime."""

    def now(self) -> dt.datetime: ...


@runtime_checkable
class WallClock(Clock, Protocol):
    """A clock that follows a wall clock, which can be stepped (by an operator, by NTP): it also
    says how much time has really passed, from a clock that is never stepped.

    A store whose clock is one judges other owners' leases by a :class:`StepGuard`, so that a
    step of the wall clock never makes a live lease look expired (R11 in
    docs/reliability.md). Test clocks (:class:`TrioClock`, a manual clock) are not wall clocks:
    their steps are time passing.
    """

    def monotonic(self) -> float:
        """Seconds from a clock that only ever moves forward at the rate time passes."""
        ...


@attrs.frozen
class SystemClock:
    """The machine's wall clock."""

    def now(self) -> dt.datetime:
        return dt.datetime.now(_UTC)

    def monotonic(self) -> float:
        return time.monotonic()


STEP_TOLERANCE = 1.0
"""Seconds the wall clock may run ahead of the time that has passed (slewing, the delay between
two readings) before it counts as stepped."""


@attrs.define
class StepGuard:
    """The time by which a store judges whether *someone else's* lease has expired, when its
    clock is a :class:`WallClock` that can be stepped.

    A lease's expiry is written in the wall clock's time. When the wall clock steps forward (an
    hour, say), every lease written before the step looks expired at once, though its owner is
    alive and renews within its renewal interval. So a forward step is believed only once it
    has lasted *hold* seconds of real time, longer than any owner takes to renew in the stepped
    time: until then this guard's time goes on from where it was, at the rate time passes. A
    backward step is believed at once: it can only make an expired lease look live for longer,
    which delays a rescue and never takes a lease from a live owner.

    One guard per store, in one process: its state is what that process has seen.
    """

    clock: WallClock
    hold: float = 120.0
    """Seconds a forward step must last before it is believed: more than the longest lease."""
    _time: dt.datetime | None = attrs.field(init=False, default=None)
    _at: float = attrs.field(init=False, default=0.0)
    _step_since: float | None = attrs.field(init=False, default=None)

    def now(self, hold: float | None = None) -> dt.datetime:
        """The guarded time (*hold*, when given and longer, for this reading: a claim passes its
        own lease, so a fleet with long leases holds a step for longer)."""
        wall, at = self.clock.now(), self.clock.monotonic()
        previous = self._time
        if previous is None:
            self._time, self._at = wall, at
            return wall
        bound = previous + dt.timedelta(seconds=at - self._at)
        if wall <= bound + dt.timedelta(seconds=STEP_TOLERANCE):
            self._step_since, result = None, wall
        else:
            if self._step_since is None:
                self._step_since = at
            held = self.hold if hold is None else max(self.hold, hold)
            result = wall if at - self._step_since >= held else bound
        self._time, self._at = result, at
        return result


_DEFAULT_EPOCH = dt.datetime(2030, 1, 1, tzinfo=_UTC)


@attrs.frozen
class TrioClock:
    """Trio's clock mapped onto a datetime: ``epoch`` plus ``trio.current_time()`` seconds.

    Only meaningful inside ``trio.run``. Under ``MockClock`` (``autojump_clock``) the datetime
    advances with virtual time, so a month of due times passes in milliseconds.
    """

    epoch: dt.datetime = attrs.field(default=_DEFAULT_EPOCH, converter=utc)

    def now(self) -> dt.datetime:
        return self.epoch + dt.timedelta(seconds=trio.current_time())
