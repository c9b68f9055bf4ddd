"""The CLI's named queues: ``items enqueue --priority/--queue`` and ``queues list|pause|resume``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from trio_supervise._cli import main
from trio_supervise.queues import open_queue

from .test_cli_reads import run


def test_enqueue_takes_a_priority_and_a_queue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--priority` and `--queue` are stored; `items show` prints them."""
    url = f"sqlite:///{tmp_path}/q.db"
    code, out, _ = run(
        capsys, "items", "enqueue", "job", "--id", "a", "--priority", "-7", "--queue", "mail",
        "--database-url", url, "--json",
    )  # fmt: skip
    assert code == 0
    assert (json.loads(out)["priority"], json.loads(out)["queue"]) == (-7, "mail")
    code, out, _ = run(capsys, "items", "show", "a", "--database-url", url)
    assert code == 0
    assert any(line.split() == ["queue", "mail"] for line in out.splitlines())
    assert any(line.split() == ["priority", "-7"] for line in out.splitlines())


@pytest.mark.parametrize("bad", ["101", "-101", "high", "1.5"])
def test_enqueue_refuses_a_priority_out_of_range(
    bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A priority out of -100..100 is a usage error (exit 2) naming the rule; nothing written."""
    path = tmp_path / "q.db"
    with pytest.raises(SystemExit) as exit_info:
        main(["items", "enqueue", "job", "--priority", bad, "--database-url", f"sqlite:///{path}"])
    assert exit_info.value.code == 2
    assert "must be an integer from -100 (claimed first) to 100" in capsys.readouterr().err
    assert not path.exists()


def test_queues_pause_list_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Pausing is stored (a claim then takes nothing), listed with counts, and undone by resume."""
    url = f"sqlite:///{tmp_path}/q.db"
    assert run(capsys, "items", "enqueue", "job", "--queue", "mail", "--database-url", url)[0] == 0
    assert run(capsys, "queues", "pause", "mail", "--database-url", url)[1] == "paused mail\n"
    again = run(capsys, "queues", "pause", "mail", "--database-url", url)
    assert again[:2] == (0, "mail was paused already\n")

    async def claim() -> int:
        async with open_queue(url) as queue:
            return len(await queue.claim_due(["job"], "w", 30, 10, queue="mail"))

    assert trio.run(claim) == 0
    code, out, _ = run(capsys, "queues", "list", "--database-url", url, "--json")
    assert code == 0
    [mail] = json.loads(out)
    assert (mail["name"], mail["paused"], mail["counts"]) == ("mail", True, {"queued": 1})
    code, out, _ = run(capsys, "queues", "list", "--database-url", url)
    assert out.splitlines()[0].split()[:2] == ["QUEUE", "STATUS"]
    assert out.splitlines()[1].startswith("mail   paused since ")
    assert run(capsys, "queues", "resume", "mail", "--database-url", url)[1] == "resumed mail\n"
    assert run(capsys, "queues", "resume", "mail", "--database-url", url)[1] == (
        "mail was not paused\n"
    )
    assert trio.run(claim) == 1


def test_queues_commands_on_a_missing_database_create_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`queues` verbs never create a database: a typo exits 1 saying how to create it."""
    path = tmp_path / "typo.db"
    code, _, err = run(capsys, "queues", "pause", "mail", "--database-url", f"sqlite:///{path}")
    assert code == 1
    assert "no database at" in err
    assert not path.exists()


def test_enqueue_takes_a_concurrency_key_and_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--concurrency-key/--concurrency-limit` are stored (a key alone: limit 1); `items show`
    prints them; a limit without a key, or below 1, is refused naming the rule."""
    url = f"sqlite:///{tmp_path}/q.db"
    code, out, _ = run(
        capsys, "items", "enqueue", "job", "--id", "a", "--concurrency-key", "acme",
        "--concurrency-limit", "3", "--database-url", url, "--json",
    )  # fmt: skip
    assert code == 0
    document = json.loads(out)
    assert (document["concurrency_key"], document["concurrency_limit"]) == ("acme", 3)
    code, out, _ = run(
        capsys, "items", "enqueue", "job", "--id", "b", "--concurrency-key", "acme",
        "--database-url", url, "--json",
    )  # fmt: skip
    assert (code, json.loads(out)["concurrency_limit"]) == (0, 1)
    code, out, _ = run(capsys, "items", "show", "a", "--database-url", url)
    assert any(line.split() == ["concurrency", "acme", "(limit", "3)"] for line in out.splitlines())
    code, _, err = run(
        capsys, "items", "enqueue", "job", "--concurrency-limit", "2", "--database-url", url
    )
    assert code == 1
    assert "concurrency_limit needs a concurrency_key" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["items", "enqueue", "job", "--concurrency-key", "k", "--concurrency-limit", "0"])
    assert exit_info.value.code == 2
    assert "--concurrency-limit: must be an integer from 1" in capsys.readouterr().err
