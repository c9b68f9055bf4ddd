"""Fast paths generated from an attrs declaration, as attrs generates ``__init__``.

A record the store builds, copies or changes per item (a claim, a settlement, a bulk enqueue)
cannot afford ``attrs.evolve`` and its converters on values the store produced itself. The
functions here write straight-line code over the record's fields, once, at import: a field added
to the declaration is copied, replaced and defaulted with no other change.

Each generated function builds the record as its *open twin* (the same slotted layout without the
frozen ``__setattr__``, so each field is one plain store) and then makes it the frozen class it is
(``__class__`` assignment between classes of one layout).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

__all__ = ["build_function", "copy_function", "field_names", "open_twin", "replace_function"]

_new_object = object.__new__


def open_twin(cls: type[Any]) -> type[Any]:
    """*cls*'s layout (no slot of its own) without the frozen class's ``__setattr__``.

    An object of it becomes a *cls* by ``__class__`` assignment. A store on a frozen attrs class
    goes through a slot's setter called as a function (about 40 to 60 ns a field); a plain store
    on a slot is one specialised bytecode (about 8 to 10 ns). Both ``__setattr__`` and
    ``__delattr__`` are object's own, so CPython's generic setter is kept, which the bytecode
    specialises on.
    """
    return type(
        f"Unfrozen{cls.__name__}",
        (cls,),
        {
            "__slots__": (),
            "__setattr__": object.__setattr__,
            "__delattr__": object.__delattr__,
            "__doc__": f"{cls.__name__} without the frozen __setattr__ (see job._fields).",
            "__module__": cls.__module__,
        },
    )


def field_names(cls: type[Any]) -> tuple[str, ...]:
    """The names of *cls*'s attrs fields, in declaration order."""
    return tuple(field.name for field in attrs.fields(cls))


def _generate(name: str, lines: list[str], namespace: dict[str, Any]) -> Callable[..., Any]:
    exec("\n".join(lines), namespace)
    function: Callable[..., Any] = namespace[name]
    return function


def copy_function(
    cls: type[Any], twin: type[Any], deep: Mapping[str, Callable[[Any], Any]] | None = None
) -> Callable[[Any], Any]:
    """``copy(record)``: a new *cls* with every field of *record*; the fields named in *deep*
    go through their function (a JSON tree copied, so a caller changing it in place changes
    nothing stored), skipped for a None value."""
    deep = dict(deep or {})
    namespace: dict[str, Any] = {"_new": _new_object, "_twin": twin, "_cls": cls}
    lines = ["def copy(record):", "    new = _new(_twin)"]
    for name in field_names(cls):
        if name in deep:
            namespace[f"_deep_{name}"] = deep[name]
            lines.append(
                f"    new.{name} = None if (value := record.{name}) is None "
                f"else _deep_{name}(value)"
            )
        else:
            lines.append(f"    new.{name} = record.{name}")
    lines += ["    new.__class__ = _cls", "    return new"]
    return _generate("copy", lines, namespace)


def replace_function(cls: type[Any], twin: type[Any]) -> Callable[..., Any]:
    """``replace(record, **changes)``: ``attrs.evolve`` without running converters or
    validators again, for values the caller produced or checked itself. A key of *changes*
    that is not a field is ignored."""
    namespace: dict[str, Any] = {"_new": _new_object, "_twin": twin, "_cls": cls}
    lines = ["def replace(record, **changes):", "    new = _new(_twin)", "    get = changes.get"]
    lines += [f"    new.{name} = get({name!r}, record.{name})" for name in field_names(cls)]
    lines += ["    new.__class__ = _cls", "    return new"]
    return _generate("replace", lines, namespace)


_FACTORY = object()
"""The default of a generated builder's parameter whose field's default is a factory."""


def build_function(cls: type[Any], twin: type[Any]) -> Callable[..., Any]:
    """``build(**fields)``: a new *cls* from keyword arguments, each field's declared default
    for the ones left out (a factory called per record), without converters or validators:
    for values the caller produced or checked itself. Required fields are required keywords."""
    namespace: dict[str, Any] = {
        "_new": _new_object,
        "_twin": twin,
        "_cls": cls,
        "_FACTORY": _FACTORY,
    }
    parameters, body = [], []
    for field in attrs.fields(cls):
        name = field.name
        default = field.default
        if default is attrs.NOTHING:
            parameters.append(name)
            body.append(f"    new.{name} = {name}")
        elif isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            namespace[f"_factory_{name}"] = default.factory
            parameters.append(f"{name}=_FACTORY")
            body.append(f"    new.{name} = _factory_{name}() if {name} is _FACTORY else {name}")
        else:
            namespace[f"_default_{name}"] = default
            parameters.append(f"{name}=_default_{name}")
            body.append(f"    new.{name} = {name}")
    lines = [f"def build(*, {', '.join(parameters)}):", "    new = _new(_twin)", *body]
    lines += ["    new.__class__ = _cls", "    return new"]
    return _generate("build", lines, namespace)
