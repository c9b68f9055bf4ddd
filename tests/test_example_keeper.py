"""Example 2, the connection keeper: faults, backoffs at the fixed seed's times, recovery."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from examples.keeper import KEEPER_POLICY, Upstream, build_service
from trio_supervise import Jitter, WorkerState
from trio_supervise.testing import Harness, run_scenario

REPO = Path(__file__).resolve().parents[1]


def expected_restarts(failed_at: float, back_up_at: float, jitter: Jitter) -> list[float]:
    """When the keeper restarts after failing at *failed_at*: after each backoff, until a
    restart finds the upstream up again. The failing run lasted longer than the policy's cap,
    so the attempt count starts again at 1."""
    restarts, now, attempt = [], failed_at, 1
    while True:
        now += KEEPER_POLICY.backoff(attempt, key="keeper", jitter=jitter)
        restarts.append(now)
        if now >= back_up_at:
            return restarts
        attempt += 1


async def test_a_fault_backs_off_at_exact_times_and_recovers(
    autojump_clock: trio.testing.MockClock, harness: Harness, fixed_jitter: Jitter
) -> None:
    """The upstream breaks at 60 s for 10 s; the ping at 63 s fails; the keeper is restarted
    after its jittered backoffs until it connects again, and the service stays healthy."""
    upstream = Upstream()
    service = await harness.run_service(
        build_service(upstream=upstream, ping_every=7, fault_every=60, outage=10)
    )
    assert service.supervisor is not None
    supervisor = service.supervisor

    failed_at = await harness.wait_until(
        lambda: supervisor.state("keeper") is WorkerState.BACKING_OFF, timeout=120
    )
    assert failed_at == 63.0
    [status] = [s for s in service.workers_status() if s.worker == "keeper"]
    assert status.state == "backing-off"  # what /healthz shows
    assert status.last_error == "ConnectionResetError: connection reset by upstream"
    assert service.healthy

    await harness.advance(100 - harness.now)
    restarts = expected_restarts(63.0, 70.0, fixed_jitter)
    assert harness.history.times("restart", "keeper") == pytest.approx(restarts, abs=1e-9)
    assert len(restarts) >= 2, "the first restarts find the upstream still down"
    refused = harness.history.select("state", "keeper", "backing-off: ConnectionRefusedError")
    assert len(refused) == len(restarts) - 1
    assert supervisor.state("keeper") is WorkerState.RUNNING
    assert upstream.connects == 2
    assert service.healthy


async def test_an_outage_longer_than_the_policy_allows_fails_the_service(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """Past ten rapid restarts the keeper is failed, health is false, the service exits 1."""
    service = await harness.run_service(build_service(ping_every=7, fault_every=60, outage=10_000))
    await harness.wait_until(lambda: bool(harness.history.select("exited", "keeper")), timeout=600)
    assert not service.healthy
    assert len(harness.history.times("restart", "keeper")) == KEEPER_POLICY.max_restarts
    [failed] = harness.history.select("state", "keeper", "failed")
    assert failed.detail == "failed: ConnectionRefusedError: upstream is down"
    assert harness.history.select("exited", "keeper")[0].detail == "exit code 1"


async def keep_for_ten_minutes(harness: Harness) -> None:
    await harness.run_service(build_service(ping_every=7, fault_every=60, outage=10))
    await harness.advance(600)


def test_ten_minutes_of_faults_are_the_same_every_time() -> None:
    """Ten faults and their restarts: the same history on every run."""
    first, second = run_scenario(keep_for_ten_minutes), run_scenario(keep_for_ten_minutes)
    assert first == second, first.diff(second)
    assert len(first.select("restart", "keeper")) >= 10


@pytest.mark.slow
def test_python_m_examples_keeper_shows_backing_off_in_healthz(tmp_path: Path) -> None:
    """The real service, with fast faults: ``/healthz`` shows the keeper ``backing-off`` and
    then ``running`` again, healthy throughout; SIGTERM stops it with exit code 0."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TRIO_SUPERVISE_DATABASE_URL": f"sqlite:///{tmp_path / 'keeper.db'}",
        "TRIO_SUPERVISE_HTTP__PORT": "0",
        "KEEPER_PING_EVERY": "0.1",
        "KEEPER_FAULT_EVERY": "1",
        "KEEPER_OUTAGE": "0.5",
    }
    log = tmp_path / "service.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "examples.keeper"], cwd=tmp_path, env=env, stderr=stderr
        )
    try:
        port = _bound_port(process, log)
        seen: list[tuple[int, str, int]] = []
        deadline = time.monotonic() + 20
        with httpx.Client(timeout=5) as client:
            while time.monotonic() < deadline:
                health = client.get(f"http://127.0.0.1:{port}/healthz")
                [keeper] = [w for w in health.json()["workers"] if w["worker"] == "keeper"]
                seen.append((health.status_code, keeper["state"], keeper["restarts"]))
                backed_off = any(state == "backing-off" for _, state, _ in seen)
                if backed_off and keeper["state"] == "running" and keeper["restarts"] > 0:
                    break
                time.sleep(0.02)
        states = [state for _, state, _ in seen]
        assert "backing-off" in states
        assert states[-1] == "running", seen[-10:]
        assert seen[-1][2] > 0
        assert {code for code, _, _ in seen} == {200}
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _bound_port(process: subprocess.Popen[bytes], log: Path) -> int:
    """The port from the service's "operations HTTP on HOST:PORT" log line."""
    for _ in range(300):
        for line in log.read_text().splitlines():
            if "operations HTTP on" in line:
                return int(line.rstrip().rpartition(":")[2])
        if process.poll() is not None:
            raise AssertionError(f"the service exited ({process.returncode}):\n{log.read_text()}")
        time.sleep(0.1)
    raise AssertionError(f"the service served no HTTP within 30 s:\n{log.read_text()}")
