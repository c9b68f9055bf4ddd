"""Logging: the JSON formatter, and ``log_level``/``log.format`` applied by the service."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import trio

import trio_supervise as ts
from trio_supervise._logging import STRUCTURED_FIELDS, SUPERVISOR_FIELDS


class ListHandler(logging.Handler):
    """An application's own handler: keeps every record it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def bare_logging() -> Iterator[logging.Logger]:
    """The root logger with no handlers (pytest's own set aside), restored afterwards along with
    the levels these tests change. Entered inside a test: pytest adds its handlers per phase."""
    root = logging.getLogger()
    library = logging.getLogger("trio_supervise")
    saved = (list(root.handlers), root.level, library.level)
    root.handlers.clear()
    try:
        yield root
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        library.setLevel(saved[2])


def record(**extra: object) -> logging.LogRecord:
    logger = logging.getLogger("trio_supervise.runner")
    made = logger.makeRecord(
        logger.name, logging.WARNING, __file__, 1, "item %r failed", ("a",), None, extra=extra
    )
    made.created = 1893456000.25  # 2030-01-01 00:00:00.250 UTC
    return made


def test_a_json_line_has_the_standard_and_the_structured_fields() -> None:
    """One object: time (UTC), level, logger, message, then every structured ``extra`` field."""
    fields = {
        "supervisor": "app",
        "child": "pipeline/flaky",
        "worker": "host-41",
        "item_id": "a",
        "spec_id": "digest",
        "lease_version": 3,
        "attempt": 2,
        "backoff_s": 4.2,
        "error": "OSError: disk on fire",
    }
    line = ts.JsonFormatter().format(record(**fields, unrelated="not copied"))
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "2030-01-01T00:00:00.250+00:00",
        "level": "WARNING",
        "logger": "trio_supervise.runner",
        "message": "item 'a' failed",
        **fields,
    }
    assert set(fields) == {*SUPERVISOR_FIELDS, *STRUCTURED_FIELDS}


def test_a_json_line_carries_the_traceback_and_survives_odd_values() -> None:
    """``exc_info`` becomes ``exception`` (the formatted traceback); a value JSON cannot hold
    is written as its ``str``; only the fields present are written."""
    try:
        raise ValueError("bad config")
    except ValueError:
        logger = logging.getLogger("trio_supervise.workflow")
        made = logger.makeRecord(
            logger.name,
            logging.ERROR,
            __file__,
            1,
            "driver failed",
            (),
            sys.exc_info(),
            extra={"error": ValueError("bad config"), "item_id": "x\nline"},
        )
    document = json.loads(ts.JsonFormatter().format(made))
    assert set(document) == {"time", "level", "logger", "message", "error", "item_id", "exception"}
    assert document["error"] == "bad config"
    assert document["item_id"] == "x\nline"
    assert document["exception"].startswith("Traceback (most recent call last):")
    assert document["exception"].endswith("ValueError: bad config")


def test_log_level_applies_beside_the_applications_own_handlers() -> None:
    """With the application's handler installed, ``log_level`` still sets the library's level;
    the application's handler, root level and format are left alone."""
    with bare_logging() as root:
        mine = ListHandler()
        root.addHandler(mine)
        root.setLevel(logging.WARNING)

        ts.configure_logging("debug", "json")

        logging.getLogger("trio_supervise.runner").debug("claimed %d", 3)
        logging.getLogger("myapp").debug("not mine to show")
        assert [r.getMessage() for r in mine.records] == ["claimed 3"]
        assert root.handlers == [mine]
        assert root.level == logging.WARNING

        ts.configure_logging("error")
        logging.getLogger("trio_supervise.runner").warning("hidden now")
        assert len(mine.records) == 1


def test_without_handlers_one_is_installed_in_the_chosen_format() -> None:
    """No handler yet: one goes on the root logger, JSON or text; a second call replaces it."""
    with bare_logging() as root:
        stream = io.StringIO()
        ts.configure_logging("info", ts.LogFormat.JSON, stream=stream)
        logging.getLogger("trio_supervise.supervisor").info(
            "worker %r running", "sensor", extra={"child": "sensor"}
        )
        logging.getLogger("trio_supervise.supervisor").debug("below the level")
        [line] = stream.getvalue().splitlines()
        document = json.loads(line)
        assert (document["level"], document["message"], document["child"]) == (
            "INFO",
            "worker 'sensor' running",
            "sensor",
        )

        text = io.StringIO()
        ts.configure_logging("warning", "text", stream=text)
        logging.getLogger("trio_supervise.runner").warning("claim failed")
        assert len(root.handlers) == 1
        assert text.getvalue().endswith(" WARNING trio_supervise.runner: claim failed\n")
        assert stream.getvalue().count("\n") == 1


def test_a_bad_level_is_refused_by_name() -> None:
    """An unknown level name is a ValueError naming it."""
    with pytest.raises(ValueError, match="log_level must be a level name, got 'loud'"):
        ts.configure_logging("loud")


def test_log_format_is_a_setting(tmp_path: Path) -> None:
    """``[log] format`` in the file and ``TRIO_SUPERVISE_LOG__FORMAT`` both choose it; a bad
    value names the field and the choices."""
    path = tmp_path / "settings.toml"
    path.write_text('[log]\nformat = "json"\n')
    assert ts.load_settings(path, env={}).log.format is ts.LogFormat.JSON
    env = {"TRIO_SUPERVISE_LOG__FORMAT": "text"}
    assert ts.load_settings(path, env=env).log.format is ts.LogFormat.TEXT
    assert ts.Settings().log.format is ts.LogFormat.TEXT
    with pytest.raises(ts.SettingsError, match=r"log\.format: expected one of text, json"):
        ts.load_settings(env={"TRIO_SUPERVISE_LOG__FORMAT": "xml"})


def stopping_service(settings: ts.Settings) -> ts.Service:
    """A service whose only worker stops it at once (no HTTP, no signals)."""
    service: ts.Service

    async def stopper() -> None:
        await trio.lowlevel.checkpoint()
        service.stop("done")
        await service.shutdown.wait()

    service = ts.Service(
        workers=[ts.ChildSpec("stopper", stopper)],
        settings=attrs.evolve(settings, http=ts.HttpSettings(enabled=False)),
        handle_signals=False,
        name="demo",
    )
    return service


def test_run_service_logs_json_when_the_settings_say_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``run_service`` applies ``log.format = "json"``: every line it writes is a JSON object."""
    service = stopping_service(ts.Settings(log=ts.LogSettings(format=ts.LogFormat.JSON)))
    with bare_logging():
        assert ts.run_service(service) == 0
    documents = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert documents, "the service logged nothing"
    assert all(d["logger"].startswith("trio_supervise.") for d in documents)
    assert {"INFO"} <= {d["level"] for d in documents}


def test_run_service_applies_log_level_under_the_applications_handlers() -> None:
    """Regression: with the application's handler on a WARNING root, ``log_level = "info"``
    still lets the service's info records through (``basicConfig`` used to do nothing)."""
    with bare_logging() as root:
        mine = ListHandler()
        root.addHandler(mine)
        root.setLevel(logging.WARNING)
        assert ts.run_service(stopping_service(ts.Settings(log_level=ts.LogLevel.INFO))) == 0
        assert root.handlers == [mine]
    assert any(
        r.levelno == logging.INFO and r.name.startswith("trio_supervise.") for r in mine.records
    )
