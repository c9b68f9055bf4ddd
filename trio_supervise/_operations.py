"""What an operator can do to an item, a queue or a schedule: one rule per action, shared by the
command line and the console.

Each action reads the item (or queue) first and refuses, with :class:`ActionRefused` naming the
state and what to do instead, where it does not apply; otherwise it calls the one
:class:`WorkQueue` operation that does it and returns the thing as it is now with one sentence
saying what happened. The store still has the last word: a state that changed in between makes
its own :class:`ItemStateError`, which callers show the same way.

========  =======================================================================================
action    applies to
========  =======================================================================================
retry     a completed, cancelled or dead item: queued again, due now (error count and attempts
          reset). A queued one is refused (it has a due time: *run now* moves it), a running one
          too (cancel it first).
run now   a queued item, made due now (``retry(at=now)``: its error count and attempts reset). An
          item waiting for its children is refused (it would stop waiting), as is any other state.
cancel    a queued item (cancelled at once) or a running one (its worker is asked to stop it);
          already cancelled: nothing to do; completed or dead: refused.
delete    any item not running; the store refuses one waiting for its children, or a child its
          parent waits for.
pause     a named queue, fleet-wide (claims stop at the next claim); resume undoes it.
fire      a schedule: one item due now, with an id no regular fire has (see
          :func:`~trio_supervise.maintenance.fire_now`).
event     a queued or running item of a store with durable journals: the event is kept for it
          (a durable workflow waiting for it is due at once); an unknown or finished item, or a
          store without journals, is refused.
========  =======================================================================================
"""

from __future__ import annotations

import datetime as dt

from ._errors import SuperviseError
from .maintenance import Schedule, fire_now
from .queues import ItemState, Journal, JSONValue, RateLimit, WorkItem, WorkQueue
from .queues._ports import (
    Capability,
    DurableJournal,
    KeyRateLimitStore,
    RateLimitStore,
    capabilities_of,
)

__all__ = [
    "ActionRefused",
    "cancel_item",
    "delete_item",
    "fire_schedule",
    "read_journal",
    "send_event",
    "pause_queue",
    "resume_queue",
    "retry_item",
    "run_item_now",
]


class ActionRefused(SuperviseError):
    """An action that does not apply to the item in its state; the message says why and what
    would."""


def _stamp(at: dt.datetime) -> str:
    return at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


async def retry_item(
    queue: WorkQueue,
    item_id: str,
    *,
    at: dt.datetime | None = None,
    move_queued: bool = False,
    queued_hint: str = "use run now to make it due now",
) -> tuple[WorkItem, str]:
    """Requeue a finished item, due at *at* (default: now). A queued item is moved only with
    *move_queued* (else refused, with *queued_hint*); a running one is refused."""
    current = await queue.get(item_id)
    if current.state is ItemState.RUNNING:
        raise ActionRefused(f"{item_id} is running; cancel it first")
    if current.state is ItemState.QUEUED and not move_queued:
        raise ActionRefused(
            f"{item_id} is queued (due {_stamp(current.due_at)} UTC); {queued_hint}"
        )
    item = await queue.retry(item_id, at=at)
    return item, f"requeued {item.id}, due {_stamp(item.due_at)} UTC"


async def run_item_now(queue: WorkQueue, item_id: str) -> tuple[WorkItem, str]:
    """Make a queued item due now (see the module doc)."""
    current = await queue.get(item_id)
    if current.state is ItemState.RUNNING:
        raise ActionRefused(f"{item_id} is running already")
    if current.state is not ItemState.QUEUED:
        raise ActionRefused(f"{item_id} is {current.state}; retry it to queue it again")
    if current.waiting:
        n = current.waiting_children
        raise ActionRefused(
            f"{item_id} is waiting for {n} {'child' if n == 1 else 'children'}; running it now "
            "would stop it waiting for them"
        )
    item = await queue.retry(item_id, at=queue.clock.now())
    return item, f"{item.id} is due now (its error count and attempts were reset)"


async def cancel_item(queue: WorkQueue, item_id: str) -> tuple[WorkItem, str]:
    """Cancel a queued item, or ask a running item's worker to stop it."""
    before = await queue.get(item_id)
    if before.state in (ItemState.COMPLETED, ItemState.DEAD):
        raise ActionRefused(f"{item_id} is {before.state}; nothing to cancel")
    if before.state is ItemState.CANCELLED:
        return before, f"{item_id} is already cancelled"
    item = await queue.request_cancel(item_id)
    if item.state is ItemState.CANCELLED:
        return item, f"cancelled {item_id}"
    if before.cancel_requested:
        return item, f"cancellation of {item_id} was already requested; its worker will stop it"
    return item, f"cancellation requested for {item_id} ({item.state}); its worker will stop it"


async def delete_item(queue: WorkQueue, item_id: str) -> tuple[WorkItem, str]:
    """Delete an item that is not running (the store refuses the rest, saying why)."""
    item = await queue.delete(item_id)
    return item, f"deleted {item.id} ({item.spec_id}, {item.state})"


async def pause_queue(queue: WorkQueue, name: str) -> tuple[bool, str]:
    """Pause the named queue fleet-wide; whether it changed, and a sentence saying so."""
    changed = await queue.pause_queue(name)
    return changed, f"paused {name}" if changed else f"{name} was paused already"


async def resume_queue(queue: WorkQueue, name: str) -> tuple[bool, str]:
    """Resume the named queue; whether it changed, and a sentence saying so."""
    changed = await queue.resume_queue(name)
    return changed, f"resumed {name}" if changed else f"{name} was not paused"


async def set_rate_limit(queue: WorkQueue, name: str, rate: RateLimit | None) -> tuple[bool, str]:
    """Set (or with None lift) the named queue's rate limit fleet-wide; whether the store
    keeps rate limits (False: nothing changed), and a sentence saying what happened."""
    if Capability.RATE_LIMITS not in capabilities_of(queue) or not isinstance(
        queue, RateLimitStore
    ):
        return False, f"this store keeps no rate limits: {name} is unchanged"
    await queue.set_rate_limit(name, rate)
    if rate is None:
        return True, f"{name} has no rate limit"
    return True, f"{name}: at most {rate.limit} starts in any {rate.period:g} s ({rate})"


async def set_key_rate_limit(
    queue: WorkQueue, key: str, rate: RateLimit | None
) -> tuple[bool, str]:
    """Set (or with None lift) the rate limit of a concurrency key or template fleet-wide;
    whether the store keeps key rate limits (False: nothing changed), and a sentence."""
    if Capability.KEY_RATE_LIMITS not in capabilities_of(queue) or not isinstance(
        queue, KeyRateLimitStore
    ):
        return False, f"this store keeps no key rate limits: {key} is unchanged"
    await queue.set_key_rate_limit(key, rate)
    if rate is None:
        return True, f"key {key} has no rate limit"
    each = " (each key it renders)" if "{" in key else ""
    return True, f"key {key}{each}: at most {rate.limit} starts in any {rate.period:g} s ({rate})"


async def fire_schedule(queue: WorkQueue, schedule: Schedule) -> tuple[WorkItem, str]:
    """Enqueue *schedule*'s item due now, by hand."""
    item = await fire_now(queue, schedule)
    return item, f"fired {schedule.name}: {item.id} is due now in queue {item.queue}"


def _journals(queue: WorkQueue) -> DurableJournal | None:
    """*queue* as its durable journal port, or None if it declares none."""
    if Capability.DURABLE_JOURNAL not in capabilities_of(queue):
        return None
    port: DurableJournal = queue  # type: ignore[assignment]
    return port


async def read_journal(queue: WorkQueue, item_id: str) -> Journal | None:
    """*item_id*'s durable journal and events, or None when the store keeps none."""
    port = _journals(queue)
    return None if port is None else await port.read_journal(item_id)


async def send_event(
    queue: WorkQueue, item_id: str, name: str, payload: JSONValue
) -> tuple[WorkItem, str]:
    """Send event *name* to *item_id*; the item as it is now and a sentence saying so."""
    port = _journals(queue)
    if port is None:
        raise ActionRefused(f"this store ({type(queue).__name__}) keeps no durable journals")
    await port.send_event(item_id, name, payload)
    item = await queue.get(item_id)
    return item, f"sent event {name!r} to {item_id!r} ({item.state}, due {_stamp(item.due_at)})"
