"""The console's actions: a form posted under the console's CSRF token, carried out through the
one rule the command line uses too (:mod:`trio_supervise._operations`), recorded in the audit
trail, and answered with a redirect back and a signed flash message (POST/redirect/GET).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from .._audit import AuditEntry
from .._errors import DuplicateItem, ItemNotFound, SuperviseError
from .._operations import (
    cancel_item,
    delete_item,
    fire_schedule,
    pause_queue,
    resume_queue,
    retry_item,
    run_item_now,
)
from ..maintenance import Schedule
from ..queues import ItemState, WorkItem, WorkQueue
from ._auth import ConsoleKeys
from ._metrics import QueueReads
from ._views import quote_part
from ._web import FLASH_COOKIE, TEXT, Request, Response, Visit, cookie, local_path, text

if TYPE_CHECKING:
    from ._app import OperationsApp

__all__ = ["ITEM_ACTIONS", "QUEUE_ACTIONS", "Actions", "Done", "item_actions", "perform"]

logger = logging.getLogger("trio_supervise.http")

MAX_BULK = 1000
"""The most items one bulk retry takes."""

ITEM_ACTIONS = ("retry", "cancel", "delete", "run-now")
QUEUE_ACTIONS = ("pause", "resume")
SCHEDULE_ACTIONS = ("fire",)


@attrs.frozen
class Done:
    """What an action did: whether it was done, what to tell the operator, and its target."""

    ok: bool
    message: str
    target: str


async def _item_action(queue: WorkQueue, action: str, item_id: str) -> str:
    if action == "retry":
        return (await retry_item(queue, item_id))[1]
    if action == "run-now":
        return (await run_item_now(queue, item_id))[1]
    if action == "cancel":
        return (await cancel_item(queue, item_id))[1]
    return (await delete_item(queue, item_id))[1]


async def perform(
    queue: WorkQueue,
    kind: str,
    name: str,
    action: str,
    *,
    ids: Sequence[str] = (),
    schedules: Mapping[str, Schedule],
    known_queues: Iterable[str],
) -> Done:
    """Carry out one action of the console: *action* on the item, queue or schedule *name*
    (*kind* ``items``, ``queues``, ``schedules``), or a bulk retry of *ids* (*kind* ``dead``).
    A refusal (the action does not apply, the thing is unknown) is a :class:`Done` with
    ``ok=False`` saying why, never an exception."""
    target = {"items": "item", "queues": "queue", "schedules": "schedule"}.get(kind, "items")
    where = f"{target}:{name}" if kind != "dead" else f"items:{len(ids)}"
    try:
        if kind == "items":
            return Done(True, await _item_action(queue, action, name), where)
        if kind == "queues":
            known = set(known_queues) | {info.name for info in await queue.list_queues()}
            if name not in known:
                listed = ", ".join(sorted(known)) or "none"
                return Done(False, f"no queue {name!r} is known (known: {listed})", where)
            switch = pause_queue if action == "pause" else resume_queue
            return Done(True, (await switch(queue, name))[1], where)
        if kind == "schedules":
            schedule = schedules.get(name)
            if schedule is None:
                return Done(False, f"no schedule {name!r} in this service", where)
            return Done(True, (await fire_schedule(queue, schedule))[1], where)
        return await _bulk_retry(queue, ids, where)
    except ItemNotFound:
        return Done(False, f"no item {name!r}", where)
    except DuplicateItem:
        return Done(False, f"{name} was fired a moment ago already", where)
    except SuperviseError as error:  # ActionRefused, ItemStateError: the rule said no
        return Done(False, str(error), where)


async def _bulk_retry(queue: WorkQueue, ids: Sequence[str], where: str) -> Done:
    if not ids:
        return Done(False, "no items were selected", where)
    refused: list[str] = []
    for item_id in ids:
        try:
            await retry_item(queue, item_id)
        except ItemNotFound:
            refused.append(f"no item {item_id!r}")
        except SuperviseError as error:
            refused.append(str(error))
    done = len(ids) - len(refused)
    message = f"retried {done} of {len(ids)}" + (f"; {'; '.join(refused)}" if refused else "")
    return Done(done > 0, message, where)


@attrs.frozen
class _Action:
    path: str
    label: str
    back: str
    danger: bool = False


def item_actions(item: WorkItem, back: str) -> list[_Action]:
    """The actions the item page offers for *item*'s state (the rules of ``_operations``)."""
    base = f"/items/{quote_part(item.id)}"
    found = []
    if item.state.finished:
        found.append(_Action(f"{base}/retry", "Retry", back))
    if item.state is ItemState.QUEUED and not item.waiting:
        found.append(_Action(f"{base}/run-now", "Run now", back))
    if item.state in (ItemState.QUEUED, ItemState.RUNNING):
        found.append(_Action(f"{base}/cancel", "Cancel", back, danger=True))
    if item.state is not ItemState.RUNNING:
        found.append(_Action(f"{base}/delete", "Delete", "/items", danger=True))
    return found


@attrs.define(eq=False)
class Actions:
    """The console's actions on the queue of *app*, under the CSRF keys *keys*."""

    _app: OperationsApp = attrs.field(repr=False)
    _keys: ConsoleKeys = attrs.field(repr=False)
    _reads: QueueReads | None = attrs.field(repr=False)

    async def act(
        self, kind: str, name: str, action: str, request: Request, visit: Visit
    ) -> Response:
        """One action: refused unless the console acts and the form is its own (CSRF), then
        done, recorded in the audit trail, and answered with a redirect back and a flash."""
        app = self._app
        queue = app.queue
        assert queue is not None
        if app.read_only:
            return text(403, "forbidden: this console is read-only (http.read_only)")
        if request.headers.get("sec-fetch-site") == "cross-site":
            return text(403, "forbidden: a form of another site")
        try:
            form = await request.form()
        except ValueError as error:
            return text(400, f"bad request: {error}")
        token = (form.get("csrf") or [""])[0]
        if visit.new_session or not self._keys.csrf_ok(visit.session, token):
            logger.warning(
                "console: refused %s %s/%s from %s: missing or wrong CSRF token",
                action,
                kind,
                name,
                request.client,
            )
            return text(403, "forbidden: missing or wrong CSRF token; reload the page and retry")
        ids = form.get("id", [])[:MAX_BULK] if kind == "dead" else []
        done = await perform(
            queue,
            kind,
            name,
            action,
            ids=ids,
            schedules={schedule.name: schedule for schedule in app.schedules},
            known_queues=[
                *(app.queue_limits or {}),
                *(schedule.item_queue for schedule in app.schedules),
            ],
        )
        if self._reads is not None:
            self._reads.invalidate()  # the page the redirect leads to shows what changed
        entry = AuditEntry(
            at=queue.clock.now(),
            who=visit.who,
            address=request.client,
            action="bulk-retry" if kind == "dead" else action,
            target=done.target,
            ok=done.ok,
            result=done.message,
        )
        await app.audit.record(entry)
        logger.info(
            "console: %s by %s from %s on %s: %s%s",
            entry.action,
            entry.who,
            entry.address,
            entry.target,
            "" if done.ok else "refused: ",
            done.message,
        )
        back = local_path((form.get("next") or ["/"])[0])
        flash = self._keys.sign(done.ok, done.message)
        headers = [
            (b"location", back.encode("utf-8", "surrogatepass")),
            (b"set-cookie", cookie(FLASH_COOKIE, flash, secure=request.secure, max_age=60)),
            TEXT,
        ]
        return Response(303, headers, b"see other\n")
