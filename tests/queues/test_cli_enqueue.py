"""The CLI's producing side: ``items enqueue --from-file``, ``--unique``, the ``exists:`` line,
and ``items show --key``, on SQLite and PostgreSQL."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trio_supervise._cli import main

from .conftest import pg_schema

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def cli(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Run]:
    """The CLI in-process against an empty, migrated database: (code, stdout, stderr)."""

    def runner(url: str) -> Run:
        def run(*argv: str, stdin: str | None = None) -> tuple[int, str, str]:
            if stdin is not None:
                monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
            code = main([*argv, "--database-url", url])
            out, err = capsys.readouterr()
            return code, out, err

        return run

    if request.param == "sqlite":
        run = runner(f"sqlite:///{tmp_path / 'cli.db'}")
        assert run("migrate")[0] == 0
        yield run
        return
    import psycopg
    from psycopg import sql

    with pg_schema() as (dsn, schema):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        separator = "&" if "?" in dsn else "?"
        run = runner(f"{dsn}{separator}options=-csearch_path%3D{schema}")
        assert run("migrate")[0] == 0
        yield run


def _lines(*documents: object) -> str:
    return "".join(json.dumps(each) + "\n" for each in documents)


def test_from_file_enqueues_every_line(cli: Run, tmp_path: Path) -> None:
    """Each line becomes an item with its fields; a blank line is skipped; a summary follows."""
    path = tmp_path / "items.jsonl"
    path.write_text(
        _lines(
            {"spec_id": "report", "config": {"customer": "acme"}, "item_id": "r-1"},
            {"spec_id": "email", "item_id": "e-1", "priority": -5, "queue": "mail"},
        )
        + "\n"
        + _lines({"spec_id": "email", "item_id": "e-2", "due_at": "2030-01-01T09:00:00+01:00"})
    )
    code, out, err = cli("items", "enqueue", "--from-file", str(path))
    assert code == 0, err
    assert out.splitlines()[0].startswith("enqueued r-1 (report), due ")
    assert "enqueued e-2 (email), due 2030-01-01 08:00:00 UTC" in out
    assert out.splitlines()[-1] == "3 enqueued, 0 existed already"
    code, out, _ = cli("items", "show", "e-1", "--json")
    shown = json.loads(out)
    assert (shown["priority"], shown["queue"]) == (-5, "mail")
    assert json.loads(cli("items", "show", "r-1", "--json")[1])["config"] == {"customer": "acme"}


def test_from_stdin_in_json(cli: Run) -> None:
    """``-`` reads standard input; ``--json`` prints per line whether it was created."""
    stdin = _lines(
        {"spec_id": "s", "idempotency_key": "k"},
        {"spec_id": "s", "idempotency_key": "k"},
    )
    code, out, err = cli("items", "enqueue", "--from-file", "-", "--json", stdin=stdin)
    assert code == 0, err
    document = json.loads(out)
    assert [(each["line"], each["created"]) for each in document] == [(1, True), (2, False)]
    assert document[0]["item"]["id"] == document[1]["item"]["id"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{bad", "line 2: not JSON"),
        ("[1, 2]", "line 2: expected a JSON object, got list"),
        ('{"spec_id": "s", "colour": 1}', "line 2: unknown field 'colour'"),
        ('{"config": {}}', "line 2: spec_id is missing"),
        ('{"spec_id": "s", "priority": "high"}', 'line 2: priority must be an integer, got "high"'),
        ('{"spec_id": "s", "priority": 500}', "line 2: priority must be an integer from -100"),
        ('{"spec_id": ""}', "line 2: spec_id must be a non-empty string"),
        ('{"spec_id": "s", "due_at": "tomorrow"}', "line 2: expected an ISO 8601 datetime"),
        ('{"spec_id": "s", "unique": "sometimes", "idempotency_key": "k"}', "line 2: unique"),
        ('{"spec_id": "s", "unique": "unfinished"}', "line 2: unique='unfinished' needs an"),
        ('{"spec_id": "s", "tenant_id": "a\\u0000b"}', "line 2: tenant_id must not contain NUL"),
    ],
)
def test_a_bad_line_writes_nothing(cli: Run, bad: str, message: str) -> None:
    """A bad line is reported with its number and field, exit 2, and no line is written."""
    stdin = _lines({"spec_id": "s", "item_id": "first"}) + bad + "\n" + _lines({"spec_id": "s"})
    code, _, err = cli("items", "enqueue", "--from-file", "-", stdin=stdin)
    assert code == 2
    assert message in err
    assert "nothing was written" in err
    assert cli("items", "list", "--json")[1].strip() == "[]"


def test_an_existing_id_in_the_file_writes_nothing(cli: Run) -> None:
    """A line whose item id exists already is named; nothing of the file is written."""
    assert cli("items", "enqueue", "s", "--id", "taken")[0] == 0
    stdin = _lines({"spec_id": "s", "item_id": "new"}, {"spec_id": "s", "item_id": "taken"})
    code, _, err = cli("items", "enqueue", "--from-file", "-", stdin=stdin)
    assert code == 1
    assert "line 2: an item with id 'taken' already exists; nothing was written" in err
    assert [each["id"] for each in json.loads(cli("items", "list", "--json")[1])] == ["taken"]


def test_from_file_refuses_per_item_flags(cli: Run) -> None:
    """--from-file with a SPEC or a per-item flag is a usage error naming them."""
    code, _, err = cli("items", "enqueue", "s", "--key", "k", "--from-file", "-", stdin="")
    assert code == 2
    assert "drop SPEC, --key" in err


def test_an_existing_key_says_exists(cli: Run) -> None:
    """A second enqueue with a held key prints ``exists: ID (key K, state S); config
    unchanged`` and exits 0; the item keeps its config."""
    assert cli("items", "enqueue", "s", '{"v": 1}', "--id", "a", "--key", "k")[0] == 0
    code, out, err = cli("items", "enqueue", "s", '{"v": 2}', "--key", "k")
    assert code == 0, err
    assert out.strip() == "exists: a (key k, state queued); config unchanged"
    assert json.loads(cli("items", "show", "a", "--json")[1])["config"] == {"v": 1}


def test_unique_unfinished_from_the_command_line(cli: Run) -> None:
    """--unique unfinished: once the holder is cancelled, the key makes a new item; show --key
    finds the new holder, and the old item shows its released key."""
    assert cli("items", "enqueue", "s", "--id", "a", "--key", "k", "--unique", "unfinished")[0] == 0
    assert "exists: a" in cli("items", "enqueue", "s", "--key", "k")[1]
    assert cli("items", "cancel", "a")[0] == 0
    code, out, err = cli("items", "enqueue", "s", "--id", "b", "--key", "k")
    assert code == 0, err
    assert out.startswith("enqueued b (s)")
    code, out, _ = cli("items", "show", "--key", "k")
    assert code == 0
    assert out.splitlines()[0].split() == ["id", "b"]
    assert "released key k" in cli("items", "show", "a")[1]


def test_unique_period_is_shown(cli: Run) -> None:
    """--unique 7d stores a period; show prints until when the key holds."""
    assert cli("items", "enqueue", "s", "--id", "a", "--key", "k", "--unique", "7d")[0] == 0
    shown = json.loads(cli("items", "show", "--key", "k", "--json")[1])
    assert shown["unique_scope"] == "period"
    assert "until " in cli("items", "show", "a")[1]


@pytest.mark.parametrize("bad", ["sometimes", "0", "-5", "7w"])
def test_unique_refuses_a_bad_scope(cli: Run, bad: str) -> None:
    """--unique takes forever, unfinished or a positive period; anything else exits 2."""
    with pytest.raises(SystemExit) as exit_info:
        cli("items", "enqueue", "s", "--key", "k", "--unique", bad)
    assert exit_info.value.code == 2


def test_show_needs_an_id_or_a_key(cli: Run) -> None:
    """``items show`` with neither an ID nor --key (or both) is a usage error; an unknown key is
    not found (exit 3)."""
    for argv in (["items", "show"], ["items", "show", "a", "--key", "k"]):
        with pytest.raises(SystemExit) as exit_info:
            cli(*argv)
        assert exit_info.value.code == 2
    code, _, err = cli("items", "show", "--key", "nope")
    assert code == 3
    assert "no item with idempotency key 'nope'" in err


def test_a_file_line_takes_every_field_of_new_item() -> None:
    """--from-file knows every field of NewItem, so nothing enqueue accepts is out of reach of
    a file (a field added to NewItem must be added to the file's fields too)."""
    import attrs

    from trio_supervise._cli._items import _FILE_FIELDS
    from trio_supervise.queues import NewItem

    assert set(_FILE_FIELDS) == {field.name for field in attrs.fields(NewItem)}


def test_from_file_carries_concurrency_keys(cli: Run) -> None:
    line = '{"spec_id": "sync", "item_id": "s1", "concurrency_key": "tenant:acme", '
    line += '"concurrency_limit": 2}\n'
    code, out, _ = cli("items", "enqueue", "--from-file", "-", stdin=line)
    assert code == 0, out
    code, out, _ = cli("items", "show", "s1", "--json")
    assert code == 0
    shown = json.loads(out)
    assert (shown["concurrency_key"], shown["concurrency_limit"]) == ("tenant:acme", 2)
    code, _, err = cli("items", "enqueue", "--from-file", "-", "--concurrency-key", "k", stdin=line)
    assert code == 2
    assert "--concurrency-key" in err
