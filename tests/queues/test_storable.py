"""Properties of what the queues store: ``storable_text`` keeps everything, ``check_json`` lets
through only what every backend can hold."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_supervise import ConfigError
from trio_supervise.job import (
    MAX_JSON_DEPTH,
    JSONValue,
    check_json,
    storable_text,
)

_ESCAPE = re.compile(r"\\x00|\\u(d[89a-f][0-9a-f]{2})")


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: "\x00" if m[1] is None else chr(int(m[1], 16)), text)


def _storable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


@given(st.text())
def test_storable_text_escapes_and_never_drops(text: str) -> None:
    """The result is storable everywhere, equal to storable input, and unescapes to the input."""
    result = storable_text(text)
    assert _storable(result)
    if _storable(text):
        assert result == text
    if "\\" not in text:
        assert _unescape(result) == text


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=20,
)


@given(json_values)
def test_check_json_passes_only_what_every_backend_stores(value: object) -> None:
    """Either a ConfigError, or a copy whose JSON text is valid UTF-8 without NUL escapes."""
    refused: str | None = None
    try:
        copy = check_json(value)
    except ConfigError as error:
        refused = str(error)
    if refused is not None:
        assert refused.startswith("config ")  # names the field
        return
    text = json.dumps(copy, ensure_ascii=False)
    assert _storable(text)
    assert "\\u0000" not in json.dumps(copy)
    assert copy == json.loads(json.dumps(value))


flat_configs = st.dictionaries(
    st.text() | st.integers(),
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    max_size=4,
)


@given(flat_configs)
def test_a_flat_config_is_checked_as_its_json_round_trip_would_be(value: JSONValue) -> None:
    """The shortcut for flat configs gives what the JSON round trip gives (a list around the
    config always takes it), types included, and refuses what it refuses, in the same words."""

    def outcome(check: Callable[[], JSONValue]) -> tuple[str, str, object]:
        try:
            copy = check()
        except ConfigError as error:
            return ("refused", str(error), None)
        return ("copy", json.dumps(copy), copy)

    shortcut = outcome(lambda: check_json(value))
    round_trip = outcome(lambda: cast("list[JSONValue]", check_json([value]))[0])
    assert shortcut[:2] == round_trip[:2]
    if shortcut[0] == "copy":
        assert shortcut[2] is not value  # a copy: the caller's dict can change, the stored not


class _Key(str):
    """A str subclass: equal to, and hashed as, the plain string."""


def test_a_str_subclass_key_goes_the_json_way() -> None:
    """The flat shortcut takes plain strings only: an equal str subclass goes the JSON way,
    which makes it a plain str."""
    assert check_json({"step": 1}) == {"step": 1}
    copy = check_json({_Key("step"): 2})
    assert copy == {"step": 2}
    assert isinstance(copy, dict)
    assert [type(key) for key in copy] == [str]


def test_a_key_refused_once_is_refused_every_time() -> None:
    """A key that cannot be stored is refused each time it is given."""
    for _ in range(3):
        with pytest.raises(ConfigError, match="NUL"):
            check_json({"a\x00b": 1})


@given(st.integers(0, 3 * MAX_JSON_DEPTH))
def test_nesting_is_refused_past_the_maximum(depth: int) -> None:
    """Exactly the configs nested more than MAX_JSON_DEPTH levels are refused."""
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    if depth <= MAX_JSON_DEPTH:
        assert check_json(value) == value
        return
    with pytest.raises(ConfigError) as info:
        check_json(value)
    assert str(info.value) == f"config is nested too deeply (more than {MAX_JSON_DEPTH} levels)"
