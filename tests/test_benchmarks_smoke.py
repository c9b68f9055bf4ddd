"""The benchmarks package runs its tiniest configuration and reports the documented JSON shape.

Speed is not asserted: only that the measures run, and that every record holds numbers, a ratio
of ``ours / baseline`` and a ``met`` that agrees with ``better`` and ``goal``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

benchmarks_main = pytest.importorskip("benchmarks.__main__")
from benchmarks._common import Config, Result  # noqa: E402

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
