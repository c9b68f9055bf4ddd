"""Supervisor: an acceptance audit against Erlang/OTP's documented supervisor behaviour.

Each test takes one rule a user of OTP's ``supervisor`` module (or of our docs/supervision.md, or of
the seed's contract) relies on, and checks it under the autojump clock with exact virtual times.
Where we differ from OTP on purpose (docs/supervision.md, "Differences from Erlang/OTP"), the test
checks our documented rule and says so.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio
import trio.testing

from trio_supervise import (
    ChildSpec,
    Intensity,
    Jitter,
    RestartPolicy,
    Supervisor,
    WorkerFailed,
)

JITTER = Jitter(seed=17)
NO_JITTER_NOW = RestartPolicy(0, 0, jitter="none")
"""Restarts at once and never runs out: the supervisor's intensity alone bounds it."""


def at(seconds: float) -> object:
    """A virtual time, compared to within a nanosecond (the autojump clock adds float deltas)."""
    return pytest.approx(seconds, abs=1e-9)


async def park() -> None:
    await trio.sleep_forever()


def fails_after(seconds: float, log: list[float]) -> ChildSpec:
    """A child that runs *seconds*, records when it fails, and raises."""

    async def target() -> None:
        await trio.sleep(seconds)
        log.append(trio.current_time())
        raise OSError("worn out")

    return ChildSpec("w", target, restart=NO_JITTER_NOW, shutdown_grace=0)


# -- restart intensity ---------------------------------------------------------------------------


async def test_a_restart_exactly_one_period_ago_is_still_within_the_intensity_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """OTP keeps every restart at or after ``now - period``: failing every MaxT seconds with
    MaxR = 1 is two restarts within MaxT seconds, one too many.

    Regression: the window dropped a restart exactly one period old, so a child failing every
    5 s under ``Intensity(1, 5)`` was restarted forever.
    """
    failures: list[float] = []
    supervisor = Supervisor(
        name="app",
        intensity=Intensity(max_restarts=1, period=5),
        children=[fails_after(5, failures)],
    )
    with trio.move_on_after(60):  # without the fix it never gives up
        with pytest.raises(WorkerFailed, match="failed workers \\['w'\\]"):
            await supervisor.run()
    assert failures == [5, 10]
    assert trio.current_time() == 10


async def test_restarts_further_apart_than_the_period_never_exceed_the_intensity(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The window slides: a child failing every 5.5 s never has two restarts within 5 s."""
    failures: list[float] = []
    supervisor = Supervisor(
        name="app",
        intensity=Intensity(max_restarts=1, period=5),
        children=[fails_after(5.5, failures)],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep(100)
        assert failures == [at(5.5 * n) for n in range(1, 19)]
        assert supervisor.healthy.value
        nursery.cancel_scope.cancel()


# -- bad input: every supervision argument is checked up front, naming the field and the rule ------


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: RestartPolicy(1, 2, jitter="sideways"), ValueError, "jitter must be a JitterMode"),
        (lambda: RestartPolicy(1, 2, jitter=3), ValueError, "jitter must be a JitterMode"),
        (lambda: ChildSpec("w", park, start="yes"), TypeError, "start must be a bool"),
        (lambda: ChildSpec("w", park, start=1), TypeError, "start must be a bool"),
        (lambda: Supervisor(name="s", shutdown=object()), TypeError, "shutdown must be a Shutdown"),
        (
            lambda: Supervisor(name="s", registry={}),
            TypeError,
            "registry must be a prometheus_client CollectorRegistry",
        ),
        (lambda: Supervisor(name="s", children=5), TypeError, "children must be an iterable"),
        (
            lambda: Supervisor(name="s", children=ChildSpec("w", park)),
            TypeError,
            "children must be an iterable",
        ),
        (lambda: Supervisor(name="s", children="w"), TypeError, "children must be an iterable"),
    ],
)
def test_bad_supervision_arguments_are_refused_at_construction_naming_the_field(
    build: Callable[[], object], error: type[Exception], message: str
) -> None:
    """Regression: these were accepted (``start``, ``shutdown``, ``registry``, ``children``) and
    failed later, far from the mistake, or raised without naming the field (``jitter``)."""
    with pytest.raises(error, match=message):
        build()
