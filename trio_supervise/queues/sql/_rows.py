"""Rows into items and new items into rows, generated from the item model (as
:mod:`trio_supervise.job._fields` generates its copies).

A row becomes a :class:`WorkItem` through a decoder generated once per column list: straight-line
code that unpacks the row and stores each field, converted by the kind its declaration gives it
(``metadata["stored"]``: JSON, errors, time, bool, state, or as stored), into the item's open
twin. A :class:`NewItem` becomes the values of its row (:data:`NEW_ROW_COLUMNS`, the columns its
fields declare) the same way (:func:`row_encoder`). The dialect supplies one expression per kind
(:class:`Codec`); the column order of a row read comes from the cursor. A field added to the
model is read and written with no change here.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from ...job import (
    ErrorEntry,
    ItemState,
    NewItem,
    UnfrozenItem,
    WorkItem,
    stored_columns,
    stored_kind,
)
from ...job._model import (
    DEADLINE,
    ERRORS,
    JSON,
    NEW_ID,
    OPTION,
    SECONDS,
    STATE,
    TAGS,
    TIME,
    UNIQUE,
)

__all__ = [
    "NEW_ROW_COLUMNS",
    "NEW_ROW_KINDS",
    "Codec",
    "RowEncoder",
    "error_entries",
    "item_decoder",
    "row_encoder",
]

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
    TAGS: "() if $value == '[]' else tuple(_loads($value))",
    STATE: "_STATES[$value] if $value in _STATES else _State($value)",
}
"""The kinds every dialect reads alike: JSON arrives as its text."""


@attrs.frozen(eq=False)
class Codec:
    """How one dialect reads stored values: an expression of ``$value`` per stored kind (the
    JSON kinds and the state read as :data:`_TEXT_JSON` unless given); how it writes a time
    (``encode_time``, an expression of ``$value``); and the names those expressions use."""

    decode: Mapping[str, str]
    encode_time: str
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


_NEW_FIELDS = tuple(
    (field, stored_kind(field), stored_columns(field))
    for field in attrs.fields(NewItem)
    if stored_kind(field) != OPTION  # how to write the item, not a column of it
)

NEW_ROW_COLUMNS: tuple[str, ...] = tuple(
    column for _, _, columns in _NEW_FIELDS for column in columns
)
"""The columns of a new item's row, in the order of :class:`NewItem`'s fields: what each
backend's multi-row insert takes (named alike in its ``queries.sql``)."""

NEW_ROW_KINDS: tuple[str | None, ...] = tuple(
    kind for _, kind, columns in _NEW_FIELDS for _ in columns
)
"""The stored kind of each of :data:`NEW_ROW_COLUMNS`."""

_WRITE = {
    None: "$value",
    JSON: "'{}' if $value is None else _dumps($value)",
    TAGS: "_dumps(list($value)) if $value else '[]'",
    NEW_ID: "next(ids) if $value is None else $value",
    SECONDS: "None if $value is None else float($value)",
    # A batch holds few scopes (a scope, whether a key holds it): each is worked out once.
    UNIQUE: "known.get(($value, entry.idempotency_key is None)) or scope(entry)",
}
"""How a NewItem's field becomes its column's value, by kind (the time: :class:`Codec`)."""

Scopes = Callable[[NewItem], tuple[Any, ...]]
"""``scope(entry)``: the columns of *entry*'s uniqueness scope, also kept in the batch's
``known`` under ``(entry.unique, entry.idempotency_key is None)``."""

RowEncoder = Callable[
    [Sequence[NewItem], Sequence[int], Any, Iterator[str], Mapping[Any, Any], Scopes],
    list[tuple[Any, ...]],
]
"""``rows(entries, sent, now, ids, known, scope)``: the row of each of ``entries[i]`` for
``i`` in *sent*, in order: its due time *now* when it has none, its id the next of *ids* when
it has none, its uniqueness scope's columns from *known* or *scope*."""


@functools.cache
def row_encoder(codec: Codec) -> RowEncoder:
    """The :data:`RowEncoder` of a dialect: one loop of straight-line code over the entries
    (a bulk enqueue builds 10,000 rows per call)."""
    write = {
        **_WRITE,
        TIME: f"now if $value is None else ({codec.encode_time})",
        DEADLINE: f"None if $value is None else ({codec.encode_time})",
    }
    values, lines = [], []
    for n, (field, kind, columns) in enumerate(_NEW_FIELDS):
        template = write.get(kind)
        if template is None:
            raise RuntimeError(f"NewItem.{field.name} is stored as {kind!r}, which has no writer")
        if kind is None:
            values.append(f"entry.{field.name}")
            continue
        lines.append(f"        v{n} = entry.{field.name}")
        written = string.Template(template).substitute(value=f"v{n}")
        if len(columns) == 1:
            values.append(f"({written})")
        else:  # a value a column
            lines.append(f"        v{n} = {written}")
            values += [f"v{n}[{k}]" for k in range(len(columns))]
    source = [
        "def rows(entries, sent, now, ids, known, scope):",
        "    result = []",
        "    append = result.append",
        "    for index in sent:",
        "        entry = entries[index]",
        *lines,
        f"        append(({', '.join(values)},))",
        "    return result",
    ]
    namespace = {"_dumps": json.dumps, **codec.namespace}
    exec("\n".join(source), namespace)
    encode: RowEncoder = namespace["rows"]
    return encode
