"""The one cattrs converter for everything that crosses a boundary.

Typed driver configs, settings and JSON status all go through :data:`converter`. It is the JSON
preconfigured converter (datetimes as ISO 8601 strings, sets as lists) with three choices made
strict on purpose, because the input is JSON a person or another program wrote:

- scalars are not coerced: ``"3"`` is not an ``int``, ``3.7`` is not an ``int``, ``True`` is not
  an ``int`` and ``5`` is not a ``str`` (an ``int`` is accepted where a ``float`` is wanted);
- unknown keys are refused (a typo such as ``dasy`` is an error, not a silently ignored field);
- errors are collected per field (``detailed_validation``) and described by
  :func:`describe_structure_error` as ``"days: expected int, got str"``.

Callers that read values which are always strings (environment variables) parse them into JSON
types first and then structure them here.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from typing import Any, TypeVar

import cattrs
from cattrs.errors import ForbiddenExtraKeysError
from cattrs.preconf.json import make_converter

from ._errors import ConfigError

__all__ = [
    "MAX_JSON_DEPTH",
    "converter",
    "describe_structure_error",
    "nested_too_deeply",
    "nesting_exceeds",
    "structure_config",
    "unstructure",
]

T = TypeVar("T")


class _WrongType(TypeError):
    """A scalar of the wrong JSON type; the message is the whole description."""


class _BadValue(ValueError):
    """A value of the right JSON type that is not allowed (not a member of an enum)."""


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _narrow(value: Any, cls: type[Any]) -> Any:
    """*value* as the subclass *cls* asks for (an enum member), or *value* itself."""
    if value.__class__ is cls:
        return value
    if issubclass(cls, enum.Enum):
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(repr(member.value) for member in cls)
            raise _BadValue(f"expected one of {allowed}, got {value!r}") from None
    return cls(value)


# These hooks are registered by class, so they also serve subclasses (a StrEnum is a str, an
# IntEnum an int): the JSON type is checked strictly, then the value is narrowed to the subclass.


def _structure_int(value: object, cls: type[Any]) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _WrongType(f"expected {cls.__name__}, got {_type_name(value)}")
    return _narrow(value, cls)


def _structure_float(value: object, cls: type[Any]) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _WrongType(f"expected {cls.__name__}, got {_type_name(value)}")
    return _narrow(float(value), cls)


def _structure_str(value: object, cls: type[Any]) -> Any:
    if not isinstance(value, str):
        raise _WrongType(f"expected {cls.__name__}, got {_type_name(value)}")
    return _narrow(value, cls)


def _structure_bool(value: object, cls: type[Any]) -> bool:
    if not isinstance(value, bool):
        raise _WrongType(f"expected bool, got {_type_name(value)}")
    return value


def _make_converter() -> cattrs.Converter:
    made = make_converter(detailed_validation=True, forbid_extra_keys=True)
    made.register_structure_hook(int, _structure_int)
    made.register_structure_hook(float, _structure_float)
    made.register_structure_hook(str, _structure_str)
    made.register_structure_hook(bool, _structure_bool)
    return made


converter: cattrs.Converter = _make_converter()
"""The shared converter. Register hooks on it only at import time of the module that needs them."""


def _format_exception(exc: BaseException, type_: type | None) -> str:
    if isinstance(exc, _WrongType | _BadValue):
        return str(exc)
    if isinstance(exc, KeyError):
        return "required field missing"
    if isinstance(exc, ForbiddenExtraKeysError):
        return f"unknown field(s) {', '.join(sorted(exc.extra_fields))}"
    if isinstance(exc, AttributeError) or (isinstance(exc, TypeError) and type_ is None):
        # Structuring a class from something that is not a mapping.
        return "expected an object"
    return cattrs.v.format_exception(exc, type_)


def _describe_path(path: str) -> str:
    if path == "$":
        return ""
    return path[2:] if path.startswith("$.") else path[1:]


def describe_structure_error(error: BaseException) -> str:
    """Describe a structuring failure field by field: ``"days: expected int, got str; ..."``."""
    parts = []
    for line in cattrs.transform_error(error, path="$", format_exception=_format_exception):
        message, _, path = line.rpartition(" @ ")
        where = _describe_path(path)
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def structure_config(value: Any, cls: type[T], *, what: str) -> T:
    """Structure *value* into *cls*, or raise :class:`ConfigError` as ``"{what}: {details}"``."""
    try:
        return converter.structure(value, cls)
    except Exception as error:
        raise ConfigError(f"{what}: {describe_structure_error(error)}") from error


# -- nesting depth ---------------------------------------------------------------------------------

MAX_JSON_DEPTH = 64
"""The deepest nesting of lists and objects (tables) accepted in a config or a settings file.

``queues.MAX_JSON_DEPTH`` is this number too, bounding what a queue stores; here text is refused
before it is parsed, so that a parser's recursion never sees it.
"""

_JSON_TOKENS = re.compile(r'\\.|["\[\]{}]', re.DOTALL)


def nested_too_deeply(what: str) -> str:
    """The one message for input nested past :data:`MAX_JSON_DEPTH`."""
    return f"{what} is nested too deeply (more than {MAX_JSON_DEPTH} levels)"


def _text_nesting_exceeds(text: str, limit: int) -> bool:
    depth = 0
    in_string = False
    for token in _JSON_TOKENS.finditer(text):
        mark = token[0]
        if mark == '"':
            in_string = not in_string
        elif in_string or mark[0] == "\\":
            continue
        elif mark in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def nesting_exceeds(value: object, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether *value* nests lists/mappings more than *limit* deep, without recursing.

    A string is read as JSON text (string literals skipped): ``"[[1]]"`` is two levels.
    """
    if isinstance(value, str):
        return _text_nesting_exceeds(value, limit)
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Mapping):
            children: Any = node.values()
        elif isinstance(node, list | tuple):
            children = node
        else:
            continue
        if depth + 1 > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def unstructure(value: Any) -> Any:
    """Turn attrs instances (and what they hold) back into JSON-compatible values."""
    return converter.unstructure(value)
