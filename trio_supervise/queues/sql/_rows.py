"""Rows into items, generated from the item model (as :mod:`trio_supervise.job._fields` does).

A row becomes a :class:`WorkItem` through a decoder generated once per column list: straight-line
code that unpacks the row and stores each field, converted by the kind its declaration gives it
(``metadata["stored"]``: JSON, errors, time, bool, state, or as stored), into the item's open
twin. The dialect supplies one expression per kind (:class:`Codec`); the column order comes
from the cursor. A field added to ``WorkItem`` is decoded with no change here.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ...job import ErrorEntry, ItemState, UnfrozenItem, WorkItem, stored_kind
from ...job._model import ERRORS, JSON, STATE

__all__ = ["Codec", "error_entries", "item_decoder"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def error_entries(stored: Sequence[Mapping[str, Any]]) -> tuple[ErrorEntry, ...]:
    """The stored ``errors`` JSON array (``at`` in microseconds since the epoch) as entries."""
    return tuple(
        ErrorEntry(
            at=_EPOCH + dt.timedelta(microseconds=each["at"]),
            worker=each["worker"],
            attempt=each["attempt"],
            error=each["error"] or "",
        )
        for each in stored
    )


_TEXT_JSON: Mapping[str, str] = {
    # The common values ('{}', '[]') are read without a parse: a new dict or the empty tuple.
    JSON: "{} if $value == '{}' else _loads($value)",
    ERRORS: "() if $value == '[]' else _entries(_loads($value))",
    STATE: "_STATES[$value] if $value in _STATES else _State($value)",
}
"""The kinds every dialect reads alike: JSON arrives as its text."""


@attrs.frozen(eq=False)
class Codec:
    """How one dialect reads stored values: an expression of ``$value`` per stored kind (the
    JSON kinds and the state read as :data:`_TEXT_JSON` unless given), and the names those
    expressions use."""

    decode: Mapping[str, str]
    namespace: Mapping[str, Any] = attrs.field(factory=dict)

    def expression(self, kind: str) -> str:
        """The expression that reads a value stored as *kind*."""
        found = self.decode.get(kind, _TEXT_JSON.get(kind))
        if found is None:
            raise RuntimeError(f"the dialect cannot read values stored as {kind!r}")
        return found


_BASE_NAMESPACE: Mapping[str, Any] = {
    "_new": object.__new__,
    "_twin": UnfrozenItem,
    "_cls": WorkItem,
    "_loads": json.loads,
    "_entries": error_entries,
    "_STATES": {str(state): state for state in ItemState},
    "_State": ItemState,
}


@functools.cache
def item_decoder(
    columns: tuple[str, ...], codec: Codec, *, mapping: bool = False
) -> Callable[[Any], WorkItem]:
    """A function from a row with these *columns* (in order) to a :class:`WorkItem`.

    The row is a sequence (a tuple, a ``sqlite3.Row``) or, with *mapping*, a dict whose values
    are in that order (psycopg's ``dict_row``). Columns that are not fields are skipped; a field
    without a column is refused, naming it. Every value is the queue's own, stored by it, so no
    converter or validator runs again: each field is one plain store on the open twin.
    """
    at: dict[str, int] = {}
    for position, name in enumerate(columns):
        at.setdefault(name, position)
    fields = attrs.fields(WorkItem)
    missing = [field.name for field in fields if field.name not in at]
    if missing:
        raise RuntimeError(f"an item row without the columns {missing}: got {list(columns)}")
    used = {at[field.name] for field in fields}
    targets = ", ".join(f"c{n}" if n in used else "_" for n in range(len(columns)))
    lines = [
        "def decode(row):",
        f"    ({targets},) = {'row.values()' if mapping else 'row'}",
        "    item = _new(_twin)",
    ]
    for field in fields:
        value = f"c{at[field.name]}"
        kind = stored_kind(field)
        if kind is None:
            lines.append(f"    item.{field.name} = {value}")
            continue
        read = string.Template(codec.expression(kind)).substitute(value=value)
        if field.default is None:  # an optional field: NULL stays None
            read = f"None if {value} is None else ({read})"
        lines.append(f"    item.{field.name} = {read}")
    lines += ["    item.__class__ = _cls", "    return item"]
    namespace = {**_BASE_NAMESPACE, **codec.namespace}
    exec("\n".join(lines), namespace)
    decode: Callable[[Any], WorkItem] = namespace["decode"]
    return decode
