"""The clock the conformance suite injects into a store: it moves only when a test moves it."""

from __future__ import annotations

import datetime as dt

import attrs

START = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
"""Where every :class:`ManualClock` starts: a fixed instant, so stored times are predictable."""


@attrs.define
class ManualClock:
    """A wall clock that moves only when a test says so, so leases expire without sleeping.

    It satisfies :class:`trio_supervise.Clock`; a store under test must read "now" (due times,
    lease expiries, pruning ages) from the clock it was given, never from the machine.
    """

    current: dt.datetime = START

    def now(self) -> dt.datetime:
        """The instant the test has moved the clock to."""
        return self.current

    def advance(self, seconds: float) -> None:
        """Move "now" forward by *seconds*."""
        self.current += dt.timedelta(seconds=seconds)
