"""The console's pages: the status page, the item lists, the dead items and one item's page.
Every read of the queue is bounded and shared with ``/metrics`` (:mod:`._metrics`); what a page
shows is made of plain rows (:mod:`._views`) rendered from the package's templates, with the
flash message a redirect left and the CSRF token of the page's forms.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import math
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

import attrs
import trio

from .._errors import ItemNotFound
from .._operations import read_journal
from ..queues import ErrorHistoryStore, ItemError, ItemState, WorkItem
from ..queues._ports import Capability, capabilities_of
from ._actions import item_actions
from ._auth import ConsoleKeys
from ._metrics import QueueReads
from ._views import (
    PAGE_HEADERS,
    PAGE_SIZE,
    QueueView,
    ScheduleView,
    audit_row,
    count_rows,
    due_row,
    error_row,
    item_error_row,
    item_page_context,
    journal_context,
    lineage,
    list_row,
    queue_rows,
    render,
    rows,
    schedule_rows,
    unowned_rows,
    worker_row,
)
from ._web import FLASH_COOKIE, Request, Response, Visit, cookie, page_query, text

if TYPE_CHECKING:
    from ._app import OperationsApp

__all__ = ["Pages"]

logger = logging.getLogger("trio_supervise.http")

T = TypeVar("T")

AUDIT_SHOWN = 20
"""The most recent audit entries the status page shows."""
ERRORS_SHOWN = 10
"""The most recent item errors the status page shows (``/errors`` pages through them all)."""


async def _answered(
    read: Callable[[], Awaitable[list[T]]], what: str, refused: type[Exception], why: str
) -> tuple[list[T], str | None]:
    """What *read* returns within 5 seconds, or no rows and why: *why* when it raises
    *refused* (a bad cursor), else what went wrong. A page says so; it does not fail."""
    try:
        with trio.fail_after(5):
            return await read(), None
    except refused:
        return [], why
    except Exception as error:
        logger.warning("%s failed", what, exc_info=True)
        return [], f"the queue did not answer: {type(error).__name__}: {error}"


@attrs.define(eq=False)
class Pages:
    """The pages of the console *app*: its settings, health and queue, read through *reads*."""

    _app: OperationsApp = attrs.field(repr=False)
    _keys: ConsoleKeys = attrs.field(repr=False)
    _reads: QueueReads | None = attrs.field(repr=False)

    def html(self, request: Request, visit: Visit, template: str, **context: Any) -> Response:
        """A console page: the flash message a redirect left (then cleared), the CSRF token
        for its forms, and the security headers."""
        headers = list(PAGE_HEADERS)
        flash = self._keys.unsign(request.cookies.get(FLASH_COOKIE))
        if FLASH_COOKIE in request.cookies:
            cleared = cookie(FLASH_COOKIE, "", secure=request.secure, max_age=0)
            headers.append((b"set-cookie", cleared))
        page = render(
            template,
            title=self._app.title,
            page_title=context.pop("page_title", None),
            refresh=context.pop("refresh", None),
            read_only=self._app.read_only,
            csrf=visit.csrf,
            flash=None if flash is None else {"ok": flash[0], "text": flash[1]},
            **context,
        )
        # Stored text may hold lone surrogates (no UTF-8 for them): shown as escapes, never a 500.
        return Response(200, headers, page.encode("utf-8", "backslashreplace"))

    async def _queue_view(self) -> QueueView:
        queue, reads = self._app.queue, self._reads
        assert queue is not None
        assert reads is not None
        await reads.depth.refresh()
        counts = await reads.depth.source.get()
        due = await reads.due.get() if counts.value is not None else None
        problem = counts.problem or (None if due is None else due.problem)
        now: dt.datetime | None = None
        try:
            now = queue.clock.now()
        except Exception:
            logger.debug("queue clock failed", exc_info=True)
        unowned = await self._unowned(counts.value, now)
        read = reads.depth.read
        return QueueView(
            counts=counts.value,
            due=() if due is None else due.value or (),
            now=now,
            problem=problem,
            unowned=unowned,
            queues=() if read is None else read.queues,
            lags={} if read is None else read.queue_lags,
            limits=self._app.queue_limits,
            throttled_keys=None if read is None else read.throttled_keys,
        )

    async def _unowned(
        self, counts: Mapping[tuple[str, ItemState], int] | None, now: dt.datetime | None
    ) -> list[tuple[str, int]]:
        """(spec, queued count) of specs with due work that no driver of this service owns."""
        owned, queue = self._app.owned_specs, self._app.queue
        if owned is None or counts is None or now is None:
            return []
        assert queue is not None
        queued = {
            spec: count
            for (spec, state), count in counts.items()
            if state == ItemState.QUEUED and count and spec not in owned
        }
        found = []
        for spec in sorted(queued)[:50]:
            try:
                due = await queue.next_due_at([spec])
            except Exception:
                logger.debug("next_due_at(%r) failed", spec, exc_info=True)
                continue
            if due is not None and due <= now:
                found.append((spec, queued[spec]))
        return found

    async def _schedule_views(self) -> list[ScheduleView]:
        last: Mapping[str, dt.datetime | None] = {}
        if self._reads is not None and self._reads.fires is not None:
            last = await self._reads.fires.refresh()
        served = self._app.queue_limits
        return [
            ScheduleView(
                schedule=schedule,
                last=last.get(schedule.name),
                unserved=served is not None and schedule.item_queue not in served,
            )
            for schedule in self._app.schedules
        ]

    async def status_page(self, request: Request, visit: Visit) -> Response:
        app, states = self._app, list(ItemState)
        view = None if app.queue is None else await self._queue_view()
        queue: dict[str, Any] | None = None
        if view is not None:
            queue = {
                "problem": view.problem,
                "queues": queue_rows(view, states) if view.counts is not None else None,
                "throttled_keys": view.throttled_keys,
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
        schedules = schedule_rows(await self._schedule_views(), now) if app.schedules else None
        audit = await app.audit.recent(AUDIT_SHOWN)
        stored = None
        if self._history() is not None:
            found, problem = await self._errors(ERRORS_SHOWN, None)
            stored = rows(found, item_error_row, what="error", empty=problem or "none")
        healthy = app.source.healthy
        return self.html(
            request,
            visit,
            "status.html",
            refresh=max(1, math.ceil(app.refresh)),
            verdict="healthy" if healthy else "unhealthy",
            warnings=app.warnings,
            workers=rows(app.source.workers(), worker_row, what="worker", empty="no workers"),
            queue=queue,
            states=states,
            schedules=schedules,
            item_errors=stored,
            errors=rows(app.source.recent_errors(), error_row, what="error", empty="none"),
            audit=rows(audit, audit_row, what="entry") if audit else None,
        )

    def _history(self) -> ErrorHistoryStore | None:
        """The queue, if it reads its items' error histories (``Capability.ERROR_HISTORY``)."""
        queue = self._app.queue
        if queue is not None and Capability.ERROR_HISTORY in capabilities_of(queue):
            return cast(ErrorHistoryStore, queue)
        return None

    async def _errors(self, limit: int, before: str | None) -> tuple[list[ItemError], str | None]:
        """A page of the items' errors (newest first, after the cursor *before*), or why
        there is none."""
        store = self._history()
        if store is None:
            return [], "this queue keeps no error history"
        return await _answered(
            functools.partial(store.recent_errors, limit=limit, before=before),
            "reading recent errors",
            ValueError,
            f"not a cursor of this list ({before}); start from the first page",
        )

    async def errors_page(self, request: Request, visit: Visit) -> Response:
        before = request.first("before") or None
        found, problem = await self._errors(PAGE_SIZE, before)
        return self.html(
            request,
            visit,
            "errors.html",
            page_title="errors",
            item_errors=rows(found, item_error_row, what="error", empty="no errors", limit=None),
            problem=problem,
            first_page="/errors" if before else None,
            next_page=(
                f"/errors?{page_query(before=found[-1].cursor)}"
                if len(found) == PAGE_SIZE
                else None
            ),
        )

    async def _list(
        self, states: list[ItemState] | None, specs: list[str] | None, after: str | None
    ) -> tuple[list[WorkItem], str | None]:
        """A page of items (keyset: the ones after *after*), or why there is none."""
        queue = self._app.queue
        assert queue is not None
        return await _answered(
            functools.partial(
                queue.list_items, states=states, spec_ids=specs, limit=PAGE_SIZE, after=after
            ),
            "listing items",
            ItemNotFound,
            f"the item this page starts after ({after}) is gone; start from the first",
        )

    async def items_page(self, request: Request, visit: Visit) -> Response:
        known = {state.value for state in ItemState}
        chosen = [state for state in request.query.get("state", []) if state in known]
        spec = request.first("spec")
        after = request.first("after") or None
        states = [ItemState(state) for state in chosen] or None
        items, problem = await self._list(states, [spec] if spec else None, after)
        assert self._reads is not None
        counts = (await self._reads.depth.source.get()).value or {}
        query: dict[str, str | list[str] | None] = {"state": chosen, "spec": spec}
        return self.html(
            request,
            visit,
            "items.html",
            page_title="items",
            states=[state.value for state in ItemState],
            chosen_states=chosen,
            specs=sorted({name for name, _ in counts} | ({spec} if spec else set())),
            chosen_spec=spec,
            items=rows(items, list_row, what="item", empty="no items", limit=None),
            problem=problem,
            first_page=f"/items?{page_query(**query)}" if after else None,
            next_page=(
                f"/items?{page_query(**query, after=items[-1].id)}"
                if len(items) == PAGE_SIZE
                else None
            ),
        )

    async def dead_page(self, request: Request, visit: Visit) -> Response:
        after = request.first("after") or None
        items, problem = await self._list([ItemState.DEAD], None, after)
        here = "/dead" + (f"?{page_query(after=after)}" if after else "")
        return self.html(
            request,
            visit,
            "dead.html",
            page_title="dead items",
            here=here,
            items=rows(items, list_row, what="item", empty="no dead items", limit=None),
            problem=problem,
            first_page="/dead" if after else None,
            next_page=(
                f"/dead?{page_query(after=items[-1].id)}" if len(items) == PAGE_SIZE else None
            ),
        )

    async def item_page(self, item_id: str, request: Request, visit: Visit) -> Response:
        queue = self._app.queue
        assert queue is not None
        try:
            item = await queue.get(item_id)
        except ItemNotFound:
            return text(404, f"no item {item_id!r}")
        children = await queue.list_children(item.id, limit=101)
        back = f"/items/{urllib.parse.quote(item.id, safe='', errors='surrogatepass')}"
        return self.html(
            request,
            visit,
            "item.html",
            page_title=f"item {item.id}",
            actions=[] if self._app.read_only else item_actions(item, back),
            lineage=await lineage(queue, item),
            **item_page_context(item, children),
            **journal_context(await read_journal(queue, item.id)),
        )
