"""Logging: a JSON formatter, and the setup a service applies from its settings.

The library only ever *emits* records, on loggers under ``trio_supervise``; configuring handlers
is the application's business. :func:`configure_logging` (what ``run_service`` and
``trio-supervise run`` call) does two things:

- it sets ``log_level`` on the ``trio_supervise`` logger itself, so the level takes effect
  whether or not the application installed handlers of its own (``logging.basicConfig`` silently
  does nothing once the root logger has a handler);
- when the root logger has no handler yet, it installs one on stderr, formatted as text or as
  JSON (``log.format``), and gives the root logger the same level. An application's own
  handlers are left as they are: to log JSON through them, give them a :class:`JsonFormatter`.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import logging
import sys
from typing import Any, TextIO

__all__ = [
    "STRUCTURED_FIELDS",
    "OUTCOME_FIELDS",
    "SUPERVISOR_FIELDS",
    "JsonFormatter",
    "LogFormat",
    "configure_logging",
]

LIBRARY_LOGGER = "trio_supervise"
"""The parent of every logger the library writes to."""

STRUCTURED_FIELDS = (
    "worker",
    "item_id",
    "spec_id",
    "lease_version",
    "attempt",
    "backoff_s",
    "error",
)
"""The ``extra`` fields a runner's records carry (when they apply), copied into JSON lines."""

SUPERVISOR_FIELDS = ("supervisor", "child")
"""The ``extra`` fields a supervisor's records carry besides ``attempt``, ``backoff_s`` and
``error``, also copied into JSON lines.

Each key has one meaning in every record: ``supervisor`` is a supervisor's name and ``child`` the
path of one of its children (``pipeline/flaky``); ``worker`` is a runner's ``worker_id`` (the
owner written in leases)."""

OUTCOME_FIELDS = ("outcome",)
"""The field of a runner's INFO line about a settled outcome: its kind (``complete``...)."""

_JSON_FIELDS = (*SUPERVISOR_FIELDS, *STRUCTURED_FIELDS, *OUTCOME_FIELDS)

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The text format of the handler :func:`configure_logging` installs."""


class LogFormat(enum.StrEnum):
    """How the handler that the service installs writes records."""

    TEXT = "text"
    """``2030-01-01 00:00:00,000 WARNING trio_supervise.runner: ...``"""
    JSON = "json"
    """One JSON object a line (see :class:`JsonFormatter`)."""


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line.

    Keys: ``time`` (ISO 8601, UTC, milliseconds), ``level``, ``logger``, ``message``; then each
    of :data:`SUPERVISOR_FIELDS` and :data:`STRUCTURED_FIELDS` that the record carries (from
    ``extra=``); then ``exception``
    (the formatted traceback) when the record has ``exc_info``, and ``stack`` with
    ``stack_info``. A value JSON cannot hold is written as its ``str``.
    """

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = record.__dict__
        for name in _JSON_FIELDS:
            if name in fields:
                document[name] = fields[name]
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["exception"] = record.exc_text
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        return json.dumps(document, default=str, ensure_ascii=False)


class _ServiceHandler(logging.StreamHandler[TextIO]):
    """The handler :func:`configure_logging` installs; replaced, never stacked, on a second call."""


def configure_logging(
    level: str, format: LogFormat | str = LogFormat.TEXT, *, stream: TextIO | None = None
) -> None:
    """Apply *level* to the library's loggers, and install a stderr handler if there is none.

    :param level: a level name (``"debug"``, ``"INFO"``, ...), set on the ``trio_supervise``
        logger always, and on the root logger when the handler is installed here.
    :param format: ``"text"`` or ``"json"``, for the installed handler.
    :param stream: where the installed handler writes (default ``sys.stderr``).
    """
    numeric = logging.getLevelNamesMapping().get(str(level).upper())
    if numeric is None:
        raise ValueError(f"log_level must be a level name, got {level!r}")
    chosen = LogFormat(format)
    logging.getLogger(LIBRARY_LOGGER).setLevel(numeric)
    root = logging.getLogger()
    ours = [handler for handler in root.handlers if isinstance(handler, _ServiceHandler)]
    if root.handlers and not ours:
        return  # the application's own handlers: theirs to format
    for handler in ours:
        root.removeHandler(handler)
        handler.close()
    handler = _ServiceHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(
        JsonFormatter() if chosen is LogFormat.JSON else logging.Formatter(TEXT_FORMAT)
    )
    root.addHandler(handler)
    root.setLevel(numeric)
