"""The operations console over real HTTP: pages, actions, CSRF, credentials, read-only, audit."""

from __future__ import annotations

import base64
import datetime as dt
import re
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import attrs
import httpx
import pytest
import trio
from prometheus_client import CollectorRegistry

from trio_supervise import (
    EntryKind,
    HttpSettings,
    ItemState,
    JournalEntry,
    MemoryAuditTrail,
    MemoryQueue,
    NewItem,
    Schedule,
    SettleKind,
    Settlement,
    Shutdown,
    hash_password,
)
from trio_supervise.console import OperationsApp, serve_http

from .test_http import FakeSource

TOKEN = "console-token-for-tests"
DAILY = Schedule(name="daily", spec_id="report", cron="0 9 * * *", queue="reports")


@attrs.define
class Console:
    client: httpx.AsyncClient
    queue: MemoryQueue
    audit: MemoryAuditTrail
    app: OperationsApp

    async def page(self, path: str = "/", **kwargs: Any) -> str:
        response = await self.client.get(path, **kwargs)
        assert response.status_code == 200, (path, response.status_code, response.text)
        return response.text

    async def token(self, path: str = "/") -> str:
        """The CSRF token of *path*'s forms (getting it sets the session cookie)."""
        found = re.search(r'name="csrf" value="([^"]+)"', await self.page(path))
        assert found is not None
        return found[1]

    async def post(self, path: str, *, back: str = "/", **fields: Any) -> httpx.Response:
        """Submit a form as the page would: its CSRF token, where to come back to, *fields*."""
        data = {"csrf": await self.token(), "next": back, **fields}
        return await self.client.post(path, data=data)

    async def flash(self, response: httpx.Response) -> str:
        """The flash message the page a redirect leads to shows."""
        assert response.status_code == 303, response.text
        found = re.search(r'<p id="flash" class="flash (\w+)">(.*?)</p>', await self.page(
            response.headers["location"]
        ))  # fmt: skip
        assert found is not None
        return f"{found[1]}: {found[2]}"


@attrs.define
class Serving:
    nursery: trio.Nursery
    opened: list[Console] = attrs.Factory(list)

    async def open(self, **options: Any) -> Console:
        """An OperationsApp with *options* served on loopback, and a client of it."""
        queue = options.pop("queue", None) or MemoryQueue()
        audit = MemoryAuditTrail()
        app = OperationsApp(
            FakeSource(),
            CollectorRegistry(),
            queue=queue,
            audit=audit,
            schedules=[DAILY],
            queue_limits={"default": 4, "reports": 2},
            **options,
        )
        shutdown = Shutdown()
        port = await self.nursery.start(partial(serve_http, app, "127.0.0.1", 0, shutdown=shutdown))
        client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10)
        console = Console(client, queue, audit, app)
        self.opened.append(console)
        self.nursery.start_soon(_close_on_exit, client, shutdown)
        return console


async def _close_on_exit(client: httpx.AsyncClient, shutdown: Shutdown) -> None:
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()
        shutdown.begin("test over")


@pytest.fixture
async def serving() -> AsyncIterator[Serving]:
    async with trio.open_nursery() as nursery:
        with trio.fail_after(60):
            yield Serving(nursery)
        nursery.cancel_scope.cancel()


@pytest.fixture
async def console(serving: Serving) -> Console:
    return await serving.open()


async def dead_item(queue: MemoryQueue, item_id: str, error: str = "OSError: gone") -> None:
    await queue.enqueue("report", item_id=item_id)
    [item] = [i for i in await queue.claim_due(["report"], "w1", 30, 100) if i.id == item_id]
    await queue.settle_many(
        [
            Settlement(
                item_id=item.id, lease_version=item.lease_version, kind=SettleKind.DEAD, error=error
            )
        ]
    )


# -- CSRF ------------------------------------------------------------------------------------------


async def test_an_action_without_the_forms_csrf_token_is_refused(console: Console) -> None:
    """No session cookie, no token, or another session's token: 403, and nothing happens."""
    await console.queue.enqueue("report", item_id="r-1")
    path = "/items/r-1/cancel"
    bare = httpx.AsyncClient(base_url=console.client.base_url)
    async with bare:
        refused = await bare.post(path, data={"csrf": "x", "next": "/"})
    assert refused.status_code == 403
    assert "missing or wrong CSRF token" in refused.text
    await console.token()  # the session cookie is set now
    for data in ({"next": "/"}, {"csrf": "", "next": "/"}, {"csrf": "A" * 43, "next": "/"}):
        assert (await console.client.post(path, data=data)).status_code == 403
    other = httpx.AsyncClient(base_url=console.client.base_url)
    async with other:
        foreign = re.search(r'name="csrf" value="([^"]+)"', (await other.get("/")).text)
    assert foreign is not None
    wrong = await console.client.post(path, data={"csrf": foreign[1], "next": "/"})
    assert wrong.status_code == 403
    assert (await console.queue.get("r-1")).state is ItemState.QUEUED
    assert console.audit.entries == []


async def test_the_session_cookie_is_strict_and_http_only(console: Console) -> None:
    """The CSRF session cookie is SameSite=Strict and HttpOnly, set once per browser."""
    first = await console.client.get("/")
    cookie = first.headers["set-cookie"]
    assert cookie.startswith("ts_csrf=")
    assert "; HttpOnly" in cookie
    assert "; SameSite=Strict" in cookie
    assert "set-cookie" not in (await console.client.get("/")).headers


async def test_a_post_from_another_site_is_refused(console: Console) -> None:
    """A browser's Sec-Fetch-Site: cross-site is refused before the form is read."""
    await console.queue.enqueue("report", item_id="r-1")
    data = {"csrf": await console.token(), "next": "/"}
    headers = {"sec-fetch-site": "cross-site"}
    response = await console.client.post("/items/r-1/cancel", data=data, headers=headers)
    assert response.status_code == 403
    assert (await console.queue.get("r-1")).state is ItemState.QUEUED


async def test_the_redirect_stays_on_this_server(console: Console) -> None:
    """A ``next`` that leaves the server (//host, a scheme, backslashes) redirects to /."""
    await console.queue.enqueue("report", item_id="r-1")
    for back in ("//evil.example/", "https://evil.example/", "/\\evil", "items"):
        response = await console.post("/items/r-1/run-now", back=back)
        assert response.headers["location"] == "/"


async def test_a_forged_flash_cookie_is_not_shown(console: Console) -> None:
    """Only the console's own (signed) flash messages appear on the page."""
    console.client.cookies.set("ts_flash", "eyJvayI6IHRydWV9.forged")
    assert 'id="flash"' not in await console.page("/")


# -- actions ---------------------------------------------------------------------------------------


async def test_retry_cancel_delete_and_run_now_do_what_the_cli_does(console: Console) -> None:
    """Each item action posts, redirects back, flashes the CLI's sentence, and acts."""
    queue = console.queue
    await dead_item(queue, "d-1")
    later = queue.clock.now() + dt.timedelta(hours=3)
    await queue.enqueue("report", item_id="later", due_at=later)
    await queue.enqueue("report", item_id="doomed")

    said = await console.flash(await console.post("/items/d-1/retry", back="/items/d-1"))
    assert said.startswith("ok: requeued d-1, due ")
    assert (await queue.get("d-1")).state is ItemState.QUEUED

    said = await console.flash(await console.post("/items/later/run-now", back="/items/later"))
    assert said == "ok: later is due now (its error count and attempts were reset)"
    assert (await queue.get("later")).due_at <= queue.clock.now()

    assert await console.flash(await console.post("/items/doomed/cancel")) == (
        "ok: cancelled doomed"
    )
    said = await console.flash(await console.post("/items/doomed/delete", back="/items"))
    assert said == "ok: deleted doomed (report, cancelled)"
    assert "doomed" not in queue.items


@pytest.mark.parametrize(
    ("action", "setup", "message"),
    [
        ("retry", "queued", "refused: r-1 is queued (due "),
        ("run-now", "dead", "refused: r-1 is dead; retry it to queue it again"),
        ("cancel", "dead", "refused: r-1 is dead; nothing to cancel"),
        ("delete", "running", "refused: item &#39;r-1&#39; is running; cancel it first"),
        ("retry", "running", "refused: r-1 is running; cancel it first"),
        ("retry", "missing", "refused: no item &#39;r-1&#39;"),
    ],
)
async def test_an_action_that_does_not_apply_is_refused_saying_why(
    console: Console, action: str, setup: str, message: str
) -> None:
    """Where an action does not apply to the item's state, the flash says why; the audit trail
    records the refusal."""
    queue = console.queue
    if setup == "queued":
        await queue.enqueue("report", item_id="r-1")
    elif setup == "dead":
        await dead_item(queue, "r-1")
    elif setup == "running":
        await queue.enqueue("report", item_id="r-1")
        await queue.claim_due(["report"], "w1", 30, 1)
    said = await console.flash(await console.post(f"/items/r-1/{action}"))
    assert said.startswith(message), said
    [entry] = console.audit.entries
    assert (entry.action, entry.target, entry.ok) == (action, "item:r-1", False)


async def test_pause_and_resume_a_queue_from_the_page(console: Console) -> None:
    """The queues panel's buttons pause and resume a queue fleet-wide; an unknown name (a
    crafted form) is refused naming the known queues."""
    await console.queue.enqueue("mail", queue="mail")
    page = await console.page("/")
    assert 'action="/queues/mail/pause"' in page
    assert await console.flash(await console.post("/queues/mail/pause")) == "ok: paused mail"
    [mail] = [q for q in await console.queue.list_queues() if q.name == "mail"]
    assert mail.paused
    page = await console.page("/")
    assert re.search(r'<tr class="paused"><td>mail</td><td>paused since ', page)
    assert re.search(r"UTC \(due\), queue mail paused</td>", page)  # its item waits, and why
    assert 'action="/queues/mail/resume"' in page
    assert await console.flash(await console.post("/queues/mail/resume")) == "ok: resumed mail"
    said = await console.flash(await console.post("/queues/remnders/pause"))
    assert said == "refused: no queue &#39;remnders&#39; is known (known: default, mail, reports)"


async def test_fire_a_schedule_now_without_taking_a_fires_place(console: Console) -> None:
    """ "Fire now" enqueues the schedule's item due now in its queue, under a manual id."""
    said = await console.flash(await console.post("/schedules/daily/fire"))
    [item] = await console.queue.list_items()
    assert item.id.startswith("schedule:daily:manual:")
    assert (item.spec_id, item.queue) == ("report", "reports")
    assert said == f"ok: fired daily: {item.id} is due now in queue reports"
    missing = await console.flash(await console.post("/schedules/nightly/fire"))
    assert missing == "refused: no schedule &#39;nightly&#39; in this service"


async def test_dead_items_are_listed_and_retried_in_bulk(console: Console) -> None:
    """The dead items page lists them with checkboxes; the selected ones are retried."""
    for n in range(3):
        await dead_item(console.queue, f"d-{n}")
    page = await console.page("/dead")
    assert page.count('type="checkbox" name="id"') == 3
    data = {"csrf": await console.token("/dead"), "next": "/dead", "id": ["d-0", "d-2"]}
    said = await console.flash(await console.client.post("/dead/retry", data=data))
    assert said == "ok: retried 2 of 2"
    states = {i: (await console.queue.get(i)).state for i in ("d-0", "d-1", "d-2")}
    assert states == {"d-0": "queued", "d-1": "dead", "d-2": "queued"}
    [entry] = console.audit.entries
    assert (entry.action, entry.target, entry.ok) == ("bulk-retry", "items:2", True)
    nothing = {"csrf": await console.token("/dead"), "next": "/dead"}
    said = await console.flash(await console.client.post("/dead/retry", data=nothing))
    assert said == "refused: no items were selected"


async def test_every_action_is_in_the_audit_trail_and_on_the_page(console: Console) -> None:
    """Who (local on loopback), from where, what, to which thing, and how it went."""
    await console.queue.enqueue("report", item_id="r-1")
    await console.post("/items/r-1/cancel")
    [entry] = console.audit.entries
    assert (entry.who, entry.address, entry.action, entry.target, entry.ok, entry.result) == (
        "local",
        "127.0.0.1",
        "cancel",
        "item:r-1",
        True,
        "cancelled r-1",
    )
    assert entry.at <= console.queue.clock.now()
    page = await console.page("/")
    assert re.search(
        r'<table id="audit">.*<td>local</td><td>127.0.0.1</td><td>cancel</td>'
        r'<td>item:r-1</td><td class="ok">cancelled r-1</td>',
        page,
        re.DOTALL,
    )


# -- pages -----------------------------------------------------------------------------------------


async def test_the_item_page_shows_everything_about_an_item(console: Console) -> None:
    """Config, result, error history with tracebacks, children and lineage, every id a link."""
    queue = console.queue
    await queue.enqueue("report", item_id="root", config={"who": "<b>acme</b>"})
    [claimed] = await queue.claim_due(["report"], "w1", 30, 1)
    await queue.mark_error("root", claimed.lease_version, "OSError: disk\nTraceback line 1")
    await queue.settle_many(
        [
            Settlement(
                item_id="root",
                lease_version=claimed.lease_version,
                kind=SettleKind.COMPLETE,
                result={"sent": 3},
                children=(NewItem(spec_id="thumb", item_id="child"),),
            )
        ]
    )
    await queue.enqueue_many([NewItem(spec_id="thumb", item_id="grandchild")])
    page = await console.page("/items/root")
    assert "<title>item root · trio_supervise</title>" in page
    assert "&lt;b&gt;acme&lt;/b&gt;" in page
    assert "<pre>{\n  &#34;sent&#34;: 3\n}</pre>" in page
    assert re.search(r"by w1 \(attempt 1\): <code>OSError: disk</code>", page)
    assert '<pre class="traceback">Traceback line 1</pre>' in page
    assert '<a href="/items/child">child</a>' in page
    assert 'action="/items/root/retry"' in page  # completed: retry applies
    assert 'action="/items/root/cancel"' not in page
    child_page = await console.page("/items/child")
    assert re.search(r'lineage: <a href="/items/root">root</a> \(report, completed\)', child_page)
    assert (await console.client.get("/items/nope")).status_code == 404


async def test_item_ids_with_slashes_and_spaces_round_trip_through_links(console: Console) -> None:
    """An id is one percent-encoded path segment: links and actions reach the same item."""
    await console.queue.enqueue("report", item_id="a/b c?d")
    page = await console.page("/items")
    assert '<a href="/items/a%2Fb%20c%3Fd">a/b c?d</a>' in page
    assert "a/b c?d" in await console.page("/items/a%2Fb%20c%3Fd")
    said = await console.flash(await console.post("/items/a%2Fb%20c%3Fd/cancel"))
    assert said == "ok: cancelled a/b c?d"


async def test_items_are_filtered_by_state_and_spec_and_paged_by_cursor(console: Console) -> None:
    """The list filters with list_items' own arguments and pages with "next page" links whose
    cursor is the last id shown (keyset), covering every item once."""
    queue = console.queue
    await dead_item(queue, "r-dead")
    await queue.enqueue_many([NewItem(spec_id="report", item_id=f"r-{n:03}") for n in range(120)])
    await queue.enqueue_many([NewItem(spec_id="mail", item_id=f"m-{n}") for n in range(3)])
    seen: list[str] = []
    path: str | None = "/items?state=queued&spec=report"
    pages = 0
    while path is not None:
        page = await console.page(path)
        seen += re.findall(r'<tr><td><a href="/items/[^"]+">([^<]+)</a></td><td>report</td>', page)
        assert "<td>mail</td>" not in page
        found = re.search(r'<a id="next-page" href="([^"]+)">', page)
        path = None if found is None else found[1].replace("&amp;", "&")
        pages += 1
    assert pages == 3
    assert seen == [f"r-{n:03}" for n in range(120)]
    dead = await console.page("/items?state=dead")
    assert re.findall(r'<a href="/items/([^"]+)">', dead) == ["r-dead"]
    gone = await console.page("/items?after=no-such-item")
    assert "the item this page starts after (no-such-item) is gone" in gone


async def test_the_status_page_has_queues_and_schedules_panels(console: Console) -> None:
    """Queues: paused or not, counts, this runner's concurrency, lag; schedules: spec, cron,
    zone, queue, next fire, last fire."""
    await console.queue.enqueue("mail", queue="mail")
    await console.queue.pause_queue("mail")
    page = await console.page("/")
    assert re.search(r"<tr><td>default</td><td>active</td>(<td class=\"num\">0</td>){5}"
                     r"<td class=\"num\">4</td>", page)  # fmt: skip
    assert re.search(r'<tr class="paused"><td>mail</td>.*?not served here</td>', page)
    assert re.search(
        r"<tr><td>daily</td><td>report</td><td><code>0 9 \* \* \*</code></td><td>UTC</td>"
        r"<td>reports</td><td>\d{4}-\d\d-\d\d 09:00:00 UTC \(in [^)]+\)</td><td>none found</td>",
        page,
    )


async def test_the_queues_panel_shows_rate_limits(console: Console) -> None:
    """A rate-limited queue shows its limit, and while its window is full, until when."""
    from trio_supervise import RateLimit

    await console.queue.set_rate_limit("mail", RateLimit(1, 30))
    await console.queue.set_rate_limit("news", RateLimit(5, 0.5))
    await console.queue.enqueue("mail", queue="mail")
    await console.queue.enqueue("mail", queue="mail")
    await console.queue.claim_due(["mail"], "w", 60, 5, queue="mail")
    page = await console.page("/")
    assert re.search(r"<tr><td>news</td><td>active</td>.*?<td>5/500ms</td>", page)
    assert re.search(r"<td>1/30s, throttled until \d{4}-\d\d-\d\d [0-9:]+ UTC", page)
    assert re.search(r"<tr><td>default</td>.*?<td>none</td>", page)


async def test_the_queues_panel_counts_throttled_keys(console: Console) -> None:
    """While a key's rate holds its items back, the panel says how many keys are held."""
    from trio_supervise import RateLimit

    await console.queue.set_key_rate_limit("{tenant}", RateLimit(1, 30))
    for _ in range(2):
        await console.queue.enqueue("mail", concurrency_key="acme", concurrency_limit=5)
    await console.queue.claim_due(["mail"], "w", 60, 5)
    page = await console.page("/")
    assert '<p id="throttled-keys">1 concurrency key held back by its rate limit now' in page


# -- read-only and credentials ---------------------------------------------------------------------


async def test_read_only_shows_no_forms_and_refuses_every_action(serving: Serving) -> None:
    """Read-only: not one form on any page, and a POST (token or not) is 403."""
    console = await serving.open(read_only=True)
    await dead_item(console.queue, "d-1")
    for path in ("/", "/items", "/dead", "/items/d-1"):
        page = await console.page(path)
        assert 'method="post"' not in page, path
        assert "<button" not in page.replace('<button type="submit">Filter</button>', ""), path
    response = await console.client.post("/items/d-1/retry", data={"csrf": "x"})
    assert response.status_code == 403
    assert "read-only" in response.text
    assert (await console.queue.get("d-1")).state is ItemState.DEAD


async def test_with_a_token_the_console_asks_for_credentials(serving: Serving) -> None:
    """A token is taken as a bearer token or as the Basic password (any user name, recorded
    as who); /healthz and /metrics stay open for probes and scrapers."""
    console = await serving.open(token=TOKEN)
    denied = await console.client.get("/")
    assert denied.status_code == 401
    assert denied.headers["www-authenticate"] == (
        'Basic realm="trio_supervise console", charset="UTF-8"'
    )
    for path in ("/items", "/dead", "/items/x"):
        assert (await console.client.get(path)).status_code == 401
    assert (await console.client.get("/healthz")).status_code == 200
    assert (await console.client.get("/metrics")).status_code == 200
    bearer = {"authorization": f"Bearer {TOKEN}"}
    assert (await console.client.get("/", headers=bearer)).status_code == 200
    wrong = {"authorization": "Bearer not-the-token-at-all"}
    assert (await console.client.get("/", headers=wrong)).status_code == 401
    console.client.auth = httpx.BasicAuth("alice", TOKEN)
    await console.queue.enqueue("report", item_id="r-1")
    await console.post("/items/r-1/cancel")
    assert [entry.who for entry in console.audit.entries] == ["alice"]


async def test_with_a_password_hash_the_console_takes_the_password(serving: Serving) -> None:
    """HTTP Basic with the password whose hash is configured; any other is refused."""
    stored = hash_password("correct horse", scheme="pbkdf2_sha256")
    console = await serving.open(password_hash=stored)
    basic = "Basic " + base64.b64encode(b"ops:correct horse").decode()
    assert (await console.client.get("/", headers={"authorization": basic})).status_code == 200
    again = await console.client.get("/items", headers={"authorization": basic})
    assert again.status_code == 200  # remembered: no second hash
    bad = "Basic " + base64.b64encode(b"ops:wrong horse").decode()
    assert (await console.client.get("/", headers={"authorization": bad})).status_code == 401
    garbage = {"authorization": "Basic ***"}
    assert (await console.client.get("/", headers=garbage)).status_code == 401


def test_password_hashes_verify_and_refuse() -> None:
    """Both schemes hash to scheme$params$salt$hash and verify only the password hashed."""
    from trio_supervise.console import check_password_hash

    for scheme in ("scrypt", "pbkdf2_sha256"):
        made = hash_password("s3cret", scheme=scheme)
        assert made.startswith(f"{scheme}$")
        assert len(made.split("$")) == 4
        parsed = check_password_hash(made)
        assert parsed.verify("s3cret")
        assert not parsed.verify("s3cret ")
    with pytest.raises(ValueError, match="scheme must be 'scrypt' or 'pbkdf2_sha256'"):
        hash_password("x", scheme="md5")


async def test_off_loopback_the_console_is_not_served_without_credentials() -> None:
    """serve_http refuses a non-loopback host for a console without credentials, and the
    settings refuse one too (the service never starts)."""
    app = OperationsApp(FakeSource(), CollectorRegistry(), queue=MemoryQueue())
    with pytest.raises(ValueError, match=r"'0\.0\.0\.0' is not a loopback address"):
        await serve_http(app, "0.0.0.0", 0, shutdown=Shutdown())
    with pytest.raises(ValueError, match=r"set http\.token or http\.password_hash"):
        HttpSettings(host="0.0.0.0")
    assert HttpSettings(host="0.0.0.0", token=TOKEN).authenticates


# -- in a service ----------------------------------------------------------------------------------


class Reminders:
    """A driver whose items go to queue "reminders"."""

    name = "reminders"
    spec_ids = ("remind",)
    queue = "reminders"

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: object, item: Any) -> Any:
        from trio_supervise import Stop

        await trio.lowlevel.checkpoint()
        return Stop()


async def test_a_service_console_shows_what_nothing_serves_and_records_actions() -> None:
    """A service's page lists its unserved driver queue and schedule as warnings, its queues
    with the runner's concurrency, its schedules; an action lands in the service's audit."""
    from trio_supervise import RunnerSettings, Service, Settings

    queue = MemoryQueue()
    audit = MemoryAuditTrail()
    service = Service(
        drivers=[Reminders()],
        schedules=[Schedule(name="nightly", spec_id="remind", cron="0 3 * * *")],
        settings=Settings(
            http=HttpSettings(port=0),
            runner=RunnerSettings(worker_id="w", queues={"default": 6}, poll_interval=0.05),
        ),
        queue=queue,
        handle_signals=False,
        audit=audit,
    )
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            base = f"http://127.0.0.1:{service.http_port}"
            async with httpx.AsyncClient(base_url=base) as client:
                page = (await client.get("/")).text
                console = Console(
                    client, queue, audit, OperationsApp(FakeSource(), CollectorRegistry())
                )
                await console.post("/schedules/nightly/fire")
            service.stop("test over")
    warnings = re.findall(r"<li>(.*?)</li>", page)
    assert warnings == [
        "driver &#39;reminders&#39; declares queue &#39;reminders&#39;, which the runner does "
        "not serve (runner.queues: default): its items would wait for ever",
        "schedule &#39;nightly&#39; enqueues into queue &#39;reminders&#39;, which the runner "
        "does not serve (runner.queues: default): its items would wait for ever",
    ]
    assert re.search(r"<tr><td>default</td><td>active</td>(<td class=\"num\">0</td>){5}"
                     r"<td class=\"num\">6</td>", page)  # fmt: skip
    assert "<td>reminders (not served here)</td>" in page
    [entry] = audit.entries
    assert (entry.action, entry.target, entry.ok) == ("fire", "schedule:nightly", True)


async def test_the_item_page_lists_a_durable_workflow_s_steps_and_events(
    console: Console,
) -> None:
    """Each recorded step (when, how long, attempts, a short form of its result), the pending
    wait and the events sent, escaped; an item without a journal shows no such section."""
    queue = console.queue
    await queue.enqueue("report", item_id="wf")
    [claimed] = await queue.claim_due(["report"], "w1", 30, 1)
    now = queue.clock.now()
    await queue.record_entry(
        "wf",
        claimed.lease_version,
        JournalEntry(
            position=0,
            kind=EntryKind.STEP,
            name="create-user",
            result={"user": "<ann>"},
            attempts=2,
            started_at=now,
            finished_at=now,
        ),
    )
    await queue.record_entry(
        "wf",
        claimed.lease_version,
        JournalEntry(position=1, kind=EntryKind.WAIT, name="approved", started_at=now),
    )
    await queue.send_event("wf", "approved", {"by": "<b>ops</b>"})
    page = await console.page("/items/wf")
    assert "<h2>Steps</h2>" in page
    assert re.search(
        r"<td>0</td><td>step</td><td>create-user</td><td><code>[0-9: -]+ UTC, 0.000 s, "
        r"2 attempts: \{&#34;user&#34;: &#34;&lt;ann&gt;&#34;\}</code>",
        page,
    )
    assert "<td>approved</td><td><code>" in page
    assert "waiting (deadline: no timeout)" in page
    assert "&#34;&lt;b&gt;ops&lt;/b&gt;&#34;" in page
    await queue.enqueue("report", item_id="plain")
    assert "<h2>Steps</h2>" not in await console.page("/items/plain")
