"""``python -m benchmarks.chaos [--quick] [--json PATH] [--dsn DSN] [--only R10,R11,R12]``.

Runs the chosen parts (all by default), prints their figures, exits. ``--only`` takes part names
separated by commas (or repeated), case-insensitive: ``r1-sqlite``, ``r1-postgres``, ``r1``
(both), ``r2`` (stops the PostgreSQL server: never on a shared one), ``r6``, ``r7``, ``r8``,
``r9``, ``r10``, ``r11``, ``r12``.

Exits 0 whether or not the goals are met (a missed goal is printed loudly, and recorded in the
JSON); a non-zero exit means the harness itself failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .harness import run_all

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
PARTS = ("r1-sqlite", "r1-postgres", "r2", "r6", "r7", "r8", "r9", "r10", "r11", "r12")
ALIASES = {"r1": ("r1-sqlite", "r1-postgres")}
R3_HINT = (
    "R3 (the queue state machine at a high example count): "
    "TRIO_SUPERVISE_MODEL_EXAMPLES=2000 TRIO_SUPERVISE_TEST_DSN=... "
    "pytest tests/queues/test_conformance.py -k model_long"
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
    _print_scenarios(report)
    print(R3_HINT)


def _parts(text: str) -> set[str]:
    """``"R6,r7"`` → ``{"r6", "r7"}``; an unknown name is an argparse error naming the choices."""
    chosen: set[str] = set()
    for name in text.lower().replace(" ", "").split(","):
        if name in ALIASES:
            chosen.update(ALIASES[name])
        elif name in PARTS:
            chosen.add(name)
        elif name:
            raise argparse.ArgumentTypeError(
                f"unknown part {name!r} (choose from {', '.join(PARTS)}, r1)"
            )
    if not chosen:
        raise argparse.ArgumentTypeError("no part named")
    return chosen


def _ran(report: dict[str, Any], part: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The backends *part* ran on, with their figures; the skipped ones are printed as such."""
    for name, figures in report.get(part, {}).items():
        if "skipped" in figures:
            print(f"{part.upper()} {name}: skipped ({figures['skipped']})")
        else:
            yield name, figures


def _print_scenarios(report: dict[str, Any]) -> None:
    for name, figures in _ran(report, "r6"):
        print(
            f"R6 {name:8}  history {figures['history_rows']}  items {figures['items']}  "
            f"completed {figures['completed']}  lost {figures['lost']}  "
            f"leases_lost {figures['leases_lost']}  evaluated_twice {figures['evaluated_twice']}  "
            f"requests {figures['requests']} {figures['statuses']}  "
            f"p50 {figures['latency_p50_seconds']} s  p99 {figures['latency_p99_seconds']} s  "
            f"({figures['clients']} clients, {figures['seconds']} s)"
        )
    for name, figures in _ran(report, "r7"):
        print(
            f"R7 {name:8}  batch-mates completed {figures['mates_completed']} of "
            f"{figures['items'] - 1} in {figures['mates_evaluations']} evaluations  "
            f"poison {figures['poison_state']} after {figures['poison_claims']} claims "
            f"(attempt {figures['poison_attempt']}, errors {figures['poison_error_count']}, "
            f"max_attempts {figures['max_attempts']}"
            f"{'' if figures['max_attempts_available'] else ' not available: max_errors used'}"
            f")  storable_text "
            f"{'available' if figures['storable_text_available'] else 'not available'}  "
            f"last_error {figures['poison_last_error']}  ({figures['seconds']} s)"
        )
    r8 = report.get("r8")
    if r8 is not None:
        print(
            f"R8 sqlite    items {r8['items']}  completed {r8['completed']}  lost {r8['lost']}  "
            f"double_finalized {r8['double_finalized']}  evaluated_twice {r8['evaluated_twice']}  "
            f"refused log {r8['refused_in_log']} metric {r8['refused_metric']}  "
            f"lease_lost_at_renewal {r8['lease_lost_at_renewal']}  "
            f"on status page: refusal {str(r8['refusal_on_status_page']).lower()} "
            f"lag warning {str(r8['lag_warning_on_status_page']).lower()}  "
            f"lag observations {r8['lag_observations']} total {r8['lag_seconds_total']} s  "
            f"(blocked {r8['block_seconds']} s, {r8['seconds']} s)"
        )
    _print_r9(report)
    _print_races(report)


R9_FIGURES = (
    "items lost wrong_state completed_twice finished_twice effects_twice evaluated_twice "
    "children_created children_wrong fanned_out_then_in_by key_most_running key_limit "
    "finished_by evaluations "
    "schema_versions migration_seconds old_in_flight_at_migration old_settled_after_migration "
    "versions_ahead_of_counter seconds"
)
"""The figures printed per R9 run, in order, as ``name value`` (all are in the JSON)."""


def _print_r9(report: dict[str, Any]) -> None:
    for name, figures in _ran(report, "r9"):
        shown = "  ".join(f"{key} {figures[key]}" for key in R9_FIGURES.split())
        print(f"R9 {name:8}  {shown}")
        late = figures["late_old_worker"]
        print(
            f"    old worker started after the migration: exit {late['exit_code']}, "
            f"{late['evaluations']} evaluations: {late['message']}"
        )
        for generation, problems in figures["problems"].items():
            for text, count in problems.items():
                print(f"    {generation} workers, {count}x: {text}")
        for item, why in figures["evaluated_twice_items"].items():
            print(f"    evaluated twice: {item}: {why}")


RACE_FIGURES = {
    "r10": (
        "items completed cancelled lost finished_twice completed_twice started_while_paused "
        "claimed_while_paused claim_calls_while_paused started_paused_claimed_before cancels "
        "cancel_found cancels_raced_completion cancels_delivered_running completions_overridden "
        "pauses paused_seconds seconds"
    ),
    "r11": (
        "items completed lost leases_lost evaluated_twice claimed_twice completed_twice seconds"
    ),
    "r12": (
        "items completed lost leases_lost evaluated_twice pool_connections_waiting_on_lock pool "
        "http seconds"
    ),
}
"""The figures printed per R10-R12 run, in order, as ``name value`` (all are in the JSON)."""


def _print_races(report: dict[str, Any]) -> None:
    for part, names in RACE_FIGURES.items():
        for backend, figures in _ran(report, part):
            shown = "  ".join(f"{name} {figures[name]}" for name in names.split())
            print(f"{part.upper()} {backend:8}  {shown}")
            for phase, calls in figures.get("calls", {}).items():
                print(f"    {phase}: {calls}")
            for step in figures.get("steps", ()):
                print(f"    step: {step}")


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
        "--only",
        action="append",
        type=_parts,
        metavar="PARTS",
        help=f"run only these parts, comma-separated (repeatable): {', '.join(PARTS)}, r1",
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
        only=set().union(*args.only) if args.only else set(PARTS),
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
