"""JSON values the stores keep: checked once, copied cheaply, and text made storable.

Every backend refuses the same values (what JSON cannot hold, nesting past
:data:`MAX_JSON_DEPTH`, strings with a NUL or a lone surrogate, which PostgreSQL cannot store and
SQLite's text cannot hold), so a value one backend accepts every backend accepts.
"""

from __future__ import annotations

import json
import math
from typing import Any, TypeAlias

from .._convert import MAX_JSON_DEPTH as _MAX_JSON_DEPTH
from .._convert import nested_too_deeply

__all__ = [
    "JSONValue",
    "MAX_JSON_DEPTH",
    "check_json",
    "copy_json",
    "flat_json_copy",
    "storable_text",
    "unstorable",
]

JSONValue: TypeAlias = Any
"""A value that survives ``json.dumps``/``json.loads`` unchanged (dict, list, str, number, ...)."""

MAX_JSON_DEPTH = _MAX_JSON_DEPTH
"""The deepest nesting of lists and objects a config (or result) may have; deeper is refused
(one number for the queues, the CLI and settings files: ``trio_supervise._convert``)."""


def unstorable(text: str) -> str | None:
    """Why a backend cannot store *text* (a NUL, a lone surrogate), or None if it can."""
    if "\x00" in text:
        return "NUL characters"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "lone surrogates (such as '\\udcff')"
    return None


def storable_text(text: str) -> str:
    """*text* as every backend can store it: NULs and lone surrogates spelled as escapes.

    For text the library writes itself (error messages, tracebacks), which must be kept, never
    dropped: ``"\\x00"`` for a NUL, ``"\\udcff"`` for a lone surrogate. Other text is unchanged.
    """
    if text.isascii() and "\x00" not in text:
        return text
    text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _check_tree(value: JSONValue, what: str) -> None:
    """Refuse a JSON tree nested deeper than MAX_JSON_DEPTH or holding unstorable strings."""
    from .._errors import ConfigError

    pending: list[tuple[JSONValue, int]] = [(value, 0)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, str):
            texts: list[str] = [node]
        elif isinstance(node, dict | list):
            if depth >= MAX_JSON_DEPTH:
                raise ConfigError(nested_too_deeply(what))
            if isinstance(node, dict):
                texts = list(node)
                pending.extend((inner, depth + 1) for inner in node.values())
            else:
                texts = []
                pending.extend((inner, depth + 1) for inner in node)
        else:
            continue
        for text in texts:
            problem = unstorable(text)
            if problem is not None:
                raise ConfigError(f"{what} must not contain {problem} in its strings")


def flat_json_copy(value: JSONValue) -> JSONValue | None:
    """What :func:`check_json` returns for a flat dict of plain scalars (the common config, a
    rescheduled step's counter), without the JSON round trip; None for anything else, and for
    anything :func:`check_json` would refuse or change (it then decides, and words the error)."""
    if type(value) is not dict or MAX_JSON_DEPTH < 1:
        return None
    # A reschedule checks its config here once per evaluation, in the runner (which marks its
    # settlement so that the memory queue need not check it again): keys and values, not
    # items (a dict's items cost a tuple each).
    for key in value:
        if type(key) is not str:
            return None
        # _unstorable's test, inlined for the common case (ASCII without a NUL).
        if (not key.isascii() or "\x00" in key) and unstorable(key) is not None:
            return None
        inner = value[key]
        kind = type(inner)
        if kind is int or kind is bool or inner is None:
            continue
        if kind is str:
            if (not inner.isascii() or "\x00" in inner) and unstorable(inner) is not None:
                return None
        elif kind is not float or not math.isfinite(inner):
            return None
    return value.copy()


def copy_json(value: JSONValue) -> JSONValue:
    """A deep copy of a checked JSON tree (what :func:`check_json` returned): every dict and list
    new, the scalars shared (immutable). For the memory queue, which stores its items' configs
    and results and must hand out copies a caller can change in place, as a durable backend's
    freshly decoded rows are; a flat dict (the common config) costs one ``dict.copy``."""
    kind = type(value)
    if kind is dict:
        assert isinstance(value, dict)
        for inner in value.values():
            if type(inner) is dict or type(inner) is list:
                return {key: copy_json(inner) for key, inner in value.items()}
        return value.copy()
    if kind is list:
        assert isinstance(value, list)
        return [copy_json(inner) for inner in value]
    return value


_BIG = 10**18
"""Ints this far from zero skip the JSON round trip (larger ones meet Python's digit limit)."""


def check_json(value: JSONValue, *, what: str = "config") -> JSONValue:
    """Return a deep copy of *value* through JSON, or raise :class:`ConfigError` naming *what*.

    Refused, the same way on every backend: what JSON cannot hold, nesting deeper than
    :data:`MAX_JSON_DEPTH`, and strings holding a NUL or a lone surrogate (PostgreSQL cannot
    store either, SQLite's text cannot hold a surrogate).
    """
    kind = type(value)
    if value is None or kind is bool or (kind is int and -_BIG < value < _BIG):
        return value  # what the JSON round trip gives back, unchanged
    if kind is str and value.isascii() and "\x00" not in value:
        return value
    flat = flat_json_copy(value)
    if flat is not None:
        return flat
    from .._errors import ConfigError

    try:
        text = json.dumps(value, allow_nan=False)
    except RecursionError:
        raise ConfigError(nested_too_deeply(what)) from None
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{what} is not JSON-compatible: {error}") from error
    copy = json.loads(text)
    _check_tree(copy, what)
    return copy
