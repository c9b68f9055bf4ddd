"""Properties of what the queues store: ``storable_text`` keeps everything, ``check_json`` lets
through only what every backend can hold."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_supervise import ConfigError
from trio_supervise.queues._protocol import MAX_JSON_DEPTH, check_json, storable_text

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
