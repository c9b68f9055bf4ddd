"""The command line."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest
import trio

from trio_supervise import __version__
from trio_supervise._cli import main
from trio_supervise.queues import NewItem, SettleKind, Settlement
from trio_supervise.queues._factory import open_queue


def test_version_flag_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    """--version prints the package version and exits 0."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_help_states_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    """--help lists the exit codes the CLI's common module defines, one meaning each."""
    from trio_supervise._cli import _common

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    codes = (
        _common.EXIT_OK,
        _common.EXIT_ERROR,
        _common.EXIT_USAGE,
        _common.EXIT_NOT_FOUND,
        _common.EXIT_UNREACHABLE,
    )
    assert codes == (0, 1, 2, 3, 4)
    assert (
        "exit codes: 0 ok, 1 a user or runtime error, 2 a malformed command line, 3 not found, "
        "4 the service is unreachable"
    ) in text


def test_retry_help_says_a_queued_item_needs_now(capsys: pytest.CaptureFixture[str]) -> None:
    """`items retry --help` says what the command refuses, as the docs do."""
    with pytest.raises(SystemExit):
        main(["items", "retry", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "moving it needs --now or --at" in text
    assert "[--at WHEN | --now]" in text


def test_module_entry_point_runs() -> None:
    """python -m trio_supervise --version works as the console script does."""
    result = subprocess.run(
        [sys.executable, "-m", "trio_supervise", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert __version__ in result.stdout


# -- end to end against real databases ------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def _postgres_dsn() -> str:
    """The test DSN, or a skip (a failure when TRIO_SUPERVISE_REQUIRE_POSTGRES=1)."""
    dsn = os.environ.get("TRIO_SUPERVISE_TEST_DSN")
    problem = None if dsn else "TRIO_SUPERVISE_TEST_DSN is not set"
    if dsn:
        try:
            import psycopg

            with psycopg.connect(dsn, connect_timeout=3):
                pass
        except Exception as error:
            problem = f"PostgreSQL at TRIO_SUPERVISE_TEST_DSN is unreachable: {error}"
    if problem is not None:
        if os.environ.get("TRIO_SUPERVISE_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{problem}, and TRIO_SUPERVISE_REQUIRE_POSTGRES=1")
        pytest.skip(problem)
    assert dsn is not None
    return dsn


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of each kind, as a queue URL (PostgreSQL: a schema of its own)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'cli.db'}"
        return
    import psycopg
    from psycopg import sql

    dsn = _postgres_dsn()
    schema = f"ts_cli_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    separator = "&" if "?" in dsn else "?"
    try:
        yield f"{dsn}{separator}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@attrs.frozen
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(
    database_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Result]:
    """Run the CLI in-process against the test database; returns code, stdout, stderr."""
    for name in list(os.environ):
        if name.startswith("TRIO_SUPERVISE_") and not name.startswith("TRIO_SUPERVISE_TEST"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TRIO_SUPERVISE_DATABASE_URL", database_url)

    def run(*argv: str) -> Result:
        code = main(list(argv))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def test_migrate_reports_the_schema_version(cli: Callable[..., Result]) -> None:
    """migrate brings the schema up to date and says which version it reached."""
    result = cli("migrate")
    assert result.code == 0, result.err
    assert "schema at version" in result.out
    assert cli("migrate").code == 0  # idempotent


def test_items_enqueue_list_show_cancel_retry(cli: Callable[..., Result]) -> None:
    """An item's life from the command line, in tables and in JSON."""
    assert cli("migrate").code == 0
    made = cli(
        "items", "enqueue", "report", '{"customer": "acme"}', "--id", "r-1", "--tenant", "t1"
    )
    assert made.code == 0, made.err
    assert "enqueued r-1 (report)" in made.out
    later = cli("items", "enqueue", "email", "--due", "+3600", "--json")
    assert later.code == 0, later.err
    email_id = json.loads(later.out)["id"]

    table = cli("items", "list")
    assert table.code == 0
    header, *rows = table.out.splitlines()
    assert header.split()[:7] == ["ID", "SPEC", "STATE", "DUE", "(UTC)", "QUEUE", "PRIORITY"]
    assert rows[0].split()[:3] == ["r-1", "report", "queued"]
    assert rows[0].split()[5:7] == ["default", "0"]  # after the due date and time
    assert rows[1].split()[:3] == [email_id, "email", "queued"]

    only_email = json.loads(cli("items", "list", "--spec", "email", "--json").out)
    assert [item["id"] for item in only_email] == [email_id]
    assert len(json.loads(cli("items", "list", "--limit", "1", "--json").out)) == 1

    shown = cli("items", "show", "r-1", "--json")
    document = json.loads(shown.out)
    assert document["config"] == {"customer": "acme"}
    assert document["tenant_id"] == "t1"
    assert document["state"] == "queued"
    assert 'config       {"customer": "acme"}' in cli("items", "show", "r-1").out

    assert "cancelled r-1" in cli("items", "cancel", "r-1").out
    cancelled = json.loads(cli("items", "list", "--state", "cancelled", "--json").out)
    assert [item["id"] for item in cancelled] == ["r-1"]

    retried = cli("items", "retry", "r-1")
    assert retried.code == 0, retried.err
    assert "requeued r-1" in retried.out
    assert json.loads(cli("items", "show", "r-1", "--json").out)["state"] == "queued"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("items", "enqueue", "x", "{bad"), "CONFIG_JSON is not JSON"),
        (("items", "enqueue", "x", "--due", "tomorrow"), "expected an ISO 8601 datetime"),
        (("items", "enqueue", "x", "--due", "2030-01-01T00:00"), "needs a timezone"),
        (("items", "enqueue", "x", "--key", ""), "idempotency_key must be a non-empty string"),
        (("items", "enqueue", "x", "--id", "i" * 401), "item_id must be a non-empty string of at"),
        (("items", "enqueue", "s" * 201), "spec_id must be a non-empty string of at most 200"),
        (("items", "list", "--database-url", "bogus://x"), "unknown queue URL scheme 'bogus'"),
        (("run", "no_such_module_xyz:service"), "cannot import module 'no_such_module_xyz'"),
        (("run", "json:dumps"), "is not a Service"),
        (("run", "json:JSONDecoder"), "is not a Service"),
        (("run", "json:nope"), "module 'json' has no attribute 'nope'"),
        (("run", "json"), "expected MODULE:ATTR"),
        (
            ("run", "examples.digest:build_service", "--http", "0.0.0.0:0"),
            "host '0.0.0.0' is not a loopback address, so the console needs credentials: set "
            "http.token or http.password_hash",
        ),
    ],
)
def test_user_errors_are_one_line_and_exit_1(
    cli: Callable[..., Result], argv: tuple[str, ...], message: str
) -> None:
    """A user's mistake is one line on stderr and exit code 1, never a traceback."""
    cli("migrate")
    result = cli(*argv)
    assert result.code == 1
    assert result.err.count("\n") == 1
    assert result.err.startswith("trio-supervise: error: ")
    assert message in result.err
    assert "Traceback" not in result.err


@pytest.mark.parametrize("verb", ["show", "cancel", "retry"])
def test_an_unknown_item_exits_3(cli: Callable[..., Result], verb: str) -> None:
    """An item that does not exist is "not found": exit 3 and one line naming it."""
    cli("migrate")
    result = cli("items", verb, "nope")
    assert result.code == 3
    assert result.err == "trio-supervise: error: no item with id 'nope'\n"


def _settle(url: str, item_id: str, kind: SettleKind) -> None:
    """Claim *item_id* and settle it as *kind*, as a runner would."""

    async def body() -> None:
        async with open_queue(url) as queue:
            [claimed] = await queue.claim_due(["job"], "w", 30.0, 1)
            assert claimed.id == item_id
            error = "boom" if kind is SettleKind.DEAD else None
            settlement = Settlement(
                item_id=item_id, lease_version=claimed.lease_version, kind=kind, error=error
            )
            assert await queue.settle_many([settlement]) == [True]

    trio.run(body)


@pytest.mark.parametrize(
    ("kind", "state"), [(SettleKind.COMPLETE, "completed"), (SettleKind.DEAD, "dead")]
)
def test_cancelling_a_finished_item_says_there_is_nothing_to_cancel(
    cli: Callable[..., Result], database_url: str, kind: SettleKind, state: str
) -> None:
    """`items cancel` on a completed or dead item: "X is STATE; nothing to cancel", exit 1."""
    cli("migrate")
    cli("items", "enqueue", "job", "--id", "done-1")
    _settle(database_url, "done-1", kind)
    result = cli("items", "cancel", "done-1")
    assert (result.code, result.out) == (1, "")
    assert result.err == f"trio-supervise: error: done-1 is {state}; nothing to cancel\n"
    assert json.loads(cli("items", "show", "done-1", "--json").out)["state"] == state


def test_cancelling_twice_says_it_is_already_cancelled(cli: Callable[..., Result]) -> None:
    """A second `items cancel` says the item is already cancelled and exits 0."""
    cli("migrate")
    cli("items", "enqueue", "job", "--id", "c-1")
    assert cli("items", "cancel", "c-1") == Result(0, "cancelled c-1\n", "")
    assert cli("items", "cancel", "c-1") == Result(0, "c-1 is already cancelled\n", "")


def test_cancelling_a_running_item_asks_its_worker_once(
    cli: Callable[..., Result], database_url: str
) -> None:
    """`items cancel` on a running item requests it; a second request says it was requested."""
    cli("migrate")
    cli("items", "enqueue", "job", "--id", "r-1")

    async def claim() -> None:
        async with open_queue(database_url) as queue:
            await queue.claim_due(["job"], "w", 300.0, 1)

    trio.run(claim)
    first = cli("items", "cancel", "r-1")
    assert first == Result(
        0, "cancellation requested for r-1 (running); its worker will stop it\n", ""
    )
    again = cli("items", "cancel", "r-1")
    assert again.out == "cancellation of r-1 was already requested; its worker will stop it\n"


def test_a_stored_traceback_is_shown_below_its_error(
    cli: Callable[..., Result], database_url: str
) -> None:
    """`items show` prints a stored traceback indented under "last error"; `list` its summary."""
    cli("migrate")
    cli("items", "enqueue", "job", "--id", "tb-1")
    stored = 'OSError: down\nTraceback (most recent call last):\n  File "d.py", line 3, in go'

    async def fail() -> None:
        async with open_queue(database_url) as queue:
            [claimed] = await queue.claim_due(["job"], "w", 30.0, 1)
            await queue.mark_error(claimed.id, claimed.lease_version, stored)

    trio.run(fail)
    shown = cli("items", "show", "tb-1").out.splitlines()
    at = shown.index("last error   OSError: down")
    assert shown[at + 1 : at + 3] == [
        "             Traceback (most recent call last):",
        '               File "d.py", line 3, in go',
    ]
    listed = cli("items", "list").out
    assert "OSError: down" in listed
    assert "Traceback" not in listed


def test_items_show_lists_the_error_history(cli: Callable[..., Result], database_url: str) -> None:
    """`items show` lists each recorded error (worker, attempt, text); `--json` has them too."""
    cli("migrate")
    cli("items", "enqueue", "job", "--id", "h-1")

    async def fail() -> None:
        async with open_queue(database_url) as queue:
            [claimed] = await queue.claim_due(["job"], "w-7", 30.0, 1)
            await queue.mark_error(claimed.id, claimed.lease_version, "ValueError: one")
            await queue.mark_error(claimed.id, claimed.lease_version, "ValueError: two")

    trio.run(fail)
    shown = [line for line in cli("items", "show", "h-1").out.splitlines() if "error " in line]
    assert [line.split("): ", 1)[1] for line in shown[-2:]] == [
        "ValueError: one",
        "ValueError: two",
    ]
    assert shown[-2].startswith("error 1 ")
    assert "by w-7 (attempt 1)" in shown[-2]
    errors = json.loads(cli("items", "show", "h-1", "--json").out)["errors"]
    assert [(e["worker"], e["attempt"], e["error"]) for e in errors] == [
        ("w-7", 1, "ValueError: one"),
        ("w-7", 1, "ValueError: two"),
    ]


def test_retrying_a_queued_item_needs_now(cli: Callable[..., Result]) -> None:
    """`items retry` refuses to pull a queued item's future due time to now unless --now."""
    cli("migrate")
    cli("items", "enqueue", "job", "--id", "daily", "--due", "2100-01-01T00:00:00+00:00")
    refused = cli("items", "retry", "daily")
    assert refused.code == 1
    assert refused.err == (
        "trio-supervise: error: daily is queued (due 2100-01-01 00:00:00 UTC); "
        "pass --now to run it now, or --at to move it\n"
    )
    assert json.loads(cli("items", "show", "daily", "--json").out)["due_at"].startswith("2100")
    moved = cli("items", "retry", "daily", "--at", "2099-01-01T00:00:00+00:00")
    assert moved == Result(0, "requeued daily, due 2099-01-01 00:00:00 UTC\n", "")
    pulled = cli("items", "retry", "daily", "--now")
    assert pulled.code == 0, pulled.err
    assert not json.loads(cli("items", "show", "daily", "--json").out)["due_at"].startswith("2099")


def test_retry_now_and_at_together_is_a_usage_error(cli: Callable[..., Result]) -> None:
    """--now and --at exclude each other: argparse's usage error, exit 2."""
    with pytest.raises(SystemExit) as exit_info:
        cli("items", "retry", "x", "--now", "--at", "+5")
    assert exit_info.value.code == 2


def test_config_prints_effective_settings_with_secrets_redacted(
    cli: Callable[..., Result], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """config shows file and environment merged, the DSN password masked."""
    path = tmp_path / "settings.toml"
    path.write_text("[http]\nport = 9123\n")
    monkeypatch.setenv("TRIO_SUPERVISE_DATABASE_URL", "postgresql://app:hunter2@db/app")
    result = cli("config", "--config", str(path))
    assert result.code == 0, result.err
    assert 'database_url = "postgresql://app:***@db/app"' in result.out
    assert "http.port = 9123" in result.out
    assert "hunter2" not in result.out
    document = json.loads(cli("config", "--json").out)
    assert document["database_url"] == "postgresql://app:***@db/app"


def test_config_reports_a_bad_setting_in_one_line(
    cli: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad setting is named with its path and rule."""
    monkeypatch.setenv("TRIO_SUPERVISE_HTTP__PORT", "abc")
    result = cli("config")
    assert result.code == 1
    assert result.err == (
        "trio-supervise: error: "
        "http.port: expected int, got 'abc' (from TRIO_SUPERVISE_HTTP__PORT)\n"
    )


def test_status_of_an_unreachable_service_exits_4(cli: Callable[..., Result]) -> None:
    """Nothing listening: exit 4 (unreachable, never a usage error's 2), saying so."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = cli("status", "--url", f"http://127.0.0.1:{port}/healthz", "--timeout", "2")
    assert result.code == 4
    assert "is unreachable" in result.err


@pytest.mark.parametrize(("code", "expected"), [(200, 0), (503, 1)])
def test_status_reports_health_and_exits_0_or_1(
    cli: Callable[..., Result], code: int, expected: int
) -> None:
    """status prints each worker and exits 0 when healthy, 1 when not."""
    document = {
        "healthy": code == 200,
        "workers": [{"worker": "runner", "state": "running", "restarts": 0, "last_error": None}],
    }
    with _health_server(code, document) as url:
        result = cli("status", "--url", url)
        as_json = cli("status", "--url", url, "--json")
    assert result.code == expected
    assert ("healthy" if code == 200 else "UNHEALTHY") in result.out
    assert "runner" in result.out
    assert json.loads(as_json.out) == document


CONTROLS = "\x1b[31mred\x1b[0m\x07bell\x9b2J\x7fdel\x00nul\u202eevil\x1b]0;title\x07"
"""ESC and CSI sequences (colour, an OSC title), BEL, the C1 CSI, DEL, NUL and a bidi override."""
RAW = {"\x1b", "\x07", "\x9b", "\x7f", "\x00", "\u202e"}


def test_item_data_carries_no_terminal_controls(cli: Callable[..., Result]) -> None:
    """Controls in every field `items list`/`show`/`enqueue` print are shown as escapes."""
    assert cli("migrate").code == 0
    text = CONTROLS.replace("\x00", "")  # NUL: no backend stores it (refused by name)
    enqueued = cli(
        "items", "enqueue", "job", json.dumps({"note": text}), "--id", f"id{text}",
        "--tenant", f"t{text}", "--subject", f"s{text}", "--key", f"k{text}",
    )  # fmt: skip
    assert enqueued.code == 0, enqueued.err
    listed = cli("items", "list")
    shown = cli("items", "show", f"id{text}")
    for result in (enqueued, listed, shown):
        assert not RAW & set(result.out + result.err), repr(result.out)
    assert "id\\x1b[31mred\\x1b[0m\\x07bell\\x9b2J\\x7fdelnul\\u202eevil" in shown.out
    assert "t\\x1b[31mred" in listed.out
    assert json.loads(cli("items", "show", f"id{text}", "--json").out)["tenant_id"] == f"t{text}"


def test_status_escapes_what_a_remote_health_document_says(cli: Callable[..., Result]) -> None:
    """Worker names and errors from /healthz are data from elsewhere: printed escaped."""
    document = {
        "healthy": False,
        "workers": [{"worker": CONTROLS, "state": CONTROLS, "last_error": CONTROLS}],
    }
    with _health_server(503, document) as url:
        result = cli("status", "--url", url)
    assert result.code == 1
    assert not RAW & set(result.out + result.err)
    assert "\\x1b[31mred" in result.out


@contextlib.contextmanager
def _health_server(code: int, document: dict[str, object]) -> Iterator[str]:
    body = json.dumps(document).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/healthz"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


SERVICE_MODULE = """
import trio
from trio_supervise._service import Service
from trio_supervise import Stop


class Finisher:
    name = "finisher"
    spec_ids = ("job",)

    def validate_specs(self):
        pass

    async def evaluate(self, context, item):
        return Stop()


def make_service():
    return Service(drivers=[Finisher()], name="cli-service")
"""


@pytest.mark.slow
def test_run_serves_a_service_until_sigterm(cli: Callable[..., Result], tmp_path: Path) -> None:
    """run MODULE:ATTR --http HOST:PORT runs the service; status sees it; SIGTERM exits 0."""
    (tmp_path / "cli_service.py").write_text(SERVICE_MODULE)
    assert cli("migrate").code == 0
    assert cli("items", "enqueue", "job", "--id", "j-1").code == 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trio_supervise",
            "run",
            "cli_service:make_service",
            "--http",
            f"127.0.0.1:{port}",
        ],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/healthz"
        deadline = 30.0
        status = cli("status", "--url", url, "--timeout", "1")
        while status.code != 0 and deadline > 0 and process.poll() is None:
            threading.Event().wait(0.1)
            deadline -= 0.1
            status = cli("status", "--url", url, "--timeout", "1")
        assert status.code == 0, (status, process.poll())
        assert "runner" in status.out
        assert "http" in status.out
        while json.loads(cli("items", "show", "j-1", "--json").out)["state"] != "completed":
            assert deadline > 0
            threading.Event().wait(0.1)
            deadline -= 0.1
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert cli("status", "--url", url, "--timeout", "1").code == 4


# -- a reader that goes away ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("listing", [["items", "list"], ["items", "list", "--json"]])
def test_output_into_a_closed_pipe_exits_quietly_with_status_0(
    tmp_path: Path, listing: list[str]
) -> None:
    """``trio-supervise items list --json | head -n 1``: the pipeline succeeds, nothing on
    stderr (no "Broken pipe" error, no "Exception ignored" from the flush at exit)."""
    url = f"sqlite:///{tmp_path / 'pipe.db'}"

    async def fill() -> None:
        async with open_queue(url, create=True) as queue:
            await queue.enqueue_many([NewItem(spec_id="job", config={"n": n}) for n in range(3000)])

    trio.run(fill)
    command = " ".join(
        [sys.executable, "-m", "trio_supervise", *listing, "--limit", "3000", "--database-url", url]
    )
    result = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command} | head -n 1"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=120,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert len(result.stdout.splitlines()) == 1


def test_printable_escapes_the_line_and_paragraph_separators() -> None:
    """U+2028 and U+2029 end a line (``str.splitlines``, many terminals): an error naming a
    URL that holds one stays one line (Hypothesis found ``status --url .../\u2028``)."""
    from trio_supervise._cli._common import printable

    assert printable("a\u2028b\u2029c") == "a\\u2028b\\u2029c"
    assert len(printable("http://127.0.0.1:1/\u2028 is unreachable").splitlines()) == 1
