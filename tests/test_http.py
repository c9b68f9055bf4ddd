"""The operations HTTP surface, exercised over real HTTP on loopback."""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from functools import partial
from typing import Any

import attrs
import httpx
import pytest
import trio
from prometheus_client import CollectorRegistry, Counter

from trio_supervise import (
    ItemState,
    MemoryQueue,
    QueueUnavailable,
    SettleKind,
    Settlement,
    Shutdown,
    WorkItem,
)
from trio_supervise.console import (
    CONTENT_SECURITY_POLICY,
    SCRAPE_CACHE_SECONDS,
    ErrorRecord,
    HttpBindError,
    OperationsApp,
    bind_http,
    serve_http,
)
from trio_supervise.supervision import WorkerState, WorkerStatus

HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"


@attrs.define
class FakeSource:
    healthy: bool = True
    statuses: list[WorkerStatus] = attrs.field(factory=list)
    errors: list[ErrorRecord] = attrs.field(factory=list)

    def workers(self) -> Sequence[WorkerStatus]:
        return self.statuses

    def recent_errors(self) -> Sequence[ErrorRecord]:
        return self.errors


def status(worker: str, state: WorkerState, restarts: int = 0, error: str | None = None) -> Any:
    return WorkerStatus(worker=worker, state=state, restarts=restarts, last_error=error, since=0.0)


@attrs.define
class Server:
    client: httpx.AsyncClient
    source: FakeSource
    queue: MemoryQueue
    registry: CollectorRegistry
    shutdown: Shutdown
    port: int


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    source = FakeSource(
        statuses=[
            status("runner", WorkerState.RUNNING),
            status("http", WorkerState.RUNNING),
            status("mailer", WorkerState.BACKING_OFF, restarts=2, error=f"OSError: {HOSTILE}"),
        ],
        errors=[ErrorRecord(at=None, source="runner", message=f"item x: {HOSTILE}")],
    )
    queue = MemoryQueue()
    registry = CollectorRegistry()
    app = OperationsApp(source, registry, queue=queue, title="test service", refresh=7)
    shutdown = Shutdown()
    async with trio.open_nursery() as nursery:
        with trio.fail_after(10):
            port = await nursery.start(partial(serve_http, app, "127.0.0.1", 0, shutdown=shutdown))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            yield Server(client, source, queue, registry, shutdown, port)
        shutdown.begin("test over")


async def test_serve_http_reports_the_bound_port_and_stops_on_shutdown() -> None:
    """Port 0 binds a free port, reported through task_status; shutdown ends the server."""
    shutdown = Shutdown()
    app = OperationsApp(FakeSource(), CollectorRegistry())
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_http, app, "127.0.0.1", 0, shutdown=shutdown))
            assert port > 0
            async with httpx.AsyncClient() as client:
                response = await client.get(f"http://127.0.0.1:{port}/healthz")
            assert response.status_code == 200
            shutdown.begin("done")
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient() as client:
            await client.get(f"http://127.0.0.1:{port}/healthz")


async def test_serve_http_refuses_a_bad_port() -> None:
    """A port outside 0..65535 is refused up front."""
    app = OperationsApp(FakeSource(), CollectorRegistry())
    with pytest.raises(ValueError, match="port must be between 0 and 65535"):
        await serve_http(app, "127.0.0.1", 70000, shutdown=Shutdown())


async def test_healthz_is_200_with_every_worker_when_healthy(server: Server) -> None:
    """A healthy service answers 200 with a JSON body naming each worker and its state."""
    with trio.fail_after(10):
        response = await server.client.get("/healthz")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    assert body["healthy"] is True
    assert [(w["worker"], w["state"]) for w in body["workers"]] == [
        ("runner", "running"),
        ("http", "running"),
        ("mailer", "backing-off"),
    ]
    assert body["workers"][2]["restarts"] == 2
    assert body["workers"][2]["last_error"] == f"OSError: {HOSTILE}"


async def test_healthz_is_503_when_unhealthy(server: Server) -> None:
    """An unhealthy service answers 503, and the failed worker is listed as failed."""
    server.source.healthy = False
    server.source.statuses[2] = status("mailer", WorkerState.FAILED, restarts=10)
    with trio.fail_after(10):
        response = await server.client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["healthy"] is False
    assert {"worker": "mailer", "state": "failed", "restarts": 10, "last_error": None} in body[
        "workers"
    ]


async def test_metrics_exposes_the_registry_and_queue_depth_read_at_scrape_time(
    server: Server,
) -> None:
    """/metrics is Prometheus text; queue depth by spec and state is read at scrape time."""
    claimed = Counter("trio_supervise_items_claimed", "test", registry=server.registry)
    claimed.inc(3)
    with trio.fail_after(10):
        first = await server.client.get("/metrics")
        assert first.status_code == 200
        assert first.headers["content-type"].startswith("text/plain")
        assert "trio_supervise_items_claimed_total 3.0" in first.text
        assert "trio_supervise_queue_up 1.0" in first.text
        assert "trio_supervise_queue_items{" not in first.text

        await server.queue.enqueue("report", config={"n": 1})
        await server.queue.enqueue("report", config={"n": 2})
        await server.queue.enqueue("email")
        await trio.sleep(SCRAPE_CACHE_SECONDS)  # past the window one read serves
        second = await server.client.get("/metrics")
    assert 'trio_supervise_queue_items{spec="report",state="queued"} 2.0' in second.text
    assert 'trio_supervise_queue_items{spec="email",state="queued"} 1.0' in second.text


async def test_metrics_says_so_when_the_queue_cannot_answer(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue that fails at scrape time gives queue_up 0, not a failed scrape."""

    async def broken(self: MemoryQueue) -> Mapping[tuple[str, ItemState], int]:
        raise QueueUnavailable("database is down")

    monkeypatch.setattr(MemoryQueue, "counts", broken)
    with trio.fail_after(10):
        response = await server.client.get("/metrics")
    assert response.status_code == 200
    assert "trio_supervise_queue_up 0.0" in response.text


async def test_status_page_shows_workers_queue_and_errors(server: Server) -> None:
    """The page lists workers and states, counts by spec and state, due items, recent errors."""
    await server.queue.enqueue("report", config={"customer": "acme"}, item_id="item-1")
    with trio.fail_after(10):
        response = await server.client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    page = response.text
    assert '<meta http-equiv="refresh" content="7">' in page
    assert "<title>test service</title>" in page
    assert re.search(r"<td>runner</td><td class=\"state-running\">running</td>", page)
    assert re.search(r"<td>mailer</td><td class=\"state-backing-off\">backing-off</td>", page)
    assert '<table id="counts">' in page
    assert "<td>report</td>" in page
    assert "item-1" in page
    assert "acme" in page
    assert "healthy" in page


async def test_status_page_escapes_every_piece_of_item_data(server: Server) -> None:
    """Hostile ids, specs, configs and errors appear as text, never as markup."""
    await server.queue.enqueue(
        "<b>spec</b>",
        config={"note": HOSTILE},
        item_id='"><script>alert(2)</script>',
        tenant_id="<i>tenant</i>",
        subject_id="<u>subject</u>",
    )
    with trio.fail_after(10):
        page = (await server.client.get("/")).text
    assert "<script" not in page
    assert "<img" not in page
    for markup in ("<b>spec", "<i>tenant", "<u>subject"):
        assert markup not in page
    # Jinja2's escaper writes ' as &#39; and " as &#34; (the stdlib's html.escape wrote &#x27;
    # and &quot;): the same characters, inert the same way.
    assert "&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;" in page
    assert "&lt;b&gt;spec&lt;/b&gt;" in page
    assert "&#34;&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in page
    # In a link the id is one percent-encoded path segment.
    assert 'href="/items/%22%3E%3Cscript%3Ealert%282%29%3C%2Fscript%3E"' in page


async def test_status_page_shows_an_items_error_history_escaped(server: Server) -> None:
    """A due item's error history is listed oldest first, worker and error text escaped."""
    await server.queue.enqueue("report", item_id="item-1")
    [item] = await server.queue.claim_due(["report"], "<b>w1</b>", 30, 1)
    await server.queue.mark_error("item-1", item.lease_version, "first")
    await server.queue.settle_many(
        [
            Settlement(
                item_id="item-1",
                lease_version=item.lease_version,
                kind=SettleKind.RETRY,
                error=HOSTILE,
            )
        ]
    )
    with trio.fail_after(10):
        page = (await server.client.get("/")).text
    assert "<summary>history (2)</summary>" in page
    assert "<b>w1" not in page
    assert "&lt;b&gt;w1&lt;/b&gt; (attempt 1)" in page
    assert "<script" not in page
    assert page.index("<code>first</code></li>") < page.index("onerror=alert(1)&gt;</code></li>")


async def test_status_page_has_a_strict_content_security_policy(server: Server) -> None:
    """No script may run on the page, and only its own stylesheet applies."""
    with trio.fail_after(10):
        response = await server.client.get("/")
    policy = response.headers["content-security-policy"]
    assert policy == CONTENT_SECURITY_POLICY
    assert "default-src 'none'" in policy
    assert "script-src" not in policy  # falls back to default-src 'none'
    assert "unsafe-inline" not in policy
    assert response.headers["x-content-type-options"] == "nosniff"


async def test_status_page_survives_a_failing_queue(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the queue cannot answer, the page still renders and says so (escaped)."""

    async def broken(self: MemoryQueue) -> Mapping[tuple[str, ItemState], int]:
        raise QueueUnavailable(f"down {HOSTILE}")

    monkeypatch.setattr(MemoryQueue, "counts", broken)
    with trio.fail_after(10):
        response = await server.client.get("/")
    assert response.status_code == 200
    assert "queue unavailable: QueueUnavailable: down &lt;script&gt;" in response.text


@pytest.mark.parametrize("path", ["/", "/healthz", "/metrics"])
@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
async def test_wrong_methods_are_405_with_allow(server: Server, path: str, method: str) -> None:
    """Only GET and HEAD are served; anything else is 405 naming them."""
    with trio.fail_after(10):
        response = await server.client.request(method, path, content=b"x" * 100)
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, HEAD"


@pytest.mark.parametrize("path", ["/nope", "/healthz/", "/metrics/x", "/index.html"])
async def test_unknown_paths_are_404(server: Server, path: str) -> None:
    """Anything but the three routes is 404."""
    with trio.fail_after(10):
        response = await server.client.get(path)
    assert response.status_code == 404


async def test_head_sends_headers_only(server: Server) -> None:
    """HEAD answers like GET with an empty body."""
    with trio.fail_after(10):
        response = await server.client.head("/healthz")
    assert response.status_code == 200
    assert response.content == b""
    assert int(response.headers["content-length"]) > 0


async def test_query_strings_are_ignored(server: Server) -> None:
    """A query string does not change the route."""
    with trio.fail_after(10):
        response = await server.client.get("/healthz?verbose=1")
    assert response.status_code == 200


async def test_oversized_request_headers_are_refused_by_the_server(server: Server) -> None:
    """A request whose head exceeds the configured limit is refused, and the server lives on."""
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        async with stream:
            huge = b"x" * (64 * 1024)
            await stream.send_all(
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + huge + b"\r\n\r\n"
            )
            reply = b""
            with trio.move_on_after(5):
                while chunk := await stream.receive_some():
                    reply += chunk
        assert not reply.startswith(b"HTTP/1.1 200")
        response = await server.client.get("/healthz")
    assert response.status_code == 200


async def test_garbage_is_not_http_and_the_server_lives_on(server: Server) -> None:
    """A request line that is not HTTP gets an error or a closed connection, nothing more."""
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        async with stream:
            await stream.send_all(b"\x00\x01\x02 not http at all\r\n\r\n")
            reply = b""
            with trio.move_on_after(5):
                while chunk := await stream.receive_some():
                    reply += chunk
        assert not reply.startswith(b"HTTP/1.1 200")
        response = await server.client.get("/healthz")
    assert response.status_code == 200


def test_app_settings_are_checked_up_front() -> None:
    """A non-positive refresh or a negative due limit is refused at construction."""
    with pytest.raises(ValueError, match="refresh must be positive"):
        OperationsApp(FakeSource(), CollectorRegistry(), refresh=0)
    with pytest.raises(ValueError, match="due_limit must be >= 0"):
        OperationsApp(FakeSource(), CollectorRegistry(), due_limit=-1)
    with pytest.raises(ValueError, match="cache_for must be a finite number >= 0"):
        OperationsApp(FakeSource(), CollectorRegistry(), cache_for=math.inf)


# -- bounded scrapes -------------------------------------------------------------------------------


@attrs.define
class CountingQueue(MemoryQueue):
    """A memory queue that counts its status reads, and may take *delay* seconds over each."""

    delay: float = 0.0
    counts_calls: int = 0
    list_calls: int = 0

    async def counts(self) -> Mapping[tuple[str, ItemState], int]:
        self.counts_calls += 1
        await trio.sleep(self.delay)
        return await super().counts()

    async def list_items(self, **kwargs: Any) -> Sequence[WorkItem]:
        self.list_calls += 1
        await trio.sleep(self.delay)
        return await super().list_items(**kwargs)


async def asgi_get(app: OperationsApp, path: str) -> tuple[int, bytes]:
    """GET *path* from the ASGI app directly (no server), returning status and body."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    await app({"type": "http", "method": "GET", "path": path}, receive, send)
    return sent[0]["status"], sent[1]["body"]


async def test_concurrent_scrapes_within_the_cache_window_read_the_queue_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Fifty concurrent /metrics and / requests within one second cause one counts() call."""
    queue = CountingQueue(delay=0.5)
    await queue.enqueue("report")
    app = OperationsApp(FakeSource(), CollectorRegistry(), queue=queue)
    bodies: list[bytes] = []

    async def scrape(path: str) -> None:
        status_code, body = await asgi_get(app, path)
        assert status_code == 200
        bodies.append(body)

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for n in range(50):
            nursery.start_soon(scrape, "/metrics" if n % 2 else "/")
    assert queue.counts_calls == 1
    assert queue.list_calls == 1
    assert trio.current_time() - start == 1.0  # one counts read, then one due read, shared
    assert all(b"report" in body for body in bodies)
    await trio.sleep(0.25)  # the counts were read at 0.5 s: at 1.25 s they are still fresh
    await asgi_get(app, "/metrics")
    assert queue.counts_calls == 1
    await trio.sleep(SCRAPE_CACHE_SECONDS)
    await asgi_get(app, "/metrics")
    assert queue.counts_calls == 2


async def test_a_failing_queue_is_not_asked_harder_by_more_scrapes(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed read is shared for the cache window too: twenty scrapes, one failing call."""
    queue = CountingQueue()
    calls = 0

    async def broken(self: MemoryQueue) -> Mapping[tuple[str, ItemState], int]:
        nonlocal calls
        calls += 1
        await trio.lowlevel.checkpoint()
        raise QueueUnavailable("down")

    monkeypatch.setattr(CountingQueue, "counts", broken)
    app = OperationsApp(FakeSource(), CollectorRegistry(), queue=queue)
    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(asgi_get, app, "/metrics")
    _, body = await asgi_get(app, "/")
    assert calls == 1
    assert b"queue unavailable: QueueUnavailable: down" in body


async def test_a_cancelled_read_is_not_shared(autojump_clock: trio.abc.Clock) -> None:
    """A scrape cancelled mid-read leaves no answer behind: the next scrape reads again."""
    queue = CountingQueue(delay=2.0)
    app = OperationsApp(FakeSource(), CollectorRegistry(), queue=queue)
    with trio.move_on_after(1.0):
        await asgi_get(app, "/metrics")
    status_code, body = await asgi_get(app, "/metrics")
    assert status_code == 200
    assert b"trio_supervise_queue_up 1.0" in body
    assert queue.counts_calls == 2


async def test_status_page_lists_a_bounded_number_of_rows(autojump_clock: trio.abc.Clock) -> None:
    """With 120 specs and 80 recent errors, the page shows 50 of each and counts the rest."""
    queue = MemoryQueue()
    for n in range(120):
        await queue.enqueue(f"spec-{n:03}")
    errors = [ErrorRecord(at=None, source="runner", message=f"e{n}") for n in range(80)]
    app = OperationsApp(FakeSource(errors=errors), CollectorRegistry(), queue=queue, due_limit=5)
    _, body = await asgi_get(app, "/")
    page = body.decode()
    assert page.count("<td>spec-") == 50 + 5  # the counts table, and the five due items
    assert "and 70 more" in page
    assert page.count("<code>e") == 50
    assert "and 30 more" in page


async def test_status_page_flags_due_specs_no_driver_owns(autojump_clock: trio.abc.Clock) -> None:
    """Due items of a spec outside owned_specs get a warning row naming the spec and count."""
    queue = MemoryQueue()
    await queue.enqueue("report")
    for _ in range(2):
        await queue.enqueue("<b>orphan</b>")
    await queue.enqueue("later", due_at=queue.clock.now() + dt.timedelta(hours=1))
    app = OperationsApp(
        FakeSource(), CollectorRegistry(), queue=queue, owned_specs=frozenset({"report"})
    )
    page = (await asgi_get(app, "/"))[1].decode()
    rows = re.findall(r'<tr class="warning">(.*?)</tr>', page)
    assert rows == [
        '<td>&lt;b&gt;orphan&lt;/b&gt;</td><td class="num">2</td>'
        "<td>due, but no driver of this service owns spec "
        "&#39;&lt;b&gt;orphan&lt;/b&gt;&#39;</td>"
    ]
    unchecked = OperationsApp(FakeSource(), CollectorRegistry(), queue=queue)
    assert 'id="unowned"' not in (await asgi_get(unchecked, "/"))[1].decode()


# -- odd data --------------------------------------------------------------------------------------

SURROGATE = "lone \udcff surrogate"


@attrs.define
class StoredQueue(MemoryQueue):
    """Answers status reads with the items given, as a backend might have stored them."""

    stored: list[WorkItem] = attrs.field(factory=list)

    async def list_items(self, **kwargs: Any) -> Sequence[WorkItem]:
        await trio.lowlevel.checkpoint()
        return self.stored

    async def counts(self) -> Mapping[tuple[str, ItemState], int]:
        await trio.lowlevel.checkpoint()
        return {(item.spec_id, item.state): 1 for item in self.stored}


async def test_the_status_page_renders_any_stored_item(autojump_clock: trio.abc.Clock) -> None:
    """Lone surrogates in every text field and the config render as escapes, not a 500."""
    now = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    item = WorkItem(
        id=SURROGATE,
        spec_id=SURROGATE,
        tenant_id=SURROGATE,
        subject_id=SURROGATE,
        config={SURROGATE: [SURROGATE, "\x00\x1b[31m"]},
        last_error=SURROGATE,
        due_at=now,
        created_at=now,
        updated_at=now,
        error_count=1,
    )
    source = FakeSource(
        statuses=[status(SURROGATE, WorkerState.FAILED, error=SURROGATE)],
        errors=[ErrorRecord(at=now, source=SURROGATE, message=SURROGATE)],
    )
    app = OperationsApp(source, CollectorRegistry(), queue=StoredQueue(stored=[item]))
    for path in ("/", "/metrics", "/healthz"):
        status_code, body = await asgi_get(app, path)
        assert status_code in (200, 503), path
        assert b"\\udcff" in body, path
        body.decode("utf-8")  # valid UTF-8 all the same


async def test_odd_error_records_never_fail_the_page(autojump_clock: trio.abc.Clock) -> None:
    """An error whose fields are not what the type says still leaves a 200 page, naming it."""
    odd: list[Any] = [
        ErrorRecord(at="yesterday", source=None, message=None),  # type: ignore[arg-type]
        ErrorRecord(at=dt.datetime(1, 1, 1), source="x", message=SURROGATE),
        ErrorRecord(at=None, source="ok", message="fine"),
        "not an error record at all",
    ]
    app = OperationsApp(FakeSource(errors=odd), CollectorRegistry())
    status_code, body = await asgi_get(app, "/")
    assert status_code == 200
    page = body.decode()
    assert "yesterday" in page
    assert "<code>fine</code>" in page
    assert "this error cannot be shown (AttributeError)" in page


# -- binding ---------------------------------------------------------------------------------------


async def test_a_port_in_use_is_one_clear_error() -> None:
    """Binding a port another socket holds raises HttpBindError as one line naming it."""
    holder = bind_http("127.0.0.1", 0)
    try:
        port = holder.insecure_sockets[0].getsockname()[1]
        with pytest.raises(HttpBindError) as caught:
            bind_http("127.0.0.1", port)
        assert str(caught.value) == f"cannot bind 127.0.0.1:{port}: address already in use"
        with pytest.raises(HttpBindError, match="address already in use"):
            await serve_http(
                OperationsApp(FakeSource(), CollectorRegistry()),
                "127.0.0.1",
                port,
                shutdown=Shutdown(),
            )
    finally:
        holder.insecure_sockets[0].close()


# -- queue series: zeros for known pairs, and the lag --------------------------------------------


def _sample(body: bytes, name: str, **labels: str) -> float | None:
    """The value of the series *name*{*labels*} in an exposition, or None if absent."""
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    prefix = f"{name}{{{wanted}}} " if labels else f"{name} "
    for line in body.decode().splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return None


async def test_queue_items_reports_zero_for_known_pairs(autojump_clock: trio.abc.Clock) -> None:
    """Every state of a spec seen once is exported, 0 when empty, even after its items go."""
    queue = MemoryQueue()
    item = await queue.enqueue("report")
    app = OperationsApp(FakeSource(), CollectorRegistry(), queue=queue)
    _, body = await asgi_get(app, "/metrics")
    assert {
        state.value: _sample(body, "trio_supervise_queue_items", spec="report", state=state.value)
        for state in ItemState
    } == {"queued": 1.0, "running": 0.0, "completed": 0.0, "cancelled": 0.0, "dead": 0.0}
    await queue.request_cancel(item.id)  # queued -> cancelled: the queued series stays, at 0
    await trio.sleep(SCRAPE_CACHE_SECONDS)
    _, body = await asgi_get(app, "/metrics")
    assert _sample(body, "trio_supervise_queue_items", spec="report", state="queued") == 0.0
    assert _sample(body, "trio_supervise_queue_items", spec="report", state="cancelled") == 1.0


@attrs.define
class DueCountingQueue(MemoryQueue):
    """A memory queue that counts its ``next_due_at`` calls."""

    due_calls: int = 0

    async def next_due_at(
        self, spec_ids: Sequence[str], *, queues: Sequence[str] | None = None
    ) -> dt.datetime | None:
        self.due_calls += 1
        return await super().next_due_at(spec_ids, queues=queues)


async def test_queue_lag_is_the_age_of_the_oldest_due_unclaimed_item(
    autojump_clock: trio.abc.Clock,
) -> None:
    """queue_lag_seconds{spec}: 0 while nothing is overdue, then how long the oldest waited."""
    queue = DueCountingQueue()
    now = queue.clock.now()
    await queue.enqueue("report", due_at=now + dt.timedelta(seconds=10))
    await queue.enqueue("email", due_at=now + dt.timedelta(seconds=30))
    app = OperationsApp(FakeSource(), CollectorRegistry(), queue=queue)
    _, body = await asgi_get(app, "/metrics")
    assert _sample(body, "trio_supervise_queue_lag_seconds", spec="report") == 0.0
    await trio.sleep(25)
    _, body = await asgi_get(app, "/metrics")
    assert _sample(body, "trio_supervise_queue_lag_seconds", spec="report") == 15.0
    assert _sample(body, "trio_supervise_queue_lag_seconds", spec="email") == 0.0
    assert len(await queue.claim_due(["report"], "w", 60.0, 1)) == 1  # no longer waiting
    await trio.sleep(SCRAPE_CACHE_SECONDS)
    _, body = await asgi_get(app, "/metrics")
    assert _sample(body, "trio_supervise_queue_lag_seconds", spec="report") == 0.0
    # Scrapes within one cache window share one read of the lag too: one call per spec, and
    # one per named queue (its lag: the "default" queue here).
    await trio.sleep(SCRAPE_CACHE_SECONDS)
    before = queue.due_calls
    for _ in range(5):
        await asgi_get(app, "/metrics")
    assert queue.due_calls - before == 2 + 1


async def test_a_queue_that_cannot_answer_exports_no_zeros(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the queue down, only queue_up 0 is exported: zeros would claim an empty queue."""
    queue = MemoryQueue()
    await queue.enqueue("report")
    app = OperationsApp(FakeSource(), CollectorRegistry(), queue=queue)
    await asgi_get(app, "/metrics")

    async def broken(self: MemoryQueue) -> Mapping[tuple[str, ItemState], int]:
        await trio.lowlevel.checkpoint()
        raise QueueUnavailable("down")

    monkeypatch.setattr(MemoryQueue, "counts", broken)
    await trio.sleep(SCRAPE_CACHE_SECONDS)
    _, body = await asgi_get(app, "/metrics")
    assert _sample(body, "trio_supervise_queue_up") == 0.0
    assert b"trio_supervise_queue_items{" not in body
    assert b"trio_supervise_queue_lag_seconds{" not in body


# -- named queues and schedules ------------------------------------------------------------------


async def test_a_paused_queues_due_items_count_in_its_lag(autojump_clock: trio.abc.Clock) -> None:
    """A queue paused a minute with an item due reads a minute of lag, per queue and per spec,
    with paused 1; resumed and drained, 0 again."""
    queue = MemoryQueue()
    await queue.enqueue("mail", queue="mail")
    await queue.enqueue("report")
    await queue.pause_queue("mail")
    app = OperationsApp(FakeSource(), CollectorRegistry(), queue=queue, queue_limits={"mail": 3})
    await trio.sleep(60)
    _, body = await asgi_get(app, "/metrics")
    assert _sample(body, "trio_supervise_named_queue_lag_seconds", queue="mail") == 60.0
    assert _sample(body, "trio_supervise_queue_lag_seconds", spec="mail") == 60.0
    assert _sample(body, "trio_supervise_named_queue_paused", queue="mail") == 1.0
    assert _sample(body, "trio_supervise_named_queue_paused", queue="default") == 0.0
    paused_at = _sample(body, "trio_supervise_named_queue_paused_timestamp_seconds", queue="mail")
    assert paused_at == (queue.clock.now() - dt.timedelta(seconds=60)).timestamp()
    assert _sample(body, "trio_supervise_named_queue_items", queue="mail", state="queued") == 1.0
    assert _sample(body, "trio_supervise_named_queue_concurrency_limit", queue="mail") == 3.0
    await queue.resume_queue("mail")
    await queue.claim_due(["mail"], "w", 30, 1, queue="mail")
    await trio.sleep(SCRAPE_CACHE_SECONDS)
    _, body = await asgi_get(app, "/metrics")
    assert _sample(body, "trio_supervise_named_queue_lag_seconds", queue="mail") == 0.0
    assert _sample(body, "trio_supervise_named_queue_paused", queue="mail") == 0.0
    since = "trio_supervise_named_queue_paused_timestamp_seconds"
    assert _sample(body, since, queue="mail") is None
    assert _sample(body, "trio_supervise_named_queue_items", queue="mail", state="running") == 1.0


async def test_a_rate_limited_queue_exports_its_limit_and_when_it_is_throttled(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The rate and its period per limited queue; throttled 1 while the window holds items
    back, 0 once it frees (and for a queue without a limit)."""
    from trio_supervise import RateLimit

    queue = MemoryQueue()
    await queue.set_rate_limit("mail", RateLimit(1, 30))
    await queue.enqueue("mail", queue="mail")
    await queue.enqueue("mail", queue="mail")
    await queue.enqueue("report")
    await queue.claim_due(["mail"], "w", 60, 5, queue="mail")
    app = OperationsApp(FakeSource(), CollectorRegistry(), queue=queue)
    _, body = await asgi_get(app, "/metrics")
    assert _sample(body, "trio_supervise_named_queue_throttled", queue="mail") == 1.0
    assert _sample(body, "trio_supervise_named_queue_throttled", queue="default") == 0.0
    assert _sample(body, "trio_supervise_named_queue_rate_limit", queue="mail") == 1.0
    assert _sample(body, "trio_supervise_named_queue_rate_period_seconds", queue="mail") == 30.0
    assert _sample(body, "trio_supervise_named_queue_rate_limit", queue="default") is None
    await trio.sleep(30)
    _, body = await asgi_get(app, "/metrics")
    assert _sample(body, "trio_supervise_named_queue_throttled", queue="mail") == 0.0


async def test_throttled_keys_are_counted(autojump_clock: trio.abc.Clock) -> None:
    """``throttled_keys`` counts the keys whose rate holds items back: 1 while acme's window is
    full, 0 once it frees."""
    from trio_supervise import RateLimit

    queue = MemoryQueue()
    await queue.set_key_rate_limit("{tenant}", RateLimit(1, 30))
    for n in range(2):
        await queue.enqueue("sync", item_id=f"a{n}", concurrency_key="acme", concurrency_limit=9)
    await queue.claim_due(["sync"], "w", 60, 5)
    app = OperationsApp(FakeSource(), CollectorRegistry(), queue=queue)
    _, body = await asgi_get(app, "/metrics")
    assert _sample(body, "trio_supervise_throttled_keys") == 1.0
    await trio.sleep(30)
    _, body = await asgi_get(app, "/metrics")
    assert _sample(body, "trio_supervise_throttled_keys") == 0.0


async def test_schedules_export_their_next_and_last_fire(autojump_clock: trio.abc.Clock) -> None:
    """next fire from the cron and the queue's clock; last fire once one has an item."""
    from trio_supervise import Schedule, TrioClock
    from trio_supervise.maintenance import Scheduler

    epoch = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    queue = MemoryQueue(clock=TrioClock(epoch=epoch))
    hourly = Schedule(name="hourly", spec_id="report", cron="0 * * * *")
    app = OperationsApp(FakeSource(), CollectorRegistry(), queue=queue, schedules=[hourly])
    name = "trio_supervise_schedule_next_fire_timestamp_seconds"
    _, body = await asgi_get(app, "/metrics")
    assert _sample(body, name, schedule="hourly") == (epoch + dt.timedelta(hours=1)).timestamp()
    assert b"trio_supervise_schedule_last_fire_timestamp_seconds{" not in body
    async with trio.open_nursery() as nursery:
        nursery.start_soon(Scheduler([hourly]).run, queue)
        await trio.sleep(2 * 3600 + 60)
        nursery.cancel_scope.cancel()
    _, body = await asgi_get(app, "/metrics")
    last = _sample(body, "trio_supervise_schedule_last_fire_timestamp_seconds", schedule="hourly")
    assert last == (epoch + dt.timedelta(hours=2)).timestamp()
    assert _sample(body, name, schedule="hourly") == (epoch + dt.timedelta(hours=3)).timestamp()
