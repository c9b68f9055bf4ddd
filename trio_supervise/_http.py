"""The operations HTTP surface: ``/healthz``, ``/metrics`` and a status page, as a raw ASGI app.

The app only reads state: a :class:`StatusSource` (the service's supervisor and runner), a
Prometheus registry, and the queue (``counts()`` and ``list_items()``). Scrapes are bounded: the
queue is read at most once per :data:`SCRAPE_CACHE_SECONDS` however many clients scrape, one read
in flight at a time (concurrent requests share it), and the page lists a bounded number of rows.
It is served by hypercorn's Trio worker through :func:`serve_http`, a ``nursery.start``-style
service that reports the bound port and stops when the service's :class:`Shutdown` begins; the
port is bound first (:func:`bind_http`), so that an address in use is one clear error.
"""

from __future__ import annotations

import base64
import datetime as dt
import errno
import functools
import hashlib
import html
import itertools
import json
import logging
import math
import socket
from collections.abc import (
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    Sequence,
)
from typing import Any, Generic, Protocol, TypeVar

import attrs
import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from ._convert import unstructure
from ._lifecycle import Shutdown
from ._supervisor import WorkerStatus
from .queues import ItemState, WorkItem, WorkQueue

__all__ = [
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

_ALLOWED = "GET, HEAD"
_QUEUE_TIMEOUT = 5.0
"""Seconds a request waits for the queue before showing what it has without it."""

SCRAPE_CACHE_SECONDS = 1.0
"""How long one read of the queue (counts, the due-soon rows) serves every scrape and page."""

_MAX_ROWS = 50
"""The most rows the page shows in its spec and error tables (the rest are counted)."""

T = TypeVar("T")


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


# -- bounded reads of the queue --------------------------------------------------------------------


@attrs.frozen
class _Read(Generic[T]):
    value: T | None
    problem: str | None  # why there is no value: the error, or "timed out"


@attrs.define(eq=False)
class SharedRead(Generic[T]):
    """One read of the queue shared by every request for *max_age* seconds (Trio's clock).

    At most one read is in flight: requests that arrive while it runs wait for it and share its
    answer. A failure (or no answer within 5 s) is shared too, so a struggling queue is not asked
    harder. A cancelled read leaves nothing behind; the next request reads again.
    """

    _read: Callable[[], Awaitable[T]] = attrs.field(alias="read")
    _what: str = attrs.field(alias="what")
    max_age: float = attrs.field(default=SCRAPE_CACHE_SECONDS, kw_only=True)
    reads: int = attrs.field(init=False, default=0)
    """How many times the queue was read (for tests and curiosity)."""
    _last: _Read[T] | None = attrs.field(init=False, default=None)
    _read_at: float = attrs.field(init=False, default=-math.inf)
    _in_flight: trio.Event | None = attrs.field(init=False, default=None)
    _answered: int = attrs.field(init=False, default=0)  # the read whose answer _last is

    async def get(self) -> _Read[T]:
        """The last answer if fresh, else a new one (or the one being read now)."""
        while True:
            if self._last is not None and trio.current_time() - self._read_at < self.max_age:
                await trio.lowlevel.checkpoint()
                return self._last
            if self._in_flight is not None:
                generation = self.reads
                await self._in_flight.wait()
                if self._last is not None and self._answered == generation:
                    return self._last
                continue  # that read was cancelled: read again
            done = self._in_flight = trio.Event()
            try:
                last = self._last = await self._fetch()
                self._read_at = trio.current_time()
                self._answered = self.reads
            finally:
                self._in_flight = None
                done.set()
            return last

    async def _fetch(self) -> _Read[T]:
        self.reads += 1
        with trio.move_on_after(_QUEUE_TIMEOUT):
            try:
                return _Read(await self._read(), None)
            except Exception as error:
                logger.warning("%s failed", self._what, exc_info=True)
                return _Read(None, f"{type(error).__name__}: {error}")
        return _Read(None, "timed out")


def _label(text: str) -> str:
    """A Prometheus label value that encodes (lone surrogates shown as escapes)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@attrs.define(eq=False)
class QueueDepthCollector:
    """Exports the queue's counts by spec and state, and each spec's lag, as last read by
    :meth:`refresh`.

    A collector is called synchronously during exposition, so it cannot ask the queue itself;
    the ``/metrics`` handler awaits :meth:`refresh` just before rendering. The counts come from
    a :class:`SharedRead` (the status page shares it), the lags from another, so scrapes never
    read more than once a :data:`SCRAPE_CACHE_SECONDS`.

    Every spec the queue has shown once stays known: its ``queue_items`` series report 0 for
    each state it has no items in (rather than vanishing, which alerting reads as "no data"),
    and its ``queue_lag_seconds`` is how long the oldest due, unclaimed item has been waiting
    (from ``next_due_at([spec])``: a queued item past its due time, or an expired lease
    waiting for rescue), 0 when nothing is overdue. While the queue does not answer, only
    ``queue_up 0`` is exported: zeros would claim an empty queue.
    """

    _queue: WorkQueue = attrs.field(alias="queue")
    _source: SharedRead[Mapping[tuple[str, ItemState], int]] | None = attrs.field(
        default=None, alias="source"
    )
    _counts: Mapping[tuple[str, ItemState], int] = attrs.field(init=False, factory=dict)
    _up: bool = attrs.field(init=False, default=False)
    _specs: set[str] = attrs.field(init=False, factory=set)
    _lag_source: SharedRead[Mapping[str, float]] = attrs.field(init=False)
    _lags: Mapping[str, float] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        if self._source is None:
            self._source = SharedRead(self._counts_now, what="queue counts")
        self._lag_source = SharedRead(self._lags_now, what="queue lag")

    async def _counts_now(self) -> Mapping[tuple[str, ItemState], int]:
        return dict(await self._queue.counts())

    async def _lags_now(self) -> Mapping[str, float]:
        lags: dict[str, float] = {}
        for spec_id in sorted(self._specs):
            due = await self._queue.next_due_at([spec_id])
            now = self._queue.clock.now()
            lags[spec_id] = 0.0 if due is None else max(0.0, (now - due).total_seconds())
        return lags

    @property
    def source(self) -> SharedRead[Mapping[tuple[str, ItemState], int]]:
        """Where the counts come from (shared with the status page)."""
        assert self._source is not None
        return self._source

    async def refresh(self) -> Mapping[tuple[str, ItemState], int]:
        """The counts, read at most once per cache window; on failure report the queue down."""
        read = await self.source.get()
        self._counts = read.value or {}
        self._specs.update(spec_id for spec_id, _ in self._counts)
        lags = await self._lag_source.get() if read.value is not None else None
        self._up = read.value is not None and lags is not None and lags.value is not None
        self._lags = {} if lags is None else lags.value or {}
        return self._counts

    def collect(self) -> Iterable[Metric]:
        items = GaugeMetricFamily(
            "trio_supervise_queue_items",
            "Work items in the queue by spec and state, read at scrape time.",
            labels=["spec", "state"],
        )
        lag = GaugeMetricFamily(
            "trio_supervise_queue_lag_seconds",
            "Seconds the oldest due, unclaimed item of the spec has waited (0: none overdue).",
            labels=["spec"],
        )
        if self._up:
            for spec_id in sorted(self._specs):
                for state in ItemState:
                    count = self._counts.get((spec_id, state), 0)
                    items.add_metric([_label(spec_id), str(state)], count)
                if spec_id in self._lags:
                    lag.add_metric([_label(spec_id)], self._lags[spec_id])
        up = GaugeMetricFamily(
            "trio_supervise_queue_up", "1 if the queue answered the last scrape, else 0."
        )
        up.add_metric([], 1 if self._up else 0)
        return [items, lag, up]


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


def _due(item: WorkItem, now: dt.datetime | None) -> str:
    """When *item* is due; "waiting for N children" while it waits for them."""
    if item.waiting:
        n = item.waiting_children
        return f"waiting for {n} {'child' if n == 1 else 'children'}"
    return _when(item.due_at, now)


def _preview(config: object) -> str:
    text = json.dumps(config, sort_keys=True, ensure_ascii=False)
    if len(text) > _CONFIG_PREVIEW:
        text = text[: _CONFIG_PREVIEW - 1] + "…"
    return text


def _stamp(at: object) -> str:
    if at is None:
        return ""
    if isinstance(at, dt.datetime):
        return at.strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(at)


def _rows(
    things: Sequence[T], render: Callable[[T], str], *, columns: int, what: str, empty: str
) -> Iterator[str]:
    """One ``<tr>`` per thing, at most :data:`_MAX_ROWS` of them, then how many were left out.

    A thing that fails to render (odd data from a driver or a backend) is a row saying so,
    never a failed page.
    """
    for thing in itertools.islice(things, _MAX_ROWS):
        try:
            yield render(thing)
        except Exception as error:
            logger.debug("status page cannot render a %s", what, exc_info=True)
            yield (
                f'<tr><td colspan="{columns}" class="muted">'
                f"this {_e(what)} cannot be shown ({_e(type(error).__name__)})</td></tr>"
            )
    if len(things) > _MAX_ROWS:
        yield (
            f'<tr><td colspan="{columns}" class="muted">'
            f"and {len(things) - _MAX_ROWS} more</td></tr>"
        )
    if not things:
        yield f'<tr><td colspan="{columns}" class="muted">{_e(empty)}</td></tr>'


def _history(item: WorkItem) -> str:
    """The item's error history (oldest first) as a folded list, every piece escaped."""
    if not item.errors:
        return ""
    entries = "".join(
        f"<li>{_e(_stamp(each.at))} by {_e(each.worker or '?')} (attempt {_e(each.attempt)}): "
        f"<code>{_e(each.error)}</code></li>"
        for each in item.errors
    )
    summary = f"<summary>history ({len(item.errors)})</summary>"
    return f'<details class="history">{summary}<ol>{entries}</ol></details>'


@attrs.frozen
class _QueueView:
    counts: Mapping[tuple[str, ItemState], int] | None
    due: Sequence[WorkItem]
    now: dt.datetime | None
    problem: str | None
    unowned: Sequence[tuple[str, int]] = ()
    """(spec, queued count) of due specs no driver of this service owns."""


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

    def worker_row(worker: WorkerStatus) -> str:
        return (
            f'<tr><td>{_e(worker.worker)}</td><td class="{_e(_state_class(worker.state))}">'
            f'{_e(worker.state)}</td><td class="num">{_e(worker.restarts)}</td>'
            f"<td><code>{_e(worker.last_error or '')}</code></td></tr>"
        )

    out.extend(_rows(workers, worker_row, columns=4, what="worker", empty="no workers"))
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
            counts = queue.counts

            def spec_row(spec: str) -> str:
                cells = "".join(
                    f'<td class="num">{_e(counts.get((spec, state), 0))}</td>' for state in states
                )
                return f"<tr><td>{_e(spec)}</td>{cells}</tr>"

            out.extend(_rows(specs, spec_row, columns=len(states) + 1, what="spec", empty="empty"))
            add("</tbody></table>")
        if queue.unowned:
            add('<table id="unowned"><thead><tr><th>unowned spec</th><th>queued</th>')
            add("<th>warning</th></tr></thead><tbody>")

            def unowned_row(entry: tuple[str, int]) -> str:
                spec, count = entry
                return (
                    f'<tr class="warning"><td>{_e(spec)}</td><td class="num">{_e(count)}</td>'
                    f"<td>due, but no driver of this service owns spec {_e(repr(spec))}</td></tr>"
                )

            out.extend(_rows(queue.unowned, unowned_row, columns=3, what="spec", empty=""))
            add("</tbody></table>")
        add('<h2>Due soon</h2><table id="due"><thead><tr><th>id</th><th>spec</th>')
        add("<th>tenant</th><th>subject</th><th>due</th><th>errors</th><th>config</th>")
        add("</tr></thead><tbody>")
        now = queue.now

        def item_row(item: WorkItem) -> str:
            return (
                f"<tr><td>{_e(item.id)}</td><td>{_e(item.spec_id)}</td>"
                f"<td>{_e(item.tenant_id)}</td><td>{_e(item.subject_id)}</td>"
                f"<td>{_e(_due(item, now))}</td>"
                f'<td class="num">{_e(item.error_count)}'
                f"{'<br><code>' + _e(item.last_error) + '</code>' if item.last_error else ''}"
                f"{_history(item)}"
                f"</td><td><code>{_e(_preview(item.config))}</code></td></tr>"
            )

        out.extend(_rows(queue.due, item_row, columns=7, what="item", empty="nothing queued"))
        add("</tbody></table>")

    add('<h2>Recent errors</h2><table id="errors"><thead><tr>')
    add("<th>when</th><th>where</th><th>error</th></tr></thead><tbody>")

    def error_row(error: ErrorRecord) -> str:
        return (
            f"<tr><td>{_e(_stamp(error.at))}</td><td>{_e(error.source)}</td>"
            f"<td><code>{_e(error.message)}</code></td></tr>"
        )

    out.extend(_rows(errors, error_row, columns=3, what="error", empty="none"))
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
    :param cache_for: seconds one read of the queue serves every scrape and page view.
    :param owned_specs: the spec ids this service's drivers own; when given, the status page
        flags due items of any other spec (nothing here will ever run them). None: no check.
    """

    source: StatusSource
    registry: CollectorRegistry
    queue: WorkQueue | None = attrs.field(default=None, kw_only=True)
    title: str = attrs.field(default="trio_supervise", kw_only=True)
    refresh: float = attrs.field(default=5.0, kw_only=True)
    due_limit: int = attrs.field(default=20, kw_only=True)
    cache_for: float = attrs.field(default=SCRAPE_CACHE_SECONDS, kw_only=True)
    owned_specs: frozenset[str] | None = attrs.field(default=None, kw_only=True)
    _depth: QueueDepthCollector | None = attrs.field(init=False, default=None)
    _due: SharedRead[Sequence[WorkItem]] | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        if not self.refresh > 0:
            raise ValueError(f"refresh must be positive, got {self.refresh!r}")
        if self.due_limit < 0:
            raise ValueError(f"due_limit must be >= 0, got {self.due_limit!r}")
        if not (math.isfinite(self.cache_for) and self.cache_for >= 0):
            raise ValueError(f"cache_for must be a finite number >= 0, got {self.cache_for!r}")
        if self.queue is not None:
            queue = self.queue
            self._depth = QueueDepthCollector(queue)
            self._depth.source.max_age = self.cache_for
            self.registry.register(self._depth)

            async def due() -> Sequence[WorkItem]:
                return await queue.list_items(states=[ItemState.QUEUED], limit=self.due_limit)

            self._due = SharedRead(due, what="status page due items", max_age=self.cache_for)

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
        assert self._depth is not None
        assert self._due is not None
        counts = await self._depth.source.get()
        due = await self._due.get() if counts.value is not None else _Read(None, None)
        problem = counts.problem or due.problem
        now: dt.datetime | None = None
        try:
            now = self.queue.clock.now()
        except Exception:
            logger.debug("queue clock failed", exc_info=True)
        unowned = await self._unowned(counts.value, now)
        return _QueueView(
            counts=counts.value, due=due.value or (), now=now, problem=problem, unowned=unowned
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
        for spec in sorted(queued)[:_MAX_ROWS]:
            try:
                due = await self.queue.next_due_at([spec])
            except Exception:
                logger.debug("next_due_at(%r) failed", spec, exc_info=True)
                continue
            if due is not None and due <= now:
                found.append((spec, queued[spec]))
        return found

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
        # Stored text may hold lone surrogates (no UTF-8 for them): shown as escapes, never a 500.
        return 200, headers, text.encode("utf-8", "backslashreplace")


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
    bound raises :class:`HttpBindError` before anything is served.
    """
    from hypercorn.trio.run import worker_serve
    from hypercorn.utils import wrap_app

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
