"""Rate limits: the short form, the checks, and the sliding window every backend applies."""

from __future__ import annotations

import contextlib
import datetime as dt
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_supervise import RateLimit
from trio_supervise.job import admitted, recorded, throttled_until

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("100/60s", RateLimit(100, 60)),
        ("100/1m", RateLimit(100, 60)),
        ("10/s", RateLimit(10, 1)),
        ("5/500ms", RateLimit(5, 0.5)),
        (" 1000 / 1h ", RateLimit(1000, 3600)),
        ("3/2min", RateLimit(3, 120)),
        ("50000/1d", RateLimit(50000, 86400)),
    ],
)
def test_the_short_form_reads_and_prints_back(text: str, rate: RateLimit) -> None:
    """``N/PERIOD`` with ms, s, m/min, h or d; str() gives a form that reads back the same."""
    assert RateLimit.parse(text) == rate
    assert RateLimit.parse(str(rate)) == rate


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("100", "rate must be N/PERIOD"),
        ("100/60x", "rate must be N/PERIOD"),
        ("-1/s", "rate must be N/PERIOD"),
        (60, "rate must be N/PERIOD"),
        ("0/s", "rate limit must be an integer from 1 to 100000"),
        ("100001/s", "rate limit must be an integer from 1 to 100000"),
        ("1/0s", "rate period must be a number of seconds from 0.001"),
        ("1/8d", "rate period must be a number of seconds from 0.001"),
    ],
)
def test_bad_rates_are_refused_naming_the_rule(text: object, rule: str) -> None:
    """A rate that is not N/PERIOD, or out of range, is a ValueError saying which rule."""
    with pytest.raises(ValueError, match=rule):
        RateLimit.parse(text)


def test_a_full_window_frees_a_period_after_its_oldest_counted_start() -> None:
    """3 per 10 s after starts at 0, 4 and 6: full until 10; then one slot until 14."""
    rate = RateLimit(3, 10)
    log = [T0 + dt.timedelta(seconds=s) for s in (0, 4, 6)]
    assert throttled_until(log, rate) == T0 + dt.timedelta(seconds=10)
    assert admitted(log, rate, T0 + dt.timedelta(seconds=9))[2] == 0
    kept, at, free = admitted(log, rate, T0 + dt.timedelta(seconds=10))
    assert (free, at) == (1, T0 + dt.timedelta(seconds=10))
    assert throttled_until(recorded(kept, at, 1, rate), rate) == T0 + dt.timedelta(seconds=14)


def test_a_lagging_clock_never_records_a_start_before_one_counted() -> None:
    """A claim whose now is behind the latest recorded start records at that start."""
    rate = RateLimit(5, 10)
    log = [T0 + dt.timedelta(seconds=3)]
    _, at, free = admitted(log, rate, T0)
    assert (at, free) == (T0 + dt.timedelta(seconds=3), 4)


@given(
    limit=st.integers(1, 5),
    period=st.integers(1, 20),
    claims=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 8)), max_size=40),
)
def test_no_interval_of_one_period_holds_more_than_the_limit(
    limit: int, period: int, claims: list[tuple[int, int]]
) -> None:
    """Claims of any size at any times: taking what the window admits and recording it, no
    interval of one period ever holds more than ``limit`` starts."""
    rate = RateLimit(limit, period)
    log: list[dt.datetime] = []
    starts: list[dt.datetime] = []
    now = T0
    for step, wanted in claims:
        now += dt.timedelta(seconds=step)
        kept, at, free = admitted(log, rate, now)
        taken = min(wanted, free)
        log = recorded(kept, at, taken, rate)
        starts += [at] * taken
    for first, last in zip(starts, starts[limit:], strict=False):
        assert last - first >= dt.timedelta(seconds=period)


class _TickingWallClock:
    """A wall clock one second later at every reading (and so readable from any thread)."""

    def __init__(self) -> None:
        self.readings = 0
        self.start = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)

    def now(self) -> dt.datetime:
        self.readings += 1
        return self.start + dt.timedelta(seconds=self.readings)

    def monotonic(self) -> float:
        return float(self.readings)


_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("backend", _BACKENDS)
async def test_a_claim_records_its_starts_when_it_holds_the_lock(
    keyed: bool, backend: str, tmp_path: Path
) -> None:
    """A rate-limited claim reads a wall clock again once it holds the lock: its starts are
    recorded no earlier than it took them, so a claim that waited for the lock cannot open the
    next window early (the queue's limit, and a key's; SQLite, and PostgreSQL with a clock of
    the application's)."""
    from trio_supervise.queues import PostgresQueue, SQLiteQueue

    from .queues.conftest import pg_schema

    clock = _TickingWallClock()
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            opened: SQLiteQueue | PostgresQueue = await SQLiteQueue.connect(
                tmp_path / "q.db", clock=clock
            )
        else:
            dsn, schema = stack.enter_context(pg_schema())
            opened = await PostgresQueue.connect(dsn, schema=schema, migrate=True, clock=clock)
        async with opened as queue:
            if keyed:
                await queue.set_key_rate_limit("k", RateLimit(1, 60))
                await queue.enqueue("spec", concurrency_key="k", concurrency_limit=5)
            else:
                await queue.set_rate_limit("q", RateLimit(1, 60))
                await queue.enqueue("spec", queue="q")
            asked = clock.start + dt.timedelta(seconds=clock.readings + 1)
            served = "default" if keyed else "q"
            [item] = await queue.claim_due(["spec"], "w", 60, 5, queue=served)
            if keyed:
                until = (await queue.throttled_keys())["k"]
            else:
                [info] = [q for q in await queue.list_queues() if q.name == "q"]
                assert info.throttled_until is not None
                until = info.throttled_until
    assert until > asked + dt.timedelta(seconds=60)
    assert item.updated_at > asked
