"""The time-travel harness, its history, and the pytest plugin as a user project sees it."""

from __future__ import annotations

import datetime as dt
import textwrap

import pytest
import trio
import trio.testing

from trio_supervise import (
    ChildSpec,
    Jitter,
    MemoryQueue,
    Outcome,
    Reschedule,
    RestartPolicy,
    Service,
    Stop,
    WorkerState,
    WorkItem,
)
from trio_supervise.testing import (
    DEFAULT_EPOCH,
    DEFAULT_JITTER_SEED,
    Entry,
    Harness,
    History,
    harness_runner_settings,
    open_harness,
    run_scenario,
)

pytest_plugins = ["pytester"]

DAY = 86_400.0
POLICY = RestartPolicy(1, 30)


class Countdown:
    """Reschedules its item a day later until ``left`` reaches zero."""

    name = "countdown"
    spec_ids = ("countdown",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: object, item: WorkItem) -> Outcome:
        left = item.config["left"] - 1
        if left == 0:
            return Stop()
        return Reschedule(item.due_at + dt.timedelta(days=1), {"left": left})


def flaky(failures: int) -> ChildSpec:
    """A worker that fails *failures* times, then runs for good."""
    runs = 0

    async def connect() -> None:
        nonlocal runs
        runs += 1
        if runs <= failures:
            raise ConnectionError("refused")
        await trio.sleep_forever()

    return ChildSpec("flaky", connect, restart=POLICY)


def completed(harness: Harness, item_id: str) -> bool:
    return bool(harness.history.select("settled", item_id, "complete"))


async def countdown_week(harness: Harness) -> None:
    await harness.run_workers(flaky(2))
    await harness.run_drivers(Countdown())
    await harness.queue.enqueue("countdown", config={"left": 7}, item_id="week")
    await harness.wait_until(lambda: completed(harness, "week"), timeout=30 * DAY)


# -- the plugin's fixtures ---------------------------------------------------------------------


def test_fixture_values(memory_queue: MemoryQueue, jitter_seed: int, fixed_jitter: Jitter) -> None:
    """The plugin gives a fresh memory queue, the default seed, and a jitter with that seed."""
    assert isinstance(memory_queue, MemoryQueue)
    assert memory_queue.items == {}
    assert jitter_seed == DEFAULT_JITTER_SEED
    assert fixed_jitter == Jitter(seed=DEFAULT_JITTER_SEED)


def test_a_user_project_gets_the_fixtures_without_a_conftest(pytester: pytest.Pytester) -> None:
    """A project with no conftest uses ``harness``, ``memory_queue`` and ``fixed_jitter``."""
    pytester.makeini("[pytest]\ntrio_mode = true\nfilterwarnings = error\n")
    pytester.makepyfile(
        test_user=textwrap.dedent(
            """
            import trio
            from trio_supervise import ChildSpec, RestartPolicy

            async def test_restart_time(autojump_clock, harness, fixed_jitter):
                runs = 0

                async def worker():
                    nonlocal runs
                    runs += 1
                    if runs == 1:
                        raise ConnectionError("down")
                    await trio.sleep_forever()

                policy = RestartPolicy(1, 30)
                await harness.run_workers(ChildSpec("w", worker, restart=policy))
                await harness.wait_until(lambda: runs == 2, timeout=60)
                expected = policy.backoff(1, key="w", jitter=fixed_jitter)
                assert harness.history.times("restart", "w") == [expected]

            async def test_queue(autojump_clock, memory_queue):
                await trio.sleep(60)
                item = await memory_queue.enqueue("job")
                assert item.due_at.isoformat() == "2030-01-01T00:01:00+00:00"
            """
        )
    )
    assert not (pytester.path / "conftest.py").exists()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_the_harness_fixture_refuses_the_real_clock(pytester: pytest.Pytester) -> None:
    """Without ``autojump_clock`` the harness says which fixture to request."""
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makepyfile("async def test_no_clock(harness):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*request pytest-trio's `autojump_clock` fixture*"])


# -- time ---------------------------------------------------------------------------------------


async def test_advance_moves_virtual_time_exactly(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """``advance`` returns the virtual time since the harness opened, and the queue's clock
    follows it."""
    assert harness.now == 0
    assert harness.queue.clock.now() == DEFAULT_EPOCH
    assert await harness.advance(DAY) == DAY
    assert harness.queue.clock.now() == DEFAULT_EPOCH + dt.timedelta(days=1)
    assert harness.at(2 * DAY) == DEFAULT_EPOCH + dt.timedelta(days=2)
    with pytest.raises(ValueError, match="duration must be a finite number >= 0"):
        await harness.advance(-1)


async def test_wait_until_returns_when_the_condition_holds(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """``wait_until`` wakes on each new entry and returns the virtual time it held at."""
    await harness.run_drivers(Countdown())
    await harness.queue.enqueue("countdown", config={"left": 3}, item_id="x")
    assert await harness.wait_until(lambda: completed(harness, "x"), timeout=10 * DAY) == 2 * DAY


async def test_wait_until_polls_for_conditions_no_entry_follows(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """With *poll*, a condition on plain state is checked on that period too."""
    flag = False

    async def set_later() -> None:
        nonlocal flag
        await trio.sleep(10)
        flag = True

    async with trio.open_nursery() as nursery:
        nursery.start_soon(set_later)
        assert await harness.wait_until(lambda: flag, timeout=60, poll=4) == 12


async def test_wait_until_times_out_with_the_last_entries(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """A condition that never holds raises TimeoutError after exactly *timeout* virtual seconds."""
    harness.note("scenario", "started")
    with pytest.raises(TimeoutError, match=r"(?s)after 5 s of virtual time.*note\s+scenario"):
        await harness.wait_until(lambda: False, timeout=5)
    assert harness.now == 5


# -- what is recorded ---------------------------------------------------------------------------


async def test_item_history_has_claims_outcomes_and_settlements(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """Each daily run of an item is a claim, an outcome and a settlement at its due time."""
    await harness.run_drivers(Countdown())
    await harness.queue.enqueue("countdown", config={"left": 3}, item_id="x")
    await harness.wait_until(lambda: completed(harness, "x"), timeout=10 * DAY)
    assert [(e.at, e.kind, e.detail) for e in harness.history.for_item("x")] == [
        (0.0, "claimed", "lease 1"),
        (0.0, "outcome", "reschedule"),
        (0.0, "settled", "reschedule"),
        (DAY, "claimed", "lease 2"),
        (DAY, "outcome", "reschedule"),
        (DAY, "settled", "reschedule"),
        (2 * DAY, "claimed", "lease 3"),
        (2 * DAY, "outcome", "complete"),
        (2 * DAY, "settled", "complete"),
    ]


async def test_renewals_are_recorded_every_third_of_the_lease(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """A long evaluation shows its lease renewals at ``lease / 3`` intervals."""

    class Slow:
        name = "slow"
        spec_ids = ("slow",)

        def validate_specs(self) -> None:
            pass

        async def evaluate(self, context: object, item: WorkItem) -> Outcome:
            await trio.sleep(65)
            return Stop()

    await harness.run_drivers(Slow(), settings=harness_runner_settings(lease=30))
    await harness.queue.enqueue("slow", item_id="s")
    await harness.wait_until(lambda: completed(harness, "s"), timeout=DAY)
    assert harness.history.times("renewed", "s") == [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    assert harness.history.times("settled", "s") == [65.0]


async def test_restarts_and_states_at_the_jittered_times(
    autojump_clock: trio.testing.MockClock, harness: Harness, fixed_jitter: Jitter
) -> None:
    """A flaky worker backs off for exactly the fixed jitter's delays, then runs."""
    await harness.run_workers(flaky(2))
    await harness.advance(60)
    first = POLICY.backoff(1, key="flaky", jitter=fixed_jitter)
    second = first + POLICY.backoff(2, key="flaky", jitter=fixed_jitter)
    assert harness.history.times("restart", "flaky") == [first, second]
    assert [(e.at, e.detail) for e in harness.history.select("state", "flaky")] == [
        (0.0, "starting"),
        (0.0, "running"),
        (0.0, "backing-off: ConnectionError: refused"),
        (first, "starting"),
        (first, "running"),
        (first, "backing-off: ConnectionError: refused"),
        (second, "starting"),
        (second, "running"),
    ]
    assert harness.supervisor.state("flaky") is WorkerState.RUNNING


async def test_a_terminal_failure_is_recorded_not_raised(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A worker without a policy fails the harness's supervisor; the harness records it."""

    async def broken() -> None:
        raise RuntimeError("boom")

    async with open_harness() as harness:
        await harness.run_workers(ChildSpec("broken", broken))
        await harness.wait_until(lambda: bool(harness.history.select("exited")), timeout=60)
    assert harness.supervisor.failed
    assert harness.history.select("state", "broken")[-1].detail == "failed: RuntimeError: boom"
    [exited] = harness.history.select("exited", "harness")
    assert exited.detail.startswith("failed: supervisor 'harness' is unhealthy")


async def test_nested_supervisor_workers_are_recorded_by_path(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """The children of a nested supervisor appear under ``parent/child``."""
    from trio_supervise import Supervisor

    await harness.run_workers(Supervisor(name="pipeline", children=[flaky(1)]))
    await harness.advance(5)
    assert harness.history.for_worker("pipeline/flaky")[0].detail == "starting"
    assert len(harness.history.times("restart", "pipeline/flaky")) == 1


async def test_a_whole_service_runs_in_virtual_time(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """A Service runs on the harness's queue with its seed, its HTTP off, and exits 0."""
    service = Service(drivers=[Countdown()], workers=[flaky(1)], name="svc")
    await harness.run_service(service)
    assert service.queue is harness.queue
    assert service.settings is not None
    assert service.settings.jitter_seed == DEFAULT_JITTER_SEED
    assert not service.settings.http.enabled
    await harness.queue.enqueue("countdown", config={"left": 2}, item_id="x")
    await harness.advance(2 * DAY)
    assert (await harness.queue.get("x")).state == "completed"
    assert [entry.kind for entry in harness.history.for_item("x")].count("claimed") == 2
    assert harness.history.times("settled", "x", "complete") == [DAY]
    backoff = POLICY.backoff(1, key="flaky", jitter=harness.jitter)
    assert harness.history.times("restart", "flaky") == [backoff]
    assert harness.history.select("state", "runner")[0].detail == "running"
    await harness.stop()
    assert harness.history.select("exited", "svc")[0].detail == "exit code 0"


async def test_under_run_service_the_harness_supervisor_is_the_services(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """harness.supervisor is the service's own supervisor, so its health says something."""

    async def broken() -> None:
        await trio.sleep(10)
        raise RuntimeError("boom")

    service = Service(drivers=[Countdown()], workers=[ChildSpec("broken", broken)], name="svc")
    await harness.run_service(service)
    assert harness.supervisor is service.supervisor
    assert harness.supervisor.state("runner") is WorkerState.RUNNING
    assert harness.root.snapshot() == []  # the harness's own supervisor runs nothing here
    assert harness.supervisor.healthy.value
    await harness.wait_until(lambda: not harness.supervisor.healthy.value, timeout=60)
    assert harness.now == 10
    assert harness.supervisor.state("broken") is WorkerState.FAILED


async def test_two_services_make_harness_supervisor_ambiguous(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """With two services run, harness.supervisor refuses to pick one, naming both."""
    await harness.run_service(Service(drivers=[Countdown()], name="one"))
    await harness.run_service(Service(workers=[flaky(0)], name="two"))
    with pytest.raises(RuntimeError, match=r"runs 2 services \('one', 'two'\)"):
        harness.supervisor  # noqa: B018


# -- comparing runs -----------------------------------------------------------------------------


def test_the_same_scenario_twice_gives_the_same_history() -> None:
    """Same seed, same scenario, same history, entry for entry and time for time."""
    first = run_scenario(countdown_week)
    second = run_scenario(countdown_week)
    assert first == second, first.diff(second)
    assert first.diff(second) == ""
    assert len(first.select("settled", "week")) == 7
    assert first.times("settled", "week", "complete") == [6 * DAY]


def test_another_seed_gives_other_restart_times() -> None:
    """The seed is what fixes the backoffs: another one moves the restarts."""
    first = run_scenario(countdown_week)
    other = run_scenario(countdown_week, jitter_seed=8)
    assert first != other
    assert first.times("restart", "flaky") != other.times("restart", "flaky")
    assert "restart" in first.diff(other)


def test_history_comparison_ignores_order_within_an_instant() -> None:
    """Entries of one instant may be recorded in any order; later ones may not."""
    a, b, c = Entry(1.0, "state", "w", "running"), Entry(1.0, "note", "x"), Entry(2.0, "note", "y")
    assert History([a, b, c]) == History([b, a, c])
    assert History([a, c]) != History([c, Entry(1.5, "state", "w", "running")])
    assert History([a]) != [a]
    assert History([a, b]).for_item("x") == [b]
    assert "running" in History([a]).format()


def test_a_third_party_store_runs_the_shipped_conformance_suite(pytester: pytest.Pytester) -> None:
    """A backend author's project, with no conftest and no ``trio_mode``, subclasses
    ``StoreConformance`` for a store of its own that has the four ports only (no single-item
    writes, no optional capability): the whole contract runs against it and passes; the tests of
    what it has not (``settle_and_claim``, ``mark_error``) are skipped, saying why."""
    pytester.makeini("[pytest]\nfilterwarnings = error\n")
    pytester.makepyfile(
        test_my_store=textwrap.dedent(
            """
            from contextlib import asynccontextmanager

            from trio_supervise.queues import MemoryQueue, SeedWrites
            from trio_supervise.testing.conformance import StoreConformance

            SEED = {"renew", "release", "reschedule", "complete", "mark_error", "settle_and_claim"}


            class PortsOnly:
                \"\"\"A store of its own: the four ports, nothing more.\"\"\"

                capabilities = frozenset()

                def __init__(self, inner):
                    self._inner = inner

                def __getattr__(self, name):
                    if name in SEED:
                        raise AttributeError(name)
                    return getattr(self._inner, name)

                async def __aenter__(self):
                    return self

                async def __aexit__(self, *exc_info):
                    await self._inner.aclose()


            class TestPortsOnly(StoreConformance):
                @asynccontextmanager
                async def open_store(self, clock):
                    async with PortsOnly(MemoryQueue(clock=clock)) as store:
                        assert not isinstance(store, SeedWrites)
                        yield store
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-q", "-rs")
    outcomes = result.parseoutcomes()
    assert "failed" not in outcomes, result.stdout.str()
    assert "errors" not in outcomes, result.stdout.str()
    assert outcomes["passed"] > 150
    for reason in ("seed-writes", "settle-and-claim"):
        result.stdout.fnmatch_lines([f"*the store lacks {reason}*"])
