"""What every measure shares: the result record, the table, wall-clock timing, no-op drivers.

Wall-clock time (``time.perf_counter``) is the point of a benchmark, so it is read here and only
here; the library itself reads time through Trio alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, Literal

import trio

import trio_supervise as ts

__all__ = [
    "Config",
    "NoopDriver",
    "Result",
    "best_of",
    "noop_step",
    "rate",
    "wall",
    "with_params",
]

Better = Literal["higher", "lower"]


def with_params(dsn: str, **params: str) -> str:
    """*dsn* with libpq parameters added (replacing any of the same name), as a URL.

    Any valid DSN works: a URL with a host (``postgresql://user@host/db``), without one (a Unix
    socket: ``postgresql:///test``), or ``key=value`` pairs (turned into
    ``postgresql://?key=value&...``, which libpq reads the same way). psycopg parses *dsn* first,
    so an invalid one fails here, loudly. The result is a URL because a queue URL must be one.
    """
    from psycopg.conninfo import conninfo_to_dict

    merged = {key: str(value) for key, value in conninfo_to_dict(dsn).items()}
    merged.update(params)
    if "://" not in dsn:
        query = urllib.parse.urlencode(merged, quote_via=urllib.parse.quote)
        return f"postgresql://?{query}"
    # Keep the URL as written (so the host, user and database read as before) and only touch the
    # query string: splitting and re-joining the whole URL would turn ``postgresql:///test``
    # into the invalid ``postgresql:/test``.
    base, _, query_text = dsn.partition("?")
    kept = [
        (key, value)
        for key, value in urllib.parse.parse_qsl(query_text, keep_blank_values=True)
        if key not in params
    ]
    query = urllib.parse.urlencode([*kept, *params.items()], quote_via=urllib.parse.quote)
    return f"{base}?{query}"


@dataclasses.dataclass(frozen=True)
class Config:
    """How big a run is, and where the database is."""

    quick: bool = False
    dsn: str | None = None
    tiny: bool = False
    """Smallest counts that still exercise the code (the smoke test); not a measurement."""

    def size(self, full: int, quick: int, tiny: int) -> int:
        """Pick a count for this run's size."""
        if self.tiny:
            return tiny
        return quick if self.quick else full


@dataclasses.dataclass
class Result:
    """One measure: ours against its baseline, and whether the goal is met.

    ``ratio`` is always ``ours / baseline``. ``better`` says which way is good: with ``higher``
    the goal is met when ``ratio >= goal``, with ``lower`` when ``ratio <= goal``.
    """

    id: str
    title: str
    ours: float
    baseline: float
    better: Better
    goal: float
    unit: str
    baseline_name: str = ""
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def ratio(self) -> float:
        if self.baseline == 0:
            return math.inf if self.ours > 0 else math.nan
        return self.ours / self.baseline

    @property
    def met(self) -> bool:
        ratio = self.ratio
        if math.isnan(ratio):
            return False
        return ratio >= self.goal if self.better == "higher" else ratio <= self.goal

    def as_json(self) -> dict[str, Any]:
        """The record: the fields, and the details beside them (a detail may not share a
        field's name: it would replace the figure the record reports)."""
        fields = {
            "title": self.title,
            "ours": self.ours,
            "baseline": self.baseline,
            "baseline_name": self.baseline_name,
            "ratio": self.ratio,
            "better": self.better,
            "goal": self.goal,
            "unit": self.unit,
            "met": self.met,
        }
        clash = sorted(fields.keys() & self.detail.keys())
        if clash:
            raise ValueError(f"{self.id}: details named as the record's fields: {clash}")
        return {**fields, **self.detail}


def best_of(rounds: int, *sides: Callable[[], Any]) -> list[Any]:
    """The best (``max``) of *rounds* runs of each side, the sides taking turns round by round.

    Run in blocks (every run of one side, then every run of the other), a stretch of a few
    seconds in which the machine is slower, another tenant busy on the host, lands on one side
    only: on the 2-core machines of issue 17, one side of P4 ran at 68,000 evaluations/s in both
    of its runs and the other at 100,000 right after, on a tree whose ratio is 0.9. Taking
    turns spreads such a stretch over both sides. A side returns its rate, or a tuple whose
    first element is its rate (``max`` compares that first).
    """
    runs: list[list[Any]] = [[] for _ in sides]
    for _ in range(rounds):
        for side, out in zip(sides, runs, strict=True):
            out.append(side())
    return [max(out) for out in runs]


def rate(count: int, seconds: float) -> float:
    """Items per second."""
    return count / seconds if seconds > 0 else math.inf


class wall:
    """A wall-clock stopwatch: ``with wall() as w: ...; w.seconds``."""

    seconds: float = 0.0

    def __enter__(self) -> wall:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start


class machine_cpu:
    """Cores kept busy (every process: ours, the server, anyone else) over a stretch of wall time,
    from ``/proc/stat``: ``with machine_cpu() as m: ...; m.cores``. NaN where there is no
    ``/proc/stat``. A throughput bound by the machine's cores shows here: two processes cannot do
    more than ``cpus / cores`` times what one did while it kept *cores* busy.
    """

    cores: float = math.nan

    @staticmethod
    def _read() -> tuple[float, float] | None:
        try:
            with open("/proc/stat") as stat:
                fields = [int(value) for value in stat.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + fields[4]  # idle and iowait
        return float(sum(fields) - idle), time.perf_counter()

    def __enter__(self) -> machine_cpu:
        self._start = self._read()
        return self

    def stop(self) -> None:
        """End the stretch here (before cleanup that should not count)."""
        end = self._read()
        if self._start is None or end is None or end[1] <= self._start[1]:
            return
        ticks = os.sysconf("SC_CLK_TCK")
        self.cores = (end[0] - self._start[0]) / ticks / (end[1] - self._start[1])

    def __exit__(self, *exc: object) -> None:
        if math.isnan(self.cores):
            self.stop()


def now() -> float:
    """Wall-clock seconds (monotonic), for latencies measured across tasks and processes."""
    return time.perf_counter()


async def noop_step() -> None:
    """The no-op unit of work that every throughput measure runs, ours and the baselines."""


class NoopDriver:
    """A driver whose every evaluation is :func:`noop_step`, then :class:`~trio_supervise.Stop`.

    *on_done* is called after each evaluation (counting, latency stamps).
    """

    name = "noop"

    def __init__(
        self, spec_ids: Sequence[str] = ("noop",), on_done: Callable[[ts.WorkItem], None] = print
    ) -> None:
        self.spec_ids = list(spec_ids)
        self._on_done = on_done

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: object, item: ts.WorkItem) -> ts.Outcome:
        await noop_step()
        self._on_done(item)
        return ts.Stop()


async def no_context() -> None:
    return None


def format_table(results: Sequence[Result]) -> str:
    """The results as a fixed-width text table."""
    head = ("id", "measure", "ours", "baseline", "unit", "ratio", "goal", "met")
    rows = [head]
    for r in results:
        sign = ">=" if r.better == "higher" else "<="
        rows.append(
            (
                r.id,
                r.title,
                _num(r.ours),
                _num(r.baseline),
                r.unit,
                f"{r.ratio:.3g}",
                f"{sign} {r.goal:g}",
                "yes" if r.met else "NO",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = []
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _num(value: float) -> str:
    if math.isinf(value) or math.isnan(value):
        return str(value)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def child_env() -> dict[str, str]:
    """The environment for a benchmark subprocess: this tree first on the path."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = [root, os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def run_json(module: str, *args: object) -> Any:
    """Run ``python -m module args...`` (this tree first on the path) and return the JSON its
    last line of output holds; a failure raises with the child's stderr in the message."""
    out = subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=300,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{module} failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_trio(fn: Callable[[], Any], **kwargs: Any) -> Any:
    """``trio.run`` for a zero-argument async function."""
    return trio.run(fn, **kwargs)
