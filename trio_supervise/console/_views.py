"""What the console's pages show, as plain rows: the Jinja2 templates shipped in the package
(``templates/``), rendered with autoescaping and a strict Content-Security-Policy, and the rows
made of workers, errors, audit entries, items, queues and schedules for them. A row that cannot
be turned into text says so, and the page still renders.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import importlib.resources
import itertools
import json
import logging
import math
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import jinja2

from .._describe import due_text, entry_text, item_fields, stamp
from .._errors import ItemNotFound
from ..maintenance import Schedule
from ..queues import ItemState, Journal, QueueInfo, WorkItem, WorkQueue
from ..supervision import WorkerStatus

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "MAX_ROWS",
    "PAGE_HEADERS",
    "PAGE_SIZE",
    "QueueView",
    "Rows",
    "ScheduleView",
    "item_page_context",
    "lineage",
    "quote_part",
    "render",
    "rows",
]

logger = logging.getLogger("trio_supervise.http")

MAX_ROWS = 50
"""The most rows a table of the status page shows (the rest are counted)."""
PAGE_SIZE = 50
"""Items per page of the item lists."""
_CONFIG_PREVIEW = 200
_LINEAGE = 20
"""The most ancestors an item page walks up."""
_CHILDREN = 100
"""The most children an item page lists."""


def quote_part(value: object) -> str:
    """*value* as one path segment (every reserved character escaped, lone surrogates kept)."""
    return urllib.parse.quote(str(value), safe="", errors="surrogatepass")


def unquote_part(segment: bytes) -> str:
    """The inverse of :func:`quote_part`, from a raw (percent-encoded) path segment."""
    return urllib.parse.unquote_to_bytes(segment).decode("utf-8", "surrogatepass")


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader(__package__, "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters["q"] = quote_part

STYLE = importlib.resources.files(__package__).joinpath("templates/console.css").read_text()
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()

CONTENT_SECURITY_POLICY = (
    f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; img-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""No script at all, only the page's own stylesheet (pinned by hash), forms posted only here."""

PAGE_HEADERS = [
    (b"content-type", b"text/html; charset=utf-8"),
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


def render(template: str, **context: Any) -> str:
    """The page *template* with *context* (and the stylesheet), every value autoescaped (the
    stylesheet, ours and pinned by hash in the CSP, is marked safe in the template)."""
    return _ENV.get_template(template).render(style=STYLE, **context)


# -- rows --------------------------------------------------------------------------------------


@attrs.frozen
class Rows:
    """A table's rows as plain values: at most :data:`MAX_ROWS` shown, how many more there are,
    and what to say when there are none."""

    shown: list[dict[str, Any]]
    more: int = 0
    empty: str = ""


T = TypeVar("T")


def rows(
    things: Sequence[T],
    view: Callable[[T], dict[str, Any]],
    *,
    what: str,
    empty: str = "",
    limit: int | None = MAX_ROWS,
) -> Rows:
    """One row per thing from *view*; a thing that fails to turn into text (odd data from a
    driver or a backend) is a row saying so, never a failed page."""
    shown = []
    for thing in itertools.islice(things, limit):
        try:
            shown.append({"unshowable": None, **view(thing)})
        except Exception as error:
            logger.debug("the console cannot show a %s", what, exc_info=True)
            shown.append({"unshowable": f"this {what} cannot be shown ({type(error).__name__})"})
    more = 0 if limit is None else max(0, len(things) - limit)
    return Rows(shown, more, empty)


def _state_class(state: str) -> str:
    safe = "".join(ch for ch in state.lower() if ch.isalnum() or ch == "-")
    return f"state-{safe}"


def _stamp(at: object) -> str:
    if at is None:
        return ""
    if isinstance(at, dt.datetime):
        return at.strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(at)


def _when(at: dt.datetime, now: dt.datetime | None) -> str:
    text = _stamp(at)
    if now is None:
        return text
    seconds = (at - now).total_seconds()
    if seconds <= 0:
        return f"{text} (due)"
    if seconds < 120:
        return f"{text} (in {math.ceil(seconds)}s)"
    if seconds < 7200:
        return f"{text} (in {math.ceil(seconds / 60)}m)"
    return f"{text} (in {seconds / 3600:.1f}h)"


def _preview(config: object) -> str:
    text = json.dumps(config, sort_keys=True, ensure_ascii=False)
    if len(text) > _CONFIG_PREVIEW:
        text = text[: _CONFIG_PREVIEW - 1] + "…"
    return text


def _first_line(text: str | None) -> str:
    return "" if not text else text.split("\n", 1)[0]


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def worker_row(worker: WorkerStatus) -> dict[str, Any]:
    return {
        "worker": str(worker.worker),
        "css": _state_class(str(worker.state)),
        "state": str(worker.state),
        "restarts": str(worker.restarts),
        "last_error": str(worker.last_error or ""),
    }


def error_row(error: Any) -> dict[str, Any]:
    return {"at": _stamp(error.at), "source": str(error.source), "message": str(error.message)}


def item_error_row(error: Any) -> dict[str, Any]:
    """A row of an :class:`~trio_supervise.ItemError`: the error's first line, and the rest
    (its traceback) folded away."""
    text = str(error.entry.error)
    head, _, rest = text.partition("\n")
    return {
        "at": _stamp(error.entry.at),
        "id": str(error.item_id),
        "spec": str(error.spec_id),
        "queue": str(error.queue),
        "attempt": int(error.entry.attempt),
        "worker": str(error.entry.worker),
        "error": head,
        "detail": rest,
    }


def audit_row(entry: Any) -> dict[str, Any]:
    return {
        "at": _stamp(entry.at),
        "who": str(entry.who),
        "address": str(entry.address),
        "action": str(entry.action),
        "target": str(entry.target),
        "ok": bool(entry.ok),
        "result": ("" if entry.ok else "refused: ") + str(entry.result),
    }


def _history(item: WorkItem) -> list[dict[str, str]]:
    """*item*'s error history, oldest first: each error whole, and apart its first line (the
    summary) and the rest (the traceback)."""
    return [
        {
            "at": _stamp(each.at),
            "worker": str(each.worker or "?"),
            "attempt": str(each.attempt),
            "error": str(each.error),
            "summary": _first_line(each.error),
            "traceback": str(each.error).partition("\n")[2],
        }
        for each in item.errors
    ]


def due_row(
    now: dt.datetime | None, paused: Iterable[str] = ()
) -> Callable[[WorkItem], dict[str, Any]]:
    """The due-soon table's rows: an item of a paused queue says so beside its due time (it
    waits however due it is); errors show their first line (tracebacks are on the item page)."""
    stopped = frozenset(paused)

    def view(item: WorkItem) -> dict[str, Any]:
        due = due_text(item) if item.waiting else _when(item.due_at, now)
        if item.queue in stopped:
            due += f", queue {item.queue} paused"
        history = [{**each, "error": each["summary"]} for each in _history(item)]
        return {
            "id": str(item.id),
            "spec": str(item.spec_id),
            "tenant": str(item.tenant_id),
            "subject": str(item.subject_id),
            "due": due,
            "errors": str(item.error_count),
            "last_error": _first_line(item.last_error),
            "history": history,
            "config": _preview(item.config),
        }

    return view


def list_row(item: WorkItem) -> dict[str, Any]:
    """An item as a row of the item lists."""
    return {
        "id": str(item.id),
        "spec": str(item.spec_id),
        "state": str(item.state) + (" (cancel requested)" if item.cancel_requested else ""),
        "queue": str(item.queue),
        "priority": str(item.priority),
        "due": due_text(item),
        "errors": str(item.error_count),
        "last_error": _first_line(item.last_error),
        "updated": f"{stamp(item.updated_at)} UTC",
    }


# -- the status page's queue panel ---------------------------------------------------------------


@attrs.frozen(kw_only=True)
class QueueView:
    """What the status page shows of the queue, as last read (see ``OperationsApp``)."""

    counts: Mapping[tuple[str, ItemState], int] | None
    due: Sequence[WorkItem]
    now: dt.datetime | None
    problem: str | None
    unowned: Sequence[tuple[str, int]] = ()
    """(spec, queued count) of due specs no driver of this service owns."""
    queues: Sequence[QueueInfo] = ()
    lags: Mapping[str, float] = attrs.field(factory=dict)
    """Each named queue's lag (seconds its oldest due item waited, paused or not)."""
    limits: Mapping[str, int] | None = None
    """Each queue this service's runner serves, with its concurrency (None: no runner here)."""
    throttled_keys: int | None = None
    """How many concurrency keys their rate limit holds back now (None: the store keeps no
    key rate limits)."""


def queue_rows(view: QueueView, states: Sequence[ItemState]) -> Rows:
    """The queues panel: every queue that holds items or is paused, and every one served here."""
    infos = {info.name: info for info in view.queues}
    for name in view.limits or {}:
        infos.setdefault(name, QueueInfo(name=name))

    def row(info: QueueInfo) -> dict[str, Any]:
        limit = (view.limits or {}).get(info.name)
        status = f"paused since {_stamp(info.paused_at)}" if info.paused else "active"
        return {
            "name": str(info.name),
            "paused": info.paused,
            "status": status,
            "counts": [str(info.counts.get(state, 0)) for state in states],
            "limit": "not served here" if limit is None else str(limit),
            "rate": _rate_shown(info),
            "lag": _ago(view.lags.get(info.name)),
        }

    return rows([infos[name] for name in sorted(infos)], row, what="queue")


def _rate_shown(info: QueueInfo) -> str:
    """A queue's rate limit on the panel: ``100/60s``, throttled until when while it holds
    items back; ``none``."""
    if info.rate_limit is None:
        return "none"
    if info.throttled_until is None:
        return str(info.rate_limit)
    return f"{info.rate_limit}, throttled until {_stamp(info.throttled_until)}"


def count_rows(counts: Mapping[tuple[str, ItemState], int], states: Sequence[ItemState]) -> Rows:
    specs = sorted({spec for spec, _ in counts})

    def row(spec: str) -> dict[str, Any]:
        return {"spec": spec, "counts": [str(counts.get((spec, state), 0)) for state in states]}

    return rows(specs, row, what="spec", empty="empty")


def unowned_rows(unowned: Sequence[tuple[str, int]]) -> Rows:
    def row(entry: tuple[str, int]) -> dict[str, Any]:
        spec, count = entry
        return {"spec": spec, "count": str(count), "spec_repr": repr(spec)}

    return rows(unowned, row, what="spec")


@attrs.frozen(kw_only=True)
class ScheduleView:
    """A schedule on the status page: its next fire, and its last one as last read."""

    schedule: Schedule
    last: dt.datetime | None
    unserved: bool = False


def schedule_rows(views: Sequence[ScheduleView], now: dt.datetime | None) -> Rows:
    def row(view: ScheduleView) -> dict[str, Any]:
        schedule = view.schedule
        upcoming = None if now is None else schedule.next_fire(now)
        queue = schedule.item_queue + (" (not served here)" if view.unserved else "")
        return {
            "name": schedule.name,
            "spec": schedule.spec_id,
            "cron": schedule.cron,
            "zone": schedule.timezone,
            "queue": queue,
            "next": "" if upcoming is None else _when(upcoming, now),
            "last": "none found" if view.last is None else _stamp(view.last),
        }

    return rows(views, row, what="schedule", limit=None)


# -- item pages ----------------------------------------------------------------------------------


async def lineage(queue: WorkQueue, item: WorkItem) -> list[dict[str, str | None]]:
    """*item*'s ancestors, the root first (at most :data:`_LINEAGE`; a deleted one says so)."""
    steps: list[dict[str, str | None]] = []
    parent_id = item.parent_id
    while parent_id is not None and len(steps) < _LINEAGE:
        try:
            parent = await queue.get(parent_id)
        except ItemNotFound:
            steps.append({"id": None, "text": f"{parent_id} (deleted)"})
            break
        steps.append(
            {"id": parent.id, "spec": parent.spec_id, "state": str(parent.state), "text": None}
        )
        parent_id = parent.parent_id
    if parent_id is not None and len(steps) >= _LINEAGE:
        steps.append({"id": None, "text": "…"})
    return steps[::-1]


def journal_context(journal: Journal | None) -> dict[str, Any]:
    """A durable workflow's journal for the item page: its steps (sleeps, waits, markers) in
    order and the events sent to it; both empty for any other item."""
    if journal is None:
        return {"steps": [], "events": []}
    steps = [
        {"position": e.position, "kind": str(e.kind), "name": e.name, "text": entry_text(e)}
        for e in journal.entries
    ]
    events = [
        {"name": e.name, "at": f"{stamp(e.sent_at)} UTC", "payload": json.dumps(e.payload)}
        for e in journal.events
    ]
    return {"steps": steps, "events": events}


def item_page_context(item: WorkItem, children: Sequence[WorkItem]) -> dict[str, Any]:
    """The item page's fields, error history (summary and traceback apart) and children."""
    fields = [
        (name, json.dumps(getattr(item, name), indent=2, sort_keys=True, ensure_ascii=False))
        if name in ("config", "result")
        else (name, value)
        for name, value in item_fields(item)
    ]
    history = _history(item)

    def child(row: WorkItem) -> dict[str, Any]:
        return {"id": row.id, "spec": row.spec_id, "state": str(row.state), "due": due_text(row)}

    shown = rows(children, child, what="child", empty="no children", limit=_CHILDREN)
    return {"fields": fields, "history": history, "children": shown}
