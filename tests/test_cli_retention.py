"""``items prune``, ``items delete`` and ``items edit`` against SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import trio

from trio_supervise._cli import main
from trio_supervise.queues import open_queue

from .test_cli import Result, cli, database_url

__all__ = ["cli", "database_url"]


def _complete(url: str, item_id: str) -> None:
    """Claim and complete *item_id* as a worker would."""

    async def run() -> None:
        async with open_queue(url) as queue:
            [item] = await queue.claim_due(["job"], "w", 30, 1)
            assert item.id == item_id
            await queue.complete(item.id, item.lease_version)

    trio.run(run)


def _claim(url: str) -> None:
    async def run() -> None:
        async with open_queue(url) as queue:
            await queue.claim_due(["job"], "w", 300, 1)

    trio.run(run)


def test_prune_counts_then_deletes_finished_items(
    cli: Callable[..., Result], database_url: str
) -> None:
    """--dry-run says what would go; without it they go; queued items stay; --state narrows."""
    cli("migrate")
    cli("items", "enqueue", "job", "--id", "done")
    _complete(database_url, "done")
    cli("items", "enqueue", "other", "--id", "gone")
    cli("items", "cancel", "gone")
    cli("items", "enqueue", "other", "--id", "waiting")
    kept = cli("items", "prune", "--older-than", "1d")
    assert kept == Result(0, "deleted 0 completed\ndeleted 0 cancelled\ndeleted 0 dead\n", "")
    dry = cli("items", "prune", "--older-than", "0", "--dry-run")
    assert dry == Result(
        0, "would delete 1 completed\nwould delete 1 cancelled\nwould delete 0 dead\n", ""
    )
    assert cli("items", "show", "done").code == 0
    only = cli("items", "prune", "--older-than", "0s", "--state", "cancelled", "--json")
    assert json.loads(only.out) == {"counts": {"cancelled": 1}, "dry_run": False}
    assert cli("items", "show", "gone").code == 3
    assert cli("items", "prune", "--older-than", "0").out.startswith("deleted 1 completed\n")
    listed = json.loads(cli("items", "list", "--json").out)
    assert [item["id"] for item in listed] == ["waiting"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--older-than", "7x"], "argument --older-than: the age must be a number of seconds"),
        (["--older-than", "none"], "argument --older-than: an age is needed, got 'none'"),
        (["--older-than", "1d", "--state", "queued"], "argument --state: invalid choice"),
        ([], "the following arguments are required: --older-than"),
    ],
)
def test_prune_usage_errors_name_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad age or state is a usage error (exit 2) naming the flag."""
    with pytest.raises(SystemExit) as exited:
        main(["items", "prune", *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_delete_an_item_and_refuse_a_running_one(
    cli: Callable[..., Result], database_url: str
) -> None:
    """delete says what it removed; a running item is exit 1, a missing one exit 3."""
    cli("migrate")
    cli("items", "enqueue", "job", "--id", "r")
    cli("items", "enqueue", "other", "--id", "q")
    assert cli("items", "delete", "q") == Result(0, "deleted q (other, queued)\n", "")
    _claim(database_url)
    refused = cli("items", "delete", "r")
    assert refused == Result(1, "", "trio-supervise: error: item 'r' is running; cancel it first\n")
    assert cli("items", "delete", "q").code == 3


def test_edit_fixes_a_config_and_refuses_bad_json_and_running_items(
    cli: Callable[..., Result], database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """edit stores the new config; bad JSON is a usage error naming --config; running: exit 1."""
    cli("migrate")
    cli("items", "enqueue", "other", '{"a": 1}', "--id", "q")
    edited = cli("items", "edit", "q", "--config", '{"a": 2}')
    assert edited == Result(0, 'edited q (queued): config {"a": 2}\n', "")
    assert json.loads(cli("items", "show", "q", "--json").out)["config"] == {"a": 2}
    with pytest.raises(SystemExit) as exited:
        main(["items", "edit", "q", "--config", "{nope"])
    assert exited.value.code == 2
    assert "argument --config: not JSON" in capsys.readouterr().err
    unstorable = cli("items", "edit", "q", "--config", '"\\u0000"')
    assert unstorable.code == 1
    assert "NUL" in unstorable.err
    cli("items", "enqueue", "job", "--id", "r")
    _claim(database_url)
    refused = cli("items", "edit", "r", "--config", "{}")
    assert refused.code == 1
    assert refused.err == (
        "trio-supervise: error: item 'r' is running; its config can change once it is not\n"
    )
    assert cli("items", "edit", "missing", "--config", "{}").code == 3
