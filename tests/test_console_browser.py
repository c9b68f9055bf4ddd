"""The console in a real browser (Debian's chromium, driven by Playwright): every action
clicked, CSRF refused, hostile data inert, credentials off loopback, read-only, screenshots.

The server runs in Trio; each scenario drives the browser with Playwright's synchronous API in a
worker thread, and reads the queue back through ``trio.from_thread``. Screenshots of every page
go to ``$TRIO_SUPERVISE_TEST_SCREENSHOTS`` (tox: ``.tox/screenshots``), else pytest's temporary
directory.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
from prometheus_client import CollectorRegistry

from trio_supervise import (
    ErrorRecord,
    ItemState,
    MemoryAuditTrail,
    MemoryQueue,
    NewItem,
    Schedule,
    SettleKind,
    Settlement,
    Shutdown,
    TrioClock,
    WorkerState,
    WorkerStatus,
)
from trio_supervise.console import OperationsApp, Receive, Scope, Send, serve_http

from .test_status_page_browser import FLAGS, HOSTILE, chromium

SCREENSHOTS = "TRIO_SUPERVISE_TEST_SCREENSHOTS"
TOKEN = "console-token-for-browsers"
EPOCH = dt.datetime(2030, 1, 1, 8, 0, tzinfo=dt.UTC)


def playwright_api() -> Any:
    """Playwright's synchronous API, or a skip (a failure on CI, where the test extra has it)."""
    try:
        from playwright import sync_api
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("playwright is not installed, and CI is set")
        pytest.skip("playwright is not installed (pip install playwright; no browser download)")
    return sync_api


@pytest.fixture
def shots(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this test's screenshots go."""
    base = os.environ.get(SCREENSHOTS)
    root = Path(base) if base else tmp_path_factory.getbasetemp() / "screenshots"
    folder = root / request.node.name.removeprefix("test_")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@attrs.define
class Source:
    healthy: bool = True
    statuses: list[WorkerStatus] = attrs.Factory(
        lambda: [
            WorkerStatus("http", WorkerState.RUNNING, 0, None, 0.0),
            WorkerStatus("runner", WorkerState.RUNNING, 0, None, 0.0),
            WorkerStatus("maintenance-schedules", WorkerState.RUNNING, 0, None, 0.0),
        ]
    )
    errors: list[ErrorRecord] = attrs.Factory(list)

    def workers(self) -> Sequence[WorkerStatus]:
        return self.statuses

    def recent_errors(self) -> Sequence[ErrorRecord]:
        return self.errors


@attrs.define
class Site:
    """A console served on loopback, its queue and audit trail, and its address."""

    queue: MemoryQueue
    audit: MemoryAuditTrail
    url: str


SCHEDULES = [
    Schedule(
        name="morning-report", spec_id="report", cron="0 9 * * MON-FRI", timezone="Europe/Paris"
    ),
    Schedule(name="nightly-digest", spec_id="digest", cron="30 2 * * *", queue="mail"),
]


async def serve(
    nursery: trio.Nursery, source: Source | None = None, host: str = "127.0.0.1", **options: Any
) -> Site:
    queue = MemoryQueue(clock=TrioClock(epoch=EPOCH - dt.timedelta(seconds=trio.current_time())))
    audit = MemoryAuditTrail()
    app = OperationsApp(
        source or Source(),
        CollectorRegistry(),
        queue=queue,
        title="billing service",
        audit=audit,
        schedules=SCHEDULES,
        queue_limits={"default": 8, "mail": 2},
        **options,
    )
    shutdown = Shutdown()
    port = await nursery.start(partial(serve_http, app, host, 0, shutdown=shutdown))
    nursery.start_soon(_stop_on_cancel, shutdown)
    return Site(queue, audit, f"http://127.0.0.1:{port}")


async def _stop_on_cancel(shutdown: Shutdown) -> None:
    try:
        await trio.sleep_forever()
    finally:
        shutdown.begin("test over")


@pytest.fixture
async def nursery() -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as opened:
        yield opened
        opened.cancel_scope.cancel()


async def settle_as(queue: MemoryQueue, item_id: str, kind: SettleKind, **fields: Any) -> None:
    """Claim *item_id* (the only due item of its spec) and settle it as *kind*."""
    item = await queue.get(item_id)
    [claimed] = await queue.claim_due([item.spec_id], "billing-7f3a", 60, 1, queue=item.queue)
    assert claimed.id == item_id
    await queue.settle_many(
        [Settlement(item_id=item_id, lease_version=claimed.lease_version, kind=kind, **fields)]
    )


TRACEBACK = (
    "ConnectionError: SMTP server refused the connection\n"
    "Traceback (most recent call last):\n"
    '  File "billing/mail.py", line 42, in send\n'
    "    await smtp.send(message)\n"
    "ConnectionError: SMTP server refused the connection"
)


async def populate(queue: MemoryQueue) -> None:
    """A day in the life: invoices queued, one running, a few dead, a paused mail queue."""
    await queue.enqueue("invoice", item_id="invoice-1000", config={"n": 1000})
    await settle_as(queue, "invoice-1000", SettleKind.COMPLETE, result={"sent": True})
    await queue.enqueue_many(
        [
            NewItem(spec_id="invoice", item_id=f"invoice-{n}", tenant_id="acme", config={"n": n})
            for n in range(1001, 1006)
        ]
    )
    later = queue.clock.now() + dt.timedelta(hours=2)
    await queue.enqueue("report", item_id="report-q1", due_at=later, config={"quarter": 1})
    await queue.enqueue("digest", item_id="digest-alice", queue="mail", config={"to": "alice"})
    for n in (1, 2, 3):
        await queue.enqueue("receipt", item_id=f"receipt-{n}", config={"order": n})
        await settle_as(queue, f"receipt-{n}", SettleKind.DEAD, error=TRACEBACK)
    await queue.pause_queue("mail")


# -- the browser, in a worker thread ---------------------------------------------------------------


def in_browser(scenario: Callable[[Any], None], **context: Any) -> Callable[[], None]:
    """A function that opens chromium (Debian's, never a downloaded one), runs *scenario* with a
    new page (*context* options: credentials, viewport) and closes it."""
    sync_api = playwright_api()
    browser_path = chromium()

    def run() -> None:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=browser_path, args=list(FLAGS), headless=True
            )
            try:
                page = browser.new_context(
                    viewport={"width": 1280, "height": 900}, **context
                ).new_page()
                scenario(page)
            finally:
                browser.close()

    return run


async def drive(scenario: Callable[[Any], None], **context: Any) -> None:
    with trio.fail_after(120):
        await trio.to_thread.run_sync(in_browser(scenario, **context))


def state_of(queue: MemoryQueue, item_id: str) -> ItemState:
    """From the browser's thread: the item's state in the Trio side's queue."""
    return trio.from_thread.run(queue.get, item_id).state


def flash(page: Any) -> str:
    return str(page.inner_text("#flash"))


def shot(page: Any, folder: Path, name: str) -> None:
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


# -- every action, clicked -------------------------------------------------------------------------


async def test_every_action_is_clicked_in_a_browser(nursery: trio.Nursery, shots: Path) -> None:
    """Retry, run now, cancel, delete, pause, resume, fire now and bulk retry, each by its
    button: each redirects back with the sentence the CLI prints, and acts."""
    site = await serve(nursery)
    queue = site.queue
    await populate(queue)
    await queue.enqueue("receipt", item_id="receipt-4")
    await settle_as(queue, "receipt-4", SettleKind.CANCEL)

    def scenario(page: Any) -> None:
        page.goto(f"{site.url}/")
        assert page.title() == "billing service"
        shot(page, shots, "status")

        page.goto(f"{site.url}/items/receipt-1")
        shot(page, shots, "item")
        page.click("button:text('Retry')")
        assert flash(page).startswith("requeued receipt-1, due ")
        assert state_of(queue, "receipt-1") is ItemState.QUEUED

        page.goto(f"{site.url}/items/report-q1")
        page.click("button:text('Run now')")
        assert flash(page) == "report-q1 is due now (its error count and attempts were reset)"

        page.goto(f"{site.url}/items/invoice-1001")
        page.click("button:text('Cancel')")
        assert flash(page) == "cancelled invoice-1001"
        assert state_of(queue, "invoice-1001") is ItemState.CANCELLED

        page.goto(f"{site.url}/items/receipt-4")
        page.click("button:text('Delete')")
        assert page.url == f"{site.url}/items"
        assert flash(page) == "deleted receipt-4 (receipt, cancelled)"
        shot(page, shots, "items")

        page.goto(f"{site.url}/")
        page.click("#queues tr:has(td:text-is('mail')) button:text('Resume')")
        assert flash(page) == "resumed mail"
        page.click("#queues tr:has(td:text-is('mail')) button:text('Pause')")
        assert flash(page) == "paused mail"
        assert page.locator("#queues tr.paused td").first.inner_text() == "mail"

        page.click("#schedules tr:has(td:text-is('nightly-digest')) button:text('Fire now')")
        assert re.fullmatch(
            r"fired nightly-digest: schedule:nightly-digest:manual:\S+ is due now in queue mail",
            flash(page),
        )

        page.goto(f"{site.url}/dead")
        shot(page, shots, "dead")
        page.check("input[value='receipt-2']")
        page.click("button:text('Retry selected')")
        assert flash(page) == "retried 1 of 1"
        assert state_of(queue, "receipt-2") is ItemState.QUEUED
        assert state_of(queue, "receipt-3") is ItemState.DEAD
        page.click("button:text('Retry all 1 on this page')")
        assert flash(page) == "retried 1 of 1"
        assert state_of(queue, "receipt-3") is ItemState.QUEUED

        page.goto(f"{site.url}/")
        shot(page, shots, "status-after")
        assert page.locator("#audit tbody tr").count() == 9

    await drive(scenario)
    actions = [(entry.action, entry.ok) for entry in reversed(site.audit.entries)][::-1]
    assert [action for action, _ in actions] == [
        "retry",
        "run-now",
        "cancel",
        "delete",
        "resume",
        "pause",
        "fire",
        "bulk-retry",
        "bulk-retry",
    ]
    assert all(ok for _, ok in actions)


# -- CSRF ------------------------------------------------------------------------------------------


async def cross_site_form(nursery: trio.Nursery, target: str) -> str:
    """A page of another site (``localhost`` is another site than ``127.0.0.1``) with a form
    posting to *target*, with a made-up token; its URL."""
    page = (
        "<!doctype html><html><head><title>win a prize</title></head><body>"
        f'<form method="post" action="{target}"><input type="hidden" name="csrf" value="guess">'
        '<input type="hidden" name="next" value="/"><button>Claim your prize</button></form>'
        "</body></html>"
    ).encode()

    async def evil(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await OperationsApp(Source(), CollectorRegistry())(scope, receive, send)
            return
        headers = [(b"content-type", b"text/html")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": page})

    shutdown = Shutdown()
    port = await nursery.start(partial(serve_http, evil, "127.0.0.1", 0, shutdown=shutdown))
    nursery.start_soon(_stop_on_cancel, shutdown)
    return f"http://localhost:{port}/"


async def test_an_action_without_the_csrf_token_is_refused(
    nursery: trio.Nursery, shots: Path
) -> None:
    """A POST with no token or a wrong one is 403 over plain HTTP; and a form of another site,
    clicked in the browser of an operator who has the console open, does nothing."""
    site = await serve(nursery)
    await site.queue.enqueue("invoice", item_id="invoice-1")
    target = f"{site.url}/items/invoice-1/cancel"
    async with httpx.AsyncClient() as client:
        assert (await client.post(target, data={"next": "/"})).status_code == 403
        await client.get(f"{site.url}/")  # a session cookie, but not its token
        refused = await client.post(target, data={"csrf": "guess", "next": "/"})
    assert refused.status_code == 403
    assert "missing or wrong CSRF token" in refused.text
    evil = await cross_site_form(nursery, target)

    def scenario(page: Any) -> None:
        page.goto(f"{site.url}/items/invoice-1")  # the operator's console, open
        page.goto(evil)
        with page.expect_response(target) as response:
            page.click("button")
        assert response.value.status == 403
        shot(page, shots, "refused")
        assert state_of(site.queue, "invoice-1") is ItemState.QUEUED

    await drive(scenario)
    assert site.audit.entries == []


# -- hostile data ----------------------------------------------------------------------------------


async def test_hostile_item_data_is_inert_on_every_page(nursery: trio.Nursery, shots: Path) -> None:
    """Script in ids, specs, configs, tenants, errors and worker errors stays text on every
    page (the recent errors' page too): the title never changes and no injected element
    appears."""
    source = Source(
        statuses=[WorkerStatus("mailer", WorkerState.BACKING_OFF, 3, f"OSError: {HOSTILE}", 0.0)],
        errors=[ErrorRecord(at=None, source=HOSTILE, message=HOSTILE)],
    )
    site = await serve(nursery, source)
    queue = site.queue
    await queue.enqueue(HOSTILE, item_id=f"x{HOSTILE}", tenant_id=HOSTILE, config={"n": HOSTILE})
    await queue.enqueue("receipt", item_id="r-1", config={HOSTILE: HOSTILE})
    await settle_as(queue, "r-1", SettleKind.DEAD, error=f"{HOSTILE}\n{HOSTILE}")
    from trio_supervise.console import quote_part

    paths = [
        "/",
        "/items",
        "/dead",
        "/errors",
        "/items/r-1",
        f"/items/{quote_part('x' + HOSTILE)}",
    ]

    def scenario(page: Any) -> None:
        for n, path in enumerate(paths):
            page.goto(f"{site.url}{path}")
            assert page.title() != "pwned", path
            assert page.query_selector("#pwned") is None, path
            assert page.query_selector("img") is None, path
            assert "<script>document.title='pwned'" in page.inner_text("body"), path
            shot(page, shots, f"page-{n}")

    await drive(scenario)


# -- credentials and read-only ---------------------------------------------------------------------


async def test_off_loopback_the_console_asks_for_credentials(
    nursery: trio.Nursery, shots: Path
) -> None:
    """Bound to every interface the console needs credentials: the browser is refused without
    them and acts with them (the user name given is who the audit trail names)."""
    with pytest.raises(ValueError, match="not a loopback address"):
        await serve(nursery, host="0.0.0.0")
    site = await serve(nursery, host="0.0.0.0", token=TOKEN)
    await site.queue.enqueue("invoice", item_id="invoice-1")

    def refused(page: Any) -> None:
        response = page.request.get(f"{site.url}/")
        assert response.status == 401
        assert response.headers["www-authenticate"].startswith("Basic ")

    def allowed(page: Any) -> None:
        page.goto(f"{site.url}/items/invoice-1")
        page.click("button:text('Cancel')")
        assert flash(page) == "cancelled invoice-1"
        shot(page, shots, "signed-in")

    await drive(refused)
    await drive(allowed, http_credentials={"username": "alice", "password": TOKEN})
    assert [entry.who for entry in site.audit.entries] == ["alice"]


async def test_a_read_only_console_shows_no_forms(nursery: trio.Nursery, shots: Path) -> None:
    """Read-only: no form that posts and no action button on any page; a POST is 403."""
    site = await serve(nursery, read_only=True)
    await populate(site.queue)

    def scenario(page: Any) -> None:
        for path in ("/", "/items", "/dead", "/errors", "/items/receipt-1", "/items/invoice-1001"):
            page.goto(f"{site.url}{path}")
            assert page.query_selector_all("form[method=post]") == [], path
            assert page.locator("button").all_inner_texts() in ([], ["Filter"]), path
            shot(page, shots, path.strip("/").replace("/", "-") or "status")
        response = page.request.post(f"{site.url}/items/receipt-1/retry", form={"csrf": "x"})
        assert response.status == 403

    await drive(scenario)
    assert site.audit.entries == []
