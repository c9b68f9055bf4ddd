"""The supervision example (also the code on the docs page) runs and does what it says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio.testing

from trio_supervise import ChildSpec, Jitter, RestartPolicy, Supervisor, WorkerState

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import supervised_workers


async def test_supervised_workers_demo(autojump_clock: trio.testing.MockClock) -> None:
    """The poller restarts after its jittered backoffs, and shutdown drains everything."""
    jitter = Jitter(seed=7)
    policy = supervised_workers.POLLER_POLICY
    run2 = policy.backoff(1, key="poller", jitter=jitter)
    run3 = run2 + policy.backoff(2, key="poller", jitter=jitter)
    assert 2 < run3 < 10, "the poller connects after the store is ready, before a heartbeat"

    lines = await supervised_workers.demo(seed=7, run_for=30)

    assert lines == [
        "  0.000s  poller: connecting (run 1)",
        f"{run2:7.3f}s  poller: connecting (run 2)",
        "  2.000s  store: ready",
        "  2.000s  supervisor ready, healthy=True",
        f"{run3:7.3f}s  poller: connecting (run 3)",
        f"{run3:7.3f}s  poller: connected",
        " 10.000s  heartbeat",
        " 20.000s  heartbeat",
        " 30.000s  heartbeat",
        " 32.500s  heartbeat: flushed",
        " 34.000s  supervisor done, healthy=True",
        " 34.000s  poller: stopped (2 restarts)",
        " 34.000s  heartbeat: stopped (0 restarts)",
        " 34.000s  pipeline: stopped (0 restarts)",
        " 34.000s  pipeline/store: stopped (0 restarts)",
        " 34.000s  pipeline/fetch: stopped (0 restarts)",
    ]
    # The pipeline's children ignore shutdown and are stopped one at a time, the last started
    # first: fetch when its one-second grace ends (33 s), then store in its own (34 s).
    assert trio.current_time() == 34


@pytest.mark.slow
def test_supervised_workers_runs_as_a_script() -> None:
    """``python examples/supervised_workers.py`` prints the demo and logs the restarts."""
    script = Path(supervised_workers.__file__)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.splitlines()[-1] == " 34.000s  pipeline/fetch: stopped (0 restarts)"
    assert result.stderr.count("worker 'poller' failed (ConnectionError: upstream refused)") == 2


async def test_the_testing_snippet_on_the_docs_page(autojump_clock: trio.testing.MockClock) -> None:
    """The "Testing supervised code" snippet of docs/supervision.md holds as written."""
    failed_once = False

    async def poller() -> None:
        nonlocal failed_once
        if not failed_once:
            failed_once = True
            raise ConnectionError("upstream refused")
        await trio.sleep_forever()

    policy, jitter = RestartPolicy(1, 30), Jitter(seed=7)
    supervisor = Supervisor(
        name="app", children=[ChildSpec("poller", poller, restart=policy)], jitter=jitter
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.watch("poller").wait_value(WorkerState.BACKING_OFF)
        await supervisor.watch("poller").wait_value(WorkerState.RUNNING)
        assert trio.current_time() == policy.backoff(1, key="poller", jitter=jitter)
        nursery.cancel_scope.cancel()
