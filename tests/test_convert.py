"""The shared cattrs converter: strict JSON scalars, enums, and field-by-field messages."""

from __future__ import annotations

import datetime as dt
import enum

import attrs
import pytest

from trio_supervise import ConfigError
from trio_supervise._convert import converter, structure_config, unstructure


class Color(enum.StrEnum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@attrs.frozen
class Inner:
    x: int


@attrs.frozen
class Config:
    days: int
    name: str = "digest"
    ratio: float = 1.0
    on: bool = True
    color: Color = Color.RED
    level: Level = Level.LOW
    inner: Inner | None = None
    tags: list[int] = attrs.Factory(list)
    when: dt.datetime | None = None


def fails(value: object) -> str:
    with pytest.raises(ConfigError) as caught:
        structure_config(value, Config, what="invalid config for spec 'digest'")
    return str(caught.value)


def test_a_fitting_config_is_structured() -> None:
    """JSON that fits the class becomes an instance; an int is accepted for a float."""
    value = {
        "days": 3,
        "ratio": 2,
        "color": "blue",
        "level": 2,
        "inner": {"x": 1},
        "tags": [1, 2],
        "when": "2030-01-01T00:00:00+00:00",
    }
    config = structure_config(value, Config, what="w")
    assert config == Config(
        days=3,
        ratio=2.0,
        color=Color.BLUE,
        level=Level.HIGH,
        inner=Inner(1),
        tags=[1, 2],
        when=dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
    )
    assert type(config.ratio) is float
    assert unstructure(config)["when"] == "2030-01-01T00:00:00+00:00"
    assert structure_config(unstructure(config), Config, what="w") == config


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        ({"days": "seven"}, "days: expected int, got str"),
        ({"days": "3"}, "days: expected int, got str"),
        ({"days": 3.7}, "days: expected int, got float"),
        ({"days": True}, "days: expected int, got bool"),
        ({"days": None}, "days: expected int, got null"),
        ({"days": 1, "name": 5}, "name: expected str, got int"),
        ({"days": 1, "ratio": "1"}, "ratio: expected float, got str"),
        ({"days": 1, "on": 1}, "on: expected bool, got int"),
        ({"days": 1, "color": "green"}, "color: expected one of 'red', 'blue', got 'green'"),
        ({"days": 1, "level": 3}, "level: expected one of 1, 2, got 3"),
        ({}, "days: required field missing"),
        ({"days": 1, "dasy": 2}, "unknown field(s) dasy"),
        ({"days": 1, "inner": {"x": "a"}}, "inner.x: expected int, got str"),
        ({"days": 1, "inner": 3}, "inner: expected an object"),
        ({"days": 1, "tags": [1, "b"]}, "tags[1]: expected int, got str"),
        ([1], "expected an object"),
    ],
)
def test_a_config_that_does_not_fit_says_where_and_why(value: object, detail: str) -> None:
    """Every misfit is reported with its field path and what was expected."""
    assert fails(value) == f"invalid config for spec 'digest': {detail}"


def test_every_problem_is_reported_at_once() -> None:
    """Several misfits are joined in one message, so one round of fixes is enough."""
    assert fails({"days": "x", "name": 1}) == (
        "invalid config for spec 'digest': days: expected int, got str; name: expected str, got int"
    )


def test_plain_scalars_are_strict_too() -> None:
    """The converter refuses coercions for bare scalars, not only inside classes."""
    assert converter.structure(3, int) == 3
    assert converter.structure(Color.RED.value, Color) is Color.RED
    with pytest.raises(TypeError):
        converter.structure("3", int)
