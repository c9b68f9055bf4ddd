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
    RestartType,
    StartFailed,
    Supervisor,
    WorkerFailed,
    WorkerState,
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


# -- a child that ends during its start: OTP's ``ignore`` and ``{error, Reason}`` ----------------


class NeverReady(trio.TaskStatus[None]):
    """A task status that fails the test if the supervisor reports itself ready."""

    def started(self, value: None = None) -> None:
        pytest.fail("the supervisor reported itself ready")


async def quits_before_ready(*, task_status: trio.TaskStatus[None]) -> None:
    await trio.sleep(1)


async def raises_before_ready(*, task_status: trio.TaskStatus[None]) -> None:
    await trio.sleep(1)
    raise OSError("port in use")


@pytest.mark.parametrize("restart_type", [RestartType.TRANSIENT, RestartType.TEMPORARY])
async def test_start_child_of_a_child_returning_before_ready_is_otps_ignore(
    autojump_clock: trio.testing.MockClock, restart_type: RestartType
) -> None:
    """OTP's start_child: a start function returning ``ignore`` gives ``{ok, undefined}``, no
    error. Ours maps a transient or temporary child's return before readiness to ``ignore`` (as
    for initial children): start_child returns, the child is listed ``stopped``.

    Regression: start_child raised StartFailed and dropped the child.
    """
    supervisor = Supervisor(name="app", children=[ChildSpec("steady", park)])
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        spec = ChildSpec("once", quits_before_ready, start=True, restart_type=restart_type)
        await supervisor.start_child(spec)
        assert trio.current_time() == 1
        assert supervisor.states == {"steady": WorkerState.RUNNING, "once": WorkerState.STOPPED}
        assert supervisor.healthy.value
        assert not supervisor.shutdown.requested
        # Listed and terminated: restart_child starts it again, and its return is ignore again.
        await supervisor.restart_child("once")
        assert trio.current_time() == 2
        assert supervisor.state("once") is WorkerState.STOPPED
        supervisor.delete_child("once")
        assert [s.worker for s in supervisor.which_children()] == ["steady"]
        nursery.cancel_scope.cancel()


async def test_start_child_of_a_child_raising_before_ready_is_an_error_whatever_its_type(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """OTP: a start function that fails is ``{error, Reason}`` for every restart type."""
    supervisor = Supervisor(name="app")
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        for restart_type in RestartType:
            spec = ChildSpec("api", raises_before_ready, start=True, restart_type=restart_type)
            with pytest.raises(StartFailed, match="'api' failed to start: failed \\(OSError"):
                await supervisor.start_child(spec)
            assert supervisor.which_children() == []
        assert supervisor.healthy.value
        nursery.cancel_scope.cancel()


async def test_an_initial_temporary_child_raising_before_ready_fails_the_start(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """OTP's start_link: any child's start function failing fails the supervisor's start, its
    restart type notwithstanding; the children started before it are stopped, later ones never
    start.

    Regression: a temporary child raising before it was ready was recorded ``stopped`` and the
    supervisor reported itself ready.
    """
    later_started: list[float] = []

    async def later() -> None:
        later_started.append(trio.current_time())
        await trio.sleep_forever()

    supervisor = Supervisor(
        name="app",
        children=[
            ChildSpec("first", park, shutdown_grace=0),
            ChildSpec("api", raises_before_ready, start=True, restart_type="temporary"),
            ChildSpec("later", later),
        ],
    )
    with pytest.raises(StartFailed) as info:
        await supervisor.run(task_status=NeverReady())
    assert "worker 'api' failed to start: failed (OSError: port in use)" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    assert later_started == []
    assert supervisor.states == {
        "first": WorkerState.STOPPED,
        "api": WorkerState.STOPPED,
        "later": WorkerState.STOPPED,
    }
    assert trio.current_time() == 1


async def test_a_child_ending_before_ready_because_shutdown_began_is_not_a_start_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Once shutdown has begun a child's end is its consequence, even one raised while starting."""

    async def slow_start(*, task_status: trio.TaskStatus[None]) -> None:
        try:
            await trio.sleep(10)
        finally:
            raise OSError("cleanup went wrong")

    supervisor = Supervisor(
        name="app",
        children=[ChildSpec("slow", slow_start, start=True, restart_type="temporary")],
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervisor.run)
        await trio.sleep(1)
        supervisor.shutdown.begin("deploy")
    assert supervisor.healthy.value
    assert supervisor.state("slow") is WorkerState.STOPPED
