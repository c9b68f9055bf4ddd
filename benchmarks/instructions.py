"""Instructions per item, counted by valgrind's callgrind: P1 and P4 without the machine's noise.

``python -m benchmarks.instructions [--json PATH] [--only P1,P1n,P4,P4r]``

A wall-clock run of P4 on a shared 2-core machine swung 0.64 to 1.09 on one tree within an
hour, its baseline and itself each by 15% from run to run, so the quick run's figure cannot say
on which side of its 0.9 a change puts it. Instructions executed can: callgrind counts them
exactly, the same for the same code and inputs whatever the machine is doing. They are not
time (a cache miss costs more than an add), but a change that removes work shows at once.

Each workload runs in a child process under ``valgrind --tool=callgrind``, at two sizes, and only
the timed window counts (the runner's start to its drain's end, as the wall-clock measures time
it; see :data:`benchmarks._runs.timed_window`): the window is marked by calls of two libc
functions nothing else here calls (``srand48`` zeroes the counts, ``drand48`` dumps them). The
difference between the sizes, divided by the difference in items, is the cost of one item with
the setup, the start and the drain cancelled out:

- ``P1``: the memory-queue runner, no-op, 2,000 and 6,000 items (per item);
- ``P1n``: P1's baseline, the same no-op in a bare Trio nursery, 64 at a time (per item);
- ``P4``: 1,000 daily workflows under the autojump clock, 3 and 8 days (per evaluation);
- ``P4r``: the same steps under the real clock, each due 1 us after the last (per evaluation);
- ``P3`` and ``P3f``, only when named: P3's runner on a SQLite file and its raw floor, 2,000 and
  6,000 items (per item: every thread of the process, SQLite's own work included).

The ratios printed are P1's measure in instructions (``P1n / P1``, higher is better, as P1's
items per second against the nursery's), P4's (``P1 / P4``), the same against the real-clock
twin (``P1 / P4r``: the reschedule's work without time travel), what time travel itself costs
(``P4r / P4``), and P3's ratio in instructions (``P3f / P3``). Needs Linux with glibc and
valgrind (Debian's ``valgrind`` package); about two minutes on two cores. Hash seeds are fixed
(``PYTHONHASHSEED=0``), so a second run of the same tree prints about the same counts: within
0.1% for P1, 0.5% for P4 (94,500 to 95,000 in five counts of one tree; what the run does still
depends a little on the process's memory layout).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import ctypes
import ctypes.util
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence

from ._common import child_env

WORKLOADS: dict[str, tuple[int, int, int, str]] = {
    # id: (small size, large size, items per unit of size, what one item is)
    "P1": (2_000, 6_000, 1, "item"),
    "P1n": (2_000, 6_000, 1, "item"),
    "P4": (3, 8, 1_000, "evaluation"),
    "P4r": (3, 8, 1_000, "evaluation"),
    "P3": (2_000, 6_000, 1, "item"),
    "P3f": (2_000, 6_000, 1, "item"),
}
NAMED_ONLY = frozenset({"P3", "P3f"})
"""Counted only when named (``--only P3,P3f``): P3's runner on a SQLite file and its raw floor,
both threads of the process, SQLite's own work included (about two minutes more)."""
_ZERO = "*srand48*"
_DUMP = "*drand48*"


def _libc() -> ctypes.CDLL:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else ctypes.CDLL(None)


@contextlib.contextmanager
def _counted() -> Iterator[None]:
    """The timed window for callgrind: counts zeroed on entry, dumped on exit (both calls are
    no-ops outside valgrind). The functions are looked up before, so the lookup is not counted."""
    libc = _libc()
    zero, dump = libc.srand48, libc.drand48
    zero(0)
    try:
        yield
    finally:
        dump()


def child(workload: str, size: int) -> None:
    """Run *workload* at *size* with its timed window marked (in the process valgrind runs).

    As without the ``otel`` extra, whatever is installed: ``opentelemetry`` cannot be imported
    here (the baseline counts a runner with no tracer), so nobody uninstalls it to measure.
    """
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]
    from . import _runs, memory, sqlite

    _runs.timed_window = _counted
    if workload == "P1":
        memory.memory_runner_rate(size)
    elif workload == "P1n":
        memory.bare_nursery_rate(size)
    elif workload in ("P3", "P3f"):
        with tempfile.TemporaryDirectory(prefix="trio_supervise_bench_") as directory:
            if workload == "P3":
                sqlite.runner_rate(directory, size)
            else:
                sqlite.floor_rate(directory, size)
    else:
        memory.time_travel(1_000, size, travel=workload == "P4")


def count(workload: str, size: int, directory: str) -> int:
    """Instructions in *workload*'s timed window at *size*, from one callgrind run."""
    out = os.path.join(directory, f"{workload}-{size}.out")
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--zero-before={_ZERO}",
        f"--dump-before={_DUMP}",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        "benchmarks.instructions",
        "--child",
        workload,
        str(size),
    ]
    env = {**child_env(), "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{workload} at {size} failed under valgrind: {done.stderr[-2000:]}")
    dumps = sorted(glob.glob(f"{out}.*"), key=lambda path: int(path.rsplit(".", 1)[1]))
    if not dumps:
        raise RuntimeError(
            f"{workload} at {size}: callgrind wrote no dump at {_DUMP} (not glibc?); "
            f"files: {os.listdir(directory)}"
        )
    return totals(dumps[0])


def totals(path: str) -> int:
    """The instructions of a callgrind dump: its ``summary:`` line (the events counted since
    the counts were zeroed). Its ``totals:`` line can be larger in a dump taken at a trigger
    while a zeroed-at frame is still running (33M more in one dump of P1, of 590M), so it is
    read only when a file has no summary."""
    found: dict[str, int] = {}
    with open(path, encoding="utf-8", errors="replace") as file:
        for line in file:
            for key in ("summary:", "totals:"):
                if line.startswith(key) and key not in found:
                    found[key] = int(line.split()[1])
    for key in ("summary:", "totals:"):
        if key in found:
            return found[key]
    raise RuntimeError(f"{path}: neither a summary nor a totals line")


def per_item(workloads: Sequence[str]) -> dict[str, float]:
    """Instructions per item (or evaluation) of each of *workloads*; two runs at a time."""
    with tempfile.TemporaryDirectory(prefix="trio_supervise_callgrind_") as directory:
        jobs = [(w, size) for w in workloads for size in WORKLOADS[w][:2]]
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            counted = dict(
                zip(jobs, pool.map(lambda job: count(*job, directory), jobs), strict=True)
            )
    result = {}
    for w in workloads:
        small, large, unit, _ = WORKLOADS[w]
        result[w] = (counted[w, large] - counted[w, small]) / ((large - small) * unit)
    return result


def ratios(counts: dict[str, float]) -> dict[str, float]:
    """The ratios the counts give (those whose two sides were counted)."""
    pairs = {
        "P1n / P1": ("P1n", "P1"),
        "P1 / P4": ("P1", "P4"),
        "P1 / P4r": ("P1", "P4r"),
        "P4r / P4": ("P4r", "P4"),
        "P3f / P3": ("P3f", "P3"),
    }
    return {
        name: counts[top] / counts[bottom]
        for name, (top, bottom) in pairs.items()
        if top in counts and bottom in counts
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.instructions", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--json", metavar="PATH", help="also write the counts as JSON here")
    parser.add_argument("--only", help=f"comma-separated workloads of {', '.join(WORKLOADS)}")
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"exit 1 when a count is more than {GROWTH_ALLOWED:.0%} over its baseline "
        f"(benchmarks/{BASELINE_FILE})",
    )
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        workload, size = args.child
        if workload not in WORKLOADS:
            parser.error(f"unknown workload {workload}")
        child(workload, int(size))
        return 0
    workloads = [w for w in WORKLOADS if w not in NAMED_ONLY]
    if args.only:
        workloads = [part.strip() for part in args.only.split(",") if part.strip()]
        unknown = sorted(set(workloads) - set(WORKLOADS))
        if unknown:
            parser.error(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    if shutil.which("valgrind") is None:
        print(
            "valgrind is not installed (Debian: apt-get install valgrind); nothing counted",
            file=sys.stderr,
        )
        return 2
    counts = per_item(workloads)
    for w, value in counts.items():
        print(f"{w:4}  {value:9,.0f} instructions per {WORKLOADS[w][3]}")
    found = ratios(counts)
    for name, value in found.items():
        print(f"{name:9} {value:.3f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump({"per_item": counts, "ratios": found}, file, indent=2)
            file.write("\n")
    if args.check:
        failures = over_baseline(counts, load_baseline())
        for line in failures:
            print(line, file=sys.stderr)
        return 1 if failures else 0
    return 0


BASELINE_FILE = "instructions_baseline.json"
"""The committed counts a change is held to (beside this module): updated on purpose, with the
reason in the commit, never to make a check pass."""
GROWTH_ALLOWED = 0.05
"""How far over its baseline a count may go before ``--check`` fails."""


def load_baseline() -> dict[str, float]:
    """The committed baseline counts, per workload."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), BASELINE_FILE)
    with open(path, encoding="utf-8") as file:
        document = json.load(file)
    baseline: dict[str, float] = document["per_item"]
    return baseline


def over_baseline(counts: dict[str, float], baseline: dict[str, float]) -> list[str]:
    """One line per workload counted more than :data:`GROWTH_ALLOWED` over *baseline* (a
    workload with no baseline is one too: the file says what is held)."""
    failures = []
    for workload, count in counts.items():
        base = baseline.get(workload)
        if base is None:
            failures.append(f"{workload}: no baseline in benchmarks/{BASELINE_FILE}")
        elif count > base * (1 + GROWTH_ALLOWED):
            failures.append(
                f"{workload}: {count:,.0f} instructions per {WORKLOADS[workload][3]}, "
                f"{count / base - 1:+.1%} over the baseline {base:,.0f} "
                f"(at most {GROWTH_ALLOWED:+.0%}); find what the change added, or update "
                f"benchmarks/{BASELINE_FILE} on purpose, saying why in the commit"
            )
    return failures


if __name__ == "__main__":
    sys.exit(main())
