"""Rate limits: what one is (:class:`RateLimit`, "at most N starts in any period"), and the one
rule every backend applies in its claim: a sliding window over the recorded start times.

A queue with a rate limit keeps the times of its latest starts (at most ``limit`` of them; a
claim of an item is a start, a rescue of an expired lease too). A claim at *now* may start as
many items as the log holds fewer than ``limit`` starts after ``now - period``; it records its
starts at *now*. So in no interval of one period are there more than ``limit`` starts, wherever
the interval falls: a burst at the edge of a window cannot double the rate, as it can with a
fixed window counter. While the log is full, the queue is claimable again at
``log[-limit] + period`` (:func:`throttled_until`), which is what ``next_due_at`` reports.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Sequence

import attrs

__all__ = [
    "MAX_RATE_LIMIT",
    "MAX_RATE_PERIOD",
    "RateLimit",
    "admitted",
    "check_rate",
    "recorded",
    "throttled_until",
]

MAX_RATE_LIMIT = 100_000
"""The largest ``limit`` of a rate limit (the log holds that many start times)."""

MAX_RATE_PERIOD = 7 * 86_400.0
"""The longest ``period`` of a rate limit, in seconds (a week)."""

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86_400.0}
_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*(ms|s|min|m|h|d)\s*")
_FORM = "N/PERIOD, as 100/60s (units: ms, s, m, h, d)"


def _check_limit(_: object, __: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RATE_LIMIT:
        raise ValueError(f"rate limit must be an integer from 1 to {MAX_RATE_LIMIT}, got {value!r}")


def _check_period(_: object, __: attrs.Attribute[float], value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0.001 <= value <= MAX_RATE_PERIOD
    ):
        raise ValueError(
            f"rate period must be a number of seconds from 0.001 to {MAX_RATE_PERIOD:g}, "
            f"got {value!r}"
        )


@attrs.frozen
class RateLimit:
    """At most *limit* starts in any interval of *period* seconds, fleet-wide.

    ``RateLimit(100, 60)`` or ``RateLimit.parse("100/60s")``; ``str()`` gives the short form.
    """

    limit: int = attrs.field(validator=_check_limit)
    period: float = attrs.field(converter=float, validator=_check_period)

    @classmethod
    def parse(cls, text: object) -> RateLimit:
        """A rate written ``N/PERIOD`` (``100/60s``, ``10/s``, ``5/500ms``, ``1000/1h``)."""
        if isinstance(text, RateLimit):
            return text
        found = _RATE.fullmatch(text) if isinstance(text, str) else None
        if found is None:
            raise ValueError(f"rate must be {_FORM}, got {text!r}")
        count, amount, unit = found.groups()
        return cls(int(count), float(amount or 1) * _UNITS[unit])

    @property
    def period_us(self) -> int:
        """The period in whole microseconds (as the SQL backends store it)."""
        return round(self.period * 1_000_000)

    def __str__(self) -> str:
        if self.period >= 1 or self.period * 1000 != round(self.period * 1000):
            return f"{self.limit}/{self.period:g}s"
        return f"{self.limit}/{self.period * 1000:g}ms"


def check_rate(rate: object) -> RateLimit:
    """*rate* as a :class:`RateLimit` (one, or its short form ``"100/60s"``); else a
    ``ValueError`` naming the form."""
    return RateLimit.parse(rate)


def _period(rate: RateLimit) -> dt.timedelta:
    return dt.timedelta(microseconds=rate.period_us)


def admitted(
    starts: Sequence[dt.datetime], rate: RateLimit, now: dt.datetime
) -> tuple[list[dt.datetime], dt.datetime, int]:
    """What a claim at *now* may do under *rate*, given the recorded *starts* (oldest first):
    the starts still in the window, the time to record new starts at (*now*, or the latest
    recorded start if that is later: a writer whose clock lags never records a start before
    one already counted), and how many items may start."""
    last = max(starts, default=now)
    at = max(now, last)
    since = at - _period(rate)
    kept = sorted(start for start in starts if start > since)[-rate.limit :]
    return kept, at, rate.limit - len(kept)


def recorded(
    kept: Sequence[dt.datetime], at: dt.datetime, started: int, rate: RateLimit
) -> list[dt.datetime]:
    """The log after *started* items started at *at*: the latest ``limit`` starts."""
    return [*kept, *([at] * started)][-rate.limit :]


def throttled_until(starts: Sequence[dt.datetime], rate: RateLimit) -> dt.datetime | None:
    """When a full log lets a start in again (``starts[-limit] + period``); None when it is not
    full (the queue may start items now, as far as its rate goes)."""
    if len(starts) < rate.limit:
        return None
    return sorted(starts)[-rate.limit] + _period(rate)
