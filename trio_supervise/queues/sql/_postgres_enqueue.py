"""PostgreSQL's side of the enqueue core: the statements, "now", the wake-up channel and how
rows and values travel, shared by :class:`PostgresQueue` and the producer outside Trio
(``trio_supervise.producer``), so that an item enqueued either way is written by the same
statement (which also sends the ``NOTIFY`` runners wait for) under the same checks.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ..._clock import utc
from ...job._model import BOOL, TIME
from .. import _sql
from ._postgres_db import QUERIES, Row, reads_text_json, text_json
from ._postgres_listen import CHANNEL
from ._producer import EnqueueCore
from ._rows import NEW_ROW_COLUMNS, Codec

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresEnqueue", "column_names"]

_Q = QUERIES
_ENQUEUE_UNKEYED = _sql.without_conflict_clause(_Q["enqueue_many"])
_ARRAYS = tuple(f"{column}_array" for column in NEW_ROW_COLUMNS)
"""The ``enqueue_many`` query's array parameters, one per :data:`NEW_ROW_COLUMNS`, in order."""
_ID = NEW_ROW_COLUMNS.index("id")


_CODEC = Codec(
    # psycopg loads a timestamptz as a UTC datetime in the pool's UTC sessions (see
    # configure): kept as it is; one in another zone is converted, as WorkItem would.
    decode={TIME: "$value if $value.tzinfo is _UTC else _utc($value)", BOOL: "$value"},
    encode_time="_utc($value)",
    namespace={"_UTC": dt.UTC, "_utc": utc},
)
"""How stored values become an item's: JSON arrives as its text (the queue's connections load
``jsonb`` as text, see :func:`configure`), read as on SQLite."""


class PostgresEnqueue(EnqueueCore):
    """The enqueue core's hooks on PostgreSQL (see ``_producer.py``)."""

    _db_clock: bool
    """Whether "now" is the database's ``now()`` (else the injected clock's)."""
    _schema: str | None

    _queries: ClassVar[Mapping[str, str]] = _Q
    _backend: ClassVar[_sql.Backend] = "postgres"

    @property
    def channel(self) -> str:
        """The ``LISTEN``/``NOTIFY`` channel: one per schema."""
        return CHANNEL if self._schema is None else f"{CHANNEL}:{self._schema}"

    def _now(self) -> dt.datetime | None:
        return None if self._db_clock else utc(self._clock.now())

    def _notify(self, conn: psycopg.Connection[Row], spec_ids: Sequence[str]) -> None:
        if spec_ids:
            conn.execute(_Q["notify"], {"channel": self.channel, "spec_ids": sorted(set(spec_ids))})

    _time = staticmethod(utc)

    @staticmethod
    def _from_time(value: dt.datetime) -> dt.datetime:
        return value

    _codec: ClassVar[Codec] = _CODEC

    @staticmethod
    def _columns(cur: psycopg.Cursor[Any]) -> tuple[str, ...]:
        return column_names(cur)

    @staticmethod
    def _ids(values: Sequence[str]) -> list[str]:
        return list(values)

    def _is_duplicate(self, error: Exception) -> bool:
        import psycopg

        return isinstance(error, psycopg.errors.UniqueViolation)

    def _cursor(self, conn: psycopg.Connection[Any]) -> psycopg.Cursor[Row]:
        from psycopg.rows import dict_row

        cur = conn.cursor(row_factory=dict_row)
        if not reads_text_json(conn):  # the application's connection (enqueue_on)
            text_json(cur.adapters)
        return cur

    def _insert_rows(
        self,
        cur: psycopg.Cursor[Row],
        rows: Sequence[tuple[Any, ...]],
        now: dt.datetime | None,
        *,
        keyed: bool,
        notify: bool,
    ) -> tuple[int, dt.datetime]:
        # One array per column (the rows transposed), but a column with one value in every
        # row goes as an empty array and that value (see the query); ids always whole. The
        # statement returns the stored now() and sends the wake-ups itself: one round trip.
        arrays: dict[str, Any] = {"now": now, "channel": self.channel if notify else None}
        columns = zip(*rows, strict=True)
        named = zip(NEW_ROW_COLUMNS, _ARRAYS, columns, strict=True)
        for n, (name, array, column) in enumerate(named):
            first = column[0]
            if n != _ID and column.count(first) == len(column):  # the ids always go whole
                arrays[name], arrays[array] = first, []
            else:
                arrays[name], arrays[array] = None, list(column)
        query = _Q["enqueue_many"] if keyed else _ENQUEUE_UNKEYED
        row = cur.execute(query, arrays).fetchone()
        assert row is not None
        return row["inserted"], utc(row["now"])


def column_names(cur: psycopg.Cursor[Any]) -> tuple[str, ...]:
    """The names of the columns of *cur*'s rows, in order (read off the result)."""
    result = cur.pgresult
    assert result is not None
    return tuple(result.fname(n).decode() for n in range(result.nfields))  # type: ignore[union-attr]
