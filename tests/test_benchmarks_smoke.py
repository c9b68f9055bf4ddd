"""The benchmarks package runs its tiniest configuration and reports the documented JSON shape.

Speed is not asserted: only that the measures run, and that every record holds numbers, a ratio
of ``ours / baseline`` and a ``met`` that agrees with ``better`` and ``goal``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from trio_supervise import MemoryQueue, WorkItem

benchmarks_main = pytest.importorskip("benchmarks.__main__")
from benchmarks._common import Config, Result, best_of  # noqa: E402

KEYS = {"ours", "baseline", "ratio", "better", "goal", "unit", "met"}


def check_record(record: dict[str, object]) -> None:
    assert record.keys() >= KEYS
    for key in ("ours", "baseline", "ratio", "goal"):
        assert isinstance(record[key], int | float), key
        assert not isinstance(record[key], bool), key
    ours, baseline, ratio, goal = (
        float(str(record[k])) for k in ("ours", "baseline", "ratio", "goal")
    )
    assert ours > 0
    assert baseline > 0
    assert math.isclose(ratio, ours / baseline)
    assert record["better"] in ("higher", "lower")
    assert record["met"] is (ratio >= goal if record["better"] == "higher" else ratio <= goal)
    assert isinstance(record["unit"], str)
    assert record["unit"]


def test_p1_and_p4_in_process_report_the_documented_shape() -> None:
    """P1 and P4 at tiny counts produce one record each, numbers and ratio as documented."""
    results = benchmarks_main.run(Config(tiny=True), ["P1", "P4"])
    records = benchmarks_main.as_json(results)
    assert list(records) == ["P1", "P4"]
    for record in records.values():
        check_record(record)
    json.dumps(records)  # serialisable as is
    # P4 also reports the same steps under the real clock: what time travel itself costs.
    p4 = records["P4"]
    assert p4["virtual_days"] >= 2  # the clock travelled (3 steps, a day apart)
    assert p4["real_clock_evals_per_s"] > 0
    assert p4["vs_real_clock"] == pytest.approx(p4["ours"] / p4["real_clock_evals_per_s"])


def test_best_of_takes_turns_and_keeps_each_sides_best() -> None:
    """The sides alternate round by round (a slow stretch lands on both), and each side's
    best run counts, a tuple compared by its first element (the rate)."""
    calls: list[str] = []
    a_runs = iter([(1.0, "a1"), (3.0, "a2"), (2.0, "a3")])
    b_runs = iter([5.0, 4.0, 6.0])

    def a() -> tuple[float, str]:
        calls.append("a")
        return next(a_runs)

    def b() -> float:
        calls.append("b")
        return next(b_runs)

    assert best_of(3, a, b) == [(3.0, "a2"), 6.0]
    assert calls == ["a", "b", "a", "b", "a", "b"]


def test_a_detail_cannot_replace_a_records_figure() -> None:
    """P8c's details once held its runs as ``ours``, which replaced the figure in the JSON."""
    result = Result("PX", "x", 1.0, 2.0, "higher", 0.5, "x/s", detail={"ours": [1.0]})
    with pytest.raises(ValueError, match=r"PX: details named as the record's fields: \['ours'\]"):
        result.as_json()


def test_a_lower_is_better_ratio_is_met_below_the_goal() -> None:
    """With ``better: lower`` the goal is a ceiling; the ratio is still ours / baseline."""
    result = Result("PX", "x", ours=3.0, baseline=2.0, better="lower", goal=2.0, unit="B")
    assert result.ratio == 1.5
    assert result.met
    assert not Result("PY", "y", 5.0, 2.0, "lower", 2.0, "B").met
    assert Result("PZ", "z", 1.0, 2.0, "higher", 0.5, "x/s").met


def test_the_command_line_writes_json_and_exits_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--json`` writes the records keyed by id; a missed goal does not change the exit code."""
    monkeypatch.setattr(
        benchmarks_main, "Config", lambda **kwargs: Config(**{**kwargs, "tiny": True})
    )
    out = tmp_path / "bench.json"
    assert benchmarks_main.main(["--only", "P1", "--json", str(out)]) == 0
    records = json.loads(out.read_text())
    assert list(records) == ["P1"]
    check_record(records["P1"])


DSNS = [
    "postgresql://postgres@127.0.0.1:5432/test",
    "postgresql:///test",
    "postgresql:///test?user=postgres&application_name=old",
    "postgres://u:p%40ss@db.example/app?sslmode=disable",
    "host=/var/run/postgresql dbname=test user=postgres",
]


@pytest.mark.parametrize("dsn", DSNS)
def test_parameters_are_added_to_any_valid_dsn(dsn: str) -> None:
    """with_params keeps a URL, a socket URL with no host and a key/value DSN valid: libpq
    reads back every original parameter plus the new ones (and a queue URL still names
    PostgreSQL); ``postgresql:///test`` no longer becomes ``postgresql:/test``."""
    from psycopg.conninfo import conninfo_to_dict

    from benchmarks._common import with_params
    from trio_supervise.queues import parse_queue_url

    params = {"application_name": "chaos-w1", "options": "-c search_path=chaos_x"}
    url = with_params(dsn, **params)
    assert conninfo_to_dict(url) == {**conninfo_to_dict(dsn), **params}
    assert parse_queue_url(url)[0] == "postgres"
    assert not url.startswith("postgresql:/test")


@pytest.mark.postgres
def test_the_test_dsn_with_the_harness_s_parameters_connects() -> None:
    """The test DSN (TCP or a Unix socket, URL or key/value), with the harness's parameters,
    reaches the server with those parameters applied."""
    import psycopg

    from benchmarks._common import with_params

    from .queues.conftest import postgres_dsn

    url = with_params(postgres_dsn(), application_name="ts-dsn-test", options="-c search_path=x")
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SELECT current_setting('application_name'), current_schemas(false)")
        assert row.fetchone() == ("ts-dsn-test", [])


def test_the_chaos_command_line_selects_parts_by_comma_separated_names() -> None:
    """``--only R6,r7`` picks those parts (any case), ``r1`` both R1 backends; an unknown name
    is a usage error naming the choices, before anything runs."""
    chaos_main = pytest.importorskip("benchmarks.chaos.__main__")

    assert chaos_main._parts("R6,r7") == {"r6", "r7"}
    assert chaos_main._parts("r1, R8") == {"r1-sqlite", "r1-postgres", "r8"}
    assert chaos_main._parts("R9,R10,r11, R12") == {"r9", "r10", "r11", "r12"}
    with pytest.raises(SystemExit) as exit_info:
        chaos_main.main(["--only", "R6,R13"])
    assert exit_info.value.code == 2


def test_the_r10_audit_tells_a_start_while_paused_from_a_claim_in_flight() -> None:
    """R10 reads the workers' timed lines (kind, item, version, detail, wall time): a start in a
    pause whose claim call began after ``pause_queue`` returned is a violation, one whose claim
    call began before is counted apart, and a claim call wholly inside a pause is a violation
    whether or not its item started. A lost lease ends the renewal gaps; caller calls parse."""
    from benchmarks.chaos.races import Timeline, _pause_figures

    timeline = Timeline()
    for line in (
        "claim-call\ta\t1\t9.0\t9.2",  # began before the pause returned (10.0): allowed
        "start\ta\t1\t10.5\t10.5",
        "claim-call\tb\t1\t10.2\t10.3",  # began after it returned: a violation
        "start\tb\t1\t10.4\t10.4",
        "claim-call\tc\t2\t10.6\t10.7",  # wholly inside the pause, not started
        "claim-call\t-\t-\t10.8\t10.9",  # a claim call that returned nothing
        "start\td\t1\t12.5\t12.5",  # after the resume was called (12.0)
        "renewed\ta\t1\tok\t11.4",
        "lease-lost\ta\t1\trenewal refused\t13.0",
        "call\tenqueue\t-\t12.5\tok\t20.0",
        "start\te\t1",  # cut short by SIGKILL
    ):
        timeline.feed("w0.0", line)
    figures = _pause_figures(timeline, [(9.8, 10.0, 12.0, 12.1)])
    assert figures["started_while_paused"] == 1
    assert figures["started_paused_claimed_before"] == 1
    assert figures["claimed_while_paused"] == 2
    assert figures["claim_calls_while_paused"] == 3
    assert timeline.leases_lost == 1
    assert timeline.longest_renewal_gap() == pytest.approx(2.2)
    assert timeline.calls == [("enqueue", 12.5, "ok", 20.0)]


def test_the_r9_audit_counts_each_item_once_and_says_why_one_ran_again() -> None:
    """R9 reads both generations' logs beside the database: a second accepted completion, a
    side effect done twice, an evaluation beyond the plan (with the errors logged for it), a
    parent with a child too many, an unfinished item, who finished what, the old workers'
    settlements after the migration and the most items of the limited key at once."""
    import collections

    from benchmarks.chaos.upgrade import UpgradeLog, audit

    plan = {
        "done": {"group": "completed", "kind": "complete", "expect": "completed", "starts": 0},
        "a": {"group": "now", "kind": "complete", "expect": "completed", "starts": 1},
        "b": {"group": "limited", "kind": "complete", "expect": "completed", "starts": 1},
        "c": {"group": "limited", "kind": "complete", "expect": "completed", "starts": 1},
        "p": {"group": "parent", "kind": "parent", "expect": "completed", "starts": 2, "fanout": 1},
        "q": {"group": "later", "kind": "complete", "expect": "completed", "starts": 1},
    }
    states = {"done": "completed", "a": "completed", "b": "completed", "c": "completed"}
    states |= {"p": "completed", "p.2.0": "completed", "p.2.1": "completed", "q": "queued"}
    parents = {"p.2.0": "p", "p.2.1": "p"}
    finishes = collections.Counter({("done", "completed"): 1, ("a", "completed"): 2})
    finishes |= {(item, "completed"): 1 for item in ("b", "c", "p", "p.2.0", "p.2.1")}
    old, new = UpgradeLog(), UpgradeLog()
    for line in (
        "library\t-\t-\t/tmp/old/trio_supervise\t1.0",
        "start\ta\t1\t9.0\t9.0",
        "outcome\ta\t1\tretry: PostgreSQL queue at postgresql://h/db?x=y: cached plan\t9.5",
        "settled\ta\t1\tretry\t9.6",
        "start\tb\t1\t10.0\t10.0",
        "end\tb\t1\t11.0\t11.0",
        "settled\tb\t1\tcomplete\t11.1",  # after the migration (10.2 - 10.4)
        "start\tp\t2\t9.1\t9.1",
        "fanout\tp\t2\t2\t9.2",
        "settled\tp\t2\tcontinue\t9.3",
        "start\tq\t1",  # cut short by SIGKILL
    ):
        old.feed("w0.0", line)
    for line in (
        "start\ta\t2\t12.0\t12.0",
        "end\ta\t2\t12.5\t12.5",
        "settled\ta\t2\tcomplete\t12.6",
        "start\tc\t1\t10.5\t10.5",
        "end\tc\t1\t11.5\t11.5",
        "settled\tc\t1\tcomplete\t11.6",
        "start\tp\t3\t13.0\t13.0",
        "fanin\tp\t3\t2/2\t13.1",
        "end\tp\t3\t13.2\t13.2",
        "settled\tp\t3\tcomplete\t13.3",
        "start\tp.2.0\t4\t12.0\t12.0",
        "end\tp.2.0\t4\t12.1\t12.1",
        "settled\tp.2.0\t4\tcomplete\t12.2",
    ):
        new.feed("w1.0", line)
    figures = audit(plan, states, parents, finishes, {"old": old, "new": new}, (10.2, 10.4))
    assert figures["items"] == 8  # the plan and the two children p made
    assert (figures["lost"], figures["lost_items"]) == (1, ["q"])
    assert figures["completed_twice"] == 1  # "a", by the database's count
    assert figures["effects_twice"] == 0
    assert list(figures["evaluated_twice_items"]) == ["a"]
    why = "outcome retry: PostgreSQL queue at <queue>: cached plan"  # the address left out
    assert figures["evaluated_twice_items"]["a"]["why"] == [why]
    assert figures["problems"] == {"old": {why: 1}, "new": {}}
    assert figures["children_wrong"] == 1  # p has two children, its plan says one
    assert figures["finished_by"] == {"setup": 1, "new": 4, "old": 1, "nobody": 2}
    assert figures["fanned_out_then_in_by"] == {"old->new": 1}
    assert figures["old_settled_after_migration"] == {"complete": 1}
    assert figures["old_in_flight_at_migration"] == 1  # b: begun at 10.0, settled at 11.1
    assert figures["key_most_running"] == 2  # b (10.0-11.0) and c (10.5-11.5) overlap
    assert figures["libraries"] == {"old": ["/tmp/old/trio_supervise"], "new": []}


def test_r9_says_why_the_previous_release_is_not_available(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the previous release's commit (or git, or a checkout), R9's library is a
    sentence saying why, never an exception."""
    from benchmarks.chaos import upgrade

    monkeypatch.setattr(upgrade, "OLD_RELEASE", "0" * 40)
    why = upgrade.old_library(tmp_path / "old")
    assert isinstance(why, str)
    assert why.startswith(("commit 0000", "git is not available", "/")), why
    assert not (tmp_path / "old").exists()


def test_chaos_metrics_are_read_from_the_exposition_or_said_missing() -> None:
    """The scenarios sum a metric's samples over labels, and say when a build lacks it."""
    from benchmarks.chaos.scenarios import _available, _metric

    text = (
        "# TYPE trio_supervise_settlements_refused_total counter\n"
        'trio_supervise_settlements_refused_total{spec="a"} 2.0\n'
        'trio_supervise_settlements_refused_total{spec="b"} 1.0\n'
    )
    assert _metric(text, "trio_supervise_settlements_refused_total") == 3.0
    assert _metric(text, "trio_supervise_event_loop_lag_seconds_count") is None
    assert _available(None) == "not available"
    assert _available(3.0) == 3


@pytest.mark.slow
def test_the_r7_scenario_finds_the_contracts_its_goal_relies_on() -> None:
    """R7's goal needs ``max_attempts`` and ``storable_text``; the check finds them in this
    build (it read a module the redesign removed, and crashed the chaos run)."""
    from benchmarks.chaos.scenarios import _contract

    assert _contract("max_attempts")
    assert _contract("storable_text")


def test_the_r8_scenario_counts_and_shows_every_refused_write(tmp_path: Path) -> None:
    """R8 (two worker processes, one blocking its loop past the lease) ends by itself with
    nothing lost, and its refused writes counted on /metrics as often as the log says."""
    from benchmarks.chaos.harness import SQLiteStore
    from benchmarks.chaos.scenarios import run_r8

    store = SQLiteStore(tmp_path, 6)
    try:
        figures = run_r8(store, tmp_path, tag="test", items=6, limit=60)
    finally:
        store.drop()
    assert (figures["lost"], figures["double_finalized"], figures["timed_out"]) == (0, 0, False)
    assert figures["refused_metric"] == figures["refused_in_log"]
    assert figures["lag_warning_on_status_page"] is True


def test_the_new_in_process_measures_report_the_documented_shape() -> None:
    """P9 and P10 on SQLite and P11 (renewal round, memory per in-flight item) run at tiny
    sizes and report one record each, numbers and ratio as documented; P5, retired from the
    goals, runs only when named."""
    results = benchmarks_main.run(Config(tiny=True), ["P9s", "P9hs", "P10s", "P11", "P11m"])
    records = benchmarks_main.as_json(results)
    assert set(records) == {"P9s", "P9hs", "P10s", "P11", "P11m"}
    for record in records.values():
        check_record(record)
    assert records["P9s"]["finished"] == 300
    assert str(records["P10s"]["path"]).startswith(("enqueue_many", "enqueue from"))
    assert "P5" in benchmarks_main.MEASURES
    assert "P5" not in benchmarks_main.DEFAULT


@pytest.mark.postgres
@pytest.mark.slow
def test_the_postgres_measures_run_against_the_test_server() -> None:
    """P6 (against a raw LISTEN/NOTIFY round trip), P8 (PgQueuer in a subprocess, in a database
    of its own), P9 and P10 on PostgreSQL run at tiny sizes on the test DSN and leave no
    benchmark database behind."""
    pytest.importorskip("pgqueuer")
    import psycopg

    from .queues.conftest import postgres_dsn

    dsn = postgres_dsn()
    only = ["P6", "P8", "P9p", "P9hp", "P10p"]
    records = benchmarks_main.as_json(benchmarks_main.run(Config(tiny=True, dsn=dsn), only))
    assert set(records) == set(only)
    for record in records.values():
        check_record(record)
    assert records["P8"]["pgqueuer_batch"] in (64, 200)
    # Our runner claims one batch ahead: its concurrency is twice its claim batch.
    assert records["P8"]["ours_concurrency"] == 2 * records["P8"]["ours_batch"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname LIKE 'bench_pgqueuer_%%'"
        ).fetchone()
    assert left == (0,)


def test_wal_is_attributed_to_the_database_and_the_transactions_that_touched_it() -> None:
    """A record counts when it touches the database's relations, or belongs to a transaction
    that did (its commit); other databases' records and shared records do not."""
    from benchmarks._cost import attributed_bytes

    lines = [
        "rmgr: Heap        len (rec/tot):     54/   100, tx:        7, lsn: 0/1, prev 0/0, "
        "desc: UPDATE, blkref #0: rel 1663/16384/16390 blk 0",
        "rmgr: Heap        len (rec/tot):     54/  1000, tx:        8, lsn: 0/2, prev 0/1, "
        "desc: UPDATE, blkref #0: rel 1663/99999/16390 blk 0",
        "rmgr: Transaction len (rec/tot):     34/    34, tx:        7, lsn: 0/3, prev 0/2, "
        "desc: COMMIT 2026-12-04",
        "rmgr: Transaction len (rec/tot):     34/    35, tx:        8, lsn: 0/4, prev 0/3, "
        "desc: COMMIT 2026-12-04",
        "rmgr: Standby     len (rec/tot):     50/    50, tx:        0, lsn: 0/5, prev 0/4, "
        "desc: RUNNING_XACTS",
    ]
    assert attributed_bytes(lines, 16384) == 134
    assert attributed_bytes(lines, 99999) == 1035


@pytest.mark.postgres
def test_the_server_cost_of_the_raw_floor_is_measured_per_item() -> None:
    """P8c's and P14's meter on the test server: the floor's CPU and WAL per item, attributed
    to its database when ``pg_waldump`` can read the server's WAL."""
    from benchmarks import postgres

    from .queues.conftest import postgres_dsn

    dsn, schema = postgres_dsn(), f"bench_cost_test_{os.getpid()}"
    costs: list[Any] = []
    with postgres.bench_schema(dsn, schema):
        postgres.floor_rate(dsn, schema, 300, costs=costs)
    (cost,) = costs
    figures = cost.per_item(300)
    assert figures["wal_scope"] in ("database", "cluster")
    if figures["wal_scope"] == "database":
        # Two updates of the row, their index entries and the claim's row locks.
        assert 300 < figures["wal_bytes"] < 20_000
    assert cost.worker_cpu >= 0
    assert cost.server_cpu >= 0


def test_profile_prints_a_pyinstrument_profile_of_one_measure(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--profile P1`` runs P1 alone under pyinstrument and prints the call tree, then the
    table; an unknown id is a usage error."""
    pytest.importorskip("pyinstrument")
    monkeypatch.setattr(
        benchmarks_main, "Config", lambda **kwargs: Config(**{**kwargs, "tiny": True})
    )
    assert benchmarks_main.main(["--profile", "P1"]) == 0
    out = capsys.readouterr().out
    assert "memory_runner_rate" in out
    assert "P1 " in out
    with pytest.raises(SystemExit) as exit_info:
        benchmarks_main.main(["--profile", "P99"])
    assert exit_info.value.code == 2


class _OneAtATime:
    """A queue that has ``enqueue`` but no ``enqueue_many`` (the memory queue underneath)."""

    def __init__(self) -> None:
        self.inner = MemoryQueue()

    async def enqueue(self, spec_id: str, **fields: Any) -> WorkItem:
        return await self.inner.enqueue(spec_id, **fields)


class _PickyBulkQueue(_OneAtATime):
    """A queue whose ``enqueue_many`` wants another entry shape."""

    async def enqueue_many(self, *, items: list[object]) -> None:
        raise AssertionError("never reached: the call itself is refused")


async def test_p10_uses_enqueue_many_when_the_queue_has_one() -> None:
    """P10's enqueue path picks up ``queue.enqueue_many`` by ``getattr`` and says so; without
    it, or when it refuses the entries before writing any, the items go in one at a time and the
    path says why."""
    from benchmarks.bulk import enqueue_all

    bulk = MemoryQueue()
    assert (await enqueue_all(bulk, 25)).startswith("enqueue_many")
    assert sum((await bulk.counts()).values()) == 25

    plain = _OneAtATime()
    assert (await enqueue_all(plain, 5)).endswith("(no enqueue_many yet)")  # type: ignore[arg-type]
    assert sum((await plain.inner.counts()).values()) == 5

    picky = _PickyBulkQueue()
    path = await enqueue_all(picky, 5)  # type: ignore[arg-type]
    assert path.startswith("enqueue_many refused the entries")
    assert sum((await picky.inner.counts()).values()) == 5


@pytest.mark.parametrize("dsn", DSNS)
def test_pgqueuer_gets_every_dsn_as_asyncpg_keywords(dsn: str) -> None:
    """P8's PgQueuer subprocess connects with asyncpg, which reads no ``key=value`` DSN: any
    valid DSN becomes asyncpg's keywords with host, port, user, password, database and sslmode
    as libpq reads them."""
    from psycopg.conninfo import conninfo_to_dict

    from benchmarks._pgqueuer import asyncpg_params

    params = conninfo_to_dict(dsn)
    kwargs = asyncpg_params(dsn)
    assert kwargs.get("host") == params.get("host")
    assert kwargs.get("user") == params.get("user")
    assert kwargs.get("password") == params.get("password")
    assert kwargs.get("database") == params.get("dbname")
    assert kwargs.get("ssl") == params.get("sslmode")
    assert kwargs.get("port") == (int(str(params["port"])) if "port" in params else None)


def test_machine_cpu_counts_the_cores_a_busy_loop_keeps_busy() -> None:
    """P7's ceiling reads the machine's busy cores over a stretch: a thread spinning for 0.3 s
    keeps at least most of one core busy, and no stretch shows more cores than the machine has."""
    import os
    import time

    from benchmarks._common import machine_cpu

    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat here")
    with machine_cpu() as cpu:
        deadline = time.perf_counter() + 0.3
        while time.perf_counter() < deadline:
            pass
    assert 0.5 <= cpu.cores <= (os.cpu_count() or 1) + 0.1


# -- benchmarks.instructions: the parts that run without valgrind ------------------------------


def test_a_callgrind_dump_is_read_by_its_summary_then_its_totals(tmp_path: Path) -> None:
    """A dump taken at a trigger has a ``totals:`` line that can exceed what was counted since
    the zeroing; the ``summary:`` line is that count. A file with only totals falls back."""
    from benchmarks.instructions import totals

    both = tmp_path / "both.out"
    both.write_text("events: Ir\nsummary: 589601587\nfn=(1) f\n1 5\ntotals: 622375912\n")
    assert totals(str(both)) == 589_601_587
    only = tmp_path / "only.out"
    only.write_text("events: Ir\nfn=(1) f\n1 5\ntotals: 1234\n")
    assert totals(str(only)) == 1234
    neither = tmp_path / "neither.out"
    neither.write_text("events: Ir\n")
    with pytest.raises(RuntimeError, match="neither"):
        totals(str(neither))


def test_instruction_ratios_are_the_counted_pairs_only() -> None:
    from benchmarks.instructions import ratios

    assert ratios({"P1": 90.0, "P1n": 99.0, "P4": 100.0, "P4r": 96.0}) == {
        "P1n / P1": pytest.approx(1.1),
        "P1 / P4": pytest.approx(0.9),
        "P1 / P4r": pytest.approx(0.9375),
        "P4r / P4": pytest.approx(0.96),
    }
    assert ratios({"P1": 90.0}) == {}


@pytest.mark.parametrize(
    ("workload", "size"),
    [("P1", 40), ("P1n", 40), ("P4", 2), ("P4r", 2), ("P3", 40), ("P3f", 40)],
)
def test_a_counted_child_marks_one_window_per_run(
    workload: str, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside valgrind the markers are plain libc calls; the child's workload runs with its
    timed window (the runner's start to its drain's end) entered once, and the module's window
    is what it was after the test, as is ``opentelemetry``'s import (the child blocks it)."""
    from benchmarks import _runs, instructions

    monkeypatch.setattr(_runs, "timed_window", _runs.timed_window)
    monkeypatch.setitem(sys.modules, "opentelemetry", sys.modules.get("opentelemetry"))
    entered = []
    counted = instructions._counted

    def spy() -> Any:
        entered.append(workload)
        return counted()

    monkeypatch.setattr(instructions, "_counted", spy)
    instructions.child(workload, size)
    assert entered == [workload]


def test_without_valgrind_the_count_says_so_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import instructions

    monkeypatch.setattr(instructions.shutil, "which", lambda name: None)
    assert instructions.main([]) == 2
    assert "valgrind is not installed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        instructions.main(["--only", "P9"])


def test_the_instructions_check_fails_past_five_percent_over_the_baseline() -> None:
    """``--check`` holds P1 and P4 to the committed baseline: 5% over passes, more fails,
    naming the workload, the growth and the file; a workload without a baseline fails too."""
    from benchmarks.instructions import load_baseline, over_baseline

    baseline = load_baseline()
    assert set(baseline) == {"P1", "P4"}
    assert over_baseline({"P1": baseline["P1"] * 1.05, "P4": baseline["P4"]}, baseline) == []
    [failure] = over_baseline({"P1": baseline["P1"] * 1.06}, baseline)
    assert failure.startswith("P1: ")
    assert "+6.0% over the baseline" in failure
    assert "instructions_baseline.json" in failure
    assert over_baseline({"P4r": 1.0}, baseline) == [
        "P4r: no baseline in benchmarks/instructions_baseline.json"
    ]


def test_the_durable_workflow_measure_reports_the_documented_shape() -> None:
    """P12s (durable workflow steps against the runner's items, SQLite) runs at a tiny size
    and reports one record, steps and items as documented."""
    results = benchmarks_main.run(Config(tiny=True), ["P12s"])
    records = benchmarks_main.as_json(results)
    assert set(records) == {"P12s"}
    check_record(records["P12s"])
    assert records["P12s"]["steps"] == records["P12s"]["workflows"] * 10
    assert "P12p" in benchmarks_main.NEEDS_DSN
