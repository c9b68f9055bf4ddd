"""The Service's supervision: start order, a drain that health watches throughout, auto shutdown."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

from trio_supervise import ChildSpec, MemoryQueue, Service, Shutdown, StartFailed, WorkerState
from trio_supervise._service import EXIT_FAILED, EXIT_OK
from trio_supervise._settings import HttpSettings, Settings

DRAIN = 15.0


@pytest.fixture
def patient_clock() -> trio.testing.MockClock:
    """Virtual time that jumps only once every task has idled for 50 ms of real time.

    A real HTTP exchange on localhost completes well within that, so virtual time stands still
    while a request is in flight, and a 15 s drain takes a second or two of real time.
    """
    return trio.testing.MockClock(autojump_threshold=0.05)


def http_settings() -> Settings:
    return Settings(http=HttpSettings(port=0))


async def test_healthz_answers_200_with_the_workers_states_through_a_15_second_drain(
    patient_clock: trio.testing.MockClock,
) -> None:
    """The HTTP server starts first and stops last: /healthz and /metrics answer the whole drain.

    Regression: the server used to watch the service's shutdown and refuse connections while
    the workers were still draining.
    """
    drained_at: list[float] = []

    async def slow_drain(*, stop: Shutdown) -> None:
        await stop.wait()
        await trio.sleep(DRAIN)
        drained_at.append(trio.current_time())

    service = Service(
        settings=http_settings(),
        queue=MemoryQueue(),
        handle_signals=False,
        workers=[ChildSpec("slow", slow_drain, stop_signal=True, shutdown_grace=DRAIN + 5)],
    )
    codes: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        assert service.supervisor is not None
        assert [s.worker for s in service.supervisor.which_children()] == ["http", "slow"]
        base = f"http://127.0.0.1:{service.http_port}"
        async with httpx.AsyncClient(base_url=base, timeout=5) as client:
            began = trio.current_time()
            service.stop("deploy")
            polls: list[tuple[float, int, dict[str, str]]] = []
            # At the start of the drain, then every second in between (the last at 14.5 s).
            for at in [0.0] + [second + 0.5 for second in range(int(DRAIN))]:
                await trio.sleep_until(began + at)
                health = await client.get("/healthz")
                metrics = await client.get("/metrics")
                codes.append(metrics.status_code)
                states = {w["worker"]: w["state"] for w in health.json()["workers"]}
                polls.append((trio.current_time() - began, health.status_code, states))
    assert drained_at == [pytest.approx(began + DRAIN, abs=1e-9)]
    assert [at for at, _, _ in polls] == [pytest.approx(0)] + [
        pytest.approx(second + 0.5) for second in range(int(DRAIN))
    ]
    assert {code for _, code, _ in polls} == {200}
    assert set(codes) == {200}
    for _, _, states in polls:
        assert states == {"http": "stopping", "slow": "stopping"}
    assert service.supervisor.states == {"http": WorkerState.STOPPED, "slow": WorkerState.STOPPED}


async def test_a_significant_worker_finishing_ends_the_service_with_exit_code_0(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """auto_shutdown='any_significant': the main task's return drains the service, exit 0."""
    helper_stopped: list[float] = []

    async def main_task() -> None:
        await trio.sleep(3)

    async def helper(*, stop: Shutdown) -> None:
        await stop.wait()
        helper_stopped.append(trio.current_time())

    service = Service(
        settings=Settings(http=HttpSettings(enabled=False)),
        queue=MemoryQueue(),
        handle_signals=False,
        auto_shutdown="any_significant",
        workers=[
            ChildSpec("helper", helper, stop_signal=True),
            ChildSpec("main", main_task, restart_type="transient", significant=True),
        ],
    )
    assert await service.run() == EXIT_OK
    assert helper_stopped == [3]
    assert service.shutdown.reason == "significant worker 'main' ended (any_significant)"


def broken_at_start() -> Service:
    async def api(*, task_status: trio.TaskStatus[None]) -> None:
        await trio.sleep(1)
        raise OSError("port in use")

    return Service(
        settings=Settings(http=HttpSettings(enabled=False)),
        queue=MemoryQueue(),
        handle_signals=False,
        workers=[ChildSpec("api", api, start=True)],
    )


async def test_a_service_whose_worker_fails_before_ready_never_reports_ready(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """nursery.start(service.run) raises StartFailed naming the worker; run() alone returns 1."""
    failures: list[BaseException] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(broken_at_start().run)
            pytest.fail("the service reported itself ready")
    except* StartFailed as group:
        failures.extend(group.exceptions)
    assert [str(f) for f in failures] == [
        "worker 'api' failed to start: failed (OSError: port in use)"
    ]
    assert await broken_at_start().run() == EXIT_FAILED
