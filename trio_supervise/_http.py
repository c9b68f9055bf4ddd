"""The operations HTTP surface: ``/healthz``, ``/metrics`` and a status page, as a raw ASGI app.

The app only reads state: a :class:`StatusSource` (the service's supervisor and runner), a
Prometheus registry, and the queue (``counts()`` and ``list_items()``, asked per request, since a
Prometheus collector runs synchronously and cannot await the queue itself). It is served by
hypercorn's Trio worker through :func:`serve_http`, a ``nursery.start``-style service that
reports the bound port and stops when the service's :class:`Shutdown` begins.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import hashlib
import html
import json
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any, Protocol

import attrs
import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from ._convert import unstructure
from ._lifecycle import Shutdown
from ._supervisor import WorkerStatus
from .queues import ItemState, WorkItem, WorkQueue

__all__ = [
    "ErrorRecord",
    "OperationsApp",
    "QueueDepthCollector",
    "StatusSource",
    "serve_http",
]

logger = logging.getLogger("trio_supervise.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_ALLOWED = "GET, HEAD"
_QUEUE_TIMEOUT = 5.0
"""Seconds a request waits for the queue before showing what it has without it."""


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


# -- queue depth -----------------------------------------------------------------------------------


@attrs.define(eq=False)
class QueueDepthCollector:
    """Exports the queue's counts by spec and state, as last read by :meth:`refresh`.

    A collector is called synchronously during exposition, so it cannot ask the queue itself;
    the ``/metrics`` handler awaits :meth:`refresh` just before rendering.
    """

    _queue: WorkQueue = attrs.field(alias="queue")
    _counts: Mapping[tuple[str, ItemState], int] = attrs.field(init=False, factory=dict)
    _up: bool = attrs.field(init=False, default=False)

    async def refresh(self) -> Mapping[tuple[str, ItemState], int]:
        """Read the counts now; on failure (or no answer in 5 s) report the queue down."""
        counts: Mapping[tuple[str, ItemState], int] | None = None
        with trio.move_on_after(_QUEUE_TIMEOUT):
            try:
                counts = dict(await self._queue.counts())
            except Exception:
                logger.warning("queue counts failed", exc_info=True)
        self._up = counts is not None
        self._counts = counts or {}
        return self._counts

    def collect(self) -> Iterable[Metric]:
        items = GaugeMetricFamily(
            "trio_supervise_queue_items",
            "Work items in the queue by spec and state, read at scrape time.",
            labels=["spec", "state"],
        )
        for (spec_id, state), count in sorted(self._counts.items()):
            items.add_metric([spec_id, str(state)], count)
        up = GaugeMetricFamily(
            "trio_supervise_queue_up", "1 if the queue answered the last scrape, else 0."
        )
        up.add_metric([], 1 if self._up else 0)
        return [items, up]


# -- the page --------------------------------------------------------------------------------------

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem; color: #222; }
h1 { font-size: 1.3rem; } h2 { font-size: 1.1rem; margin-top: 1.5rem; }
table { border-collapse: collapse; margin: .5rem 0; }
th, td { border: 1px solid #ccc; padding: .25rem .5rem; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; }
code { white-space: pre-wrap; word-break: break-all; }
.banner { padding: .5rem .75rem; border-radius: 4px; display: inline-block; font-weight: 600; }
.healthy { background: #dff5e1; } .unhealthy { background: #fbe0e0; }
.state-running { color: #17692a; } .state-backing-off { color: #8a5a00; }
.state-failed { color: #b00020; font-weight: 600; }
.muted { color: #777; }
"""
_STYLE_HASH = base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()

CONTENT_SECURITY_POLICY = (
    f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; img-src 'none'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""No script at all, and only the page's own stylesheet (pinned by hash)."""

_PAGE_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]

_CONFIG_PREVIEW = 200


def _e(value: object) -> str:
    """Escape anything for HTML text or a quoted attribute."""
    return html.escape(str(value), quote=True)


def _state_class(state: str) -> str:
    safe = "".join(ch for ch in state.lower() if ch.isalnum() or ch == "-")
    return f"state-{safe}"


def _when(at: dt.datetime, now: dt.datetime | None) -> str:
    stamp = at.strftime("%Y-%m-%d %H:%M:%S UTC")
    if now is None:
        return stamp
    seconds = (at - now).total_seconds()
    if seconds <= 0:
        return f"{stamp} (due)"
    if seconds < 120:
        return f"{stamp} (in {math.ceil(seconds)}s)"
    if seconds < 7200:
        return f"{stamp} (in {math.ceil(seconds / 60)}m)"
    return f"{stamp} (in {seconds / 3600:.1f}h)"


def _preview(config: object) -> str:
    text = json.dumps(config, sort_keys=True, ensure_ascii=False)
    if len(text) > _CONFIG_PREVIEW:
        text = text[: _CONFIG_PREVIEW - 1] + "…"
    return text


@attrs.frozen
class _QueueView:
    counts: Mapping[tuple[str, ItemState], int] | None
    due: Sequence[WorkItem]
    now: dt.datetime | None
    problem: str | None


def render_status_page(
    *,
    title: str,
    healthy: bool,
    workers: Sequence[WorkerStatus],
    errors: Sequence[ErrorRecord],
    queue: _QueueView | None,
    refresh: float,
) -> str:
    """The status page as HTML; every piece of data passes through :func:`html.escape`."""
    out: list[str] = []
    add = out.append
    add("<!doctype html>")
    add('<html lang="en"><head><meta charset="utf-8">')
    add(f'<meta http-equiv="refresh" content="{max(1, math.ceil(refresh))}">')
    add('<meta name="viewport" content="width=device-width, initial-scale=1">')
    add(f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>")
    add(f"<h1>{_e(title)}</h1>")
    verdict = "healthy" if healthy else "unhealthy"
    add(f'<p id="health" class="banner {verdict}">{verdict}</p>')

    add('<h2>Workers</h2><table id="workers"><thead><tr>')
    add("<th>worker</th><th>state</th><th>restarts</th><th>last error</th></tr></thead><tbody>")
    for worker in workers:
        add(
            f'<tr><td>{_e(worker.worker)}</td><td class="{_e(_state_class(worker.state))}">'
            f'{_e(worker.state)}</td><td class="num">{_e(worker.restarts)}</td>'
            f"<td><code>{_e(worker.last_error or '')}</code></td></tr>"
        )
    if not workers:
        add('<tr><td colspan="4" class="muted">no workers</td></tr>')
    add("</tbody></table>")

    if queue is not None:
        add("<h2>Queue</h2>")
        if queue.problem is not None:
            add(f'<p class="banner unhealthy">queue unavailable: {_e(queue.problem)}</p>')
        if queue.counts is not None:
            states = list(ItemState)
            specs = sorted({spec for spec, _ in queue.counts})
            add('<table id="counts"><thead><tr><th>spec</th>')
            add("".join(f"<th>{_e(state)}</th>" for state in states))
            add("</tr></thead><tbody>")
            for spec in specs:
                cells = "".join(
                    f'<td class="num">{_e(queue.counts.get((spec, state), 0))}</td>'
                    for state in states
                )
                add(f"<tr><td>{_e(spec)}</td>{cells}</tr>")
            if not specs:
                add(f'<tr><td colspan="{len(states) + 1}" class="muted">empty</td></tr>')
            add("</tbody></table>")
        add('<h2>Due soon</h2><table id="due"><thead><tr><th>id</th><th>spec</th>')
        add("<th>tenant</th><th>subject</th><th>due</th><th>errors</th><th>config</th>")
        add("</tr></thead><tbody>")
        for item in queue.due:
            add(
                f"<tr><td>{_e(item.id)}</td><td>{_e(item.spec_id)}</td>"
                f"<td>{_e(item.tenant_id)}</td><td>{_e(item.subject_id)}</td>"
                f"<td>{_e(_when(item.due_at, queue.now))}</td>"
                f'<td class="num">{_e(item.error_count)}'
                f"{'<br><code>' + _e(item.last_error) + '</code>' if item.last_error else ''}"
                f"</td><td><code>{_e(_preview(item.config))}</code></td></tr>"
            )
        if not queue.due:
            add('<tr><td colspan="7" class="muted">nothing queued</td></tr>')
        add("</tbody></table>")

    add('<h2>Recent errors</h2><table id="errors"><thead><tr>')
    add("<th>when</th><th>where</th><th>error</th></tr></thead><tbody>")
    for error in errors:
        when = error.at.strftime("%Y-%m-%d %H:%M:%S UTC") if error.at else ""
        add(
            f"<tr><td>{_e(when)}</td><td>{_e(error.source)}</td>"
            f"<td><code>{_e(error.message)}</code></td></tr>"
        )
    if not errors:
        add('<tr><td colspan="3" class="muted">none</td></tr>')
    add("</tbody></table>")
    add(f'<p class="muted">refreshes every {_e(max(1, math.ceil(refresh)))}s</p>')
    add("</body></html>")
    return "\n".join(out)


# -- the app ---------------------------------------------------------------------------------------


@attrs.define(eq=False)
class OperationsApp:
    """The ASGI app behind the operations server.

    :param source: health, workers and recent errors.
    :param registry: the Prometheus registry ``/metrics`` exposes. When a *queue* is given, a
        :class:`QueueDepthCollector` is registered on it.
    :param queue: the service's queue, for counts and the items due soon (optional).
    :param title: the status page's heading.
    :param refresh: seconds between status page refreshes.
    :param due_limit: how many due-soon items the status page lists.
    """

    source: StatusSource
    registry: CollectorRegistry
    queue: WorkQueue | None = attrs.field(default=None, kw_only=True)
    title: str = attrs.field(default="trio_supervise", kw_only=True)
    refresh: float = attrs.field(default=5.0, kw_only=True)
    due_limit: int = attrs.field(default=20, kw_only=True)
    _depth: QueueDepthCollector | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        if not self.refresh > 0:
            raise ValueError(f"refresh must be positive, got {self.refresh!r}")
        if self.due_limit < 0:
            raise ValueError(f"due_limit must be >= 0, got {self.due_limit!r}")
        if self.queue is not None:
            self._depth = QueueDepthCollector(self.queue)
            self.registry.register(self._depth)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "http":
            await self._http(scope, send)
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

    async def _http(self, scope: Scope, send: Send) -> None:
        method = scope.get("method", "GET")
        routes = {"/": self._page, "/healthz": self._healthz, "/metrics": self._metrics}
        handler = routes.get(scope.get("path", ""))
        head = method == "HEAD"
        if handler is None:
            status, headers, body = 404, [(b"content-type", b"text/plain; charset=utf-8")], b""
            body = b"not found\n"
        elif method not in ("GET", "HEAD"):
            status, body = 405, b"method not allowed\n"
            headers = [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"allow", _ALLOWED.encode()),
            ]
        else:
            try:
                status, headers, body = await handler()
            except Exception:
                logger.exception("operations endpoint %s failed", scope.get("path"))
                status, body = 500, b"internal error\n"
                headers = [(b"content-type", b"text/plain; charset=utf-8")]
        headers = [
            *headers,
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if head else body})

    # -- handlers ------------------------------------------------------------------------------

    async def _healthz(self) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        healthy = self.source.healthy
        document = {
            "healthy": healthy,
            "workers": [_worker_json(worker) for worker in self.source.workers()],
        }
        body = json.dumps(document, indent=2).encode() + b"\n"
        return (200 if healthy else 503), [(b"content-type", b"application/json")], body

    async def _metrics(self) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        if self._depth is not None:
            await self._depth.refresh()
        return (
            200,
            [(b"content-type", CONTENT_TYPE_LATEST.encode())],
            generate_latest(self.registry),
        )

    async def _queue_view(self) -> _QueueView:
        assert self.queue is not None
        counts: Mapping[tuple[str, ItemState], int] | None = None
        due: Sequence[WorkItem] = ()
        problem: str | None = "timed out"
        with trio.move_on_after(_QUEUE_TIMEOUT):
            try:
                counts = await self.queue.counts()
                due = await self.queue.list_items(states=[ItemState.QUEUED], limit=self.due_limit)
                problem = None
            except Exception as error:
                logger.warning("status page could not read the queue", exc_info=True)
                problem = f"{type(error).__name__}: {error}"
        now: dt.datetime | None = None
        try:
            now = self.queue.clock.now()
        except Exception:
            logger.debug("queue clock failed", exc_info=True)
        return _QueueView(counts=counts, due=due, now=now, problem=problem)

    async def _page(self) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        queue = None if self.queue is None else await self._queue_view()
        text = render_status_page(
            title=self.title,
            healthy=self.source.healthy,
            workers=self.source.workers(),
            errors=self.source.recent_errors(),
            queue=queue,
            refresh=self.refresh,
        )
        headers = [(b"content-type", b"text/html; charset=utf-8"), *_PAGE_HEADERS]
        return 200, headers, text.encode()


# -- serving ---------------------------------------------------------------------------------------


def _port_of(bind: str) -> int:
    return int(bind.rpartition(":")[2])


async def serve_http(
    app: Callable[[Scope, Receive, Send], Awaitable[None]],
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    shutdown: Shutdown,
    graceful_timeout: float = 3.0,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve *app* with hypercorn's Trio worker until *shutdown* begins.

    Reports the bound port through *task_status* (useful with ``port=0``). Open requests get
    *graceful_timeout* seconds once shutdown begins.
    """
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be between 0 and 65535, got {port!r}")
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logger
    config.graceful_timeout = graceful_timeout
    config.h11_max_incomplete_size = 16 * 1024
    config.h2_max_header_list_size = 16 * 1024
    config.max_app_queue_size = 10
    config.keep_alive_timeout = 5
    config.include_server_header = False
    config.wsgi_max_body_size = 0

    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(
            functools.partial(serve, app, config, shutdown_trigger=shutdown.wait)  # type: ignore[arg-type]
        )
        bound = _port_of(binds[0])
        logger.info("operations HTTP on %s", binds[0])
        task_status.started(bound)
