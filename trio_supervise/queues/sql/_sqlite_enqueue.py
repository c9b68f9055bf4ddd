"""SQLite's side of the enqueue core: the statements, "now", and how rows and values travel,
shared by :class:`SQLiteQueue` and the producer outside Trio (``trio_supervise.producer``),
so that an item enqueued either way is written by the same statements under the same checks.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ...job._model import BOOL, SECONDS, TIME
from .. import _sql
from ._producer import EnqueueCore
from ._rows import NEW_ROW_COLUMNS, NEW_ROW_KINDS, Codec
from ._sqlite_db import EPOCH, QUERIES, US, from_us, next_number, to_us

__all__ = ["SQLiteEnqueue"]

_Q = QUERIES
_ENQUEUE_UNKEYED = _sql.without_conflict_clause(_Q["enqueue"])
_ID = NEW_ROW_COLUMNS.index("id")
_SECONDS = [n for n, kind in enumerate(NEW_ROW_KINDS) if kind == SECONDS]
"""The columns of a new row that hold a float (seconds)."""


@functools.cache
def _enqueue_rows_query(varying: tuple[bool, ...], keyed: bool) -> str:
    """The ``enqueue_rows`` template filled in: the columns *varying* (one flag per
    :data:`NEW_ROW_COLUMNS`, the id's always set) come from each JSON row (the row itself when
    only the id varies), the others from the parameter of the column's name."""
    positions = [n for n, flag in enumerate(varying) if flag]
    values: dict[str, str] = {}
    for n, name in enumerate(NEW_ROW_COLUMNS):
        if not varying[n]:
            values[name] = f":{name}"
        elif len(positions) == 1:
            values[name] = "r.value"
        else:
            values[name] = f"json_extract(r.value, '$[{positions.index(n)}]')"
    query = _Q["enqueue_rows"].format_map(values)
    return query if keyed else _sql.without_conflict_clause(query)


_CODEC = Codec(
    # Times are integers (microseconds since the epoch), booleans 0 or 1: the same exact
    # arithmetic as timedelta(microseconds=value), in half the time.
    decode={TIME: "_EPOCH + _US * $value", BOOL: "True if $value else False"},
    encode_time="to_us($value)",
    namespace={"_EPOCH": EPOCH, "_US": US, "to_us": to_us},
)


class SQLiteEnqueue(EnqueueCore):
    """The enqueue core's hooks on SQLite (see ``_producer.py``)."""

    _queries: ClassVar[Mapping[str, str]] = QUERIES
    _backend: ClassVar[_sql.Backend] = "sqlite"

    def _now(self) -> int:
        return to_us(self._clock.now())

    _time = staticmethod(to_us)
    _from_time = staticmethod(from_us)
    _codec: ClassVar[Codec] = _CODEC

    @staticmethod
    def _columns(cur: sqlite3.Cursor) -> tuple[str, ...]:
        return tuple(column[0] for column in cur.description)

    @staticmethod
    def _ids(values: Sequence[str]) -> str:
        return json.dumps(list(values))

    def _is_duplicate(self, error: Exception) -> bool:
        return isinstance(error, sqlite3.IntegrityError)

    def _cursor(self, conn: sqlite3.Connection) -> sqlite3.Cursor:
        cur = conn.cursor()
        cur.row_factory = sqlite3.Row
        return cur

    def _insert_rows(
        self,
        cur: sqlite3.Cursor,
        rows: Sequence[tuple[Any, ...]],
        now: int,
        *,
        keyed: bool,
        notify: bool,
    ) -> tuple[int, dt.datetime]:
        columns = list(zip(*rows, strict=True))
        incarnation = next_number(cur, "next_incarnation")
        params: dict[str, Any] = {"now": now, "incarnation": incarnation}
        varying = []
        for n, (name, column) in enumerate(zip(NEW_ROW_COLUMNS, columns, strict=True)):
            same = n != _ID and column.count(column[0]) == len(column)  # the ids always vary
            if same:
                params[name] = column[0]
            varying.append(not same)
        if any(
            varying[n] and not all(t is None or t.is_integer() for t in columns[n])
            for n in _SECONDS
        ):
            # A fractional number in the JSON would go through SQLite's text-to-float
            # conversion, which is not correctly rounded on every build: bound as a double.
            cur.executemany(
                _Q["enqueue"] if keyed else _ENQUEUE_UNKEYED,
                [
                    dict(zip(NEW_ROW_COLUMNS, row, strict=True), now=now, incarnation=incarnation)
                    for row in rows
                ],
            )
            return cur.rowcount, from_us(now)
        # One statement reading one JSON array: SQLite's fastest multi-row form. The strings
        # go as UTF-8 (every text is checked free of NULs and lone surrogates).
        picked = [column for column, flag in zip(columns, varying, strict=True) if flag]
        values = picked[0] if len(picked) == 1 else list(zip(*picked, strict=True))
        params["rows"] = json.dumps(values, ensure_ascii=False)
        cur.execute(_enqueue_rows_query(tuple(varying), keyed), params)
        return cur.rowcount, from_us(now)
