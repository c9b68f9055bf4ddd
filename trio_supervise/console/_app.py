"""The ASGI app of the operations server (:class:`OperationsApp`): its settings, the lifespan
scope, routing, the credentials and CSRF session of a console request, ``/healthz`` and
``/metrics``; the console's pages (:mod:`._pages`) and actions (:mod:`._actions`) it routes to.
Reads of the queue are bounded (:mod:`._metrics`); credentials and CSRF keys are
:mod:`._auth`'s. With a token or a password hash the console asks for credentials;
``/healthz`` and ``/metrics`` never do (probes and scrapers).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import attrs
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .._audit import AuditTrail, MemoryAuditTrail
from .._convert import unstructure
from ..maintenance import Schedule, checked_schedules
from ..queues import WorkQueue
from ..queues._ports import audit_trail_of
from ..supervision import WorkerStatus
from ._actions import ITEM_ACTIONS, QUEUE_ACTIONS, Actions
from ._auth import (
    CREDENTIALS_REALM,
    ConsoleAuth,
    ConsoleKeys,
    check_password_hash,
    check_token,
)
from ._metrics import SCRAPE_CACHE_SECONDS, QueueReads
from ._pages import Pages
from ._web import (
    SESSION_COOKIE,
    Handler,
    Receive,
    Request,
    Response,
    Scope,
    Send,
    Visit,
    cookie,
    segments,
    text,
)

__all__ = ["ErrorRecord", "OperationsApp", "StatusSource"]

logger = logging.getLogger("trio_supervise.http")

_READ = "GET, HEAD"
_POST = "POST"


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


def _credentials(token: str | None, password_hash: str | None) -> ConsoleAuth | None:
    if token is None and password_hash is None:
        return None
    return ConsoleAuth(
        token=None if token is None else check_token(token),
        password_hash=None if password_hash is None else check_password_hash(password_hash),
    )


def _default_trail(app: OperationsApp) -> AuditTrail:
    return audit_trail_of(app.queue) or MemoryAuditTrail()


def _texts(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


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
    :param audit: where the console records actions; by default the queue's own trail when it
        keeps one (``Capability.AUDIT_TRAIL``), else a :class:`MemoryAuditTrail`.
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
    audit: AuditTrail = attrs.field(
        default=attrs.Factory(_default_trail, takes_self=True), kw_only=True
    )
    _reads: QueueReads | None = attrs.field(init=False, default=None, repr=False)
    _auth: ConsoleAuth | None = attrs.field(init=False, default=None)
    _keys: ConsoleKeys = attrs.field(init=False, factory=ConsoleKeys)
    _pages: Pages = attrs.field(init=False, repr=False)
    _actions: Actions = attrs.field(init=False, repr=False)

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
            self._reads = QueueReads.register(
                self.queue,
                self.registry,
                schedules=self.schedules,
                limits=self.queue_limits,
                due_limit=self.due_limit,
                cache_for=self.cache_for,
            )
        self._pages = Pages(self, self._keys, self._reads)
        self._actions = Actions(self, self._keys, self._reads)

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

    def _route(self, path: list[str]) -> tuple[str, Handler, bool] | None:
        """``(allowed methods, handler, is it the console)`` for a path, or None (404)."""
        queued, pages, act = self.queue is not None, self._pages, self._actions.act
        match path:
            case []:
                return _READ, pages.status_page, True
            case ["healthz"]:
                return _READ, self._healthz, False
            case ["metrics"]:
                return _READ, self._metrics, False
            case ["items"] if queued:
                return _READ, pages.items_page, True
            case ["dead"] if queued:
                return _READ, pages.dead_page, True
            case ["errors"] if queued:
                return _READ, pages.errors_page, True
            case ["items", item_id] if queued and item_id:
                return _READ, functools.partial(pages.item_page, item_id), True
            case ["items", item_id, action] if queued and item_id and action in ITEM_ACTIONS:
                return _POST, functools.partial(act, "items", item_id, action), True
            case ["dead", "retry"] if queued:
                return _POST, functools.partial(act, "dead", "", "retry"), True
            case ["queues", name, action] if queued and name and action in QUEUE_ACTIONS:
                return _POST, functools.partial(act, "queues", name, action), True
            case ["schedules", name, "fire"] if queued and name:
                return _POST, functools.partial(act, "schedules", name, "fire"), True
        return None

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request.of(scope, receive)
        path = segments(scope)
        route = None if path is None else self._route(path)
        if route is None:
            response = text(404, "not found")
        elif request.method not in route[0].split(", "):
            response = text(405, "method not allowed", (b"allow", route[0].encode()))
        else:
            _, handler, console = route
            try:
                response = await self._answer(request, handler, console)
            except Exception:
                logger.exception("operations endpoint %s failed", scope.get("path"))
                response = text(500, "internal error")
        headers = [
            *response.headers,
            (b"content-length", str(len(response.body)).encode()),
            (b"cache-control", b"no-store"),
        ]
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        body = b"" if request.method == "HEAD" else response.body
        await send({"type": "http.response.body", "body": body})

    async def _answer(self, request: Request, handler: Handler, console: bool) -> Response:
        """Credentials and the CSRF session of a console request, then its handler."""
        who = "local"
        if console and self._auth is not None:
            found = await self._auth.who(request.headers.get("authorization"))
            if found is None:
                challenge = f'Basic realm="{CREDENTIALS_REALM}", charset="UTF-8"'.encode()
                return text(401, "credentials required", (b"www-authenticate", challenge))
            who = found
        session = request.cookies.get(SESSION_COOKIE, "")
        fresh = len(session) < 32 or not session.replace("-", "").replace("_", "").isalnum()
        if fresh:
            session = self._keys.new_session()
        visit = Visit(who, session, fresh, self._keys.csrf_token(session))
        response = await handler(request, visit)
        if console and fresh and request.method != "POST":
            made = cookie(SESSION_COOKIE, session, secure=request.secure)
            response = attrs.evolve(response, headers=[*response.headers, (b"set-cookie", made)])
        return response

    # -- handlers ------------------------------------------------------------------------------

    async def _healthz(self, request: Request, visit: Visit) -> Response:
        healthy = self.source.healthy
        document = {
            "healthy": healthy,
            "workers": [_worker_json(worker) for worker in self.source.workers()],
        }
        body = json.dumps(document, indent=2).encode() + b"\n"
        return Response(200 if healthy else 503, [(b"content-type", b"application/json")], body)

    async def _metrics(self, request: Request, visit: Visit) -> Response:
        reads = self._reads
        if reads is not None:
            await reads.depth.refresh()
            if reads.fires is not None and reads.depth.read is not None:
                await reads.fires.refresh()
        return Response(
            200,
            [(b"content-type", CONTENT_TYPE_LATEST.encode())],
            generate_latest(self.registry),
        )
