"""R9: a rolling upgrade, workers of the previous release running while the schema migrates.

The previous release is commit :data:`OLD_RELEASE`, the last landed before this one's schema
migrations (``TRIO_SUPERVISE_R9_FROM`` names another: ``5f6de71``, the last before the migration
that records item incarnations, SQLite ``0005``, PostgreSQL ``0008``). Its ``trio_supervise`` is
taken from this checkout's git history (``git archive``, the working tree untouched) into a
temporary directory; without git or that commit, R9 says "not available" and why.

On each backend (a SQLite file; a fresh PostgreSQL schema):

1. the previous release creates the schema at its version and fills the queue with items in
   every state (``upgrade_fill.py``: queued now and later, running under an expired lease,
   completed, cancelled, dead, parents waiting for queued children, keyed items);
2. two worker processes of the previous release (``worker.py --upgrade``, importing it) drain
   it: items complete, reschedule themselves, fan out children and wait for them, fail once;
3. once they have begun 40 evaluations, this release migrates the schema (``migrate``,
   timed), then two workers of this release start beside them, and one more of the previous
   release, which should be refused at start (the schema is newer than it knows);
4. once every item has finished, every process is stopped, and the database (a trigger on
   every move into a finished state) and every worker's log are audited.

Goal: 0 lost, 0 completed or finished twice, no completion's side effect done twice, no item
evaluated more often than its plan says, each parent's children created once and all counted
at its fan-in, the concurrency key's limit held across both releases, the late worker of the
previous release refused with a ``SchemaError`` naming both versions, and workers of both
releases settling items after the migration.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import trio

import trio_supervise as ts

from .harness import ROOT, Fleet, PostgresStore, SQLiteStore, Store, library_env
from .races import Tail
from .upgrade_fill import KEY_LIMIT

OLD_RELEASE = os.environ.get("TRIO_SUPERVISE_R9_FROM") or "6921817"
"""The previous release: the last landed before this release's migrations (SQLite 0011,
PostgreSQL 0014), or the commit ``TRIO_SUPERVISE_R9_FROM`` names."""
FILL = Path(__file__).with_name("upgrade_fill.py")
FINISHED = ("completed", "cancelled", "dead")
"""The finished states; also the filler's groups of items finished before any worker starts."""
MIGRATE_AFTER = 40
"""The old workers' evaluations begun before the migration starts."""
WORKER_ARGS = ["--upgrade", "--concurrency", "4", "--requeue-delay", "0.5"]
LATE = "w2.0"
"""The worker of the previous release started after the migration."""
_WHERE = re.compile(r"(PostgreSQL queue at |SQLite queue at |the queue schema at )\S+?(?=: | |$)")


def _text(detail: str) -> str:
    """An error text as one line of at most 200 characters, the queue's address left out (it
    names the worker), so that one error from several workers counts as one."""
    return _WHERE.sub(r"\1<queue>", detail)[:200]


def old_library(directory: Path) -> Path | str:
    """The previous release's ``trio_supervise``, extracted into *directory*, or why not."""
    here = Path(__file__).resolve().parent
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if top.returncode != 0:
            return f"{here} is not in a git checkout: {top.stderr.strip()}"
        archive = subprocess.run(
            ["git", "-C", top.stdout.strip(), "archive", OLD_RELEASE, "trio_supervise"],
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as error:
        return f"git is not available: {error}"
    if archive.returncode != 0:
        why = archive.stderr.decode(errors="replace").strip()
        return f"commit {OLD_RELEASE} is not in this checkout's history: {why}"
    directory.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(directory, filter="data")
    return directory


def _fill_with(library: Path, args: list[str]) -> str:
    """Run ``upgrade_fill.py`` with *args*, importing the library at *library*; its output."""
    done = subprocess.run(
        [sys.executable, str(FILL), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=library_env(library),
    )
    if done.returncode != 0:
        raise RuntimeError(f"upgrade_fill.py {args[1]} failed:\n{done.stderr[-3000:]}")
    return done.stdout


# -- what the workers logged -----------------------------------------------------------------------


Key = tuple[str, int]
"""An item id and a lease version: one claim."""


@dataclasses.dataclass
class UpgradeLog:
    """What one generation's workers logged (``worker.py --upgrade`` lines), fed line by line."""

    libraries: set[str] = dataclasses.field(default_factory=set)
    starts: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    by_worker: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    ends: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    """Completions' side effects (the driver about to return ``Stop``), by item."""
    spans: dict[Key, list[float]] = dataclasses.field(default_factory=dict)
    """Each evaluation's start and (once it ended in ``Stop``) end, in the wall clock."""
    completions: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    settled: dict[Key, tuple[str, float]] = dataclasses.field(default_factory=dict)
    """Each accepted settlement's kind and when it was logged."""
    fanouts: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    fanins: dict[str, str] = dataclasses.field(default_factory=dict)
    """Each parent's last fan-in: ``finished/children`` as its driver saw them."""
    trouble: dict[str, list[str]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list)
    )
    """What went wrong with each item, in order: a lost lease, a refused or failed write, an
    error that was not planned."""
    problems: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    """Every error that was not planned, by its text (claims, renewals and writes too)."""

    def feed(self, worker: str, line: str) -> None:
        parts = line.rstrip("\n").split("\t")
        if len(parts) < 5:
            return  # a line cut short
        kind, item, version, detail, stamp = *parts[:4], parts[-1]
        if kind == "library":
            self.libraries.add(detail)
            return
        if kind in ("claim-failed", "renewal-failed"):
            self.problems[f"{kind}: {_text(detail)}"] += 1
            return
        if not version.isdigit():
            return
        key = (item, int(version))
        if kind == "start":
            self.starts[item] += 1
            self.by_worker[worker] += 1
            self.spans[key] = [float(detail)]
        elif kind == "end":
            self.ends[item] += 1
            self.spans.setdefault(key, [float(detail)]).append(float(detail))
        elif kind == "fanout":
            self.fanouts[item] += 1
        elif kind == "fanin":
            self.fanins[item] = detail
        elif kind == "settled":
            self.settled[key] = (detail, float(stamp))
            if detail == "complete":
                self.completions[item] += 1
        elif kind == "outcome" and detail == "lease-lost":
            self.trouble[item].append("evaluation stopped: lease lost")
        elif kind == "outcome" and ": " in detail and "planned failure" not in detail:
            self.trouble[item].append(f"outcome {_text(detail)}")
            self.problems[f"outcome {_text(detail)}"] += 1
        elif kind in ("settle-refused", "settle-failed", "lease-lost"):
            self.trouble[item].append(f"{kind}: {_text(detail)}")
            self.problems[f"{kind}: {_text(detail)}"] += 1

    def read(self, lines: Iterable[tuple[str, str]]) -> None:
        for worker, line in lines:
            self.feed(worker, line)


def _most_at_once(spans: Iterable[list[float]]) -> int:
    """The most of these ``[start, end]`` spans that overlap at one instant."""
    edges = sorted(
        (at, step)
        for span in spans
        if len(span) == 2
        for at, step in zip(span, (1, -1), strict=True)
    )
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


# -- the audit -------------------------------------------------------------------------------------


def audit(
    plan: dict[str, dict[str, Any]],
    states: dict[str, str],
    parents: dict[str, str],
    finishes: collections.Counter[tuple[str, str]],
    logs: dict[str, UpgradeLog],
    migration: tuple[float, float],
) -> dict[str, Any]:
    """R9's figures: *plan* (the filler's, by item), the items' final *states* and *parents*
    (by child), the database's *finishes* (see ``Store.finishes``), each generation's log, and
    when the migration began and ended (wall clock)."""
    expected = dict(plan)
    for child, parent in parents.items():
        if child not in expected and plan.get(parent, {}).get("kind") == "parent":
            expected[child] = {"group": "child", "expect": "completed", "starts": 1}
    gens = list(logs.values())
    lost = sorted(i for i in expected if states.get(i) not in FINISHED)
    wrong = sorted(i for i, e in expected.items() if i not in lost and states[i] != e["expect"])
    per_item = collections.Counter(i for (i, _), n in finishes.items() for _ in range(n))
    db_twice = {i for (i, state), n in finishes.items() if state == "completed" and n > 1}
    log_twice = {i for i in expected if sum(g.completions[i] for g in gens) > 1}
    twice = {}
    for item, entry in expected.items():
        starts = sum(g.starts[item] for g in gens)
        if starts > entry["starts"]:
            why = [t for g in gens for t in g.trouble.get(item, [])]
            twice[item] = {
                "starts": starts,
                "planned": entry["starts"],
                "why": why or ["nothing refused, lost or failed was logged"],
            }
    children_wrong = []
    crossings: collections.Counter[str] = collections.Counter()
    for parent, entry in plan.items():
        if entry["kind"] != "parent":
            continue
        out = "+".join(name for name, g in logs.items() if g.fanouts[parent]) or "setup"
        back = "+".join(name for name, g in logs.items() if g.completions[parent]) or "nobody"
        crossings[f"{out}->{back}"] += 1
        kids = sum(1 for p in parents.values() if p == parent)
        fanouts = sum(g.fanouts[parent] for g in gens)
        fanin = next((g.fanins[parent] for g in gens if parent in g.fanins), None)
        want = entry["fanout"]
        planned_fanouts = 1 if entry["group"] == "parent" else 0
        if kids != want or fanouts != planned_fanouts or fanin != f"{want}/{want}":
            children_wrong.append(
                f"{parent}: {kids} children (want {want}), fanned out {fanouts} times "
                f"(want {planned_fanouts}), last fan-in saw {fanin} finished (want {want}/{want})"
            )
    finished_by: collections.Counter[str] = collections.Counter()
    for item, entry in expected.items():
        if entry["group"] in FINISHED:
            finished_by["setup"] += 1
            continue
        by = [name for name, g in logs.items() if g.completions[item]]
        finished_by["+".join(by) if by else "nobody"] += 1
    began, ended = migration
    old = logs.get("old", UpgradeLog())
    after = collections.Counter(kind for kind, at in old.settled.values() if at > ended)
    in_flight = sum(
        1
        for key, span in old.spans.items()
        if span[0] < began and (key not in old.settled or old.settled[key][1] > began)
    )
    limited = [
        span
        for g in gens
        for (i, _), span in g.spans.items()
        if plan.get(i, {}).get("group") == "limited"
    ]
    return {
        "items": len(expected),
        "children_created": len(parents),
        "states": dict(collections.Counter(states.values())),
        "lost": len(lost),
        "lost_items": lost[:10],
        "wrong_state": len(wrong),
        "wrong_state_items": wrong[:10],
        "completed_twice": max(len(db_twice), len(log_twice)),
        "finished_twice": sum(1 for n in per_item.values() if n > 1),
        "effects_twice": sum(1 for i in expected if sum(g.ends[i] for g in gens) > 1),
        "evaluated_twice": len(twice),
        "evaluated_twice_items": dict(sorted(twice.items())[:10]),
        "children_wrong": len(children_wrong),
        "children_wrong_items": children_wrong[:10],
        "finished_by": dict(finished_by),
        "fanned_out_then_in_by": dict(crossings),
        "evaluations": {name: sum(g.starts.values()) for name, g in logs.items()},
        "old_in_flight_at_migration": in_flight,
        "old_settled_after_migration": dict(after),
        "key_most_running": _most_at_once(limited),
        "key_limit": KEY_LIMIT,
        "problems": {name: dict(g.problems.most_common(10)) for name, g in logs.items()},
        "libraries": {name: sorted(g.libraries) for name, g in logs.items()},
    }


# -- one run ---------------------------------------------------------------------------------------


_NEXT_VERSION = {
    "sqlite": "SELECT next_version FROM trio_supervise_counters",
    "postgres": "SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END "
    "FROM trio_supervise_lease_versions",
}
"""The next lease version this release's claims draw (schema 0005 / 0008)."""


def versions_ahead(store: Store) -> dict[str, int] | None:
    """How many items hold a lease version that this release's counter has yet to hand out
    (it may hand it to a new incarnation of their id), and the counter's next value; None
    before the migration."""
    try:
        [(next_version,)] = store.query(_NEXT_VERSION[store.name])
    except Exception:
        return None
    [(ahead,)] = store.query(
        f"SELECT count(*) FROM trio_supervise_items WHERE lease_version >= {int(next_version)}"
    )
    return {"items": int(ahead), "next_version": int(next_version)}


def _last_error(stderr: Path) -> str:
    """The line of *stderr* that names a ``SchemaError``, else its last line ('' if none)."""
    lines = [line.strip() for line in stderr.read_text(errors="replace").splitlines()]
    lines = [line for line in lines if line]
    named = [line for line in lines if "SchemaError" in line]
    return (named or lines or [""])[-1][:400]


class _Watch:
    """Polls the fleets' processes: which exited, with what code, and when (none restarted)."""

    def __init__(self, fleets: dict[str, Fleet]) -> None:
        self._fleets = fleets
        self.exits: dict[tuple[str, int], int] = {}

    def poll(self) -> None:
        for name, fleet in self._fleets.items():
            for slot in fleet.slots:
                if slot.proc is not None and (name, slot.index) not in self.exits:
                    code = slot.proc.poll()
                    if code is not None:
                        self.exits[name, slot.index] = code

    def wait(self, done: Callable[[], bool], limit: float) -> bool:
        """Poll until *done* or *limit* seconds; whether it timed out."""
        deadline = time.perf_counter() + limit
        while not done():
            self.poll()
            if time.perf_counter() > deadline:
                return True
            time.sleep(0.05)
        self.poll()
        return False


def run_r9(
    store: Store,
    directory: Path,
    *,
    plan: dict[str, dict[str, Any]],
    library: Path,
    before: int,
    tag: str,
    limit: float,
) -> dict[str, Any]:
    """Old workers drain *store* (filled by the release at *library*, schema *before*); this
    release migrates it and joins; see the module doc."""
    fleets = {
        "old": Fleet(
            store,
            directory / "old",
            0.4,
            tag=f"{tag}o",
            workers=3,
            args=WORKER_ARGS,
            library=library,
        ),
        "new": Fleet(store, directory / "new", 0.4, tag=f"{tag}n", workers=2, args=WORKER_ARGS),
    }
    tails = {name: Tail(fleet.directory_logs) for name, fleet in fleets.items()}
    logs = {name: UpgradeLog() for name in fleets}
    watch = _Watch(fleets)

    def read() -> None:
        for name, tail in tails.items():
            logs[name].read(tail.read())

    def begun() -> int:
        read()
        return sum(logs["old"].starts.values())

    def drained() -> bool:
        states = store.item_states()
        return all(state in FINISHED for state in states.values()) and all(
            states.get(item) in FINISHED for item in plan
        )

    migration_error = None
    after = None
    started = time.perf_counter()
    try:
        fleets["old"].start([0, 1])
        watch.wait(lambda: begun() >= MIGRATE_AFTER, 30.0)
        url = store.worker_url(f"chaos-{tag}-migrate")
        began, clock = time.time(), time.perf_counter()
        try:
            after = trio.run(ts.migrate, url)
        except Exception as error:
            migration_error = f"{type(error).__name__}: {error}"
        migration_seconds = time.perf_counter() - clock
        migration = (began, time.time())
        fleets["new"].start()
        fleets["old"].start([2])
        timed_out = watch.wait(drained, limit)
        watch.wait(lambda: ("old", 2) in watch.exits, 10.0)
        seconds = time.perf_counter() - started
    finally:
        for fleet in fleets.values():
            fleet.stop()
    read()
    figures = audit(plan, store.item_states(), store.parents(), store.finishes(), logs, migration)
    ahead = versions_ahead(store)
    late_log = fleets["old"].directory_logs
    code = watch.exits.get(("old", 2))
    message = _last_error(late_log / f"{LATE}.stderr")
    figures.update(
        {
            "schema_versions": [before, after],
            "versions_ahead_of_counter": None if ahead is None else ahead["items"],
            "next_version": None if ahead is None else ahead["next_version"],
            "migration_seconds": round(migration_seconds, 3),
            "migration_error": migration_error,
            "late_old_worker": {
                "exit_code": code,
                "refused": code not in (None, 0) and "SchemaError" in message,
                "names_versions": f"version {before}" in message and f"version {after}" in message,
                "message": message,
                "evaluations": logs["old"].by_worker[LATE],
            },
            "unexpected_exits": [
                f"{name} w{index}: exited {code}: "
                f"{_last_error(fleets[name].directory_logs / f'w{index}.0.stderr')}"
                for (name, index), code in sorted(watch.exits.items())
                if (name, index) != ("old", 2)
            ],
            "expected_library": {
                "old": str(library / "trio_supervise"),
                "new": str(ROOT / "trio_supervise"),
            },
            "timed_out": timed_out,
            "seconds": round(seconds, 2),
        }
    )
    return figures


def run_part(
    part: str, kind: str, quick: bool, base: Path, *, dsn: str, tag: str, log: Any
) -> dict[str, Any]:
    """R9 on a fresh *kind* store, bounded; its figures (or why it is not available)."""
    directory = base / f"{part}-{kind}"
    library = old_library(directory / "previous")
    if isinstance(library, str):
        log(f"R9 {kind}: not available ({library})")
        return {"skipped": f"not available: {library}"}
    run_tag = f"{tag}{part}{kind[0]}"
    plan_path = directory / "plan.json"
    versions: list[int] = []

    def build(url: str, add_audit: Callable[[], None]) -> None:
        versions.append(int(_fill_with(library, [url, "schema"]).split()[-1]))
        add_audit()
        _fill_with(library, [url, "fill", str(plan_path), "1" if quick else "3"])

    log(
        f"R9 {kind}: the previous release ({OLD_RELEASE}) fills a queue, migrated under its workers"
    )
    store = (
        SQLiteStore(directory, 0, build=build)
        if kind == "sqlite"
        else PostgresStore(dsn, 0, run_tag, build=build)
    )
    try:
        figures = run_r9(
            store,
            directory,
            plan=json.loads(plan_path.read_text()),
            library=library,
            before=versions[0],
            tag=run_tag,
            limit=45 if quick else 120,
        )
    finally:
        store.drop()
    log(f"R9 {kind}: done in {figures['seconds']} s")
    return figures


def goals(report: dict[str, Any]) -> list[str]:
    """Every R9 goal the report misses, as a sentence."""
    missed = []
    for name, figures in report.get("r9", {}).items():
        if "skipped" in figures:
            continue
        where = f"R9 {name}"
        for key in (
            "lost",
            "wrong_state",
            "completed_twice",
            "finished_twice",
            "effects_twice",
            "evaluated_twice",
            "children_wrong",
        ):
            if figures[key] != 0:
                missed.append(f"{where}: {key} = {figures[key]} (goal 0)")
        if figures["key_most_running"] > figures["key_limit"]:
            missed.append(
                f"{where}: {figures['key_most_running']} items of one concurrency key ran at once "
                f"(limit {figures['key_limit']})"
            )
        late = figures["late_old_worker"]
        if not (late["refused"] and late["names_versions"]):
            missed.append(
                f"{where}: the old worker started after the migration was not refused with a "
                f"SchemaError naming both versions (exit {late['exit_code']}, "
                f"{late['evaluations']} evaluations): {late['message']!r}"
            )
        if not figures["old_settled_after_migration"]:
            missed.append(f"{where}: no old worker settled anything after the migration")
        if not figures["evaluations"].get("new"):
            missed.append(f"{where}: the new workers evaluated nothing")
        for generation, want in figures["expected_library"].items():
            if figures["libraries"].get(generation) != [want]:
                missed.append(
                    f"{where}: {generation} workers imported {figures['libraries'].get(generation)}"
                    f" (want {want})"
                )
        for key in ("versions_ahead_of_counter", "migration_error", "timed_out"):
            if figures[key]:
                missed.append(f"{where}: {key} = {figures[key]}")
        missed += [f"{where}: {text}" for text in figures["unexpected_exits"]]
    return missed
