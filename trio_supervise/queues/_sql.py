"""What the SQL backends share: their ``.sql`` files, migrations, and small helpers.

SQL is data: each backend keeps, under ``sql/<backend>/``,

- ``schema.sql``: the current schema, applied as a whole to an empty database;
- ``migrations/NNNN_<what>.sql``: the same schema reached step by step, one file per version;
- ``queries.sql``: named queries, each block opened by ``-- name: <name>``.

They ship inside the package and are read with :mod:`importlib.resources`. The schema version is
the number of the newest migration; a database records the versions it has applied in the
``trio_supervise_schema_version`` table.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import urllib.parse
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Literal

import attrs

from .._errors import SchemaError
from ..job import WorkItem
from ..job._model import ERRORS, JSON, TAGS, stored_kind

__all__ = [
    "Backend",
    "Migration",
    "duration_us",
    "latest_version",
    "load_queries",
    "migrations",
    "dsn_secrets",
    "redact_dsn",
    "schema_sql",
    "scrub_dsn",
    "too_new",
]

Backend = Literal["postgres", "sqlite"]

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")


@attrs.frozen
class Migration:
    """One step of a backend's schema history."""

    version: int
    name: str
    sql: str


def _sql_dir(backend: Backend) -> resources.abc.Traversable:
    return resources.files(__package__).joinpath("sql", backend)


_COMMENT_LINE = re.compile(r"^[ \t]*--.*\n", re.MULTILINE)
"""A line holding nothing but a comment (the queries hold no string literal spanning lines)."""


@functools.cache
def load_queries(backend: Backend) -> Mapping[str, str]:
    """The backend's named queries, ``{name: sql}``, without their comment lines.

    Each ``{item_columns}`` becomes the item's columns by name (see :func:`item_columns`).
    The comments are for readers of the ``.sql`` file; the driver is better off without them:
    psycopg caches the parse of a query's placeholders only for a query shorter than 4096
    characters (``MAX_CACHED_STATEMENT_LENGTH``), and with its comments the claim is longer,
    so every claim parsed it again (a third of the claim's client time besides its rows).
    """
    text = _sql_dir(backend).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"query {name!r} is defined twice in {backend}/queries.sql")
        query = _COMMENT_LINE.sub("", body.strip() + "\n").strip()
        queries[name] = _ITEM_COLUMNS.sub(lambda m: item_columns(backend, m.group(1)), query)
    return queries


_ITEM_COLUMNS = re.compile(r"\{item_columns(?::(\w+))?\}")
_JSON_KINDS = frozenset({JSON, ERRORS, TAGS})


def item_columns(backend: Backend, alias: str | None = None) -> str:
    """The item's columns, named (as ``{item_columns}`` or ``{item_columns:alias}`` in a query).

    Never ``*``: a worker's prepared statement returning ``*`` fails once a later release's
    migration adds a column ("cached plan must not change result type"), so workers of the
    release before could not run beside the new schema during a rolling upgrade. Named, the
    result keeps its shape, and the added column is simply not read. On PostgreSQL the JSON
    columns come as their text (``::text``), in the binary format too, as the decoders read
    them.
    """
    prefix = f"{alias}." if alias else ""
    columns = []
    for field in attrs.fields(WorkItem):
        column = prefix + field.name
        if backend == "postgres" and stored_kind(field) in _JSON_KINDS:
            column = f"{column}::text AS {field.name}"
        columns.append(column)
    return ", ".join(columns)


# PostgreSQL's names the partial index's predicate (the key's unique index holds keyed items
# only); SQLite's is the plain clause.
_CONFLICT_CLAUSE = re.compile(
    r"ON CONFLICT \(idempotency_key\)(?: WHERE idempotency_key IS NOT NULL)? DO NOTHING"
)


def without_conflict_clause(query: str) -> str:
    """The enqueue *query* without its ``ON CONFLICT (idempotency_key) ... DO NOTHING``: for a
    batch with no key, which cannot conflict on it, and whose insert is faster without the
    clause (a third faster on SQLite)."""
    stripped, count = _CONFLICT_CLAUSE.subn("", query)
    if count != 1:  # pragma: no cover - the .sql file was changed
        raise RuntimeError(f"the enqueue query must hold {_CONFLICT_CLAUSE.pattern!r} once")
    return stripped


def with_query(query: str, name: str, inner: str) -> str:
    """*query* with its ``{name}`` placeholder (alone on its line) replaced by the query *inner*,
    its final semicolon dropped: one statement built around another without copying it."""
    marker = "{" + name + "}"
    if query.count(marker) != 1:  # pragma: no cover - the .sql file was changed
        raise RuntimeError(f"the query must hold {marker!r} once")
    return query.replace(marker, inner.rstrip().removesuffix(";"))


@functools.cache
def migrations(backend: Backend) -> tuple[Migration, ...]:
    """Every migration of the backend, oldest first, numbered 1, 2, 3, ... without gaps."""
    found = []
    for entry in _sql_dir(backend).joinpath("migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"{backend} migrations are not numbered 1..n without gaps")
    return tuple(found)


def latest_version(backend: Backend) -> int:
    """The schema version this release of trio_supervise writes and expects."""
    return migrations(backend)[-1].version


@functools.cache
def schema_sql(backend: Backend) -> str:
    """The backend's current schema as one script (equal to every migration applied)."""
    return _sql_dir(backend).joinpath("schema.sql").read_text(encoding="utf-8")


def too_new(found: int, backend: Backend, where: str) -> SchemaError:
    """The error for a schema newer than this release knows."""
    return SchemaError(
        f"the queue schema at {where} is at version {found}, newer than version "
        f"{latest_version(backend)} that this release of trio_supervise knows; "
        "upgrade trio_supervise"
    )


def missing(found: int, backend: Backend, where: str, url: str) -> SchemaError:
    """The error for a schema that is absent or older than this release needs."""
    what = "has no queue schema" if found == 0 else f"has queue schema version {found}"
    return SchemaError(
        f"{where} {what}; this release of trio_supervise needs version "
        f"{latest_version(backend)}. Run `trio-supervise migrate --database-url {url}` "
        "(or `await trio_supervise.migrate(url)`), or open the queue with migrate=True"
    )


def to_migrate(found: int, backend: Backend, where: str, url: str, *, migrate: bool) -> bool:
    """Whether a database whose schema is at version *found* is to be migrated as it opens:
    a newer one raises :func:`too_new`, and an older (or missing) one :func:`missing` unless
    *migrate*."""
    latest = latest_version(backend)
    if found > latest:
        raise too_new(found, backend, where)
    if found < latest and not migrate:
        raise missing(found, backend, where, url)
    return found < latest


def duration_us(name: str, value: float, *, positive: bool = False) -> int:
    """Check a duration in seconds and return it in whole microseconds, rounded as timedelta."""
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if positive and value == 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return dt.timedelta(seconds=value) // dt.timedelta(microseconds=1)


def other_than(generation: int) -> Callable[[int], bool]:
    """A predicate for ``AsyncValue.wait_value``: anything but *generation*."""
    return lambda value: value != generation


def check_limit(limit: int) -> int:
    """Refuse a negative limit."""
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return limit


_SECRET_KEYS = r"(?:ssl)?password|passwd|secret|token"
_URL_IN_TEXT = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/?#@\s]*:)[^@\s]*(?=@)")
_QUERY_PASSWORD = re.compile(rf"(?P<head>[?&](?:{_SECRET_KEYS})=)[^&#\s]*", re.IGNORECASE)
_QUERY_VALUE = re.compile(rf"[?&](?:{_SECRET_KEYS})=(?P<value>[^&#]*)", re.IGNORECASE)
_KV_PASSWORD = re.compile(
    rf"(?P<head>\b(?:{_SECRET_KEYS})\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*(?:'|$)|[^\s']+)",
    re.IGNORECASE | re.DOTALL,
)
_PIECES = re.compile(r"[@\s/?#:'\"]+")
_MASK = "***"
_MIN_SECRET = 3
"""Shorter secrets are not searched for in texts: masking them would mangle the words."""
_MIN_PIECE = 4


def _url_password_span(dsn: str) -> tuple[int, int] | None:
    """Where the password of the URL *dsn* is, read generously enough that an unencoded ``@``,
    space, ``?`` or ``/`` in a password stays inside it.

    The credentials end at the last ``@`` before the first ``/`` after the scheme; when no ``@``
    comes before that ``/`` (a password holding a ``/``), at the last ``@`` before the query.
    The password runs from the first ``:`` of the credentials.
    """
    start = dsn.find("://") + 3
    slash = dsn.find("/", start)
    last_at = dsn.rfind("@", start, slash if slash >= 0 else len(dsn))
    if last_at < 0 and slash >= 0:
        query = dsn.find("?", slash)
        last_at = dsn.rfind("@", slash, query if query >= 0 else len(dsn))
    if last_at < 0:
        return None
    colon = dsn.find(":", start, last_at)
    return None if colon < 0 else (colon + 1, last_at)


def dsn_secrets(dsn: str) -> tuple[str, ...]:
    """Every secret *dsn* holds, as it is written, decoded, and in the fragments a parser may
    quote on its own (libpq splits a malformed URL at the first ``@``); longest first."""
    found: set[str] = set()
    if "://" in dsn:
        span = _url_password_span(dsn)
        if span is not None:
            found.add(dsn[span[0] : span[1]])
        found.update(match["value"] for match in _QUERY_VALUE.finditer(dsn))
    else:
        for match in _KV_PASSWORD.finditer(dsn):
            value = match["value"]
            if value.startswith("'"):
                value = re.sub(r"\\(.)", r"\1", value[1:].removesuffix("'"))
            found.add(value)
    found |= {urllib.parse.unquote(secret) for secret in found}
    found |= {
        piece for secret in found for piece in _PIECES.split(secret) if len(piece) >= _MIN_PIECE
    }
    return tuple(sorted((s for s in found if len(s) >= _MIN_SECRET), key=len, reverse=True))


def redact_dsn(dsn: str) -> str:
    """*dsn* with any password replaced by ``***``, for error messages and logs.

    Handles URLs (``postgresql://user:secret@host/db``, ``?password=secret``), malformed ones
    included (an unencoded ``@`` or space in the password), and libpq key/value strings
    (``host=h password=secret``, quoted or not, even unterminated).
    """
    if "://" in dsn:
        span = _url_password_span(dsn)
        if span is not None:
            dsn = dsn[: span[0]] + _MASK + dsn[span[1] :]
        return _QUERY_PASSWORD.sub(rf"\g<head>{_MASK}", dsn)
    return _KV_PASSWORD.sub(rf"\g<head>{_MASK}", dsn)


def scrub_dsn(text: str, dsn: str) -> str:
    """*text* (an error message, a log line) with *dsn* redacted wherever it appears and every
    secret of *dsn* removed, even where a parser quoted a piece of it on its own."""
    if dsn:
        text = text.replace(dsn, redact_dsn(dsn))
    text = _URL_IN_TEXT.sub(rf"\g<head>{_MASK}", text)
    text = _QUERY_PASSWORD.sub(rf"\g<head>{_MASK}", text)
    text = _KV_PASSWORD.sub(rf"\g<head>{_MASK}", text)
    for secret in dsn_secrets(dsn):
        text = text.replace(secret, _MASK)
    return text
