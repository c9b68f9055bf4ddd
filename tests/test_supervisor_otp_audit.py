"""Supervisor: an acceptance audit against Erlang/OTP's documented supervisor behaviour.

Each test takes one rule a user of OTP's ``supervisor`` module (or of our docs/supervision.md, or of
the seed's contract) relies on, and checks it under the autojump clock with exact virtual times.
Where we differ from OTP on purpose (docs/supervision.md, "Differences from Erlang/OTP"), the test
checks our documented rule and says so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from trio_supervise import (
    ChildSpec,
    ChildStateError,
    Intensity,
    Jitter,
    RestartPolicy,
    RestartType,
    Shutdown,
    StartFailed,
    Strategy,
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


async def test_intensity_zero_means_the_first_restart_gives_up_stopping_the_rest_in_reverse(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MaxR = 0: no restart at all, whatever the child's policy; the supervisor stops every
    other child (the last started first, each within its grace) and then fails itself."""
    stopped: list[tuple[str, float]] = []

    def drains(name: str) -> ChildSpec:
        async def target(*, stop: Shutdown) -> None:
            await stop.wait()
            await trio.sleep(1)
            stopped.append((name, trio.current_time()))

        return ChildSpec(name, target, stop_signal=True)

    runs: list[float] = []

    async def crashes() -> None:
        runs.append(trio.current_time())
        await trio.sleep(2)
        raise OSError("crash")

    supervisor = Supervisor(
        name="app",
        intensity=Intensity(max_restarts=0, period=60),
        children=[
            drains("a"),
            ChildSpec("w", crashes, restart=RestartPolicy(1, 1)),
            drains("b"),
        ],
    )
    with pytest.raises(WorkerFailed, match="failed workers \\['w'\\]"):
        await supervisor.run()
    assert runs == [0]
    assert stopped == [("b", 3), ("a", 4)]
    assert supervisor.states == {
        "a": WorkerState.STOPPED,
        "w": WorkerState.FAILED,
        "b": WorkerState.STOPPED,
    }


# -- restart types -------------------------------------------------------------------------------


async def test_restart_types_decide_which_ends_are_restarted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """permanent: every end restarted (a return too); transient: only a raise; temporary: never,
    and (our documented difference from OTP) kept listed, ``stopped``, with its error, until
    delete_child."""
    runs: dict[str, int] = {}

    def ends_with(name: str, how: str) -> Callable[[], Awaitable[None]]:
        async def target() -> None:
            runs[name] = runs.get(name, 0) + 1
            await trio.sleep(1)
            if runs[name] > 1:
                await trio.sleep_forever()
            if how == "raise":
                raise OSError(name)

        return target

    policy = RestartPolicy(1, 1, jitter="none")
    children = [
        ChildSpec(f"{kind}-{how}", ends_with(f"{kind}-{how}", how), restart_type=kind, **extra)
        for kind, extra in [
            ("permanent", {"restart": policy}),
            ("transient", {"restart": policy}),
            ("temporary", {}),
        ]
        for how in ("return", "raise")
    ]
    supervisor = Supervisor(name="app", children=children)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep(10)
        assert runs == {
            "permanent-return": 2,
            "permanent-raise": 2,
            "transient-return": 1,
            "transient-raise": 2,
            "temporary-return": 1,
            "temporary-raise": 1,
        }
        assert supervisor.states == {
            "permanent-return": WorkerState.RUNNING,
            "permanent-raise": WorkerState.RUNNING,
            "transient-return": WorkerState.STOPPED,
            "transient-raise": WorkerState.RUNNING,
            "temporary-return": WorkerState.STOPPED,
            "temporary-raise": WorkerState.STOPPED,
        }
        [temporary] = [s for s in supervisor.which_children() if s.worker == "temporary-raise"]
        assert temporary.last_error == "OSError: temporary-raise"
        assert supervisor.healthy.value
        supervisor.delete_child("temporary-raise")
        assert "temporary-raise" not in supervisor.states
        nursery.cancel_scope.cancel()


# -- strategies ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "group"),
    [
        (Strategy.ONE_FOR_ONE, ["b"]),
        (Strategy.ONE_FOR_ALL, ["a", "b", "c"]),
        (Strategy.REST_FOR_ONE, ["b", "c"]),
    ],
)
async def test_a_strategy_group_is_restarted_in_start_order_each_once_the_previous_is_ready(
    autojump_clock: trio.testing.MockClock, strategy: Strategy, group: list[str]
) -> None:
    """OTP restarts the group in start order; ours also waits for each one's readiness (1 s)."""
    starts: list[tuple[str, float]] = []
    crashed = False

    def child(name: str) -> ChildSpec:
        async def target(*, task_status: trio.TaskStatus[None]) -> None:
            nonlocal crashed
            starts.append((name, trio.current_time()))
            await trio.sleep(1)
            task_status.started()
            if name == "b" and not crashed:
                crashed = True
                await trio.sleep(7)  # started at 1, ready at 2: fails at 9
                raise OSError("b")
            await trio.sleep_forever()

        return ChildSpec(name, target, start=True, restart=RestartPolicy(2, 2, jitter="none"))

    supervisor = Supervisor(name="app", strategy=strategy, children=[child(n) for n in "abc"])
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        assert starts == [("a", 0), ("b", 1), ("c", 2)]
        await trio.sleep(30)
        # Fails at 9, restarted after its 2 s backoff: the group starts at 11, 12, 13.
        assert starts[3:] == [(name, 11 + i) for i, name in enumerate(group)]
        assert all(state is WorkerState.RUNNING for state in supervisor.states.values())
        nursery.cancel_scope.cancel()


def _off_and_flaky(
    runs: dict[str, int],
) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    """Two children counting their runs in *runs*: ``off`` sleeps for ever; ``flaky`` fails
    5 s into its first run and sleeps for ever in the next."""

    async def off() -> None:
        runs["off"] += 1
        await trio.sleep_forever()

    async def flaky() -> None:
        runs["flaky"] += 1
        await trio.sleep(5)
        if runs["flaky"] == 1:
            raise OSError("flaky")
        await trio.sleep_forever()

    return off, flaky


async def test_group_members_that_already_ended_for_good_stay_ended(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Our documented difference: OTP's one_for_all starts every non-temporary member again,
    running or not; ours leaves a finished transient child and a terminated one stopped."""
    runs: dict[str, int] = {"done": 0, "off": 0, "flaky": 0}

    async def done() -> None:
        runs["done"] += 1

    off, flaky = _off_and_flaky(runs)

    policy = RestartPolicy(1, 1, jitter="none")
    supervisor = Supervisor(
        name="app",
        strategy="one_for_all",
        children=[
            ChildSpec("done", done, restart_type="transient", restart=policy),
            ChildSpec("off", off, restart=policy),
            ChildSpec("flaky", flaky, restart=policy),
        ],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.terminate_child("off")
        await trio.sleep(20)
        assert runs == {"done": 1, "off": 1, "flaky": 2}
        assert supervisor.states == {
            "done": WorkerState.STOPPED,
            "off": WorkerState.STOPPED,
            "flaky": WorkerState.RUNNING,
        }
        nursery.cancel_scope.cancel()


async def test_a_child_being_terminated_is_not_restarted_by_its_group(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """terminate_child gives a child its grace; a sibling failing meanwhile restarts its
    one_for_all group without the child being terminated, which ends stopped, as a terminated
    child does (it used to be taken into the group's restart and run again)."""
    runs: dict[str, int] = {"off": 0, "flaky": 0}

    off, flaky = _off_and_flaky(runs)

    policy = RestartPolicy(1, 1, jitter="none")
    supervisor = Supervisor(
        name="app",
        strategy="one_for_all",
        children=[
            ChildSpec("off", off, restart=policy, shutdown_grace=10),
            ChildSpec("flaky", flaky, restart=policy),
        ],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        nursery.start_soon(supervisor.terminate_child, "off")  # its grace runs until t=10
        await trio.sleep(30)
        assert runs == {"off": 1, "flaky": 2}
        assert supervisor.states == {"off": WorkerState.STOPPED, "flaky": WorkerState.RUNNING}
        nursery.cancel_scope.cancel()


# -- shutdown ------------------------------------------------------------------------------------


async def test_a_nested_supervisor_is_given_as_long_as_its_children_need_to_stop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """OTP's ``infinity`` for a supervisor child: the parent's turn for it lasts until its own
    children are done, each within its own grace, however long that is; then the next one."""
    stopped: list[tuple[str, float]] = []

    def drains(name: str, seconds: float, grace: float) -> ChildSpec:
        async def target(*, stop: Shutdown) -> None:
            await stop.wait()
            await trio.sleep(seconds)
            stopped.append((name, trio.current_time()))

        return ChildSpec(name, target, stop_signal=True, shutdown_grace=grace)

    inner = Supervisor(name="inner", children=[drains("slow", 20, 30), drains("stubborn", 100, 8)])
    outer = Supervisor(name="outer", children=[drains("db", 1, 5), inner])
    async with trio.open_nursery() as nursery:
        await nursery.start(outer.run)
        outer.shutdown.begin("deploy")
    # stubborn is cancelled at the end of its 8 s grace, slow drains its 20 s, then db its 1 s.
    assert stopped == [("slow", 28), ("db", 29)]
    assert outer.states["inner/stubborn"] is WorkerState.STOPPED
    assert trio.current_time() == 29
    assert outer.healthy.value


async def test_cancelling_a_supervisor_during_its_ordered_shutdown_propagates_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Cancellation from above is never swallowed, even mid-drain: run raises trio.Cancelled
    itself (not wrapped in a group), every child's ``finally`` has run."""
    finished: list[str] = []

    def drains(name: str) -> ChildSpec:
        async def target(*, stop: Shutdown) -> None:
            try:
                await stop.wait()
                await trio.sleep(10)
            finally:
                finished.append(name)

        return ChildSpec(name, target, stop_signal=True, shutdown_grace=30)

    supervisor = Supervisor(name="app", children=[drains("a"), drains("b")])
    raised: list[BaseException] = []
    with trio.CancelScope() as scope:

        async def watch(*, task_status: trio.TaskStatus[None]) -> None:
            try:
                await supervisor.run(task_status=task_status)
            except BaseException as exc:
                raised.append(exc)
                raise

        async with trio.open_nursery() as nursery:
            await nursery.start(watch)
            supervisor.shutdown.begin("deploy")
            await trio.sleep(5)  # b is draining
            scope.cancel()
    assert scope.cancelled_caught
    [exc] = raised
    assert isinstance(exc, trio.Cancelled)
    assert sorted(finished) == ["a", "b"]
    assert trio.current_time() == 5


# -- dynamic children ----------------------------------------------------------------------------


async def test_start_child_with_a_listed_name_is_refused_naming_it_running_or_not(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """OTP: ``already_started`` / ``already_present``; ours: ValueError naming the child, and
    the listed child is untouched either way."""
    supervisor = Supervisor(name="app", children=[ChildSpec("w", park)])
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        with pytest.raises(ValueError, match="supervisor 'app' already has a child named 'w'"):
            await supervisor.start_child(ChildSpec("w", park))
        assert supervisor.state("w") is WorkerState.RUNNING
        await supervisor.terminate_child("w")
        with pytest.raises(ValueError, match="already has a child named 'w'"):
            await supervisor.start_child(ChildSpec("w", park))
        assert supervisor.state("w") is WorkerState.STOPPED
        supervisor.delete_child("w")
        await supervisor.start_child(ChildSpec("w", park))
        assert supervisor.state("w") is WorkerState.RUNNING
        nursery.cancel_scope.cancel()


async def test_delete_child_and_restart_child_are_refused_while_it_runs_or_backs_off(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """OTP: ``{error, running}`` / ``{error, restarting}``; ours: ChildStateError saying which."""
    runs = 0

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        await trio.sleep(1)
        raise OSError("flaky")

    supervisor = Supervisor(
        name="app",
        children=[ChildSpec("w", flaky, restart=RestartPolicy(10, 10, jitter="none"))],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        with pytest.raises(ChildStateError, match="'w' is running"):
            supervisor.delete_child("w")
        await trio.sleep(2)
        assert supervisor.state("w") is WorkerState.BACKING_OFF
        with pytest.raises(ChildStateError, match="'w' is running \\(or restarting\\)"):
            supervisor.delete_child("w")
        with pytest.raises(ChildStateError, match="'w' is already restarting"):
            await supervisor.restart_child("w")
        await supervisor.terminate_child("w")  # drops the pending restart
        await trio.sleep(20)
        assert runs == 1
        await supervisor.restart_child("w")
        assert runs == 2
        assert supervisor.state("w") is WorkerState.RUNNING
        nursery.cancel_scope.cancel()


async def test_a_temporary_child_that_ended_can_be_restarted_while_it_is_listed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """OTP deletes a temporary child's spec when it ends, so restart_child is ``not_found``;
    ours keeps it listed (documented difference), so restart_child runs it again, once."""
    runs: list[float] = []

    async def job() -> None:
        runs.append(trio.current_time())
        await trio.sleep(1)

    supervisor = Supervisor(name="app", children=[ChildSpec("job", job, restart_type="temporary")])
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep(5)
        assert supervisor.state("job") is WorkerState.STOPPED
        await supervisor.restart_child("job")
        await trio.sleep(5)
        assert runs == [0, 5]
        assert supervisor.state("job") is WorkerState.STOPPED
        supervisor.delete_child("job")
        with pytest.raises(KeyError, match="no worker 'job'"):
            await supervisor.restart_child("job")
        nursery.cancel_scope.cancel()


# -- significant children ------------------------------------------------------------------------


async def test_all_significant_counts_a_terminated_significant_child_as_ended(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """OTP: all_significant shuts down when the last *active* significant child ends; one
    terminated with terminate_child is not active, and its termination alone shuts nothing."""

    async def job(seconds: float) -> None:
        await trio.sleep(seconds)

    supervisor = Supervisor(
        name="app",
        auto_shutdown="all_significant",
        children=[
            ChildSpec("a", lambda: job(100), restart_type="transient", significant=True),
            ChildSpec("b", lambda: job(10), restart_type="transient", significant=True),
            ChildSpec("helper", park, shutdown_grace=0),
        ],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.terminate_child("a")
        await trio.sleep(1)
        assert not supervisor.shutdown.requested
    assert trio.current_time() == 10  # b's normal end is the last significant one
    assert supervisor.healthy.value
    assert supervisor.shutdown.reason == "significant worker 'b' ended (all_significant)"


# -- backoff and health --------------------------------------------------------------------------


async def test_restart_delays_are_the_policys_keyed_jittered_backoffs_and_repeat_per_seed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Capped exponential backoff, spread by a keyed draw: the same seed and worker path give the
    same restart times on every run; another path gives others. Health stays true meanwhile."""
    policy = RestartPolicy(1, 8, max_restarts=20)

    async def restart_times(name: str, seed: int) -> list[float]:
        starts: list[float] = []

        async def crashes() -> None:
            starts.append(trio.current_time())
            raise OSError("down")

        supervisor = Supervisor(
            name="app",
            children=[ChildSpec(name, crashes, restart=policy)],
            jitter=Jitter(seed=seed),
        )
        begin = trio.current_time()
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            while len(starts) < 7:
                await supervisor.watch(name).wait_transition()
                assert supervisor.healthy.value, "backing off does not flip health (the seed)"
            nursery.cancel_scope.cancel()
        return [t - begin for t in starts]

    times = await restart_times("poller", seed=7)
    expected, now = [0.0], 0.0
    for attempt in range(1, 7):
        delay = policy.backoff(attempt, key="poller", jitter=Jitter(seed=7))
        assert (
            policy.delay(attempt) / 2
            <= delay
            <= policy.delay(attempt)
            == min(2 ** (attempt - 1), 8)
        )
        now += delay
        expected.append(now)
    assert times == [at(t) for t in expected]
    assert await restart_times("poller", seed=7) == [at(t) for t in times]
    assert await restart_times("fetcher", seed=7) != [at(t) for t in times]
    assert await restart_times("poller", seed=8) != [at(t) for t in times]


async def test_health_is_false_from_the_moment_a_worker_is_down_for_good(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """ "Health never lies": a permanent worker that returns without a policy is ``failed`` and
    health is false at once, while the others keep running (the seed's exit rule)."""

    async def quits() -> None:
        await trio.sleep(3)

    supervisor = Supervisor(name="app", children=[ChildSpec("q", quits), ChildSpec("p", park)])
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.watch("q").wait_value(WorkerState.FAILED)
        assert not supervisor.healthy.value
        assert trio.current_time() == 3
        assert supervisor.state("p") is WorkerState.RUNNING
        assert not supervisor.shutdown.requested
        nursery.cancel_scope.cancel()
