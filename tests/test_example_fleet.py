"""Example 3, the fleet: workers sharing one queue, in virtual time and as real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from examples.fleet import SPEC_ID, ChecksumDriver, ResultStore, checksum
from trio_supervise.testing import Harness, harness_runner_settings, run_scenario

from .queues.conftest import drop_schema, new_schema_name, postgres_dsn

REPO = Path(__file__).resolve().parents[1]
JOBS = 30


@attrs.define
class MemoryResults:
    saved: dict[str, tuple[str, str]] = attrs.Factory(dict)

    async def save(self, item_id: str, worker: str, result: str) -> None:
        await trio.lowlevel.checkpoint()
        assert item_id not in self.saved, f"{item_id} saved twice"
        self.saved[item_id] = (worker, result)


async def inline(function: Callable[[str, int], str], text: str, rounds: int) -> str:
    await trio.lowlevel.checkpoint()
    return function(text, rounds)


async def three_workers(harness: Harness, results: MemoryResults) -> float:
    """Three runners, as three processes would, each two jobs at a time, on one queue."""
    for name in ("w1", "w2", "w3"):
        await harness.run_drivers(
            ChecksumDriver(worker=name, offload=inline),
            context=results,
            name=name,
            settings=harness_runner_settings(worker_id=name, concurrency=2, claim_batch=2),
        )
    for n in range(JOBS):
        job = f"job-{n:05}"
        await harness.queue.enqueue(
            SPEC_ID, item_id=job, config={"text": job, "rounds": 10, "io_seconds": 1.0}
        )
    return await harness.wait_until(
        lambda: len(harness.history.select("settled", detail="complete")) == JOBS, timeout=3600
    )


async def test_three_workers_share_the_jobs_in_virtual_time(
    autojump_clock: trio.testing.MockClock, harness: Harness
) -> None:
    """Six slots over thirty one-second jobs: five rounds, each job once, every worker busy."""
    results = MemoryResults()
    assert await three_workers(harness, results) == 5.0
    assert sorted(results.saved) == [f"job-{n:05}" for n in range(JOBS)]
    assert {worker for worker, _ in results.saved.values()} == {"w1", "w2", "w3"}
    assert results.saved["job-00007"][1] == checksum("job-00007", 10)
    for n in range(JOBS):
        assert [e.kind for e in harness.history.for_item(f"job-{n:05}")] == [
            "claimed",
            "outcome",
            "settled",
        ]


def test_three_workers_give_the_same_history_every_time() -> None:
    """Which job each claim took is the same on every run."""

    async def scenario(harness: Harness) -> None:
        await three_workers(harness, MemoryResults())

    first, second = run_scenario(scenario), run_scenario(scenario)
    assert first == second, first.diff(second)


async def test_a_result_is_never_written_twice(tmp_path: Path) -> None:
    """The file store refuses a second result for the same job."""
    store = ResultStore(tmp_path / "results")
    await store.save("job-1", "w1", "abc")
    with pytest.raises(FileExistsError):
        await store.save("job-1", "w2", "def")
    assert json.loads((tmp_path / "results" / "job-1.json").read_text())["worker"] == "w1"


# -- real processes ---------------------------------------------------------------------------


def _run(args: list[str], env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _fleet(url: str, tmp_path: Path, processes: int, jobs: int) -> None:
    """Launch *processes* workers on *url*, enqueue *jobs*, wait for them all, SIGTERM."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TRIO_SUPERVISE_DATABASE_URL": url,
        "FLEET_RESULTS": str(tmp_path / "results"),
    }
    _run(["-m", "trio_supervise", "migrate"], env, tmp_path)
    log = tmp_path / "launch.log"
    with log.open("w") as stderr:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "examples.fleet.launch", "--processes", str(processes),
             "--base-port", "0"],
            env=env, cwd=tmp_path, stderr=stderr,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while log.read_text().count("service 'fleet' running") < processes:
            assert launcher.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        out = _run(
            ["-m", "examples.fleet.enqueue", str(jobs), "--io-seconds", "0.2"], env, tmp_path
        )
        assert out.startswith(f"enqueued {jobs} checksum jobs")
        results = tmp_path / "results"
        while len(list(results.glob("*.json"))) < jobs:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 0, log.read_text()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    documents = [json.loads(path.read_text()) for path in results.glob("*.json")]
    assert sorted(d["item"] for d in documents) == [f"job-{n:05}" for n in range(jobs)]
    assert len({d["worker"] for d in documents}) > 1, "the work was shared"
    listed = json.loads(_run(["-m", "trio_supervise", "items", "list", "--json", "--limit",
                              str(jobs + 1)], env, tmp_path))  # fmt: skip
    assert {item["state"] for item in listed} == {"completed"}
    assert {item["error_count"] for item in listed} == {0}
    assert "SIGTERM: draining the workers" in log.read_text()


@pytest.mark.slow
def test_processes_share_one_sqlite_file(tmp_path: Path) -> None:
    """Three worker processes on the SQLite default share forty jobs, each run once."""
    _fleet(f"sqlite:///{tmp_path / 'fleet.db'}", tmp_path, processes=3, jobs=40)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh schema in the test database, as a queue URL whose search_path selects it."""
    import psycopg
    from psycopg import sql

    dsn = postgres_dsn()
    schema = new_schema_name()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    separator = "&" if "?" in dsn else "?"
    try:
        yield f"{dsn}{separator}options=-csearch_path%3D{schema}"
    finally:
        drop_schema(dsn, schema)


@pytest.mark.slow
@pytest.mark.postgres
def test_processes_share_one_postgres_database(tmp_path: Path, postgres_url: str) -> None:
    """Four worker processes on one PostgreSQL database share eighty jobs, each run once."""
    _fleet(postgres_url, tmp_path, processes=4, jobs=80)
