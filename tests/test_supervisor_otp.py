"""Supervisor: the day-to-day operations of Erlang/OTP, ported scenario by scenario.

The scenarios follow OTP's ``lib/stdlib/test/supervisor_SUITE.erl`` (the case each one adapts is
named in its docstring): start failures, ``start_child`` errors, child administration
(``terminate_child`` / ``restart_child`` / ``delete_child`` / ``which_children`` /
``count_children``), restart intensity and its escalation, shutdown order, significant children and
``auto_shutdown``. Every one runs under the autojump clock and asserts exact virtual times.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from trio_supervise import (
    AutoShutdown,
    ChildCounts,
    ChildSpec,
    ChildStateError,
    Intensity,
    Jitter,
    RestartPolicy,
    RestartType,
    Shutdown,
    ShutdownOrder,
    StartFailed,
    Strategy,
    Supervisor,
    WorkerFailed,
    WorkerState,
)

JITTER = Jitter(seed=13)


def at(seconds: float) -> object:
    """A virtual time, compared to within a nanosecond (the autojump clock adds float deltas)."""
    return pytest.approx(seconds, abs=1e-9)


def backoff(policy: RestartPolicy, key: str, attempt: int) -> float:
    return policy.backoff(attempt, key=key, jitter=JITTER)


@attrs.define
class Child:
    """A scripted child that reports readiness and watches its own stop signal.

    Its first *fail_before_ready* runs raise after *ready_after* seconds without reporting
    ready; later runs report ready and park. On its stop signal it takes *drains_for* seconds,
    then returns.
    """

    fail_before_ready: int = 0
    ready_after: float = 0.0
    drains_for: float = 0.0
    error: Exception = attrs.field(factory=lambda: OSError("port in use"))
    starts: list[float] = attrs.field(factory=list)
    stop_seen: list[float] = attrs.field(factory=list)
    ends: list[float] = attrs.field(factory=list)

    async def __call__(self, *, stop: Shutdown, task_status: trio.TaskStatus[None]) -> None:
        self.starts.append(trio.current_time())
        try:
            await trio.sleep(self.ready_after)
            if len(self.starts) <= self.fail_before_ready:
                raise self.error
            task_status.started()
            await stop.wait()
            self.stop_seen.append(trio.current_time())
            await trio.sleep(self.drains_for)
        finally:
            self.ends.append(trio.current_time())

    def spec(self, name: str, **options: object) -> ChildSpec:
        return ChildSpec(name, self, start=True, stop_signal=True, **options)  # type: ignore[arg-type]


async def park() -> None:
    await trio.sleep_forever()


async def start_failure(supervisor: Supervisor) -> StartFailed:
    """Start *supervisor* the usual way, in a nursery; the StartFailed its start raised."""
    failures: list[StartFailed] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            pytest.fail("the supervisor reported itself ready")
    except* StartFailed as group:
        failures.extend(e for e in group.exceptions if isinstance(e, StartFailed))
    [failure] = failures
    return failure


def counts(supervisor: Supervisor) -> list[int]:
    """OTP's ``[specs, active, supervisors, workers]``."""
    c = supervisor.count_children()
    return [c.specs, c.active, c.supervisors, c.workers]


# -- start failures (sup_start_fail, sup_start_error_return) ---------------------------------------


async def test_an_initial_child_failing_before_ready_fails_the_start(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """nursery.start raises StartFailed naming the child and its cause, and never reports ready.

    Regression: the supervisor used to report itself ready with the child failed.
    """
    db, api, worker = (
        Child(ready_after=1, drains_for=1),
        Child(fail_before_ready=1, ready_after=2),
        Child(),
    )
    supervisor = Supervisor(
        name="app", children=[db.spec("db"), api.spec("api"), worker.spec("worker")]
    )
    error = await start_failure(supervisor)
    assert isinstance(error, WorkerFailed)
    assert error.worker == "api"
    assert str(error) == "worker 'api' failed to start: failed (OSError: port in use)"
    assert isinstance(error.__cause__, OSError)
    # db was ready at 1, api failed at 3; db is stopped (its 1 s drain); worker never started.
    assert db.stop_seen == [3]
    assert db.ends == [4]
    assert worker.starts == []
    assert supervisor.states == {
        "db": WorkerState.STOPPED,
        "api": WorkerState.FAILED,
        "worker": WorkerState.STOPPED,
    }
    assert supervisor.shutdown.reason == "worker 'api' failed"
    assert trio.current_time() == 4


async def test_readiness_waits_for_the_restart_of_a_child_that_failed_before_ready(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With a restart policy, nursery.start returns once the restarted child is ready."""
    policy = RestartPolicy(1, 8)
    api, later = Child(fail_before_ready=2, ready_after=1), Child()
    supervisor = Supervisor(
        name="app",
        children=[api.spec("api", restart=policy), later.spec("later")],
        jitter=JITTER,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        first, second = backoff(policy, "api", 1), backoff(policy, "api", 2)
        assert api.starts == [0, at(1 + first), at(2 + first + second)]
        assert trio.current_time() == at(3 + first + second)
        assert supervisor.state("api") is WorkerState.RUNNING
        assert later.starts == [at(3 + first + second)], "the next child waits for readiness"
        assert supervisor.healthy.value
        nursery.cancel_scope.cancel()


async def test_a_child_exhausting_its_policy_before_ready_fails_the_start(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A child that keeps failing before ready, past its restarts, fails the start."""
    policy = RestartPolicy(1, 1, max_restarts=1)
    api = Child(fail_before_ready=5)
    supervisor = Supervisor(name="app", children=[api.spec("api", restart=policy)], jitter=JITTER)
    error = await start_failure(supervisor)
    assert str(error) == "worker 'api' failed to start: failed (OSError: port in use)"
    assert api.starts == [0, at(backoff(policy, "api", 1))]
    assert supervisor.failed


async def test_a_transient_child_that_finishes_before_ready_does_not_fail_the_start(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """OTP's ``ignore``: a transient child that returns before it is ready is just stopped."""

    async def migrate(*, task_status: trio.TaskStatus[None]) -> None:
        await trio.sleep(2)

    supervisor = Supervisor(
        name="app",
        children=[
            ChildSpec("migrate", migrate, start=True, restart_type=RestartType.TRANSIENT),
            ChildSpec("worker", park),
        ],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        assert trio.current_time() == 2
        assert supervisor.states == {"migrate": WorkerState.STOPPED, "worker": WorkerState.RUNNING}
        nursery.cancel_scope.cancel()


async def test_a_nested_supervisor_failing_to_start_fails_its_parents_start(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A start failure deep in the tree names the nested supervisor, with the inner failure."""
    inner = Supervisor(
        name="inner", children=[Child(fail_before_ready=1, ready_after=1).spec("db")]
    )
    outer = Supervisor(name="outer", children=[inner])
    with pytest.raises(StartFailed) as info:
        await outer.run()
    assert info.value.worker == "inner"
    assert "worker 'inner/db' failed to start: failed (OSError: port in use)" in str(info.value)
    assert isinstance(info.value.__cause__, StartFailed)
    assert trio.current_time() == 1


# -- start_child errors (child_adm, sup_start_ignore_child) ----------------------------------------


async def test_start_child_of_a_child_failing_before_ready_raises_and_adds_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """start_child raises StartFailed with the cause; the supervisor and its children go on.

    Regression: start_child used to return, with the child failed and the supervisor shutting down.
    """
    steady = Child()
    supervisor = Supervisor(name="app", children=[steady.spec("steady")])
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        broken = Child(fail_before_ready=1, ready_after=2)
        with pytest.raises(StartFailed) as info:
            await supervisor.start_child(broken.spec("api", restart=RestartPolicy(1, 2)))
        assert str(info.value) == "worker 'api' failed to start: failed (OSError: port in use)"
        assert isinstance(info.value.__cause__, OSError)
        assert trio.current_time() == 2
        assert broken.starts == [0], "start_child never restarts a child that was never ready"
        assert [s.worker for s in supervisor.which_children()] == ["steady"]
        assert supervisor.state("steady") is WorkerState.RUNNING
        assert supervisor.healthy.value
        assert not supervisor.shutdown.requested
        # The name is free again: a second try with a child that starts is added.
        await supervisor.start_child(Child(ready_after=1).spec("api"))
        assert trio.current_time() == 3
        assert counts(supervisor) == [2, 2, 0, 2]
        with pytest.raises(ValueError, match="already has a child named 'api'"):
            await supervisor.start_child(Child().spec("api"))
        nursery.cancel_scope.cancel()


async def test_start_child_of_a_permanent_child_returning_before_ready_raises(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A child returning before it is ready is a start error too, with no metric series left."""

    async def quits(*, task_status: trio.TaskStatus[None]) -> None:
        await trio.sleep(1)

    supervisor = Supervisor(name="app")
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        with pytest.raises(StartFailed, match="worker 'quits' failed to start: returned"):
            await supervisor.start_child(ChildSpec("quits", quits, start=True))
        assert supervisor.snapshot() == []
        sample = supervisor.registry.get_sample_value(
            "trio_supervise_worker_state", {"worker": "quits", "state": "stopped"}
        )
        assert sample is None
        nursery.cancel_scope.cancel()


async def test_start_child_of_a_nested_supervisor_failing_to_start_leaves_it_unattached(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A nested supervisor that fails to start is not adopted: it may be added again later."""
    db = Child(fail_before_ready=1, ready_after=1)
    inner = Supervisor(name="inner", children=[db.spec("db")])
    outer = Supervisor(name="outer")
    async with trio.open_nursery() as nursery:
        await nursery.start(outer.run)
        with pytest.raises(StartFailed, match="worker 'inner' failed to start"):
            await outer.start_child(inner)
        assert outer.snapshot() == []
        assert outer.healthy.value
        await outer.start_child(inner)  # db's second run is ready
        assert outer.states == {"inner": WorkerState.RUNNING, "inner/db": WorkerState.RUNNING}
        assert trio.current_time() == 2
        nursery.cancel_scope.cancel()


async def test_a_nested_supervisor_started_unhealthy_makes_its_parent_unhealthy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A worker that exits while its nested supervisor starts shows upstairs once it is added."""

    async def quits() -> None:
        await trio.sleep(0.5)

    inner = Supervisor(
        name="inner", children=[ChildSpec("quits", quits), Child(ready_after=1).spec("db")]
    )
    outer = Supervisor(name="outer")
    async with trio.open_nursery() as nursery:
        await nursery.start(outer.run)
        await outer.start_child(inner)
        assert outer.state("inner/quits") is WorkerState.FAILED
        assert not outer.healthy.value, "a dead worker anywhere makes the process unhealthy"
        nursery.cancel_scope.cancel()


# -- child administration (child_adm, extra_return, count_children) --------------------------------


async def test_terminate_restart_delete_and_count_children(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """OTP's child_adm: each operation's effect and each refusal, in one child's life."""
    child = Child(ready_after=0, drains_for=1)
    supervisor = Supervisor(name="app", children=[child.spec("child1", shutdown_grace=5)])
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        assert counts(supervisor) == [1, 1, 0, 1]
        assert supervisor.count_children() == ChildCounts(
            specs=1, active=1, supervisors=0, workers=1
        )

        for call in (supervisor.terminate_child, supervisor.restart_child):
            with pytest.raises(KeyError, match="no worker 'hej'"):
                await call("hej")
        with pytest.raises(KeyError, match="no worker 'hej'"):
            supervisor.delete_child("hej")
        with pytest.raises(ChildStateError, match="'child1' is running"):
            supervisor.delete_child("child1")
        with pytest.raises(ChildStateError, match="'child1' is running"):
            await supervisor.restart_child("child1")

        await supervisor.terminate_child("child1")  # its stop signal, then its 1 s drain
        assert child.stop_seen == [0]
        assert child.ends == [1]
        assert trio.current_time() == 1
        [row] = supervisor.which_children()
        assert (row.worker, row.state) == ("child1", WorkerState.STOPPED)
        assert counts(supervisor) == [1, 0, 0, 1]
        await supervisor.terminate_child("child1")  # terminating a terminated child is fine
        assert supervisor.healthy.value
        assert not supervisor.shutdown.requested

        await supervisor.restart_child("child1")
        assert child.starts == [0, 1]
        assert supervisor.state("child1") is WorkerState.RUNNING
        assert counts(supervisor) == [1, 1, 0, 1]

        await supervisor.terminate_child("child1")
        supervisor.delete_child("child1")
        assert supervisor.which_children() == []
        assert counts(supervisor) == [0, 0, 0, 0]
        with pytest.raises(KeyError, match="no worker 'child1'"):
            await supervisor.restart_child("child1")
        assert (
            supervisor.registry.get_sample_value(
                "trio_supervise_worker_state", {"worker": "child1", "state": "stopped"}
            )
            is None
        ), "a deleted child leaves no metric series behind"

        await supervisor.start_child(child.spec("child1"))
        assert counts(supervisor) == [1, 1, 0, 1]
        nursery.cancel_scope.cancel()


async def test_terminate_child_cancels_a_child_ignoring_its_stop_at_the_end_of_its_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """terminate_child gives the child exactly its grace, then cancels it; no restart follows."""
    ends: list[float] = []

    async def stubborn() -> None:
        try:
            await trio.sleep_forever()
        finally:
            ends.append(trio.current_time())

    supervisor = Supervisor(
        name="app",
        children=[ChildSpec("s", stubborn, restart=RestartPolicy(0, 0), shutdown_grace=3)],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep(2)
        await supervisor.terminate_child("s")
        assert ends == [5]
        await trio.sleep(10)
        assert supervisor.state("s") is WorkerState.STOPPED
        assert supervisor.snapshot()[0].restarts == 0
        nursery.cancel_scope.cancel()


async def test_terminate_child_drops_a_pending_restart_and_leaves_its_group_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Terminating a backing-off child drops its restart; terminating one restarts no sibling."""
    runs = 0

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        raise OSError("flaky")

    sibling = Child()
    policy = RestartPolicy(5, 5)
    supervisor = Supervisor(
        name="app",
        strategy=Strategy.ONE_FOR_ALL,
        children=[sibling.spec("sibling"), ChildSpec("flaky", flaky, restart=policy)],
        jitter=JITTER,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        assert supervisor.state("flaky") is WorkerState.BACKING_OFF
        await supervisor.terminate_child("flaky")
        await trio.sleep(20)
        assert runs == 1
        assert supervisor.state("flaky") is WorkerState.STOPPED
        # The group restart still ran for the sibling, which is running again.
        assert sibling.starts == [0, at(backoff(policy, "flaky", 1))]
        await supervisor.terminate_child("sibling")
        assert supervisor.state("flaky") is WorkerState.STOPPED, "no strategy on terminate"
        nursery.cancel_scope.cancel()


async def test_restart_child_that_fails_before_ready_raises_and_stays_terminated(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """restart_child reports the start error, and the child stays listed and stopped."""
    child = Child(fail_before_ready=0)
    supervisor = Supervisor(name="app", children=[child.spec("c")])
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.terminate_child("c")
        child.fail_before_ready = 2  # its second run fails before ready
        with pytest.raises(StartFailed, match="worker 'c' failed to start: failed"):
            await supervisor.restart_child("c")
        assert supervisor.state("c") is WorkerState.STOPPED
        assert supervisor.healthy.value
        nursery.cancel_scope.cancel()


async def test_child_management_reaches_into_nested_supervisors_by_path(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """terminate/restart/delete take a path; terminating a nested supervisor stops its subtree."""
    x, y = Child(drains_for=1), Child(drains_for=1)
    inner = Supervisor(name="inner", children=[x.spec("x"), y.spec("y")])
    outer = Supervisor(name="outer", children=[inner])
    async with trio.open_nursery() as nursery:
        await nursery.start(outer.run)
        await outer.terminate_child("inner/x")
        assert outer.state("inner/x") is WorkerState.STOPPED
        assert x.ends == [1]
        await outer.restart_child("inner/x")
        await outer.terminate_child("inner")  # y then x, one second each
        assert y.stop_seen == [1]
        assert x.stop_seen == [0, 2]
        assert trio.current_time() == 3
        assert outer.states == {
            "inner": WorkerState.STOPPED,
            "inner/x": WorkerState.STOPPED,
            "inner/y": WorkerState.STOPPED,
        }
        assert counts(outer) == [1, 0, 1, 0]
        await outer.restart_child("inner")
        assert outer.state("inner/y") is WorkerState.RUNNING
        await outer.terminate_child("inner")
        outer.delete_child("inner")
        assert outer.snapshot() == []
        assert inner.running is False
        nursery.cancel_scope.cancel()


async def test_child_management_refuses_a_supervisor_that_is_not_running() -> None:
    """restart_child and start_child need a running supervisor; the error says so."""
    supervisor = Supervisor(name="app", children=[ChildSpec("w", park)])
    with pytest.raises(RuntimeError, match="'app' is not running"):
        await supervisor.restart_child("w")
    with pytest.raises(TypeError, match="worker name must be a str"):
        supervisor.delete_child(3)  # type: ignore[arg-type]
    supervisor.delete_child("w")
    assert supervisor.children == ()
    with pytest.raises(TypeError, match="a child must be a ChildSpec or a Supervisor"):
        supervisor.add_child(park)  # type: ignore[arg-type]


async def test_child_management_refuses_a_supervisor_that_is_shutting_down(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Once shutdown has begun, start_child and restart_child are refused by name."""
    supervisor = Supervisor(name="app", children=[ChildSpec("w", park, shutdown_grace=5)])
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.terminate_child("w")
        supervisor.shutdown.begin("test")
        with pytest.raises(RuntimeError, match="'app' is shutting down; not adding 'x'"):
            await supervisor.start_child(ChildSpec("x", park))
        with pytest.raises(RuntimeError, match="'app' is shutting down; not restarting 'w'"):
            await supervisor.restart_child("w")


# -- shutdown order (sup_stop_timeout, sup_stop_infinity) ------------------------------------------


async def test_shutdown_stops_children_one_at_a_time_in_reverse_start_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Three children that each take 1 s to stop are asked to stop at 0, 1 and 2 s, c first."""
    a, b, c = Child(drains_for=1), Child(drains_for=1), Child(drains_for=1)
    supervisor = Supervisor(name="app", children=[a.spec("a"), b.spec("b"), c.spec("c")])
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        supervisor.shutdown.begin("test")
    assert (c.stop_seen, b.stop_seen, a.stop_seen) == ([0], [1], [2])
    assert (c.ends, b.ends, a.ends) == ([1], [2], [3])
    assert trio.current_time() == 3


async def test_parallel_shutdown_order_stops_every_child_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """ShutdownOrder.PARALLEL keeps the old drain: every child asked at once."""
    a, b, c = Child(drains_for=1), Child(drains_for=1), Child(drains_for=1)
    supervisor = Supervisor(
        name="app",
        children=[a.spec("a"), b.spec("b"), c.spec("c")],
        shutdown_order=ShutdownOrder.PARALLEL,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        supervisor.shutdown.begin("test")
    assert a.stop_seen == b.stop_seen == c.stop_seen == [0]
    assert trio.current_time() == 1


async def test_each_child_gets_its_own_grace_from_its_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A child ignoring its stop is cancelled when its grace, counted from its turn, ends."""
    ends: dict[str, float] = {}

    def stubborn(name: str) -> Callable[[], Awaitable[None]]:
        async def target() -> None:
            try:
                await trio.sleep_forever()
            finally:
                ends[name] = trio.current_time()

        return target

    supervisor = Supervisor(
        name="app",
        children=[
            ChildSpec("a", stubborn("a"), shutdown_grace=1),
            ChildSpec("b", stubborn("b"), shutdown_grace=2),
            ChildSpec("c", stubborn("c"), shutdown_grace=3),
            ChildSpec("forever", stubborn("forever"), shutdown_grace=0),
        ],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep(10)
        supervisor.shutdown.begin("test")
        await trio.sleep(4)
        # Every live child shows the drain at once; b is inside its grace, a waits its turn.
        assert supervisor.state("b") is WorkerState.STOPPING
        assert supervisor.state("a") is WorkerState.STOPPING
    assert ends == {"forever": 10, "c": 13, "b": 15, "a": 16}


async def test_a_nested_supervisor_stops_its_children_when_its_turn_comes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """outer[inner[x, y], z]: z stops first, then inner stops y, then x (sup_stop_infinity)."""
    x, y, z = Child(drains_for=1), Child(drains_for=1), Child(drains_for=1)
    inner = Supervisor(name="inner", children=[x.spec("x"), y.spec("y")])
    outer = Supervisor(name="outer", children=[inner, z.spec("z")])
    async with trio.open_nursery() as nursery:
        await nursery.start(outer.run)
        outer.shutdown.begin("test")
        assert inner.shutdown.requested, "the switch itself still reaches the whole tree"
    assert (z.stop_seen, y.stop_seen, x.stop_seen) == ([0], [1], [2])
    assert trio.current_time() == 3


@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 5), st.booleans()), min_size=1, max_size=6
    ),
    st.sampled_from(list(ShutdownOrder)),
)
def test_every_child_stops_within_its_grace_from_its_turn(
    children: list[tuple[int, int, bool]], order: ShutdownOrder
) -> None:
    """For any drains and graces: reverse order adds the stop times up, parallel takes the max.

    Each child (drain, grace, watches its stop) takes ``drain`` seconds once asked, or until
    its grace ends if it ignores its stop: ``min(drain, grace)`` or ``grace``.
    """
    took = [min(drain, grace) if watches else grace for drain, grace, watches in children]
    asked: dict[int, float] = {}

    def target(index: int, drain: int, watches: bool) -> Callable[..., Awaitable[None]]:
        async def run(*, stop: Shutdown) -> None:
            await stop.wait()
            asked[index] = trio.current_time()
            await trio.sleep(drain if watches else math.inf)

        return run

    async def main() -> float:
        supervisor = Supervisor(
            name="app",
            shutdown_order=order,
            children=[
                ChildSpec(f"c{i}", target(i, d, w), stop_signal=True, shutdown_grace=g)
                for i, (d, g, w) in enumerate(children)
            ],
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            supervisor.shutdown.begin("test")
        return trio.current_time()

    ended = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    if order is ShutdownOrder.PARALLEL:
        assert asked == dict.fromkeys(range(len(children)), 0)
        assert ended == max(took)
        return
    expected, turn = {}, 0.0
    for index in reversed(range(len(children))):
        expected[index] = turn
        turn += took[index]
    assert asked == expected
    assert ended == turn


def test_an_ordered_drain_records_the_same_states_on_every_run() -> None:
    """Children that drain on the shared switch end at once; their recorded states never vary.

    Regression: with states set at each child's turn, whether a child that had already finished
    draining showed ``stopping`` depended on which task Trio happened to run first.
    """

    def one_run() -> list[tuple[float, str, str]]:
        seen: list[tuple[float, str, str]] = []

        async def main() -> None:
            shutdown = Shutdown()

            async def drains() -> None:
                await shutdown.wait()
                await trio.sleep(1)

            names = ["a", "b", "c", "d"]
            supervisor = Supervisor(
                name="app", shutdown=shutdown, children=[ChildSpec(n, drains) for n in names]
            )
            with contextlib.ExitStack() as stack:
                for name in names:

                    def record(state: WorkerState, name: str = name) -> None:
                        seen.append((trio.current_time(), name, str(state)))

                    stack.enter_context(supervisor.watch(name).open_transform(record))
                async with trio.open_nursery() as nursery:
                    await nursery.start(supervisor.run)
                    shutdown.begin("test")

        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
        return sorted(seen)

    first = one_run()
    assert [entry for entry in first if entry[2] == "stopping"] == [
        (0, name, "stopping") for name in "abcd"
    ]
    for _ in range(20):
        assert one_run() == first


# -- restart intensity (one_for_one_escalation, one_for_all_escalation, multiple_restarts) ---------


async def test_restarts_past_the_intensity_stop_the_supervisor_and_fail_upward(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Two restarts allowed in 10 s: the third failure within them gives up, stopping the rest."""
    fails_at: list[float] = []

    async def flaky() -> None:
        fails_at.append(trio.current_time())
        await trio.sleep(1)
        raise OSError("flaky")

    bystander = Child(drains_for=0.5)
    policy = RestartPolicy(1, 1, jitter="none")
    supervisor = Supervisor(
        name="app",
        intensity=Intensity(max_restarts=2, period=10),
        children=[bystander.spec("bystander"), ChildSpec("flaky", flaky, restart=policy)],
    )
    with pytest.raises(WorkerFailed, match="failed workers \\['flaky'\\]"):
        await supervisor.run()
    assert fails_at == [0, 2, 4]  # runs of 1 s, restarts after 1 s: failures at 1, 3, 5
    assert bystander.stop_seen == [5]
    assert bystander.ends == [5.5]
    assert supervisor.state("flaky") is WorkerState.FAILED
    [record] = [r for r in caplog.records if "restart intensity" in r.getMessage()]
    assert record.getMessage() == (
        "worker 'flaky' failed (OSError: flaky); supervisor 'app' exceeded its restart intensity "
        "(3 restarts within 10 s, at most 2): shutting down"
    )
    assert record.child == "flaky"  # type: ignore[attr-defined]
    assert record.error == "OSError: flaky"  # type: ignore[attr-defined]


async def test_intensity_counts_restarts_over_all_children_in_a_sliding_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Restarts of different children add up; restarts older than the period no longer count."""
    policy = RestartPolicy(1, 1, jitter="none")
    runs: dict[str, int] = {"a": 0, "b": 0}

    def every(name: str, seconds: float) -> Callable[[], Awaitable[None]]:
        async def target() -> None:
            runs[name] += 1
            await trio.sleep(seconds)
            raise OSError(name)

        return target

    # a fails every 6 s of running (7 s per cycle): alone it never has two restarts in 5 s.
    steady = Supervisor(
        name="steady",
        intensity=Intensity(max_restarts=1, period=5),
        children=[ChildSpec("a", every("a", 6), restart=policy)],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(steady.run)
        await trio.sleep(60)
        assert runs["a"] == 9
        assert steady.healthy.value
        nursery.cancel_scope.cancel()

    # With b failing 2 s after start too, the restarts of a and b fall within 5 s: it gives up.
    start = trio.current_time()
    both = Supervisor(
        name="both",
        intensity=Intensity(max_restarts=1, period=5),
        children=[
            ChildSpec("a", every("a", 6), restart=policy, shutdown_grace=0),
            ChildSpec("b", every("b", 2), restart=policy, shutdown_grace=0),
        ],
    )
    with pytest.raises(WorkerFailed):
        await both.run()
    assert trio.current_time() - start == at(5)  # b fails at 2 (restart) and at 5 (one too many)


async def test_a_group_restart_counts_once_towards_the_intensity(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """one_for_all_escalation: a failure restarting three children is one restart, not three."""
    fails = 0

    async def flaky() -> None:
        nonlocal fails
        fails += 1
        if fails <= 2:
            await trio.sleep(1)
            raise OSError("flaky")
        await trio.sleep_forever()

    policy = RestartPolicy(1, 1, jitter="none")
    supervisor = Supervisor(
        name="app",
        strategy=Strategy.ONE_FOR_ALL,
        intensity=Intensity(max_restarts=1, period=10),
        children=[
            ChildSpec("a", park, restart=policy),
            ChildSpec("flaky", flaky, restart=policy),
            ChildSpec("c", park, restart=policy),
        ],
    )

    async def run_expecting_failure(*, task_status: trio.TaskStatus[None]) -> None:
        with pytest.raises(WorkerFailed, match="'flaky'"):
            await supervisor.run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        await nursery.start(run_expecting_failure)
        await trio.sleep(2.5)
        assert supervisor.healthy.value
        assert [s.restarts for s in supervisor.which_children()] == [1, 1, 1]
    # The second failure (at 3 s) is the second restart within 10 s: one too many.
    assert fails == 2
    assert supervisor.state("flaky") is WorkerState.FAILED
    # Then c and a, which ignore shutdown, are given their 5 s graces one after the other.
    assert trio.current_time() == at(13)


async def test_a_nested_supervisor_past_its_intensity_is_restarted_by_its_own_policy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The nested supervisor gives up, its parent restarts it afresh, and health stays true."""
    runs = 0

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs <= 2:
            raise OSError("flaky")
        await trio.sleep_forever()

    inner = Supervisor(
        name="inner",
        intensity=Intensity(max_restarts=0, period=5),
        restart=RestartPolicy(10, 10, jitter="none"),
        children=[ChildSpec("w", flaky, restart=RestartPolicy(1, 1, jitter="none"))],
    )
    outer = Supervisor(name="outer", children=[inner, ChildSpec("other", park)])
    async with trio.open_nursery() as nursery:
        await nursery.start(outer.run)
        await trio.sleep(1)
        assert outer.state("inner") is WorkerState.BACKING_OFF
        assert outer.healthy.value, "the parent decides, and it restarts the nested supervisor"
        # Run 2 of w fails at 10 s: the fresh inner supervisor gives up again; restarted at 20 s.
        await trio.sleep_until(25)
        assert runs == 3
        assert outer.states == {
            "inner": WorkerState.RUNNING,
            "inner/w": WorkerState.RUNNING,
            "other": WorkerState.RUNNING,
        }
        assert outer.snapshot()[0].restarts == 2
        assert inner.healthy.value
        assert outer.healthy.value
        assert not outer.shutdown.requested
        nursery.cancel_scope.cancel()


async def test_a_nested_supervisor_without_a_policy_past_its_intensity_fails_its_parent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Without a policy of its own, a nested supervisor that gives up fails upward (escalation)."""

    async def flaky() -> None:
        await trio.sleep(1)
        raise OSError("flaky")

    inner = Supervisor(
        name="inner",
        intensity=Intensity(max_restarts=1, period=60),
        children=[ChildSpec("w", flaky, restart=RestartPolicy(1, 1, jitter="none"))],
    )
    outer = Supervisor(name="outer", children=[inner, ChildSpec("other", park, shutdown_grace=1)])
    with pytest.raises(WorkerFailed, match="'inner'"):
        await outer.run()
    assert trio.current_time() == 4  # w fails at 1 and 3; other is given its 1 s grace
    assert outer.state("inner") is WorkerState.FAILED


def test_intensity_refuses_bad_arguments_naming_the_field() -> None:
    """Intensity takes an int >= 0 and a finite period > 0 (OTP's sup_flags checks)."""
    with pytest.raises(ValueError, match="max_restarts must be >= 0"):
        Intensity(max_restarts=-1, period=5)
    with pytest.raises(TypeError, match="max_restarts must be an int"):
        Intensity(max_restarts=math.inf, period=5)  # type: ignore[arg-type]
    for period in (0, math.inf):
        with pytest.raises(ValueError, match="period must be a finite number > 0"):
            Intensity(max_restarts=1, period=period)
    with pytest.raises(TypeError, match="intensity must be an Intensity"):
        Supervisor(name="app", intensity=(1, 5))  # type: ignore[arg-type]


# -- significant children (significant_temporary, _transient, _bystander, _escalation) -------------


async def test_a_significant_transient_child_finishing_shuts_its_supervisor_down_cleanly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """any_significant: the main task's return stops the others in order, and run returns."""
    helper = Child(drains_for=1)

    async def main_task() -> None:
        await trio.sleep(5)

    supervisor = Supervisor(
        name="app",
        auto_shutdown=AutoShutdown.ANY_SIGNIFICANT,
        children=[
            helper.spec("helper"),
            ChildSpec("main", main_task, restart_type="transient", significant=True),
        ],
    )
    await supervisor.run()
    assert helper.stop_seen == [5]
    assert helper.ends == [6]
    assert supervisor.healthy.value
    assert supervisor.shutdown.reason == "significant worker 'main' ended (any_significant)"
    assert supervisor.states == {"helper": WorkerState.STOPPED, "main": WorkerState.STOPPED}


async def test_a_significant_transient_child_that_raises_is_restarted_not_a_shutdown(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Only a normal end is significant: a transient child's failure is restarted as usual."""
    runs = 0

    async def main_task() -> None:
        nonlocal runs
        runs += 1
        await trio.sleep(1)
        if runs == 1:
            raise OSError("once")

    supervisor = Supervisor(
        name="app",
        auto_shutdown="any_significant",
        children=[
            ChildSpec(
                "main",
                main_task,
                restart_type="transient",
                significant=True,
                restart=RestartPolicy(2, 2, jitter="none"),
            )
        ],
    )
    await supervisor.run()
    assert runs == 2
    assert trio.current_time() == 4


async def test_a_significant_temporary_child_ends_its_supervisor_even_when_it_raises(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """OTP: a temporary significant child's end, normal or not, triggers the auto shutdown."""

    async def boom() -> None:
        await trio.sleep(2)
        raise OSError("boom")

    supervisor = Supervisor(
        name="app",
        auto_shutdown="any_significant",
        children=[
            ChildSpec("other", park, shutdown_grace=0),
            ChildSpec("job", boom, restart_type="temporary", significant=True),
        ],
    )
    await supervisor.run()
    assert trio.current_time() == 2
    assert supervisor.healthy.value


async def test_all_significant_waits_for_the_last_significant_child_and_ignores_bystanders(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """all_significant: a bystander's end and the first significant end change nothing."""

    def finishes_after(seconds: float) -> Callable[[], Awaitable[None]]:
        async def target() -> None:
            await trio.sleep(seconds)

        return target

    supervisor = Supervisor(
        name="app",
        auto_shutdown=AutoShutdown.ALL_SIGNIFICANT,
        children=[
            ChildSpec("bystander", finishes_after(1), restart_type="transient"),
            ChildSpec("a", finishes_after(2), restart_type="transient", significant=True),
            ChildSpec("b", finishes_after(7), restart_type="temporary", significant=True),
            ChildSpec("other", park, shutdown_grace=0),
        ],
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervisor.run)
        await trio.sleep(3)
        assert not supervisor.shutdown.requested
    assert trio.current_time() == 7
    assert supervisor.shutdown.reason == "significant worker 'b' ended (all_significant)"


async def test_a_terminated_significant_child_does_not_shut_its_supervisor_down(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Only a significant child ending by itself counts, not one the supervisor stopped."""
    supervisor = Supervisor(
        name="app",
        auto_shutdown="any_significant",
        children=[ChildSpec("main", park, restart_type="transient", significant=True)],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.terminate_child("main")
        assert not supervisor.shutdown.requested
        nursery.cancel_scope.cancel()


async def test_a_significant_nested_supervisor_shutting_down_escalates_the_auto_shutdown(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """significant_escalation: inner shuts down on its significant child; outer on inner."""

    async def finish() -> None:
        await trio.sleep(3)

    inner = Supervisor(
        name="inner",
        auto_shutdown="any_significant",
        restart_type="transient",
        significant=True,
        children=[ChildSpec("main", finish, restart_type="transient", significant=True)],
    )
    outer = Supervisor(
        name="outer",
        auto_shutdown="any_significant",
        children=[ChildSpec("other", park, shutdown_grace=0), inner],
    )
    await outer.run()
    assert trio.current_time() == 3
    assert outer.shutdown.reason == "significant worker 'inner' ended (any_significant)"
    assert outer.healthy.value


def test_significance_follows_otps_rules() -> None:
    """A permanent child cannot be significant; nor can any child under auto_shutdown='never'."""
    with pytest.raises(ValueError, match="significant must be False for a permanent child"):
        ChildSpec("main", park, significant=True)
    with pytest.raises(ValueError, match="significant must be False for a permanent child"):
        Supervisor(name="inner", significant=True)
    spec = ChildSpec("main", park, restart_type="transient", significant=True)
    with pytest.raises(ValueError, match="auto_shutdown='never', so its child 'main' cannot"):
        Supervisor(name="app", children=[spec])
    supervisor = Supervisor(name="app")
    with pytest.raises(ValueError, match="cannot be significant"):
        supervisor.add_child(spec)
    with pytest.raises(ValueError, match="auto_shutdown"):
        Supervisor(name="app", auto_shutdown="sometimes")
