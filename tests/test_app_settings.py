"""An application's own settings: a subclass of ``Settings`` with its own table, read from the
same TOML file and environment, and handed to the service by ``trio-supervise run``."""

from __future__ import annotations

import logging
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

import trio_supervise as ts
from trio_supervise._cli import main


@attrs.frozen(kw_only=True)
class Garden:
    """An application's own table."""

    name: str
    beds: int = 1


@attrs.frozen(kw_only=True)
class GardenSettings(ts.Settings):
    """The application's settings: the library's, and a ``[garden]`` table."""

    garden: Garden
    greeting: str = "hello"


ONE_FILE = """
database_url = "sqlite:///garden.db"
greeting = "hi"

[http]
port = 9000

[runner]
concurrency = 3

[garden]
name = "roof"
"""


def test_app_and_library_settings_come_from_one_file(tmp_path: Path) -> None:
    """The library's fields and the application's table are read from the same file."""
    path = tmp_path / "garden.toml"
    path.write_text(ONE_FILE)
    settings = ts.load_settings(path, env={}, cls=GardenSettings)
    assert settings.garden == Garden(name="roof")
    assert settings.greeting == "hi"
    assert (settings.database_url, settings.http.port) == ("sqlite:///garden.db", 9000)
    assert settings.runner.concurrency == 3
    assert settings.runner.worker_id == ts.Settings().runner.worker_id


def test_the_environment_sets_app_fields_too(tmp_path: Path) -> None:
    """``TRIO_SUPERVISE_GARDEN__BEDS`` sets ``garden.beds``, parsed for its type, over the file."""
    path = tmp_path / "garden.toml"
    path.write_text(ONE_FILE)
    env = {"TRIO_SUPERVISE_GARDEN__BEDS": "4", "TRIO_SUPERVISE_GREETING": "hey"}
    settings = ts.load_settings(path, env=env, cls=GardenSettings)
    assert (settings.garden, settings.greeting) == (Garden(name="roof", beds=4), "hey")


@pytest.mark.parametrize(
    ("toml", "env", "message"),
    [
        ("", {}, "garden: required, but not given"),
        ("[garden]\nbeds = 2\n", {}, "garden.name: required, but not given"),
        ('[garden]\nname = "x"\nbedz = 2\n', {}, "garden.bedz: unknown setting; did you mean"),
        ('[garden]\nname = "x"\nbeds = "2"\n', {}, "garden.beds: expected int, got str"),
        (
            '[garden]\nname = "x"\n',
            {"TRIO_SUPERVISE_GARDEN__BEDS": "many"},
            "garden.beds: expected int, got 'many' (from TRIO_SUPERVISE_GARDEN__BEDS)",
        ),
    ],
    ids=["table-missing", "required-field-missing", "typo", "wrong-type", "bad-env"],
)
def test_app_settings_errors_name_the_field(
    tmp_path: Path, toml: str, env: dict[str, str], message: str
) -> None:
    """An application's fields get the library's errors: by field path, with the rule."""
    path = tmp_path / "garden.toml"
    path.write_text(toml)
    with pytest.raises(ts.SettingsError) as raised:
        ts.load_settings(path, env=env, cls=GardenSettings)
    assert message in str(raised.value)


APP_MODULE = """
    import attrs
    import trio

    import trio_supervise as ts

    RECEIVED = []


    @attrs.frozen(kw_only=True)
    class Garden:
        name: str


    @attrs.frozen(kw_only=True)
    class GardenSettings(ts.Settings):
        garden: Garden


    def make_service(settings: GardenSettings) -> ts.Service:
        RECEIVED.append(settings)
        service = None

        async def stopper() -> None:
            await trio.lowlevel.checkpoint()
            service.stop("done")

        service = ts.Service(
            workers=[ts.ChildSpec("stopper", stopper, restart_type="temporary")],
            handle_signals=False,
        )
        return service
"""


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A module ``garden_app`` importable from *tmp_path*, the working directory."""
    (tmp_path / "garden_app.py").write_text(textwrap.dedent(APP_MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    library = logging.getLogger("trio_supervise")
    level = library.level
    try:
        yield tmp_path
    finally:
        library.setLevel(level)
        sys.modules.pop("garden_app", None)


def test_run_hands_the_app_settings_to_its_factory(app_module: Path) -> None:
    """``run MODULE:FACTORY --settings-class MODULE:CLASS`` loads that class from the file and
    the environment and calls the factory with ``settings=``; the service runs with them."""
    config = app_module / "garden.toml"
    config.write_text('[http]\nenabled = false\n\n[garden]\nname = "roof"\n')
    argv = [
        "run",
        "garden_app:make_service",
        "--settings-class",
        "garden_app:GardenSettings",
        "--config",
        str(config),
    ]
    assert main(argv) == 0
    import garden_app  # type: ignore[import-not-found]

    [settings] = garden_app.RECEIVED
    assert type(settings) is garden_app.GardenSettings
    assert settings.garden == garden_app.Garden(name="roof")
    assert settings.http.enabled is False


@pytest.mark.parametrize(
    ("settings_class", "message"),
    [
        ("garden_app:make_service", "is not an attrs subclass of trio_supervise.Settings"),
        ("garden_app:Garden", "is not an attrs subclass of trio_supervise.Settings"),
        ("garden_app:Nope", "module 'garden_app' has no attribute 'Nope'"),
        ("garden_app", "--settings-class: expected MODULE:ATTR, got 'garden_app'"),
    ],
)
def test_a_bad_settings_class_is_one_line(
    app_module: Path, capsys: pytest.CaptureFixture[str], settings_class: str, message: str
) -> None:
    """A ``--settings-class`` that is not a Settings subclass is a user error, not a traceback."""
    assert main(["run", "garden_app:make_service", "--settings-class", settings_class]) == 1
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_the_app_section_is_required_when_run_uses_the_app_class(
    app_module: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing required app table is reported by name, before anything starts."""
    argv = ["run", "garden_app:make_service", "--settings-class", "garden_app:GardenSettings"]
    assert main(argv) == 1
    assert "garden: required, but not given" in capsys.readouterr().err
