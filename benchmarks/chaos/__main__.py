"""``python -m benchmarks.chaos [--quick] [--json PATH] [--dsn DSN]``: run, print, exit.

Exits 0 whether or not the goals are met (a missed goal is printed loudly, and recorded in the
JSON); a non-zero exit means the harness itself failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .harness import run_all

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
PARTS = ("r1-sqlite", "r1-postgres", "r2")
R3_HINT = (
    "R3 (the queue state machine at a high example count): "
    "TRIO_SUPERVISE_MODEL_EXAMPLES=2000 TRIO_SUPERVISE_TEST_DSN=... "
    "pytest tests/queues/test_state_machine.py -k long"
)


def _print_table(report: dict[str, Any]) -> None:
    for name, figures in report["r1"].items():
        if "skipped" in figures:
            print(f"R1 {name}: skipped ({figures['skipped']})")
            continue
        print(
            f"R1 {name:8}  items {figures['items']}  completed {figures['completed']}  "
            f"lost {figures['lost']}  double_finalized {figures['double_finalized']}  "
            f"stale_refused {figures['stale_refused']}  evaluations {figures['evaluations']}  "
            f"throughput_ratio {figures['throughput_ratio']}  "
            f"(calm {figures['calm_seconds']} s, chaos {figures['chaos_seconds']} s, "
            f"{figures['kills']} kills, {figures['pauses']} pauses)"
        )
    r2 = report.get("r2")
    if r2 is not None:
        if "skipped" in r2:
            print(f"R2 postgres: skipped ({r2['skipped']})")
        else:
            stop = r2["server_stop"]
            where = (
                f"server down {stop['window_seconds']} s"
                if stop
                else f"no server stop ({r2['server_stop_skipped']})"
            )
            print(
                f"R2 postgres  items {r2['items']}  completed {r2['completed']}  "
                f"lost {r2['lost']}  double_finalized {r2['double_finalized']}  "
                f"degraded_seen {str(r2['degraded_seen']).lower()}  "
                f"recovered {str(r2['recovered']).lower()}  "
                f"({r2['terminations']} termination rounds, {r2['backends_terminated']} "
                f"backends terminated, {where}, {r2['seconds']} s)"
            )
    print(R3_HINT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1,000 items instead of 10,000")
    parser.add_argument("--json", metavar="PATH", help="also write the figures here")
    parser.add_argument(
        "--dsn",
        default=os.environ.get("TRIO_SUPERVISE_TEST_DSN", DEFAULT_DSN),
        help="PostgreSQL (default: $TRIO_SUPERVISE_TEST_DSN or %(default)s)",
    )
    parser.add_argument(
        "--only", action="append", choices=PARTS, help="run only this part (repeatable)"
    )
    parser.add_argument("--items", type=int, help="override the item count")
    parser.add_argument(
        "--server-stop",
        type=float,
        metavar="SECONDS",
        help="R2: how long the PostgreSQL server stays down (default 3 quick, 5 full; 0: never)",
    )
    args = parser.parse_args(argv)
    window = args.server_stop if args.server_stop is not None else (3.0 if args.quick else 5.0)
    began = time.perf_counter()

    def log(text: str) -> None:
        print(f"[{time.perf_counter() - began:6.1f}s] {text}", flush=True)

    report = run_all(
        quick=args.quick,
        dsn=args.dsn,
        only=set(args.only or PARTS),
        stop_window=window or None,
        items=args.items,
        log=log,
    )
    _print_table(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    if report["missed"]:
        bar = "!" * 72
        print(f"\n{bar}\nCHAOS GOALS MISSED:", file=sys.stderr)
        for line in report["missed"]:
            print(f"  - {line}", file=sys.stderr)
        print(bar, file=sys.stderr)
    else:
        print("all chaos goals met")
    print(f"wall time {report['wall_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
