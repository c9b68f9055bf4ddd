"""Supervisor: the seed's behaviour contract under virtual time, and the OTP extensions."""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Awaitable, Callable

import attrs
import prometheus_client
import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from trio_supervise import (
    ChildSpec,
    Jitter,
    RestartPolicy,
    RestartType,
    Shutdown,
    Strategy,
    Supervisor,
    WorkerFailed,
    WorkerState,
    WorkerStatus,
)

JITTER = Jitter(seed=20240601)


def at(seconds: float) -> object:
    """A virtual time, compared to within a nanosecond (the autojump clock adds float deltas)."""
    return pytest.approx(seconds, abs=1e-9)


def backoff(policy: RestartPolicy, key: str, attempt: int) -> float:
    """The jittered delay the supervisor will wait before restart *attempt* of *key*."""
    return policy.backoff(attempt, key=key, jitter=JITTER)


def restart_times(policy: RestartPolicy, key: str, runs: int) -> list[float]:
    """When each of *runs* runs of a child that fails at once starts (the first at 0)."""
    times = [0.0]
    for attempt in range(1, runs):
        times.append(times[-1] + backoff(policy, key, attempt))
    return times


@attrs.define
class Worker:
    """A scripted child: records when each run starts and ends, fails its first *fails* runs."""

    fails: int = 0
    runs_for: float = 0.0
    then: str = "park"  # after the failures: "park", "return" or "raise"
    starts: list[float] = attrs.field(factory=list)
    ends: list[float] = attrs.field(factory=list)

    async def __call__(self) -> None:
        self.starts.append(trio.current_time())
        try:
            await trio.sleep(self.runs_for)
            if len(self.starts) <= self.fails or self.then == "raise":
                raise RuntimeError("injected failure")
            if self.then == "return":
                return
            await trio.sleep_forever()
        finally:
            self.ends.append(trio.current_time())


@attrs.define
class Outcome:
    """How a supervisor's run ended."""

    error: WorkerFailed | None = None
    ended_at: float | None = None


async def supervise(
    supervisor: Supervisor,
    outcome: Outcome,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run *supervisor*, recording how and when it ended."""
    try:
        await supervisor.run(task_status=task_status)
    except WorkerFailed as exc:
        outcome.error = exc
    outcome.ended_at = trio.current_time()


def gauge(supervisor: Supervisor, worker: str, state: str) -> float | None:
    return supervisor.registry.get_sample_value(
        "trio_supervise_worker_state", {"worker": worker, "state": state}
    )


def restarts(supervisor: Supervisor, worker: str) -> float | None:
    return supervisor.registry.get_sample_value(
        "trio_supervise_worker_restarts_total", {"worker": worker}
    )


# -- the seed's tests ----------------------------------------------------------------------------


async def test_worker_error_marks_unhealthy_and_starts_shutdown(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A worker raising with no policy is failed, health goes false and shutdown begins."""

    async def err_worker() -> None:
        raise RuntimeError("worker blew up")

    supervisor = Supervisor(name="app", children=[ChildSpec("err-worker", err_worker)])
    with pytest.raises(WorkerFailed, match="err-worker"):
        await supervisor.run()

    assert not supervisor.healthy.value
    assert supervisor.failed
    assert supervisor.shutdown.requested
    assert supervisor.state("err-worker") is WorkerState.FAILED
    assert supervisor.snapshot()[0].last_error == "RuntimeError: worker blew up"
    assert trio.current_time() == 0


async def test_worker_crash_in_its_own_nursery_marks_unhealthy_and_starts_shutdown(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A crash deep in a worker's own tasks (the seed's panic) is a failure like any other."""

    async def crash() -> None:
        await trio.sleep(2)
        raise ZeroDivisionError("worker panicked on purpose")

    async def panicking_worker() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(crash)
            await trio.sleep_forever()

    supervisor = Supervisor(name="app", children=[ChildSpec("panicking-worker", panicking_worker)])
    with pytest.raises(WorkerFailed):
        await supervisor.run()

    assert not supervisor.healthy.value
    assert supervisor.shutdown.requested
    assert supervisor.state("panicking-worker") is WorkerState.FAILED
    assert "ZeroDivisionError" in (supervisor.snapshot()[0].last_error or "")
    assert trio.current_time() == 2


async def test_unexpected_exit_marks_unhealthy_without_shutdown(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A worker returning with no policy is failed and unhealthy, and the others keep running."""
    ok_worker = Worker(then="return", runs_for=1)
    steady = Worker()
    supervisor = Supervisor(
        name="app",
        children=[ChildSpec("ok-worker", ok_worker), ChildSpec("steady", steady, shutdown_grace=0)],
    )
    outcome = Outcome()
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, supervisor, outcome)
        await supervisor.watch("ok-worker").wait_value(WorkerState.FAILED)
        assert trio.current_time() == 1

        assert not supervisor.healthy.value
        assert not supervisor.shutdown.requested
        await trio.sleep(10)
        assert supervisor.state("steady") is WorkerState.RUNNING
        assert steady.ends == []
        supervisor.shutdown.begin("test over")

    assert isinstance(outcome.error, WorkerFailed)
    assert outcome.ended_at == 11
    assert supervisor.state("ok-worker") is WorkerState.FAILED
    assert supervisor.state("steady") is WorkerState.STOPPED


async def test_a_worker_ending_during_shutdown_leaves_health_alone(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker that fails because shutdown began is logged at debug and nothing else happens.

    The seed leaves the state at running because it has no better word; ours is ``stopped``.
    """
    shutdown = Shutdown()

    async def shutdown_worker() -> None:
        await shutdown.wait()
        raise ConnectionError("connection closed under us")

    supervisor = Supervisor(
        name="app", children=[ChildSpec("shutdown-worker", shutdown_worker)], shutdown=shutdown
    )
    outcome = Outcome()
    caplog.set_level(logging.DEBUG, logger="trio_supervise")
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, supervisor, outcome)
        await trio.sleep(3)
        shutdown.begin("deploy")

    assert supervisor.healthy.value
    assert outcome.error is None
    assert outcome.ended_at == 3
    assert supervisor.state("shutdown-worker") is WorkerState.STOPPED
    [record] = [r for r in caplog.records if getattr(r, "child", None) == "shutdown-worker"]
    assert record.levelno == logging.DEBUG
    assert record.outcome == "raised ConnectionError: connection closed under us"  # type: ignore[attr-defined]


async def test_restart_policy_survives_injected_failures(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A flaky worker is restarted after the jittered backoffs and then stays running."""
    policy = RestartPolicy(1, 4)
    flaky = Worker(fails=2)
    supervisor = Supervisor(
        name="app", children=[ChildSpec("flaky-worker", flaky, restart=policy)], jitter=JITTER
    )
    expected = restart_times(policy, "flaky-worker", 3)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep(expected[1] / 2)
        assert supervisor.state("flaky-worker") is WorkerState.BACKING_OFF
        assert supervisor.healthy.value, "backing off must not flip health"
        await trio.sleep_until(expected[2] + 100)

        assert flaky.starts == [at(t) for t in expected]
        assert supervisor.state("flaky-worker") is WorkerState.RUNNING
        assert supervisor.healthy.value
        assert not supervisor.shutdown.requested
        assert restarts(supervisor, "flaky-worker") == 2
        nursery.cancel_scope.cancel()


async def test_exhausted_restart_policy_escalates(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Past max_restarts consecutive restarts the worker takes the loud path."""
    policy = RestartPolicy(1, 2, max_restarts=2)
    doomed = Worker(then="raise")
    supervisor = Supervisor(
        name="app", children=[ChildSpec("doomed-worker", doomed, restart=policy)], jitter=JITTER
    )
    with pytest.raises(WorkerFailed):
        await supervisor.run()

    expected = restart_times(policy, "doomed-worker", 3)
    assert doomed.starts == [at(t) for t in expected]
    assert trio.current_time() == at(expected[-1])
    assert not supervisor.healthy.value
    assert supervisor.shutdown.requested
    assert supervisor.state("doomed-worker") is WorkerState.FAILED
    assert restarts(supervisor, "doomed-worker") == 2


# -- restart policy details ----------------------------------------------------------------------


async def test_a_run_lasting_the_cap_resets_the_restart_count(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A worker that fails only after running the cap never exhausts a bound of one restart."""
    policy = RestartPolicy(1, 4, max_restarts=1)
    slow = Worker(then="raise", runs_for=policy.cap)
    supervisor = Supervisor(
        name="app", children=[ChildSpec("slow", slow, restart=policy)], jitter=JITTER
    )
    first = backoff(policy, "slow", 1)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep(4 * (policy.cap + first) + 1)
        expected = list(itertools.accumulate([0.0] + [policy.cap + first] * 4))
        assert slow.starts == [at(t) for t in expected]
        assert supervisor.healthy.value
        assert supervisor.state("slow") is WorkerState.RUNNING
        nursery.cancel_scope.cancel()


async def test_a_permanent_worker_that_returns_is_restarted_under_a_policy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A return is an exit, so a permanent worker with a policy is restarted after it too."""
    policy = RestartPolicy(1, 8)
    quitter = Worker(then="return", runs_for=0)
    supervisor = Supervisor(
        name="app", children=[ChildSpec("quitter", quitter, restart=policy)], jitter=JITTER
    )
    expected = restart_times(policy, "quitter", 3)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep_until(expected[2] + 0.001)
        assert quitter.starts == [at(t) for t in expected]
        assert supervisor.healthy.value
        nursery.cancel_scope.cancel()


async def test_shutdown_during_a_backoff_stops_the_worker_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A worker backing off when shutdown begins is stopped then, not restarted."""
    policy = RestartPolicy(10, 10)
    flaky = Worker(fails=1)
    supervisor = Supervisor(
        name="app", children=[ChildSpec("flaky", flaky, restart=policy)], jitter=JITTER
    )
    outcome = Outcome()
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, supervisor, outcome)
        await trio.sleep(2)
        assert supervisor.state("flaky") is WorkerState.BACKING_OFF
        supervisor.shutdown.begin()

    assert outcome.ended_at == 2
    assert outcome.error is None
    assert flaky.starts == [0]
    assert supervisor.state("flaky") is WorkerState.STOPPED
    assert supervisor.healthy.value


async def test_restart_logs_say_what_happened_and_carry_structured_fields(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The restart record's message tells the story; worker, attempt, backoff_s, error go along."""
    policy = RestartPolicy(1, 4)
    supervisor = Supervisor(
        name="app",
        children=[ChildSpec("flaky", Worker(fails=1), restart=policy)],
        jitter=JITTER,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep(10)
        nursery.cancel_scope.cancel()

    delay = backoff(policy, "flaky", 1)
    [record] = [r for r in caplog.records if "restart 1 of 10" in r.getMessage()]
    assert record.getMessage() == (
        f"worker 'flaky' failed (RuntimeError: injected failure); restart 1 of 10 in {delay:.3g} s"
    )
    assert record.levelno == logging.WARNING
    assert record.child == "flaky"  # type: ignore[attr-defined]
    assert not hasattr(record, "worker")  # one meaning: a runner's worker id, never a child
    assert record.attempt == 1  # type: ignore[attr-defined]
    assert record.backoff_s == delay  # type: ignore[attr-defined]
    assert record.error == "RuntimeError: injected failure"  # type: ignore[attr-defined]
    assert record.outcome == "raised RuntimeError: injected failure"  # type: ignore[attr-defined]
    for supervisor_record in caplog.records:
        if supervisor_record.name == "trio_supervise.supervisor":
            for field in ("supervisor", "child", "attempt", "backoff_s", "error"):
                assert hasattr(supervisor_record, field), (supervisor_record.getMessage(), field)


# -- restart types -------------------------------------------------------------------------------


async def test_a_transient_worker_that_returns_is_stopped_not_restarted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A transient worker's normal return ends it cleanly, even with a policy."""
    backfill = Worker(then="return", runs_for=3)
    supervisor = Supervisor(
        name="app",
        children=[
            ChildSpec(
                "backfill",
                backfill,
                restart=RestartPolicy(1, 2),
                restart_type=RestartType.TRANSIENT,
            )
        ],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep(100)
        assert backfill.starts == [0]
        assert supervisor.state("backfill") is WorkerState.STOPPED
        assert supervisor.healthy.value
        assert not supervisor.shutdown.requested
        supervisor.shutdown.begin()


async def test_a_transient_worker_that_raises_is_restarted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A transient worker's exception is a failure, restarted per its policy."""
    policy = RestartPolicy(1, 2)
    backfill = Worker(fails=1, then="return")
    supervisor = Supervisor(
        name="app",
        children=[ChildSpec("backfill", backfill, restart=policy, restart_type="transient")],
        jitter=JITTER,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep(100)
        assert backfill.starts == [at(t) for t in restart_times(policy, "backfill", 2)]
        assert supervisor.state("backfill") is WorkerState.STOPPED
        assert supervisor.healthy.value
        supervisor.shutdown.begin()


async def test_a_transient_worker_that_raises_without_a_policy_fails_loudly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Without a policy, a transient worker's exception takes the loud path."""
    supervisor = Supervisor(
        name="app",
        children=[ChildSpec("t", Worker(then="raise"), restart_type=RestartType.TRANSIENT)],
    )
    with pytest.raises(WorkerFailed):
        await supervisor.run()
    assert supervisor.state("t") is WorkerState.FAILED
    assert supervisor.shutdown.requested


@pytest.mark.parametrize("then", ["raise", "return"])
async def test_a_temporary_worker_is_recorded_but_never_escalates(
    autojump_clock: trio.testing.MockClock, then: str
) -> None:
    """A temporary worker's end, failure or not, is recorded and leaves health and shutdown be."""
    one_shot = Worker(then=then, runs_for=2)
    supervisor = Supervisor(
        name="app",
        children=[ChildSpec("one-shot", one_shot, restart_type=RestartType.TEMPORARY)],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep(100)
        assert one_shot.starts == [0]
        assert supervisor.state("one-shot") is WorkerState.STOPPED
        assert supervisor.healthy.value
        assert not supervisor.shutdown.requested
        expected_error = "RuntimeError: injected failure" if then == "raise" else None
        assert supervisor.snapshot()[0].last_error == expected_error
        supervisor.shutdown.begin()


# -- strategies ----------------------------------------------------------------------------------


def three_children(
    strategy: Strategy, policy: RestartPolicy
) -> tuple[Supervisor, Worker, Worker, Worker]:
    first, middle, last = Worker(), Worker(fails=1, runs_for=1), Worker()
    supervisor = Supervisor(
        name="app",
        strategy=strategy,
        children=[
            ChildSpec("first", first, restart=policy),
            ChildSpec("middle", middle, restart=policy),
            ChildSpec("last", last, restart=policy),
        ],
        jitter=JITTER,
    )
    return supervisor, first, middle, last


@pytest.mark.parametrize(
    ("strategy", "first_restarted", "last_restarted"),
    [
        (Strategy.ONE_FOR_ONE, False, False),
        (Strategy.ONE_FOR_ALL, True, True),
        (Strategy.REST_FOR_ONE, False, True),
    ],
)
async def test_each_strategy_restarts_its_group(
    autojump_clock: trio.testing.MockClock,
    strategy: Strategy,
    first_restarted: bool,
    last_restarted: bool,
) -> None:
    """When the middle child fails, each strategy restarts exactly its OTP group, together."""
    policy = RestartPolicy(2, 8)
    supervisor, first, middle, last = three_children(strategy, policy)
    restart_at = 1 + backoff(policy, "middle", 1)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep(1.5)
        for name, worker, in_group in [
            ("first", first, first_restarted),
            ("last", last, last_restarted),
        ]:
            expected = WorkerState.BACKING_OFF if in_group else WorkerState.RUNNING
            assert supervisor.state(name) is expected
            assert worker.ends == ([1] if in_group else [])
        await trio.sleep_until(restart_at + 10)

        assert middle.starts == [0, at(restart_at)]
        assert first.starts == ([0, at(restart_at)] if first_restarted else [0])
        assert last.starts == ([0, at(restart_at)] if last_restarted else [0])
        assert all(state is WorkerState.RUNNING for state in supervisor.states.values())
        assert restarts(supervisor, "middle") == 1
        assert restarts(supervisor, "first") == int(first_restarted)
        assert restarts(supervisor, "last") == int(last_restarted)
        assert supervisor.healthy.value
        nursery.cancel_scope.cancel()


async def test_rest_for_one_merges_a_pending_restart_into_an_earlier_childs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A group still backing off joins the group of an earlier child that fails, restarting once."""
    quick, slow = RestartPolicy(1, 1), RestartPolicy(10, 10)
    first = Worker(fails=1, runs_for=2)
    middle = Worker(fails=1, runs_for=1)
    last = Worker()
    supervisor = Supervisor(
        name="app",
        strategy=Strategy.REST_FOR_ONE,
        children=[
            ChildSpec("first", first, restart=quick),
            ChildSpec("middle", middle, restart=slow),
            ChildSpec("last", last, restart=slow),
        ],
        jitter=JITTER,
    )
    merged_at = 2 + backoff(quick, "first", 1)
    assert merged_at < 1 + backoff(slow, "middle", 1)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep(1.5)
        assert supervisor.state("last") is WorkerState.BACKING_OFF
        assert supervisor.state("first") is WorkerState.RUNNING
        await trio.sleep(60)

        assert first.starts == [0, at(merged_at)]
        assert middle.starts == [0, at(merged_at)]
        assert last.starts == [0, at(merged_at)]
        assert last.ends == [1]
        assert [restarts(supervisor, name) for name in ("first", "middle", "last")] == [1, 1, 1]
        nursery.cancel_scope.cancel()


async def test_a_group_member_failing_before_readiness_restarts_the_group_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A child that fails while its group is being relaunched starts a fresh group restart."""
    policy = RestartPolicy(1, 1)
    runs: list[float] = []

    async def api(*, task_status: trio.TaskStatus[None]) -> None:
        runs.append(trio.current_time())
        if len(runs) == 1:
            task_status.started()
            await trio.sleep(1)
            raise OSError("listener died")
        if len(runs) == 2:
            raise OSError("port still in use")
        task_status.started()
        await trio.sleep_forever()

    sidecar = Worker()
    supervisor = Supervisor(
        name="app",
        strategy=Strategy.ONE_FOR_ALL,
        children=[
            ChildSpec("api", api, start=True, restart=policy),
            ChildSpec("sidecar", sidecar, restart=policy),
        ],
        jitter=JITTER,
    )
    second = 1 + backoff(policy, "api", 1)
    third = second + backoff(policy, "api", 2)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep(30)
        assert runs == [0, at(second), at(third)]
        assert sidecar.starts == [0, at(third)]
        assert supervisor.states == {"api": WorkerState.RUNNING, "sidecar": WorkerState.RUNNING}
        assert supervisor.healthy.value
        nursery.cancel_scope.cancel()


async def test_one_for_all_stops_a_temporary_sibling_for_good(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A temporary sibling is stopped with its group and, as in OTP, not restarted."""
    policy = RestartPolicy(1, 1)
    helper = Worker()
    supervisor = Supervisor(
        name="app",
        strategy=Strategy.ONE_FOR_ALL,
        children=[
            ChildSpec("helper", helper, restart_type=RestartType.TEMPORARY),
            ChildSpec("flaky", Worker(fails=1, runs_for=3), restart=policy),
        ],
        jitter=JITTER,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep(10)
        assert helper.starts == [0]
        assert helper.ends == [3]
        assert supervisor.state("helper") is WorkerState.STOPPED
        assert supervisor.state("flaky") is WorkerState.RUNNING
        nursery.cancel_scope.cancel()


async def test_one_for_all_restarts_a_nested_supervisor_with_its_siblings(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A nested supervisor in a one_for_all group is cancelled and run again from scratch."""
    policy = RestartPolicy(1, 4)
    inner_worker = Worker()
    inner = Supervisor(name="inner", children=[ChildSpec("w", inner_worker)])
    supervisor = Supervisor(
        name="outer",
        strategy="one_for_all",
        children=[inner, ChildSpec("flaky", Worker(fails=1, runs_for=2), restart=policy)],
        jitter=JITTER,
    )
    restart_at = 2 + backoff(policy, "flaky", 1)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep_until(restart_at + 1)
        assert inner_worker.starts == [0, at(restart_at)]
        assert inner_worker.ends == [2]
        assert supervisor.states == {
            "inner": WorkerState.RUNNING,
            "inner/w": WorkerState.RUNNING,
            "flaky": WorkerState.RUNNING,
        }
        assert restarts(supervisor, "inner") == 1
        nursery.cancel_scope.cancel()


# -- nesting -------------------------------------------------------------------------------------


async def test_an_exhausted_child_supervisor_fails_upward(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A nested supervisor that exhausts a policy fails, and its parent takes the loud path."""
    policy = RestartPolicy(1, 2, max_restarts=1)
    doomed = Worker(then="raise")
    steady = Worker()
    inner = Supervisor(name="inner", children=[ChildSpec("doomed", doomed, restart=policy)])
    outer = Supervisor(
        name="outer",
        children=[inner, ChildSpec("steady", steady, shutdown_grace=1)],
        jitter=JITTER,
    )
    with pytest.raises(WorkerFailed, match="inner"):
        await outer.run()

    expected = restart_times(policy, "inner/doomed", 2)
    assert doomed.starts == [at(t) for t in expected]
    assert steady.ends == [at(expected[-1] + 1)]
    assert outer.states == {
        "inner": WorkerState.FAILED,
        "inner/doomed": WorkerState.FAILED,
        "steady": WorkerState.STOPPED,
    }
    assert not inner.healthy.value
    assert not outer.healthy.value
    assert outer.shutdown.reason == "worker 'inner' failed"
    assert inner.shutdown.reason == "worker 'inner/doomed' failed"


async def test_a_nested_supervisor_shares_shutdown_health_and_metrics_with_its_parent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The parent's shutdown reaches nested workers, whose states and health show upstairs."""
    quitter = Worker(then="return", runs_for=1)
    inner = Supervisor(
        name="inner",
        children=[ChildSpec("quitter", quitter), ChildSpec("w", Worker(), shutdown_grace=2)],
    )
    registry = CollectorRegistry()
    outer = Supervisor(name="outer", children=[inner], registry=registry)
    outcome = Outcome()
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, outer, outcome)
        await trio.sleep(5)
        assert not inner.healthy.value
        assert not outer.healthy.value, "a dead worker anywhere makes the process unhealthy"
        assert not outer.shutdown.requested
        assert gauge(outer, "inner/quitter", "failed") == 1
        assert gauge(outer, "inner/w", "running") == 1
        assert [s.worker for s in outer.snapshot()] == ["inner", "inner/quitter", "inner/w"]
        outer.shutdown.begin("deploy")
        assert inner.shutdown.requested

    assert outcome.ended_at == 7
    assert isinstance(outcome.error, WorkerFailed)
    assert outer.state("inner/w") is WorkerState.STOPPED
    assert outer.watch("inner/w") is inner.watch("w")


def test_a_supervisor_cannot_have_two_parents_or_itself_as_a_child() -> None:
    """Adopting an already adopted supervisor, or an ancestor, is refused."""
    inner = Supervisor(name="inner")
    outer = Supervisor(name="outer", children=[inner])
    with pytest.raises(ValueError, match="already has a parent"):
        Supervisor(name="other", children=[inner])
    with pytest.raises(ValueError, match="cannot supervise itself"):
        inner.add_child(outer)


# -- dynamic children ----------------------------------------------------------------------------


async def test_a_child_added_while_running_is_launched_and_supervised(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """add_child on a running supervisor launches the child, restarts included."""
    policy = RestartPolicy(1, 4)
    late = Worker(fails=1)
    supervisor = Supervisor(name="app", children=[ChildSpec("steady", Worker())], jitter=JITTER)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep(10)
        supervisor.add_child(ChildSpec("late", late, restart=policy))
        await trio.sleep(50)
        assert late.starts == [10, at(10 + backoff(policy, "late", 1))]
        assert supervisor.state("late") is WorkerState.RUNNING
        assert [s.name for s in supervisor.children] == ["steady", "late"]
        with pytest.raises(ValueError, match="already has a child named 'late'"):
            supervisor.add_child(ChildSpec("late", late))
        supervisor.shutdown.begin()
        with pytest.raises(RuntimeError, match="shutting down"):
            supervisor.add_child(ChildSpec("too-late", late))


async def test_a_child_added_before_run_starts_with_the_others(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """add_child before run queues the child, started in order when run begins."""
    early, added = Worker(), Worker()
    supervisor = Supervisor(name="app", children=[ChildSpec("early", early)])
    supervisor.add_child(ChildSpec("added", added))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        assert supervisor.states == {"early": WorkerState.RUNNING, "added": WorkerState.RUNNING}
        nursery.cancel_scope.cancel()


async def test_start_child_returns_once_the_child_is_ready(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """start_child waits for a start=True child to report readiness."""

    async def slow_start(*, task_status: trio.TaskStatus[None]) -> None:
        await trio.sleep(2)
        task_status.started()
        await trio.sleep_forever()

    supervisor = Supervisor(name="app")
    with pytest.raises(RuntimeError, match="not running"):
        await supervisor.start_child(ChildSpec("x", slow_start, start=True))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await trio.sleep(1)
        await supervisor.start_child(ChildSpec("slow", slow_start, start=True))
        assert trio.current_time() == 3
        assert supervisor.state("slow") is WorkerState.RUNNING
        nursery.cancel_scope.cancel()


async def test_readiness_waits_for_every_initial_child(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """run reports started only once every start=True child has, and they start in order."""
    ready_at: list[float] = []

    def ready_after(seconds: float) -> Callable[..., Awaitable[None]]:
        async def target(*, task_status: trio.TaskStatus[None]) -> None:
            await trio.sleep(seconds)
            ready_at.append(trio.current_time())
            task_status.started()
            await trio.sleep_forever()

        return target

    supervisor = Supervisor(
        name="app",
        children=[
            ChildSpec("db", ready_after(2), start=True),
            ChildSpec("api", ready_after(3), start=True),
        ],
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervisor.run)
        await trio.sleep(1)
        assert supervisor.state("db") is WorkerState.STARTING
        assert supervisor.state("api") is WorkerState.STARTING
        nursery.cancel_scope.cancel()

    supervisor = Supervisor(
        name="app2",
        children=[
            ChildSpec("db", ready_after(2), start=True),
            ChildSpec("api", ready_after(3), start=True),
        ],
    )
    ready_at.clear()
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(supervisor.run)
        assert trio.current_time() - start == 5
        assert [t - start for t in ready_at] == [2, 5]
        nursery.cancel_scope.cancel()


async def test_a_child_failing_before_it_is_ready_is_a_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A start=True child that raises before readiness fails like any other, and run still ends."""

    async def broken(*, task_status: trio.TaskStatus[None]) -> None:
        await trio.sleep(1)
        raise OSError("port in use")

    supervisor = Supervisor(name="app", children=[ChildSpec("api", broken, start=True)])
    with pytest.raises(WorkerFailed):
        await supervisor.run()
    assert supervisor.state("api") is WorkerState.FAILED
    assert trio.current_time() == 1


# -- graceful shutdown ---------------------------------------------------------------------------


async def test_shutdown_grace_cancels_exactly_at_the_end_of_the_grace_period(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A child watching shutdown finishes in its own time; one ignoring it is cancelled at grace."""
    shutdown = Shutdown()
    polite_done: list[float] = []

    async def polite() -> None:
        await shutdown.wait()
        await trio.sleep(1)  # flush what it holds
        polite_done.append(trio.current_time())

    stubborn = Worker()
    supervisor = Supervisor(
        name="app",
        shutdown=shutdown,
        children=[
            ChildSpec("polite", polite, shutdown_grace=10),
            ChildSpec("stubborn", stubborn, shutdown_grace=3),
            ChildSpec("instant", Worker(), shutdown_grace=0),
        ],
    )
    outcome = Outcome()
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, supervisor, outcome)
        await trio.sleep(5)
        shutdown.begin("SIGTERM")
        await trio.sleep(0.5)
        assert supervisor.state("stubborn") is WorkerState.STOPPING
        assert supervisor.state("instant") is WorkerState.STOPPED

    assert polite_done == [6]
    assert stubborn.ends == [8]
    assert outcome.ended_at == 8
    assert outcome.error is None
    assert set(supervisor.states.values()) == {WorkerState.STOPPED}


async def test_a_supervisor_whose_shutdown_already_began_starts_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """run with shutdown already begun returns at once, every child stopped, none started."""
    worker = Worker()
    shutdown = Shutdown()
    shutdown.begin()
    supervisor = Supervisor(name="app", children=[ChildSpec("w", worker)], shutdown=shutdown)
    await supervisor.run()
    assert worker.starts == []
    assert supervisor.state("w") is WorkerState.STOPPED


# -- what is never swallowed ---------------------------------------------------------------------


async def test_cancellation_propagates_out_of_a_supervisor_unchanged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A supervisor cancelled from outside raises Cancelled, and learns nothing about children."""
    worker = Worker()
    inner = Supervisor(name="inner", children=[ChildSpec("deep", Worker())])
    supervisor = Supervisor(name="app", children=[ChildSpec("w", worker), inner])
    raised: list[BaseException] = []
    with trio.move_on_after(5) as scope:
        try:
            await supervisor.run()
        except BaseException as exc:
            raised.append(exc)
            raise
    assert scope.cancelled_caught
    assert [type(exc) for exc in raised] == [trio.Cancelled]
    assert worker.ends == [5]
    assert supervisor.healthy.value
    assert not supervisor.shutdown.requested
    assert set(supervisor.states.values()) == {WorkerState.STOPPED}
    assert not supervisor.running


@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit])
async def test_keyboard_interrupt_and_system_exit_propagate_unchanged(
    autojump_clock: trio.testing.MockClock, kind: type[BaseException]
) -> None:
    """KeyboardInterrupt or SystemExit from a (nested) child leaves the supervisor as itself."""

    async def interrupted() -> None:
        await trio.sleep(2)
        raise kind()

    inner = Supervisor(
        name="inner", children=[ChildSpec("i", interrupted, restart=RestartPolicy(1, 1))]
    )
    steady = Worker()
    supervisor = Supervisor(name="app", children=[inner, ChildSpec("steady", steady)])
    with pytest.raises(kind):
        await supervisor.run()
    assert steady.ends == [2]
    assert supervisor.healthy.value
    assert inner.state("i") is WorkerState.STOPPED


# -- metrics -------------------------------------------------------------------------------------


async def test_state_gauge_and_restart_counter_follow_the_worker(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The gauge is 1 for the current state only, and the counter counts restarts."""
    policy = RestartPolicy(4, 4)
    registry = CollectorRegistry()
    supervisor = Supervisor(
        name="app",
        children=[ChildSpec("w", Worker(fails=1), restart=policy)],
        registry=registry,
        jitter=JITTER,
    )
    assert supervisor.registry is registry
    assert gauge(supervisor, "w", "starting") == 1
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        assert {state.value: gauge(supervisor, "w", state.value) for state in WorkerState} == {
            "starting": 0,
            "running": 0,
            "backing-off": 1,
            "stopping": 0,
            "stopped": 0,
            "failed": 0,
        }
        assert restarts(supervisor, "w") == 0
        await trio.sleep(10)
        assert gauge(supervisor, "w", "running") == 1
        assert gauge(supervisor, "w", "backing-off") == 0
        assert restarts(supervisor, "w") == 1
        nursery.cancel_scope.cancel()


def test_metrics_never_touch_the_global_registry_and_refuse_a_second_root() -> None:
    """Each supervisor gets a private registry by default; one registry takes one root."""
    first = Supervisor(name="a", children=[ChildSpec("w", Worker())])
    second = Supervisor(name="b", children=[ChildSpec("w", Worker())])
    assert first.registry is not second.registry
    assert first.registry is not prometheus_client.REGISTRY
    assert (
        prometheus_client.REGISTRY.get_sample_value(
            "trio_supervise_worker_state", {"worker": "w", "state": "starting"}
        )
        is None
    )
    with pytest.raises(ValueError, match="root supervisor only"):
        Supervisor(name="c", registry=first.registry)


# -- construction --------------------------------------------------------------------------------


async def _noop() -> None:
    pass


@pytest.mark.parametrize(
    ("kwargs", "error", "field"),
    [
        ({"name": ""}, ValueError, "name"),
        ({"name": "a/b"}, ValueError, "name"),
        ({"name": 3}, TypeError, "name"),
        ({"target": "not callable"}, TypeError, "target"),
        ({"restart": (1, 2)}, TypeError, "restart"),
        ({"shutdown_grace": -1}, ValueError, "shutdown_grace"),
        ({"shutdown_grace": math.nan}, ValueError, "shutdown_grace"),
        ({"shutdown_grace": "5"}, TypeError, "shutdown_grace"),
        (
            {"restart_type": RestartType.TEMPORARY, "restart": RestartPolicy(1, 2)},
            ValueError,
            "restart",
        ),
        ({"restart_type": "sometimes"}, ValueError, "RestartType"),
        ({"restart_type": "sometimes"}, ValueError, "restart_type must be a RestartType"),
        ({"stop_signal": "yes"}, TypeError, "stop_signal must be a bool"),
        ({"significant": 1}, TypeError, "significant must be a bool"),
        ({"significant": True}, ValueError, "significant must be False for a permanent child"),
    ],
)
def test_child_spec_refuses_bad_arguments_naming_the_field(
    kwargs: dict[str, object], error: type[Exception], field: str
) -> None:
    """A bad ChildSpec argument raises at construction, naming the field."""
    arguments: dict[str, object] = {"name": "w", "target": _noop, **kwargs}
    with pytest.raises(error, match=field):
        ChildSpec(**arguments)  # type: ignore[arg-type]


def test_supervisor_refuses_bad_arguments_naming_the_field() -> None:
    """Bad Supervisor arguments raise at construction, naming what is wrong."""
    with pytest.raises(ValueError, match="name"):
        Supervisor(name="")
    with pytest.raises(ValueError, match="already has a child named 'w'"):
        Supervisor(name="s", children=[ChildSpec("w", _noop), ChildSpec("w", _noop)])
    with pytest.raises(TypeError, match="ChildSpec or a Supervisor"):
        Supervisor(name="s", children=[_noop])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="Strategy"):
        Supervisor(name="s", strategy="one_for_some")
    with pytest.raises(TypeError, match="jitter"):
        Supervisor(name="s", jitter=42)  # type: ignore[arg-type]


async def test_run_twice_at_once_is_refused(autojump_clock: trio.testing.MockClock) -> None:
    """A supervisor runs once at a time."""
    supervisor = Supervisor(name="app", children=[ChildSpec("w", Worker())])
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        assert supervisor.running
        with pytest.raises(RuntimeError, match="already running"):
            await supervisor.run()
        nursery.cancel_scope.cancel()


def test_lookups_of_unknown_workers_name_the_path() -> None:
    """state, watch and nested paths raise KeyError naming the missing worker."""
    inner = Supervisor(name="inner", children=[ChildSpec("w", _noop)])
    outer = Supervisor(name="outer", children=[inner, ChildSpec("x", _noop)])
    assert outer.state("inner/w") is WorkerState.STARTING
    for path in ["nope", "inner/nope", "x/w"]:
        with pytest.raises(KeyError, match=path):
            outer.state(path)
    assert outer.snapshot()[0] == WorkerStatus(
        worker="inner", state=WorkerState.STARTING, restarts=0, last_error=None, since=None
    )


def test_worker_state_labels_match_the_seed() -> None:
    """The state labels are the ones /healthz and the gauge use."""
    assert [state.value for state in WorkerState] == [
        "starting",
        "running",
        "backing-off",
        "stopping",
        "stopped",
        "failed",
    ]
    assert str(WorkerState.BACKING_OFF) == "backing-off"
