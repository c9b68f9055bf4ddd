"""The operations HTTP surface: ``/healthz``, ``/metrics`` and the console, as a raw ASGI app.

The console is the status page at ``/`` and the pages and actions beside it: item lists
filtered by state and spec (``/items``, paged by keyset cursor), dead items with bulk retry
(``/dead``), an item's page (``/items/<id>``), and actions posted as forms:
``/items/<id>/retry|cancel|delete|run-now``, ``/dead/retry``, ``/queues/<name>/pause|resume``
and ``/schedules/<name>/fire``. Every action needs the form's CSRF token (see
:mod:`trio_supervise._console_auth`), answers with a redirect back and a flash message
(POST/redirect/GET), and is recorded in an :class:`~trio_supervise.AuditTrail`. With a token
or a password hash the console asks for credentials (HTTP Basic or a bearer token);
``/healthz`` and ``/metrics`` never do (probes and scrapers). Read-only, it shows no forms and
refuses every action.

Reads of the queue are bounded (:mod:`trio_supervise._http_metrics`): at most one per
:data:`SCRAPE_CACHE_SECONDS` however many clients scrape, and the pages list a bounded number
of rows. It is served by hypercorn's Trio worker through :func:`serve_http`, a
``nursery.start``-style service that reports the bound port and stops when the service's
:class:`Shutdown` begins; the port is bound first (:func:`bind_http`), so that an address in use
is one clear error.
"""

from __future__ import annotations

import datetime as dt
import errno
import functools
import json
import logging
import math
import socket
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any, Protocol

import attrs
import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ._audit import AuditEntry, AuditTrail, MemoryAuditTrail
from ._console import (
    CONTENT_SECURITY_POLICY,
    ITEM_ACTIONS,
    PAGE_HEADERS,
    PAGE_SIZE,
    QUEUE_ACTIONS,
    QueueView,
    ScheduleView,
    audit_row,
    count_rows,
    due_row,
    error_row,
    item_actions,
    item_page_context,
    lineage,
    list_row,
    perform,
    queue_rows,
    render,
    rows,
    schedule_rows,
    unowned_rows,
    unquote_part,
    worker_row,
)
from ._console_auth import (
    CREDENTIALS_REALM,
    ConsoleAuth,
    ConsoleKeys,
    check_password_hash,
    check_token,
    is_loopback,
)
from ._convert import unstructure
from ._errors import ItemNotFound
from ._http_metrics import (
    SCRAPE_CACHE_SECONDS,
    QueueDepthCollector,
    ScheduleCollector,
    SharedRead,
)
from ._lifecycle import Shutdown
from .maintenance import Schedule, checked_schedules
from .queues import ItemState, WorkItem, WorkQueue
from .supervision import WorkerStatus

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "SCRAPE_CACHE_SECONDS",
    "ErrorRecord",
    "HttpBindError",
    "OperationsApp",
    "QueueDepthCollector",
    "SharedRead",
    "StatusSource",
    "bind_http",
    "serve_http",
]

logger = logging.getLogger("trio_supervise.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

_READ = "GET, HEAD"
_POST = "POST"
_MAX_BODY = 256 * 1024
"""The largest form an action accepts (a bulk retry of a page of long ids fits many times)."""
_MAX_BULK = 1000
"""The most items one bulk retry takes."""
_AUDIT_SHOWN = 20
_SESSION_COOKIE = "ts_csrf"
_FLASH_COOKIE = "ts_flash"
_TEXT = (b"content-type", b"text/plain; charset=utf-8")


@attrs.frozen(kw_only=True)
class ErrorRecord:
    """A recent error worth showing a person."""

    at: dt.datetime | None
    source: str
    message: str


class StatusSource(Protocol):
    """What the HTTP surface reads: health, the workers, and recent errors."""

    @property
    def healthy(self) -> bool:
        """False once any worker failed terminally (or the service is not up)."""
        ...

    def workers(self) -> Sequence[WorkerStatus]:
        """Every supervised worker and its state."""
        ...

    def recent_errors(self) -> Sequence[ErrorRecord]:
        """The latest errors, newest first."""
        ...


def _worker_json(status: WorkerStatus) -> dict[str, Any]:
    document: dict[str, Any] = unstructure(status)
    document.pop("since", None)  # Trio's clock: meaningless outside the process
    return document


# -- requests and responses ----------------------------------------------------------------------


@attrs.frozen
class _Response:
    status: int
    headers: Headers
    body: bytes


def _text(status: int, text: str, *headers: tuple[bytes, bytes]) -> _Response:
    plain = [_TEXT, (b"x-content-type-options", b"nosniff")]
    return _Response(status, [*plain, *headers], (text + "\n").encode("utf-8", "backslashreplace"))


@attrs.frozen
class _Request:
    scope: Scope
    receive: Receive
    method: str
    headers: Mapping[str, str]
    query: Mapping[str, list[str]]
    cookies: Mapping[str, str]

    @classmethod
    def of(cls, scope: Scope, receive: Receive) -> _Request:
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", ()):
            headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        cookies: dict[str, str] = {}
        for part in headers.get("cookie", "").split(";"):
            name, sep, value = part.strip().partition("=")
            if sep and name not in cookies:
                cookies[name] = value
        query = urllib.parse.parse_qs(
            scope.get("query_string", b"").decode("latin-1"),
            keep_blank_values=True,
            max_num_fields=100,
        )
        return cls(scope, receive, scope.get("method", "GET"), headers, query, cookies)

    @property
    def client(self) -> str:
        client = self.scope.get("client")
        return "?" if not client else str(client[0])

    @property
    def secure(self) -> bool:
        return self.scope.get("scheme") == "https"

    def first(self, name: str) -> str:
        return (self.query.get(name) or [""])[0]

    async def form(self) -> dict[str, list[str]]:
        """The posted form, read up to :data:`_MAX_BODY` bytes (ValueError past it, or when it is
        not ``application/x-www-form-urlencoded``)."""
        kind = self.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind != "application/x-www-form-urlencoded":
            raise ValueError("an action is a form (application/x-www-form-urlencoded)")
        body = b""
        while True:
            message = await self.receive()
            if message.get("type") != "http.request":
                break
            body += message.get("body", b"")
            if len(body) > _MAX_BODY:
                raise ValueError(f"the form is larger than {_MAX_BODY} bytes")
            if not message.get("more_body", False):
                break
        return urllib.parse.parse_qs(
            body.decode("utf-8", "surrogateescape"), keep_blank_values=True, max_num_fields=2000
        )


def _segments(scope: Scope) -> list[str] | None:
    """The request path's segments, each percent-decoded on its own (so an item id holding
    ``/`` is one segment); None when one is not UTF-8."""
    raw = scope.get("raw_path")
    try:
        if isinstance(raw, bytes) and raw:
            path = raw.partition(b"?")[0]
            return [unquote_part(part) for part in path.split(b"/")[1:]] if path != b"/" else []
        path_text = str(scope.get("path", ""))
        return path_text.split("/")[1:] if path_text != "/" else []
    except UnicodeDecodeError:
        return None


def _local_path(text: str, default: str = "/") -> str:
    """*text* if it is a path on this server (``/...``, not ``//host``), else *default*."""
    if not text.startswith("/") or text.startswith("//") or "\\" in text or len(text) > 4096:
        return default
    if not text.isascii():
        return default
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in text):
        return default
    return text


def _cookie(name: str, value: str, *, secure: bool, max_age: int | None = None) -> bytes:
    parts = [f"{name}={value}", "Path=/", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if secure:
        parts.append("Secure")
    return "; ".join(parts).encode()


def _page_query(**values: str | list[str] | None) -> str:
    pairs = [
        (name, each)
        for name, value in values.items()
        if value
        for each in ([value] if isinstance(value, str) else value)
    ]
    return urllib.parse.urlencode(pairs)


def _credentials(token: str | None, password_hash: str | None) -> ConsoleAuth | None:
    if token is None and password_hash is None:
        return None
    return ConsoleAuth(
        token=None if token is None else check_token(token),
        password_hash=None if password_hash is None else check_password_hash(password_hash),
    )


Handler = Callable[[_Request, "_Page"], Awaitable[_Response]]


def _texts(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen
class _Page:
    """What a console request carries besides itself: who asked, and its CSRF session."""

    who: str
    session: str
    new_session: bool
    csrf: str


# -- the app ---------------------------------------------------------------------------------------


@attrs.define(eq=False)
class OperationsApp:
    """The ASGI app behind the operations server: ``/healthz``, ``/metrics`` and the console.

    :param source: health, workers and recent errors.
    :param registry: the Prometheus registry ``/metrics`` exposes. When a *queue* is given, a
        :class:`QueueDepthCollector` (and with *schedules*, a schedule collector) is registered
        on it.
    :param queue: the service's queue: counts, items, and the console's actions (optional;
        without one the console is the status page of workers and errors only).
    :param title: the status page's heading.
    :param refresh: seconds between status page refreshes.
    :param due_limit: how many due-soon items the status page lists.
    :param cache_for: seconds one read of the queue serves every scrape and page view.
    :param owned_specs: the spec ids this service's drivers own; when given, the status page
        flags due items of any other spec (nothing here will ever run them). None: no check.
    :param schedules: the service's schedules, for the schedules panel, their metrics and
        "fire now".
    :param queue_limits: each queue the service's runner serves, with its concurrency (None:
        no runner here), for the queues panel and ``named_queue_concurrency_limit``.
    :param warnings: problems found at start (a queue nothing here serves), shown on the page.
    :param token: the console's token (see ``HttpSettings.token``); with it or *password_hash*
        the console asks for credentials.
    :param password_hash: the console's password, hashed (``HttpSettings.password_hash``).
    :param read_only: show no action forms and refuse every action (403).
    :param audit: where the console records actions (a :class:`MemoryAuditTrail` if None).
    """

    source: StatusSource
    registry: CollectorRegistry
    queue: WorkQueue | None = attrs.field(default=None, kw_only=True)
    title: str = attrs.field(default="trio_supervise", kw_only=True)
    refresh: float = attrs.field(default=5.0, kw_only=True)
    due_limit: int = attrs.field(default=20, kw_only=True)
    cache_for: float = attrs.field(default=SCRAPE_CACHE_SECONDS, kw_only=True)
    owned_specs: frozenset[str] | None = attrs.field(default=None, kw_only=True)
    schedules: Sequence[Schedule] = attrs.field(
        default=(), kw_only=True, converter=checked_schedules
    )
    queue_limits: Mapping[str, int] | None = attrs.field(default=None, kw_only=True)
    warnings: Sequence[str] = attrs.field(default=(), kw_only=True, converter=_texts)
    token: str | None = attrs.field(default=None, kw_only=True, repr=False)
    password_hash: str | None = attrs.field(default=None, kw_only=True, repr=False)
    read_only: bool = attrs.field(default=False, kw_only=True)
    audit: AuditTrail = attrs.field(factory=MemoryAuditTrail, kw_only=True)
    _depth: QueueDepthCollector | None = attrs.field(init=False, default=None)
    _fires: ScheduleCollector | None = attrs.field(init=False, default=None)
    _due: SharedRead[Sequence[WorkItem]] | None = attrs.field(init=False, default=None)
    _auth: ConsoleAuth | None = attrs.field(init=False, default=None)
    _keys: ConsoleKeys = attrs.field(init=False, factory=ConsoleKeys)

    def __attrs_post_init__(self) -> None:
        if not self.refresh > 0:
            raise ValueError(f"refresh must be positive, got {self.refresh!r}")
        if self.due_limit < 0:
            raise ValueError(f"due_limit must be >= 0, got {self.due_limit!r}")
        if not (math.isfinite(self.cache_for) and self.cache_for >= 0):
            raise ValueError(f"cache_for must be a finite number >= 0, got {self.cache_for!r}")
        self._auth = _credentials(self.token, self.password_hash)
        self._keys = ConsoleKeys.from_secret(self.token or self.password_hash)
        if self.queue is not None:
            queue = self.queue
            self._depth = QueueDepthCollector(queue, limits=self.queue_limits)
            self._depth.source.max_age = self.cache_for
            self.registry.register(self._depth)
            if self.schedules:
                self._fires = ScheduleCollector(queue, self.schedules, cache_for=self.cache_for)
                self.registry.register(self._fires)

            async def due() -> Sequence[WorkItem]:
                return await queue.list_items(states=[ItemState.QUEUED], limit=self.due_limit)

            self._due = SharedRead(due, what="status page due items", max_age=self.cache_for)

    @property
    def authenticates(self) -> bool:
        """Whether the console asks for credentials."""
        return self._auth is not None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            # Closing before accepting makes the server answer the handshake with 403 (returning
            # without a word would be a 500).
            logger.debug("refusing a websocket handshake for %r", scope.get("path"))
            await send({"type": "websocket.close", "code": 1008})
        else:  # anything newer: nothing to say
            logger.debug("refusing ASGI scope %r", kind)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _route(self, segments: list[str]) -> tuple[str, Handler, bool] | None:
        """``(allowed methods, handler, is it the console)`` for a path, or None (404)."""
        queued = self.queue is not None
        match segments:
            case []:
                return _READ, self._status_page, True
            case ["healthz"]:
                return _READ, self._healthz, False
            case ["metrics"]:
                return _READ, self._metrics, False
            case ["items"] if queued:
                return _READ, self._items_page, True
            case ["dead"] if queued:
                return _READ, self._dead_page, True
            case ["items", item_id] if queued and item_id:
                return _READ, functools.partial(self._item_page, item_id), True
            case ["items", item_id, action] if queued and item_id and action in ITEM_ACTIONS:
                return _POST, functools.partial(self._act, "items", item_id, action), True
            case ["dead", "retry"] if queued:
                return _POST, functools.partial(self._act, "dead", "", "retry"), True
            case ["queues", name, action] if queued and name and action in QUEUE_ACTIONS:
                return _POST, functools.partial(self._act, "queues", name, action), True
            case ["schedules", name, "fire"] if queued and name:
                return _POST, functools.partial(self._act, "schedules", name, "fire"), True
        return None

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = _Request.of(scope, receive)
        segments = _segments(scope)
        route = None if segments is None else self._route(segments)
        if route is None:
            response = _text(404, "not found")
        elif request.method not in route[0].split(", "):
            response = _text(405, "method not allowed", (b"allow", route[0].encode()))
        else:
            _, handler, console = route
            try:
                response = await self._answer(request, handler, console)
            except Exception:
                logger.exception("operations endpoint %s failed", scope.get("path"))
                response = _text(500, "internal error")
        headers = [
            *response.headers,
            (b"content-length", str(len(response.body)).encode()),
            (b"cache-control", b"no-store"),
        ]
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        body = b"" if request.method == "HEAD" else response.body
        await send({"type": "http.response.body", "body": body})

    async def _answer(self, request: _Request, handler: Handler, console: bool) -> _Response:
        """Credentials and the CSRF session of a console request, then its handler."""
        who = "local"
        if console and self._auth is not None:
            found = await self._auth.who(request.headers.get("authorization"))
            if found is None:
                challenge = f'Basic realm="{CREDENTIALS_REALM}", charset="UTF-8"'.encode()
                return _text(401, "credentials required", (b"www-authenticate", challenge))
            who = found
        session = request.cookies.get(_SESSION_COOKIE, "")
        fresh = len(session) < 32 or not session.replace("-", "").replace("_", "").isalnum()
        if fresh:
            session = self._keys.new_session()
        page = _Page(who, session, fresh, self._keys.csrf_token(session))
        response = await handler(request, page)
        if console and fresh and request.method != "POST":
            cookie = _cookie(_SESSION_COOKIE, session, secure=request.secure)
            response = attrs.evolve(response, headers=[*response.headers, (b"set-cookie", cookie)])
        return response

    # -- handlers ------------------------------------------------------------------------------

    async def _healthz(self, request: _Request, page: _Page) -> _Response:
        healthy = self.source.healthy
        document = {
            "healthy": healthy,
            "workers": [_worker_json(worker) for worker in self.source.workers()],
        }
        body = json.dumps(document, indent=2).encode() + b"\n"
        return _Response(200 if healthy else 503, [(b"content-type", b"application/json")], body)

    async def _metrics(self, request: _Request, page: _Page) -> _Response:
        if self._depth is not None:
            await self._depth.refresh()
        if self._fires is not None and self._depth is not None and self._depth.read is not None:
            await self._fires.refresh()
        return _Response(
            200,
            [(b"content-type", CONTENT_TYPE_LATEST.encode())],
            generate_latest(self.registry),
        )

    def _html(self, request: _Request, page: _Page, template: str, **context: Any) -> _Response:
        """A console page: the flash message a redirect left (then cleared), the CSRF token
        for its forms, and the security headers."""
        headers = list(PAGE_HEADERS)
        flash = self._keys.unsign(request.cookies.get(_FLASH_COOKIE))
        if _FLASH_COOKIE in request.cookies:
            cleared = _cookie(_FLASH_COOKIE, "", secure=request.secure, max_age=0)
            headers.append((b"set-cookie", cleared))
        text = render(
            template,
            title=self.title,
            page_title=context.pop("page_title", None),
            refresh=context.pop("refresh", None),
            read_only=self.read_only,
            csrf=page.csrf,
            flash=None if flash is None else {"ok": flash[0], "text": flash[1]},
            **context,
        )
        # Stored text may hold lone surrogates (no UTF-8 for them): shown as escapes, never a 500.
        return _Response(200, headers, text.encode("utf-8", "backslashreplace"))

    async def _queue_view(self) -> QueueView:
        assert self.queue is not None
        assert self._depth is not None
        assert self._due is not None
        await self._depth.refresh()
        counts = await self._depth.source.get()
        due = await self._due.get() if counts.value is not None else None
        problem = counts.problem or (None if due is None else due.problem)
        now: dt.datetime | None = None
        try:
            now = self.queue.clock.now()
        except Exception:
            logger.debug("queue clock failed", exc_info=True)
        unowned = await self._unowned(counts.value, now)
        read = self._depth.read
        return QueueView(
            counts=counts.value,
            due=() if due is None else due.value or (),
            now=now,
            problem=problem,
            unowned=unowned,
            queues=() if read is None else read.queues,
            lags={} if read is None else read.queue_lags,
            limits=self.queue_limits,
        )

    async def _unowned(
        self, counts: Mapping[tuple[str, ItemState], int] | None, now: dt.datetime | None
    ) -> list[tuple[str, int]]:
        """(spec, queued count) of specs with due work that no driver of this service owns."""
        if self.owned_specs is None or counts is None or now is None:
            return []
        assert self.queue is not None
        queued = {
            spec: count
            for (spec, state), count in counts.items()
            if state == ItemState.QUEUED and count and spec not in self.owned_specs
        }
        found = []
        for spec in sorted(queued)[:50]:
            try:
                due = await self.queue.next_due_at([spec])
            except Exception:
                logger.debug("next_due_at(%r) failed", spec, exc_info=True)
                continue
            if due is not None and due <= now:
                found.append((spec, queued[spec]))
        return found

    async def _schedule_views(self) -> list[ScheduleView]:
        last: Mapping[str, dt.datetime | None] = {}
        if self._fires is not None:
            last = await self._fires.refresh()
        served = self.queue_limits
        return [
            ScheduleView(
                schedule=schedule,
                last=last.get(schedule.name),
                unserved=served is not None and schedule.item_queue not in served,
            )
            for schedule in self.schedules
        ]

    async def _status_page(self, request: _Request, page: _Page) -> _Response:
        states = list(ItemState)
        view = None if self.queue is None else await self._queue_view()
        queue: dict[str, Any] | None = None
        if view is not None:
            queue = {
                "problem": view.problem,
                "queues": queue_rows(view, states) if view.counts is not None else None,
                "counts": None if view.counts is None else count_rows(view.counts, states),
                "unowned": unowned_rows(view.unowned) if view.unowned else None,
                "due": rows(
                    view.due,
                    due_row(view.now, [info.name for info in view.queues if info.paused]),
                    what="item",
                    empty="nothing queued",
                ),
            }
        now = None if view is None else view.now
        schedules = schedule_rows(await self._schedule_views(), now) if self.schedules else None
        audit = await self.audit.recent(_AUDIT_SHOWN)
        healthy = self.source.healthy
        return self._html(
            request,
            page,
            "status.html",
            refresh=max(1, math.ceil(self.refresh)),
            verdict="healthy" if healthy else "unhealthy",
            warnings=self.warnings,
            workers=rows(self.source.workers(), worker_row, what="worker", empty="no workers"),
            queue=queue,
            states=states,
            schedules=schedules,
            errors=rows(self.source.recent_errors(), error_row, what="error", empty="none"),
            audit=rows(audit, audit_row, what="entry") if audit else None,
        )

    async def _list(
        self, states: list[ItemState] | None, specs: list[str] | None, after: str | None
    ) -> tuple[list[WorkItem], str | None]:
        """A page of items (keyset: the ones after *after*), or why there is none."""
        assert self.queue is not None
        try:
            with trio.fail_after(5):
                return await self.queue.list_items(
                    states=states, spec_ids=specs, limit=PAGE_SIZE, after=after
                ), None
        except ItemNotFound:
            return [], f"the item this page starts after ({after}) is gone; start from the first"
        except Exception as error:  # a page says what went wrong, it does not fail
            logger.warning("listing items failed", exc_info=True)
            return [], f"the queue did not answer: {type(error).__name__}: {error}"

    async def _items_page(self, request: _Request, page: _Page) -> _Response:
        known = {state.value for state in ItemState}
        chosen = [state for state in request.query.get("state", []) if state in known]
        spec = request.first("spec")
        after = request.first("after") or None
        states = [ItemState(state) for state in chosen] or None
        items, problem = await self._list(states, [spec] if spec else None, after)
        assert self._depth is not None
        counts = (await self._depth.source.get()).value or {}
        query: dict[str, str | list[str] | None] = {"state": chosen, "spec": spec}
        return self._html(
            request,
            page,
            "items.html",
            page_title="items",
            states=[state.value for state in ItemState],
            chosen_states=chosen,
            specs=sorted({name for name, _ in counts} | ({spec} if spec else set())),
            chosen_spec=spec,
            items=rows(items, list_row, what="item", empty="no items", limit=None),
            problem=problem,
            first_page=f"/items?{_page_query(**query)}" if after else None,
            next_page=(
                f"/items?{_page_query(**query, after=items[-1].id)}"
                if len(items) == PAGE_SIZE
                else None
            ),
        )

    async def _dead_page(self, request: _Request, page: _Page) -> _Response:
        after = request.first("after") or None
        items, problem = await self._list([ItemState.DEAD], None, after)
        here = "/dead" + (f"?{_page_query(after=after)}" if after else "")
        return self._html(
            request,
            page,
            "dead.html",
            page_title="dead items",
            here=here,
            items=rows(items, list_row, what="item", empty="no dead items", limit=None),
            problem=problem,
            first_page="/dead" if after else None,
            next_page=(
                f"/dead?{_page_query(after=items[-1].id)}" if len(items) == PAGE_SIZE else None
            ),
        )

    async def _item_page(self, item_id: str, request: _Request, page: _Page) -> _Response:
        assert self.queue is not None
        try:
            item = await self.queue.get(item_id)
        except ItemNotFound:
            return _text(404, f"no item {item_id!r}")
        children = await self.queue.list_children(item.id, limit=101)
        back = f"/items/{urllib.parse.quote(item.id, safe='', errors='surrogatepass')}"
        return self._html(
            request,
            page,
            "item.html",
            page_title=f"item {item.id}",
            actions=[] if self.read_only else item_actions(item, back),
            lineage=await lineage(self.queue, item),
            **item_page_context(item, children),
        )

    async def _act(
        self, kind: str, name: str, action: str, request: _Request, page: _Page
    ) -> _Response:
        """One action: refused unless the console acts and the form is its own (CSRF), then
        done, recorded in the audit trail, and answered with a redirect back and a flash."""
        assert self.queue is not None
        if self.read_only:
            return _text(403, "forbidden: this console is read-only (http.read_only)")
        if request.headers.get("sec-fetch-site") == "cross-site":
            return _text(403, "forbidden: a form of another site")
        try:
            form = await request.form()
        except ValueError as error:
            return _text(400, f"bad request: {error}")
        token = (form.get("csrf") or [""])[0]
        if page.new_session or not self._keys.csrf_ok(page.session, token):
            logger.warning(
                "console: refused %s %s/%s from %s: missing or wrong CSRF token",
                action,
                kind,
                name,
                request.client,
            )
            return _text(403, "forbidden: missing or wrong CSRF token; reload the page and retry")
        ids = form.get("id", [])[:_MAX_BULK] if kind == "dead" else []
        done = await perform(
            self.queue,
            kind,
            name,
            action,
            ids=ids,
            schedules={schedule.name: schedule for schedule in self.schedules},
            known_queues=[
                *(self.queue_limits or {}),
                *(schedule.item_queue for schedule in self.schedules),
            ],
        )
        for read in (self._depth, self._fires, self._due):
            if read is not None:
                read.invalidate()  # the page the redirect leads to shows what changed
        entry = AuditEntry(
            at=self.queue.clock.now(),
            who=page.who,
            address=request.client,
            action="bulk-retry" if kind == "dead" else action,
            target=done.target,
            ok=done.ok,
            result=done.message,
        )
        await self.audit.record(entry)
        logger.info(
            "console: %s by %s from %s on %s: %s%s",
            entry.action,
            entry.who,
            entry.address,
            entry.target,
            "" if done.ok else "refused: ",
            done.message,
        )
        back = _local_path((form.get("next") or ["/"])[0])
        flash = self._keys.sign(done.ok, done.message)
        headers = [
            (b"location", back.encode("utf-8", "surrogatepass")),
            (b"set-cookie", _cookie(_FLASH_COOKIE, flash, secure=request.secure, max_age=60)),
            _TEXT,
        ]
        return _Response(303, headers, b"see other\n")


# -- serving ---------------------------------------------------------------------------------------


class HttpBindError(OSError):
    """The operations server cannot listen where it was told (the address in use, say)."""


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_http(host: str = "127.0.0.1", port: int = 8080) -> Any:
    """Bind and listen on *host*:*port* now, for :func:`serve_http`'s *sockets*.

    Returns hypercorn's ``Sockets``; raises :class:`HttpBindError` as one line,
    ``cannot bind 127.0.0.1:8080: address already in use``. Close the sockets (or hand them to
    :func:`serve_http`, which closes them) when done.
    """
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be between 0 and 65535, got {port!r}")
    from hypercorn.config import Sockets

    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as error:
        raise HttpBindError(f"cannot bind {_address(host, port)}: {_reason(error)}") from None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(_BACKLOG)
        sock.setblocking(False)
    except (OSError, UnicodeError) as error:  # UnicodeError: a host name IDNA cannot encode
        sock.close()
        raise HttpBindError(f"cannot bind {_address(host, port)}: {_reason(error)}") from None
    return Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])


_BACKLOG = 100
"""Connections the kernel queues before the server accepts them (hypercorn's default)."""


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.errno == errno.EADDRINUSE:
        return "address already in use"
    text = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return text[:1].lower() + text[1:]


def _close(sockets: Any) -> None:
    for sock in (*sockets.secure_sockets, *sockets.insecure_sockets, *sockets.quic_sockets):
        sock.close()


def _config(host: str, port: int, graceful_timeout: float = 3.0) -> Any:
    from hypercorn.config import Config

    config = Config()
    config.bind = [_address(host, port)]
    config.accesslog = None
    config.errorlog = logger
    config.graceful_timeout = graceful_timeout
    config.h11_max_incomplete_size = 16 * 1024
    config.h2_max_header_list_size = 16 * 1024
    config.max_app_queue_size = 10
    config.keep_alive_timeout = 5
    config.include_server_header = False
    config.wsgi_max_body_size = 0
    return config


def _port_of(bind: str) -> int:
    return int(bind.rpartition(":")[2])


async def serve_http(
    app: Callable[[Scope, Receive, Send], Awaitable[None]],
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    shutdown: Shutdown,
    graceful_timeout: float = 3.0,
    sockets: Any = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve *app* with hypercorn's Trio worker until *shutdown* begins.

    Reports the bound port through *task_status* (useful with ``port=0``). Open requests get
    *graceful_timeout* seconds once shutdown begins. *sockets* from :func:`bind_http` are used
    (and closed) instead of binding *host*:*port* here; either way an address that cannot be
    bound raises :class:`HttpBindError` before anything is served. An :class:`OperationsApp`
    without credentials is served on loopback only (``ValueError`` otherwise).
    """
    from hypercorn.trio.run import worker_serve
    from hypercorn.utils import wrap_app

    if isinstance(app, OperationsApp) and not app.authenticates and not is_loopback(host):
        raise ValueError(
            f"host {host!r} is not a loopback address, so the console needs credentials: "
            "give the OperationsApp a token or a password_hash"
        )
    if sockets is None:
        sockets = bind_http(host, port)
    config = _config(host, port, graceful_timeout)
    try:
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(
                functools.partial(
                    worker_serve,
                    wrap_app(app, config.wsgi_max_body_size, "asgi"),  # type: ignore[arg-type]
                    config,
                    sockets=sockets,
                    shutdown_trigger=shutdown.wait,
                )
            )
            bound = _port_of(binds[0])
            logger.info("operations HTTP on %s", binds[0])
            task_status.started(bound)
    finally:
        _close(sockets)
