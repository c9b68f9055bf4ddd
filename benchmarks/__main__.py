"""``python -m benchmarks [--quick] [--json PATH] [--dsn DSN] [--only P1,P3]``.

Prints a table; with ``--json`` also writes ``{measure id: {ours, baseline, ratio, better, goal,
unit, met, ...}}``. Exits 0 whatever the ratios: a goal missed is a number to read, not a
failure. The PostgreSQL measures need ``--dsn`` (or ``TRIO_SUPERVISE_BENCH_DSN``, then
``TRIO_SUPERVISE_TEST_DSN``); without one they are skipped and said so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence

from ._common import Config, Result, format_table

MEASURES = (
    "P1",
    "P2",
    "P2f",
    "P3",
    "P4",
    "P5",
    "P6",
    "P7",
    "P8",
    "P8c",
    "P14",
    "P14f",
    "P9s",
    "P9hs",
    "P9p",
    "P9hp",
    "P10s",
    "P10p",
    "P11",
    "P11m",
    "P12s",
    "P12p",
    "P13s",
    "P13rs",
    "P13p",
    "P13rp",
)
NEEDS_DSN = {
    "P2",
    "P2f",
    "P6",
    "P7",
    "P8",
    "P8c",
    "P14",
    "P14f",
    "P9p",
    "P9hp",
    "P10p",
    "P12p",
    "P13p",
    "P13rp",
}


RETIRED = {"P5"}
"""Met and out of the goals table: run only when named with ``--only``."""
DEFAULT = tuple(measure for measure in MEASURES if measure not in RETIRED)


def run(config: Config, only: Sequence[str] = DEFAULT) -> list[Result]:
    """Run the measures in *only* (in the canonical order) and return their results."""
    from . import bulk, durable, flow, inflight, memory, postgres, scale, sqlite, supervision

    wanted = set(only)
    steps: list[tuple[set[str], Callable[[Config], Result | list[Result]]]] = [
        ({"P1"}, memory.p1),
        ({"P2", "P2f"}, postgres.p2),
        ({"P3"}, sqlite.p3),
        ({"P4"}, memory.p4),
        ({"P5"}, supervision.p5),
        ({"P6"}, postgres.p6),
        ({"P7"}, postgres.p7),
        ({"P8", "P8c", "P14", "P14f"}, postgres.p8),
        ({"P9s", "P9hs"}, scale.p9s),
        ({"P9p", "P9hp"}, scale.p9p),
        ({"P10s"}, bulk.p10s),
        ({"P10p"}, bulk.p10p),
        ({"P11", "P11m"}, inflight.p11),
        ({"P12s"}, durable.p12s),
        ({"P12p"}, durable.p12p),
        ({"P13s", "P13rs"}, flow.p13s),
        ({"P13p", "P13rp"}, flow.p13p),
    ]
    results: list[Result] = []
    for ids, step in steps:
        if not ids & wanted:
            continue
        if ids & NEEDS_DSN and config.dsn is None:
            print(f"skipping {', '.join(sorted(ids))}: no --dsn given", file=sys.stderr)
            continue
        started = time.perf_counter()
        produced = step(config)
        for result in produced if isinstance(produced, list) else [produced]:
            if result.id in wanted:
                result.detail["seconds"] = round(time.perf_counter() - started, 2)
                results.append(result)
                print(f"{result.id}: {result.ratio:.3g} (goal {result.goal:g})", file=sys.stderr)
    return results


def profile(config: Config, measure: str) -> list[Result]:
    """Run *measure* alone under pyinstrument (wall-clock stacks of this process's main
    thread, the Trio scheduler included; subprocesses, such as P7's workers and P8's PgQueuer,
    are not in it) and print the profile before the results."""
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.001, async_mode="disabled")
    profiler.start()
    try:
        results = run(config, [measure])
    finally:
        profiler.stop()
    print(profiler.output_text(unicode=True, color=False, show_all=False, short_mode=False))
    return results


def as_json(results: Sequence[Result]) -> dict[str, dict[str, object]]:
    return {result.id: result.as_json() for result in results}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller counts: under 2 minutes")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    parser.add_argument("--dsn", help="PostgreSQL DSN for P2, P2f, P6, P7")
    parser.add_argument("--only", help="comma-separated measure ids, e.g. P1,P3")
    parser.add_argument(
        "--profile",
        metavar="ID",
        help="run one measure under pyinstrument and print where this process's time went",
    )
    args = parser.parse_args(argv)
    if args.profile and args.profile not in MEASURES:
        parser.error(f"unknown measure {args.profile}; known: {', '.join(MEASURES)}")
    only: Sequence[str] = DEFAULT
    if args.only:
        only = [part.strip() for part in args.only.split(",") if part.strip()]
        unknown = sorted(set(only) - set(MEASURES))
        if unknown:
            parser.error(f"unknown measure(s) {', '.join(unknown)}; known: {', '.join(MEASURES)}")
    dsn = (
        args.dsn
        or os.environ.get("TRIO_SUPERVISE_BENCH_DSN")
        or os.environ.get("TRIO_SUPERVISE_TEST_DSN")
    )
    started = time.perf_counter()
    config = Config(quick=args.quick, dsn=dsn)
    results = profile(config, args.profile) if args.profile else run(config, only)
    print(format_table(results))
    print(f"\n{len(results)} measures in {time.perf_counter() - started:.1f} s", end="")
    print(f"; goals met: {sum(r.met for r in results)} of {len(results)}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(as_json(results), file, indent=2)
            file.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
