"""R5: security. Loopback by default; hostile data stays data; a DSN's password stays secret.

What other files already prove, and this one does not repeat:

- ``tests/test_status_page_browser.py`` renders the status page in headless Chromium with hostile
  worker names, errors and item data, and checks that no script ran (with a control page that
  proves the detector works);
- ``tests/test_http.py`` checks the escaping of each item field and the Content-Security-Policy
  on the app alone.

Here, hostile data takes the whole path: enqueued in a real queue, through a runner and a driver
that fails with it, to the page a running :class:`Service` serves.
"""

from __future__ import annotations

import getpass
import logging
import re
import socket
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from trio_supervise import ItemState, Outcome, RunnerSettings, RunnerState, Stop
from trio_supervise._cli import main as cli_main
from trio_supervise._service import Service
from trio_supervise._settings import HttpSettings, Settings, load_settings
from trio_supervise.queues import (
    Lease,
    LeaseStatus,
    PostgresQueue,
    SettleKind,
    Settlement,
    WorkItem,
    WorkQueue,
)
from trio_supervise.queues._factory import open_queue
from trio_supervise.queues._sql import redact_dsn, scrub_dsn

from .queues.conftest import BACKENDS, open_backend, pg_schema

# -- loopback by default ---------------------------------------------------------------------------


def _listening_addresses(port: int) -> list[str]:
    """The local addresses of the sockets listening on *port* (Linux /proc/net)."""
    found = []
    for name, width in (("tcp", 8), ("tcp6", 32)):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                if width == 8:
                    found.append(socket.inet_ntop(socket.AF_INET, raw[::-1]))
                else:
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                    found.append(socket.inet_ntop(socket.AF_INET6, words))
    return found


def test_the_http_server_binds_loopback_by_default() -> None:
    """The default host is 127.0.0.1, from the class and from an empty environment alike."""
    assert HttpSettings().host == "127.0.0.1"
    assert load_settings(None, {}).http.host == "127.0.0.1"


async def test_a_service_listens_on_loopback_only() -> None:
    """With default settings, the socket the service binds is on 127.0.0.1 and nowhere else."""
    if not Path("/proc/net/tcp").exists():  # noqa: ASYNC240 - a stat, once
        pytest.skip("needs Linux /proc/net/tcp to see the bound address")
    service = Service(
        settings=Settings(http=HttpSettings(port=0), runner=RunnerSettings(worker_id="w")),
        queue_url="memory://",
        handle_signals=False,
    )
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            assert service.http_port is not None
            assert _listening_addresses(service.http_port) == ["127.0.0.1"]
            service.stop()


# -- hostile item data on the status page ----------------------------------------------------------

HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=\"alert(1)\">"


@attrs.frozen
class HostileFailer:
    """Fails every item with its own hostile config in the message."""

    name: str = "hostile"
    spec_ids: Sequence[str] = (f"<b>{HOSTILE}</b>",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> Outcome:
        await trio.lowlevel.checkpoint()
        raise RuntimeError(f"failed on {item.config['note']}")


async def test_hostile_item_data_is_inert_on_a_served_status_page(tmp_path: Path) -> None:
    """Hostile ids, tenants, configs and driver errors, via SQLite and a runner, render as text."""
    spec = HostileFailer().spec_ids[0]
    async with open_queue(f"sqlite:///{tmp_path / 'q.db'}") as queue:
        await queue.enqueue(
            spec,
            item_id=f'"><svg onload=alert(1)>{HOSTILE}',
            tenant_id=HOSTILE,
            subject_id=f"<u>{HOSTILE}</u>",
            config={"note": HOSTILE, HOSTILE: [HOSTILE]},
        )
        service = Service(
            drivers=[HostileFailer()],
            settings=Settings(
                http=HttpSettings(port=0),
                runner=RunnerSettings(worker_id=HOSTILE, requeue_delay=0, poll_interval=0.05),
            ),
            queue=queue,
            name="svc <i onclick=alert(1)>title",  # a supervisor name has no '/'
            handle_signals=False,
        )
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                await nursery.start(service.run)
                assert service.runner is not None
                while not service.runner.recent_errors:  # noqa: ASYNC110
                    await trio.sleep(0.02)
                async with httpx.AsyncClient() as client:
                    response = await client.get(f"http://127.0.0.1:{service.http_port}/")
                service.stop()
    page = response.text
    assert response.status_code == 200
    tags, attributes = _markup(page)
    assert tags <= {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p"} | {
        "table",
        "thead",
        "tbody",
        "tr",
        "th",
        "td",
        "code",
        "br",
        # an item's error history, folded: inert markup, no script
        "details",
        "summary",
        "ol",
        "li",
        "pre",
        # the console: links between its pages, and its actions as forms with buttons
        "nav",
        "a",
        "form",
        "input",
        "button",
    }
    assert not {name for name in attributes if name.startswith("on")}
    # Every link and every form leads to the console itself, whatever the item data says.
    targets = re.findall(r'(?:href|action)="([^"]*)"', page)
    assert targets
    assert all(target.startswith("/") and not target.startswith("//") for target in targets)
    # Control: the hostile text is on the page, as text (Jinja2 writes ' as &#39;).
    assert "&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;" in page
    assert "failed on &lt;script&gt;" in page  # the driver's error, in the recent errors
    assert "default-src 'none'" in response.headers["content-security-policy"]


def _markup(page: str) -> tuple[set[str], set[str]]:
    """Every tag name and attribute name an HTML parser finds in *page*."""
    from html.parser import HTMLParser

    tags: set[str] = set()
    attributes: set[str] = set()

    class Collect(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            tags.add(tag)
            attributes.update(name for name, _ in attrs)

    Collect().feed(page)
    return tags, attributes


# -- a DSN's password never shows ------------------------------------------------------------------


@attrs.frozen
class Finisher:
    name: str = "finisher"
    spec_ids: Sequence[str] = ("job",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> Outcome:
        await trio.lowlevel.checkpoint()
        return Stop()


def _block_claims(dsn: str, schema: str, *, block: bool) -> None:
    """Make every claim fail (a check no running row passes) or work again.

    A transient fault: a missing table would be permanent (QueueFailed), and the runner would
    stop at once instead of backing off.
    """
    import psycopg
    from psycopg import sql

    table = sql.Identifier(schema, "trio_supervise_items")
    statement = (
        sql.SQL("ALTER TABLE {} ADD CONSTRAINT block_claims CHECK (state <> 'running') NOT VALID")
        if block
        else sql.SQL("ALTER TABLE {} DROP CONSTRAINT block_claims")
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement.format(table))


async def test_a_dsn_password_never_appears_anywhere(
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sentinel password is in no log line, CLI output, error, status page, health or metrics.

    The run goes through the paths that print a DSN: a claim that fails (a check constraint
    refusing it for a moment) and is retried, the runner's recent errors on the page, the CLI's
    ``config``, ``migrate``, ``items list`` and a connection error, and an unreachable server in
    both URL and key/value form. Controls check that the DSN did reach those texts, redacted.
    """
    from psycopg.conninfo import make_conninfo

    sentinel = f"Sentinel-{uuid.uuid4().hex}"
    caplog.set_level(logging.DEBUG)
    texts: dict[str, str] = {}
    with pg_schema() as (plain, schema):
        base, netloc = _url_with_password(plain, sentinel)
        user = netloc.partition(":")[0]
        url = f"{base}{'&' if '?' in base else '?'}options=-c%20search_path%3D{schema}"
        queue = await PostgresQueue.connect(url, schema=schema, migrate=True, pool_size=2)
        async with queue:
            item = await queue.enqueue("job")
            service = Service(
                drivers=[Finisher()],
                settings=Settings(
                    database_url=url,
                    http=HttpSettings(port=0),
                    runner=RunnerSettings(worker_id="w", poll_interval=0.05),
                ),
                handle_signals=False,
            )
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    await nursery.start(service.run)
                    assert service.runner is not None
                    while (await queue.get(item.id)).state is not ItemState.COMPLETED:  # noqa: ASYNC110
                        await trio.sleep(0.02)
                    _block_claims(plain, schema, block=True)
                    await queue.enqueue("job")
                    try:
                        while service.runner.state is not RunnerState.BACKING_OFF:  # noqa: ASYNC110
                            await trio.sleep(0.02)
                        base_url = f"http://127.0.0.1:{service.http_port}"
                        async with httpx.AsyncClient(base_url=base_url) as client:
                            for path in ("/", "/healthz", "/metrics"):
                                texts[f"http {path}"] = (await client.get(path)).text
                    finally:
                        _block_claims(plain, schema, block=False)
                    service.stop()

        # The command line, with the password in the settings and on the command line.
        monkeypatch.setenv("TRIO_SUPERVISE_DATABASE_URL", f"{url}&password={sentinel}")
        for argv in (
            ["config"],
            ["config", "--json"],
            ["migrate"],
            ["items", "list"],
            ["items", "show", "no-such-item"],
            ["items", "list", "--database-url", f"postgresql://{user}:{sentinel}@127.0.0.1:1/db"],
        ):
            await trio.to_thread.run_sync(cli_main, argv)  # it runs Trio itself
            captured = capsys.readouterr()
            texts[f"cli {' '.join(argv[:2])}"] = captured.out + captured.err

    # Errors from a server that is not there, in both DSN forms.
    for dsn in (
        f"postgresql://{user}:{sentinel}@127.0.0.1:1/db",
        make_conninfo(host="127.0.0.1", port=1, user="u", password=sentinel, dbname="db"),
    ):
        with pytest.raises(Exception) as caught:  # any error, as long as it is clean
            await PostgresQueue.connect(dsn, connect_timeout=2)
        texts[f"error {dsn[:10]}"] = f"{caught.value!r} {caught.value}"

    texts["logs"] = "\n".join(
        f"{record.getMessage()} {record.exc_text or ''}" for record in caplog.records
    )
    for where, text in texts.items():
        assert sentinel not in text, f"the password leaked into {where}"
    # Controls: the texts searched really carry the (redacted) DSN.
    assert f"{user}:***@" in texts["http /"]  # the claim error, on the page
    assert f"{user}:***@" in texts["logs"]
    assert ":***@" in texts["cli config"]
    assert "password=***" in texts["cli config"]
    assert "schema at version" in texts["cli migrate"]
    assert "error" in texts["cli items list"]
    assert "trio_supervise_queue_up" in texts["http /metrics"]


def _url_with_password(dsn: str, password: str) -> tuple[str, str]:
    """*dsn* (URL or key/value, TCP or Unix socket) as a URL whose authority holds *password*,
    and that authority's ``user:password@host:port`` part without the ``@host...``."""
    import urllib.parse

    from psycopg.conninfo import conninfo_to_dict

    parts = {key: str(value) for key, value in conninfo_to_dict(dsn).items()}
    user = parts.pop("user", None) or getpass.getuser()
    host, port, dbname = parts.pop("host", ""), parts.pop("port", ""), parts.pop("dbname", "")
    parts.pop("password", None)
    if host.startswith("/"):  # a Unix socket directory goes in the query
        parts["host"] = host
        host = ""
    netloc = f"{user}:{password}@{host}{':' + port if port and host else ''}"
    if port and not host:
        parts["port"] = port
    query = urllib.parse.urlencode(parts, quote_via=urllib.parse.quote)
    return f"postgresql://{netloc}/{dbname}{'?' + query if query else ''}", netloc


MALFORMED = [  # libpq refuses or misreads each of these; its message must not carry the password
    "postgresql://u:S3ntA1 S3ntA2@127.0.0.1:1/db",
    "postgresql://u:S3ntB1@S3ntB2@S3ntB3@127.0.0.1:1/db",
    "postgresql://u:S3ntC1/S3ntC2@127.0.0.1:1/db",
    "postgresql://u:S3ntD1?S3ntD2@127.0.0.1:1/db",
    "postgresql://u:S3ntE1@[::1/db",
    "postgresql://127.0.0.1:1/db?password=S3ntF1%20S3ntF2&sslmode=bogus",
    "host=127.0.0.1 port=1 password='S3ntG1 S3ntG2' sslmode=bogus",
    "host=127.0.0.1 port=1 password='S3ntH1 unterminated",
    "host=127.0.0.1 port=1 password=S3ntI1 user=u = oops",
]
"""Every password fragment starts with S3nt: none may show anywhere."""


@pytest.mark.parametrize("dsn", MALFORMED)
def test_a_malformed_dsn_password_never_appears(
    dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`config`, `migrate` and `items list` print a malformed DSN, and libpq's error, redacted."""
    monkeypatch.setenv("TRIO_SUPERVISE_DATABASE_URL", dsn if "://" in dsn else "postgresql://x")
    outputs = {}
    for argv in (
        ["config"],
        ["config", "--json"],
        ["migrate", "--database-url", dsn],
        ["items", "list", "--database-url", dsn],
        ["items", "show", "x", "--database-url", dsn],
    ):
        code = cli_main(argv)
        captured = capsys.readouterr()
        outputs[" ".join(argv[:2])] = (code, captured.out + captured.err)
    for where, (code, text) in outputs.items():
        assert "S3nt" not in text, f"a password leaked into {where}: {text}"
        if where.startswith(("migrate", "items")):
            assert code == 1, where
            assert len(text.splitlines()) == 1, text
    assert "***" in outputs["migrate --database-url"][1]


def test_redaction_masks_malformed_and_key_value_passwords() -> None:
    """redact_dsn masks a password holding '@', spaces, '/', '?' or quotes, and nothing else."""
    assert redact_dsn("postgresql://u:p@ss w?rd@h:5432/db?sslmode=require") == (
        "postgresql://u:***@h:5432/db?sslmode=require"
    )
    assert redact_dsn("postgresql://u:pa/ss@h/db?application_name=a@b") == (
        "postgresql://u:***@h/db?application_name=a@b"
    )
    assert redact_dsn("postgresql://h:5432/db?application_name=a@b") == (
        "postgresql://h:5432/db?application_name=a@b"
    )
    assert redact_dsn("host=h password='unterminated secret") == "host=h password=***"
    assert redact_dsn("postgresql:///test?host=/var/run/postgresql") == (
        "postgresql:///test?host=/var/run/postgresql"
    )
    text = "failed to resolve host 'ssword@127.0.0.1'"
    assert scrub_dsn(text, "postgresql://u:p@ssword@127.0.0.1/db") == (
        "failed to resolve host '***@127.0.0.1'"
    )


# -- hostile spec ids and configs are data, never SQL ----------------------------------------------

HOSTILE_SQL = [
    "'; DROP TABLE trio_supervise_items; --",
    '"; DROP TABLE trio_supervise_items; --',
    "Robert'); DELETE FROM trio_supervise_items WHERE ('1'='1",
    "x' OR '1'='1",
    "' || pg_sleep(5) || '",
    "%s",
    "%(now)s",
    "$1",
    "?",
    ":id",
    "{}",
    "\\",
    "\\'",
    "`",
    "-- comment",
    "/* open",
    "\u202erlo",
    "ünïcødé ✓ 🎉",
    "line\nbreak\r\ttab",
]
NUL = "nul\x00inside"
"""NUL: PostgreSQL text cannot hold it, so every backend refuses it by name."""


async def _table_count(queue: WorkQueue, backend: str, tmp_path: Path) -> int:
    """How many queue tables exist, read around the library."""
    if backend == "sqlite":
        import sqlite3

        conn = sqlite3.connect(tmp_path / "queue.db")
        try:
            row = conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' "
                "AND name LIKE 'trio_supervise%'"
            ).fetchone()
        finally:
            conn.close()
        return int(row[0])
    if backend == "postgres":
        assert isinstance(queue, PostgresQueue)
        rows = await queue._run(
            lambda conn: conn.execute(
                "SELECT count(*) AS n FROM information_schema.tables "
                "WHERE table_schema = current_schema() AND table_name LIKE 'trio_supervise%'"
            ).fetchall()
        )
        return int(rows[0]["n"])
    return 2


@pytest.mark.parametrize("backend", BACKENDS)
async def test_hostile_spec_ids_and_configs_reach_the_database_only_as_parameters(
    backend: str, tmp_path: Path
) -> None:
    """Injection-shaped ids, tenants, keys and configs round-trip unchanged; the tables survive."""
    import datetime as dt

    values = HOSTILE_SQL
    async with open_backend(backend, None, tmp_path) as queue:
        tables = await _table_count(queue, backend, tmp_path)
        assert tables >= 2
        for n, text in enumerate(values):
            config = {text: [text, {"k": text}], "n": n}
            item = await queue.enqueue(
                text,
                item_id=f"{text}#{n}",
                tenant_id=text,
                subject_id=text,
                idempotency_key=f"key:{text}",
                config=config,
            )
            again = await queue.enqueue(text, idempotency_key=f"key:{text}", config={"x": 1})
            assert again.id == item.id  # the key found the same row
            got = await queue.get(f"{text}#{n}")
            assert (got.spec_id, got.tenant_id, got.subject_id) == (text, text, text)
            assert got.idempotency_key == f"key:{text}"
            assert got.config == config
            assert [i.id for i in await queue.list_items(spec_ids=[text])] == [f"{text}#{n}"]

            [claimed] = await queue.claim_due([text], text, 30, 5)
            assert claimed.id == f"{text}#{n}"
            lease = Lease(claimed.id, claimed.lease_version, text)
            assert await queue.renew_many([lease], 30) == {claimed.id: LeaseStatus.HELD}
            later = dt.datetime(2031, 1, 1, tzinfo=dt.UTC)
            new_config = {"next": text, text: text}
            settled = await queue.settle_many(
                [
                    Settlement(
                        item_id=claimed.id,
                        lease_version=claimed.lease_version,
                        kind=SettleKind.RESCHEDULE,
                        at=later,
                        config=new_config,
                    )
                ]
            )
            assert settled == [True]
            assert (await queue.get(claimed.id)).config == new_config

        counts = dict(await queue.counts())
        assert counts == {(text, ItemState.QUEUED): 1 for text in values}
        assert await _table_count(queue, backend, tmp_path) == tables
        listed = await queue.list_items(limit=1000)
        assert sorted(i.spec_id for i in listed) == sorted(values)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_nul_is_refused_by_name_on_every_backend(backend: str, tmp_path: Path) -> None:
    """A NUL in any text field or config string is refused up front, naming the field.

    PostgreSQL cannot store one and a spec id holding one could never be claimed on SQLite, so
    every backend keeps the same contract: nothing is written, never stored truncated.
    """
    from trio_supervise import ConfigError

    async with open_backend(backend, None, tmp_path) as queue:
        cases: list[tuple[str, dict[str, Any]]] = [
            ("spec_id", {"spec_id": NUL}),
            ("item_id", {"item_id": NUL}),
            ("tenant_id", {"tenant_id": NUL}),
            ("subject_id", {"subject_id": NUL}),
            ("idempotency_key", {"idempotency_key": NUL}),
            ("config", {"config": {"x": NUL}}),
            ("config", {"config": {NUL: 1}}),
        ]
        for field, fields in cases:
            spec_id = fields.pop("spec_id", "job")
            with pytest.raises(ConfigError, match=f"^{field} must not contain NUL"):
                await queue.enqueue(spec_id, **fields)
        assert dict(await queue.counts()) == {}
