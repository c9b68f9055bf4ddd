"""The Service: one supervisor over the runner, the HTTP server and the user's workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import attrs
import httpx
import pytest
import trio

from trio_supervise import (
    Continue,
    ItemState,
    MemoryQueue,
    Outcome,
    RestartPolicy,
    RunnerSettings,
    Shutdown,
    Stop,
)
from trio_supervise._service import EXIT_FAILED, EXIT_OK, Service, ServiceHandle, _takes_service
from trio_supervise._settings import HttpSettings, Settings
from trio_supervise.queues import WorkItem
from trio_supervise.queues._factory import open_queue
from trio_supervise.supervision import ChildSpec, WorkerState

ROOT = Path(__file__).resolve().parent.parent


@attrs.frozen
class Finisher:
    """Completes every item of spec 'job' at once."""

    name: str = "finisher"
    spec_ids: Sequence[str] = ("job",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: object, item: WorkItem) -> Outcome:
        await trio.lowlevel.checkpoint()
        return Stop() if item.config.get("stop", True) else Continue()


def settings(**runner: float) -> Settings:
    return Settings(
        http=HttpSettings(port=0),
        runner=RunnerSettings(worker_id="test-worker", poll_interval=0.05, **runner),  # type: ignore[arg-type]
    )


async def idle_worker(shutdown: Shutdown) -> None:
    await shutdown.wait()


async def test_a_running_service_serves_every_endpoint_and_stops_cleanly() -> None:
    """Runner, HTTP and a user worker run under one supervisor; stop() drains and returns 0."""
    queue = MemoryQueue()
    item = await queue.enqueue("job", config={"stop": True})
    await queue.enqueue("stray")  # no driver owns it: the status page says so
    service = Service(
        drivers=[Finisher()],
        settings=settings(shutdown_grace=1.0),
        queue=queue,
        name="svc",
        handle_signals=False,
    )
    service.workers = (ChildSpec("idle", partial(idle_worker, service.shutdown)),)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            started: Service = await nursery.start(_run_and_check, service, EXIT_OK)
            assert started is service
            assert service.http_port
            while (await queue.get(item.id)).state is not ItemState.COMPLETED:  # noqa: ASYNC110
                await trio.sleep(0.02)
            base = f"http://127.0.0.1:{service.http_port}"
            async with httpx.AsyncClient(base_url=base) as client:
                health = await client.get("/healthz")
                metrics = await client.get("/metrics")
                page = await client.get("/")
                wrong = await client.post("/healthz")
            assert health.status_code == 200
            assert {(w["worker"], w["state"]) for w in health.json()["workers"]} == {
                ("runner", "running"),
                ("http", "running"),
                ("idle", "running"),
            }
            assert 'trio_supervise_worker_state{state="running",worker="runner"} 1.0' in (
                metrics.text
            )
            assert 'trio_supervise_items_claimed_total{spec="job"} 1.0' in metrics.text
            assert 'trio_supervise_items_completed_total{spec="job"} 1.0' in metrics.text
            assert 'trio_supervise_queue_items{spec="job",state="completed"} 1.0' in metrics.text
            assert "trio_supervise_evaluation_seconds_bucket" in metrics.text
            assert page.status_code == 200
            assert "<title>svc</title>" in page.text
            assert '<tr class="warning"><td>stray</td><td class="num">1</td>' in page.text
            assert wrong.status_code == 405
            service.stop("test over")


async def _run_and_check(
    service: Service, expected: int, *, task_status: trio.TaskStatus[Service]
) -> None:
    code = await service.run(task_status=task_status)
    assert code == expected


async def test_a_terminal_worker_failure_returns_a_failing_exit_code() -> None:
    """A worker that fails without a restart policy fails the service: exit code 1."""

    async def broken() -> None:
        await trio.sleep(0.05)
        raise RuntimeError("disk on fire")

    service = Service(
        workers=[ChildSpec("broken", broken)],
        settings=settings(),
        queue=MemoryQueue(),
        handle_signals=False,
    )
    with trio.fail_after(20):
        assert await service.run() == EXIT_FAILED
    assert service.supervisor is not None
    assert service.supervisor.state("broken") is WorkerState.FAILED
    assert not service.healthy


async def test_a_worker_that_exhausts_its_restarts_fails_the_service() -> None:
    """A worker is restarted per its policy; past max_restarts the service exits 1."""
    attempts = 0

    async def flaky() -> None:
        nonlocal attempts
        attempts += 1
        await trio.sleep(0.05)
        raise OSError("flaky")

    service = Service(
        workers=[ChildSpec("flaky", flaky, restart=RestartPolicy(0.01, 1.0, max_restarts=2))],
        settings=settings(),
        queue=MemoryQueue(),
        handle_signals=False,
    )
    with trio.fail_after(20):
        assert await service.run() == EXIT_FAILED
    assert attempts == 3
    statuses = {s.worker: s for s in service.workers_status()}
    assert statuses["flaky"].restarts == 2
    assert statuses["flaky"].last_error == "OSError: flaky"


async def test_a_bad_queue_url_fails_before_anything_starts() -> None:
    """A queue URL that names no backend is refused with the rule."""
    service = Service(settings=settings(), queue_url="bogus://x", handle_signals=False)
    with pytest.raises(ValueError, match="unknown queue URL scheme"):
        await service.run()


async def test_http_can_be_disabled() -> None:
    """With http.enabled false there is no HTTP child."""
    service = Service(
        settings=attrs.evolve(settings(), http=HttpSettings(enabled=False)),
        queue=MemoryQueue(),
        handle_signals=False,
    )
    service.workers = (ChildSpec("idle", partial(idle_worker, service.shutdown)),)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(_run_and_check, service, EXIT_OK)
            assert [s.worker for s in service.workers_status()] == ["idle"]
            assert service.http_port is None
            service.stop()


# -- handles for the service's own workers --------------------------------------------------------


async def test_a_worker_reaches_the_services_queue_and_shutdown(tmp_path: Path) -> None:
    """A worker taking ``service=`` enqueues into the queue the service opened from its URL,
    waits for the runner to finish the work, then stops the whole service: exit 0."""
    seen: list[ServiceHandle] = []

    async def feeder(*, service: ServiceHandle) -> None:
        seen.append(service)
        for n in range(3):
            await service.queue.enqueue("job", item_id=f"fed-{n}", config={"stop": True})
        while (await service.queue.counts()).get(("job", ItemState.COMPLETED), 0) < 3:  # noqa: ASYNC110
            await trio.sleep(0.02)
        service.shutdown.begin("the feeder is done")
        await service.shutdown.wait()  # draining with the rest

    url = f"sqlite:///{tmp_path / 'fed.db'}"
    service = Service(
        drivers=[Finisher()],
        workers=[
            ChildSpec("feeder", feeder),
            ChildSpec("plain", trio.sleep_forever, shutdown_grace=0),
        ],
        settings=attrs.evolve(settings(), http=HttpSettings(enabled=False)),
        queue_url=url,
        name="fed",
        handle_signals=False,
    )
    with trio.fail_after(20):
        assert await service.run() == EXIT_OK
    [handle] = seen
    assert (handle.name, handle.shutdown, handle.settings) == (
        "fed",
        service.shutdown,
        service.settings,
    )
    assert service.shutdown.reason == "the feeder is done"
    async with open_queue(url) as queue:
        states = {item.id: item.state for item in await queue.list_items()}
    assert states == {f"fed-{n}": ItemState.COMPLETED for n in range(3)}


def test_only_a_target_taking_service_gets_the_handle() -> None:
    """A ``service`` keyword (or keyword-only) parameter opts in; anything else is left alone."""

    async def keyword(*, service: ServiceHandle) -> None: ...
    async def positional(service: ServiceHandle) -> None: ...
    async def other(queue: object = None) -> None: ...
    async def only_positional(service: object, /) -> None: ...

    assert _takes_service(keyword)
    assert _takes_service(positional)
    assert _takes_service(partial(keyword))
    assert not _takes_service(other)
    assert not _takes_service(only_positional)
    assert not _takes_service(print)


# -- as a process ---------------------------------------------------------------------------------

SERVICE_MODULE = """
import os

import trio
from trio_supervise._service import Service
from trio_supervise.supervision import ChildSpec
from trio_supervise import Continue


class Sleeper:
    name = "sleeper"
    spec_ids = ("slow",)

    def validate_specs(self):
        pass

    async def evaluate(self, context, item):
        open(os.environ["EVALUATING_MARKER"], "w").close()
        await trio.sleep_forever()
        return Continue()


async def broken():
    await trio.sleep(0.2)
    raise RuntimeError("worker broke")


service = Service(drivers=[Sleeper()], name="proc")
failing = Service(drivers=[Sleeper()], workers=[ChildSpec("broken", broken)], name="proc")

if __name__ == "__main__":
    import sys
    {"service": service, "failing": failing}[sys.argv[1]].main()
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIO_SUPERVISE_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
        TRIO_SUPERVISE_DATABASE_URL=f"sqlite:///{tmp_path / 'queue.db'}",
        TRIO_SUPERVISE_HTTP__PORT="0",
        TRIO_SUPERVISE_RUNNER__WORKER_ID="proc-worker",
        TRIO_SUPERVISE_RUNNER__POLL_INTERVAL="0.05",
        TRIO_SUPERVISE_RUNNER__SHUTDOWN_GRACE="0.5",
        TRIO_SUPERVISE_RUNNER__LEASE="30",
        EVALUATING_MARKER=str(tmp_path / "evaluating"),
    )
    env.update(extra)
    return env


async def _wait_until_evaluating(url: str, item_id: str, marker: Path) -> WorkItem:
    """Wait until the driver is inside evaluate (it touches *marker*), and return the item."""
    while not await trio.Path(marker).exists():  # noqa: ASYNC110 - another process's file
        await trio.sleep(0.05)
    async with open_queue(url) as queue:
        return await queue.get(item_id)


async def _start_with_running_item(
    tmp_path: Path, env: dict[str, str], nursery: trio.Nursery
) -> tuple[trio.Process, str]:
    (tmp_path / "proc_service.py").write_text(textwrap.dedent(SERVICE_MODULE))
    url = env["TRIO_SUPERVISE_DATABASE_URL"]
    async with open_queue(url) as queue:
        item = await queue.enqueue("slow", item_id="slow-1")
    process: trio.Process = await nursery.start(
        partial(
            trio.run_process,
            [sys.executable, str(tmp_path / "proc_service.py"), "service"],
            env=env,
            check=False,
            stderr=subprocess.PIPE,
        )
    )
    running = await _wait_until_evaluating(url, item.id, Path(env["EVALUATING_MARKER"]))
    assert running.state is ItemState.RUNNING
    assert running.lease_owner == "proc-worker"
    return process, url


@pytest.mark.slow
async def test_sigterm_drains_releases_leases_and_exits_zero(tmp_path: Path) -> None:
    """SIGTERM: the service stops claiming, releases its in-flight lease and exits 0."""
    env = _env(tmp_path)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            process, url = await _start_with_running_item(tmp_path, env, nursery)
            process.send_signal(signal.SIGTERM)
            code = await process.wait()
        assert code == 0, process.stderr
        async with open_queue(url) as queue:
            item = await queue.get("slow-1")
    assert item.state is ItemState.QUEUED
    assert item.lease_owner is None


@pytest.mark.slow
async def test_a_second_signal_releases_leases_and_stops_at_once(tmp_path: Path) -> None:
    """A second SIGTERM during a long drain hands the in-flight lease back, exits 128 + SIGTERM."""
    env = _env(tmp_path, TRIO_SUPERVISE_RUNNER__SHUTDOWN_GRACE="600")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            process, url = await _start_with_running_item(tmp_path, env, nursery)
            process.send_signal(signal.SIGTERM)
            await trio.sleep(0.5)
            assert process.returncode is None  # still draining
            process.send_signal(signal.SIGTERM)
            code = await process.wait()
        async with open_queue(url) as queue:
            item = await queue.get("slow-1")
    assert code == 128 + signal.SIGTERM
    # Released, not left running until its 30 s lease expires.
    assert (item.state, item.lease_owner) == (ItemState.QUEUED, None)


@pytest.mark.slow
async def test_a_terminal_worker_failure_exits_non_zero(tmp_path: Path) -> None:
    """A worker that fails terminally makes the process exit 1, after draining the runner."""
    env = _env(tmp_path)
    (tmp_path / "proc_service.py").write_text(textwrap.dedent(SERVICE_MODULE))
    with trio.fail_after(60):
        result = await trio.run_process(
            [sys.executable, str(tmp_path / "proc_service.py"), "failing"],
            env=env,
            check=False,
            capture_stderr=True,
        )
    assert result.returncode == 1
    assert b"worker broke" in result.stderr
