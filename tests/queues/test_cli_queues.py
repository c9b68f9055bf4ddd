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


# -- known queues: a typo is not a new queue ---------------------------------------------------

REMINDERS_APP = """
from trio_supervise import RunnerSettings, Schedule, Service, Settings, Stop


class Reminders:
    name = "reminders"
    spec_ids = ("remind",)
    queue = "reminders"
    priority = -3

    def validate_specs(self):
        pass

    async def evaluate(self, context, item):
        return Stop()


def service():
    return Service(
        drivers=[Reminders()],
        schedules=[Schedule(name="nightly", spec_id="remind", cron="0 3 * * *")],
        settings=Settings(runner=RunnerSettings(worker_id="w", queues={"reminders": 2})),
    )
"""


@pytest.fixture
def reminders_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A service module whose driver declares queue "reminders", as --service MODULE:ATTR."""
    (tmp_path / "cli_reminders_app.py").write_text(REMINDERS_APP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRIO_SUPERVISE_RUNNER__QUEUES", raising=False)
    return "cli_reminders_app:service"


def test_pausing_a_queue_nothing_uses_is_refused_naming_the_known_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`queues pause remnders` (a typo) exits 1 naming the known queues and pauses nothing;
    --force pauses it all the same."""
    url = f"sqlite:///{tmp_path}/q.db"
    run(capsys, "items", "enqueue", "remind", "--queue", "reminders", "--database-url", url)
    for verb in ("pause", "resume"):
        code, out, err = run(capsys, "queues", verb, "remnders", "--database-url", url)
        assert (code, out) == (1, "")
        assert "no queue 'remnders' is known" in err
        assert "(known: default, reminders)" in err
        assert f"pass --force to {verb} it anyway" in err
    code, out, _ = run(capsys, "queues", "list", "--database-url", url, "--json")
    assert [queue["name"] for queue in json.loads(out)] == ["reminders"]
    forced = run(capsys, "queues", "pause", "remnders", "--force", "--database-url", url)
    assert forced[:2] == (0, "paused remnders\n")


def test_a_queue_a_services_driver_declares_is_known(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], reminders_app: str
) -> None:
    """With --service, the queues its drivers declare may be paused before any item exists."""
    url = f"sqlite:///{tmp_path}/q.db"
    assert run(capsys, "migrate", "--database-url", url)[0] == 0
    code, out, err = run(
        capsys, "queues", "pause", "reminders", "--service", reminders_app, "--database-url", url
    )
    assert (code, out, err) == (0, "paused reminders\n", "")


def test_enqueue_with_a_service_uses_the_drivers_queue_and_priority(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], reminders_app: str
) -> None:
    """Without --queue, --service puts the item where its driver says, with no warning."""
    url = f"sqlite:///{tmp_path}/q.db"
    code, out, err = run(
        capsys, "items", "enqueue", "remind", "--service", reminders_app, "--database-url", url,
        "--json",
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert (json.loads(out)["queue"], json.loads(out)["priority"]) == ("reminders", -3)


def test_enqueue_warns_when_the_item_lands_where_nothing_serves_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    reminders_app: str,
) -> None:
    """An item put beside its driver's queue, or in a queue the settings' runner does not
    serve, is enqueued (exit 0) with a warning on stderr saying why it may never run."""
    url = f"sqlite:///{tmp_path}/q.db"
    code, _, err = run(
        capsys, "items", "enqueue", "remind", "--queue", "default", "--service", reminders_app,
        "--database-url", url,
    )  # fmt: skip
    assert code == 0
    assert "warning: spec remind's driver declares queue 'reminders', but this item goes to " in err
    monkeypatch.setenv("TRIO_SUPERVISE_RUNNER__QUEUES", '{"reminders": 4}')
    code, _, err = run(capsys, "items", "enqueue", "remind", "--database-url", url)
    assert code == 0
    assert "warning: queue 'default' is not served by the runner of these settings" in err
    assert "(it serves: reminders)" in err
    code, _, err = run(
        capsys, "items", "enqueue", "remind", "--queue", "reminders", "--database-url", url
    )
    assert (code, err) == (0, "")


def test_queues_limit_sets_shows_and_lifts_a_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`queues limit NAME --rate 2/60s` is stored (a claim then takes 2 of 5), listed with the
    time its window frees, and `--rate none` lifts it."""
    url = f"sqlite:///{tmp_path}/q.db"
    for _ in range(5):
        assert (
            run(capsys, "items", "enqueue", "job", "--queue", "mail", "--database-url", url)[0] == 0
        )
    code, out, _ = run(capsys, "queues", "limit", "mail", "--rate", "2/60s", "--database-url", url)
    assert (code, out) == (0, "mail: at most 2 starts in any 60 s (2/60s)\n")

    async def claim() -> int:
        async with open_queue(url) as queue:
            return len(await queue.claim_due(["job"], "w", 30, 10, queue="mail"))

    assert trio.run(claim) == 2
    assert trio.run(claim) == 0
    code, out, _ = run(capsys, "queues", "list", "--database-url", url, "--json")
    [mail] = json.loads(out)
    assert mail["rate_limit"] == "2/60s"
    assert mail["throttled_until"] is not None
    code, out, _ = run(capsys, "queues", "list", "--database-url", url)
    assert out.splitlines()[0].split()[-1] == "RATE"
    assert "2/60s, throttled until " in out.splitlines()[1]
    code, out, _ = run(capsys, "queues", "limit", "mail", "--rate", "none", "--database-url", url)
    assert (code, out) == (0, "mail has no rate limit\n")
    assert trio.run(claim) == 3


@pytest.mark.parametrize(
    ("rate", "rule"),
    [
        ("fast", "rate must be N/PERIOD, as 100/60s"),
        ("0/1s", "rate limit must be an integer from 1 to 100000"),
        ("5/0s", "rate period must be a number of seconds from 0.001"),
    ],
)
def test_queues_limit_refuses_a_bad_rate(
    rate: str, rule: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rate that is not N/PERIOD in range is a usage error (exit 2) naming the rule."""
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "queues",
                "limit",
                "mail",
                "--rate",
                rate,
                "--database-url",
                f"sqlite:///{tmp_path}/q.db",
            ]
        )
    assert exit_info.value.code == 2
    assert rule in capsys.readouterr().err


def test_queues_limit_key_sets_shows_and_lifts_a_keys_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`queues limit-key TEMPLATE --rate 2/60s` is stored (a claim then takes 2 of each
    tenant's items), `queues keys` lists it and the throttled keys, `--rate none` lifts it; a
    template naming another field is a usage error (exit 2) naming the rule."""
    url = f"sqlite:///{tmp_path}/q.db"
    for key in ("t:acme", "t:acme", "t:acme", "t:globex"):
        args = ["--concurrency-key", key, "--concurrency-limit", "9", "--database-url", url]
        assert run(capsys, "items", "enqueue", "job", *args)[0] == 0
    code, out, _ = run(
        capsys, "queues", "limit-key", "t:{tenant}", "--rate", "2/60s", "--database-url", url
    )
    assert (code, out) == (
        0,
        "key t:{tenant} (each key it renders): at most 2 starts in any 60 s (2/60s)\n",
    )

    async def claim() -> int:
        async with open_queue(url) as queue:
            return len(await queue.claim_due(["job"], "w", 30, 10))

    assert trio.run(claim) == 3  # 2 of acme, 1 of globex
    assert trio.run(claim) == 0
    code, out, _ = run(capsys, "queues", "keys", "--database-url", url, "--json")
    shown = json.loads(out)
    assert shown["limits"] == {"t:{tenant}": "2/60s"}
    assert list(shown["throttled"]) == ["t:acme"]
    code, out, _ = run(
        capsys, "queues", "limit-key", "t:{tenant}", "--rate", "none", "--database-url", url
    )
    assert (code, out) == (0, "key t:{tenant} has no rate limit\n")
    assert trio.run(claim) == 1
    with pytest.raises(SystemExit) as exit_info:
        main(["queues", "limit-key", "t:{user}", "--rate", "1/s", "--database-url", url])
    assert exit_info.value.code == 2
    assert "may name only {tenant} and {subject}" in capsys.readouterr().err


def test_enqueue_debounce_replaces_the_pending_item(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`items enqueue --key K --debounce`: the queued holder takes the newest config, said so."""
    url = f"sqlite:///{tmp_path}/q.db"
    first = run(capsys, "items", "enqueue", "job", '{"v": 1}', "--id", "a", "--key", "k",
                "--unique", "unfinished", "--debounce", "--database-url", url)  # fmt: skip
    assert first[0] == 0
    code, out, _ = run(capsys, "items", "enqueue", "job", '{"v": 2}', "--key", "k",
                       "--unique", "unfinished", "--debounce", "--database-url", url)  # fmt: skip
    assert code == 0
    assert out.startswith("replaced: a (key k) takes this config, due ")
    code, out, _ = run(capsys, "items", "show", "a", "--database-url", url, "--json")
    assert json.loads(out)["config"] == {"v": 2}
