"""Wall-clock time, from one injectable object.

Durations and waits go through Trio (``trio.current_time``, ``trio.sleep``). Timestamps that are
stored (due times, lease expiries) are timezone-aware UTC datetimes read from a :class:`Clock`.
:class:`TrioClock` maps Trio's clock onto a datetime epoch, so under ``autojump_clock`` due times
and leases follow virtual time.
"""

from __future__ import annotations

import datetime as dt
from typing import Protocol, runtime_checkable

import attrs
import trio

__all__ = ["Clock", "SystemClock", "TrioClock", "utc"]

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


@attrs.frozen
class SystemClock:
    """The machine's wall clock."""

    def now(self) -> dt.datetime:
        return dt.datetime.now(_UTC)


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
