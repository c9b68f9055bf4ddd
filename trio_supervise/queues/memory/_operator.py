"""The memory queue's operator side (:class:`OperatorSide`): what a person or a console reads
(items, counts, children, queues) and does (cancel, retry, delete, edit a config, pause a queue).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

import trio

from ..._clock import utc
from ..._errors import ItemNotFound, ItemStateError
from ...job import (
    ItemError,
    ItemState,
    JSONValue,
    QueueInfo,
    RateLimit,
    WorkItem,
    check_config,
    check_errors_page,
    check_key_rule,
    check_prune_limit,
    check_queue_name,
    check_rate,
    check_tags,
    item_errors,
    newest_errors,
    rule_for,
)
from ._state import MemoryState

__all__ = ["OperatorSide"]


class OperatorSide(MemoryState):
    """What a person (the CLI, the console) reads and does (:class:`OperatorStore`)."""

    __slots__ = ()

    def _item(self, item_id: str) -> WorkItem:
        try:
            return self._items[item_id]
        except KeyError:
            raise ItemNotFound(item_id) from None

    async def get(self, item_id: str) -> WorkItem:
        await trio.lowlevel.checkpoint()
        return self._out(self._item(item_id))

    async def list_items(
        self,
        *,
        states: Sequence[ItemState] | None = None,
        spec_ids: Sequence[str] | None = None,
        limit: int = 100,
        after: str | None = None,
        tags: Sequence[str] | None = None,
    ) -> list[WorkItem]:
        await trio.lowlevel.checkpoint()
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        wanted = check_tags(tags or ())
        cursor = None if after is None else self._item(after)
        found = [
            item
            for item in self._items.values()
            if (states is None or item.state in states)
            and (spec_ids is None or item.spec_id in spec_ids)
            and all(tag in item.tags for tag in wanted)
            and (cursor is None or (item.due_at, item.id) > (cursor.due_at, cursor.id))
        ]
        found.sort(key=lambda item: (item.due_at, item.id))
        out = self._out
        return [out(item) for item in found[:limit]]

    async def recent_errors(self, *, limit: int = 50, before: str | None = None) -> list[ItemError]:
        """The entries of every item's error history, newest first (see
        :class:`~trio_supervise.queues.ErrorHistoryStore`)."""
        await trio.lowlevel.checkpoint()
        limit, key = check_errors_page(limit, before)
        return newest_errors(item_errors(self._items.values(), key), limit)

    async def counts(self) -> Mapping[tuple[str, ItemState], int]:
        await trio.lowlevel.checkpoint()
        totals: dict[tuple[str, ItemState], int] = {}
        for item in self._items.values():
            key = (item.spec_id, item.state)
            totals[key] = totals.get(key, 0) + 1
        return totals

    async def list_children(self, parent_id: str, *, limit: int = 1000) -> list[WorkItem]:
        await trio.lowlevel.checkpoint()
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        # An id deleted since (or taken again by another item) is no longer this parent's child;
        # one deleted and created again as its child is listed once.
        found = [
            child
            for child_id in dict.fromkeys(self._children_of.get(parent_id, ()))
            if (child := self._items.get(child_id)) is not None and child.parent_id == parent_id
        ]
        found.sort(key=lambda item: (item.created_at, item.id))
        out = self._out
        return [out(item) for item in found[:limit]]

    async def list_queues(self) -> list[QueueInfo]:
        await trio.lowlevel.checkpoint()
        counts: dict[str, dict[ItemState, int]] = {name: {} for name in self._paused}
        counts.update((name, {}) for name in self._rates)
        for item in self._items.values():
            per_state = counts.setdefault(item.queue, {})
            per_state[item.state] = per_state.get(item.state, 0) + 1
        now = self._now()
        return [
            QueueInfo(
                name=name,
                paused=name in self._paused,
                paused_at=self._paused.get(name),
                counts=counts[name],
                rate_limit=self._rates[name][0] if name in self._rates else None,
                throttled_until=self._throttled(name, now),
            )
            for name in sorted(counts)
        ]

    async def request_cancel(self, item_id: str) -> WorkItem:
        await trio.lowlevel.checkpoint()
        item = self._item(item_id)
        if item.state is ItemState.QUEUED:
            now = self._now()
            # A parent cancelled while it waits for children waits no more.
            item = self._put(
                item, now, state=ItemState.CANCELLED, cancel_requested=True, waiting_children=0
            )
            self._child_finished(item_id, now)
        elif item.state is ItemState.RUNNING and not item.cancel_requested:
            item = self._put(item, cancel_requested=True)
        self._log("request_cancel", item_id, state=str(item.state))
        self._changed()
        return self._out(item)

    async def retry(self, item_id: str, *, at: dt.datetime | None = None) -> WorkItem:
        await trio.lowlevel.checkpoint()
        item = self._item(item_id)
        if item.state is ItemState.RUNNING:
            raise ItemStateError(f"item {item_id!r} is running; cancel it first")
        now = self._now()
        item = self._requeue(
            item,
            now if at is None else utc(at),
            now,
            error_count=0,
            attempt=0,
            cancel_requested=False,
            waiting_children=0,
        )
        self._log("retry", item_id)
        self._changed()
        return self._out(item)

    async def delete(self, item_id: str) -> WorkItem:
        await trio.lowlevel.checkpoint()
        item = self._item(item_id)
        if item.state is ItemState.RUNNING:
            raise ItemStateError(f"item {item_id!r} is running; cancel it first")
        if getattr(item, "waiting_children", 0):
            raise ItemStateError(f"item {item_id!r} is waiting for its children")
        if self._waited_for(item_id):
            raise ItemStateError(
                f"item {item_id!r} is a child its parent waits for; cancel it first (the parent "
                "counts it), then delete it"
            )
        self._remove(item)
        self._log("delete", item_id)
        self._changed()
        return self._out(item)

    async def edit_config(self, item_id: str, config: JSONValue) -> WorkItem:
        await trio.lowlevel.checkpoint()
        config = check_config(config)
        item = self._item(item_id)
        if item.state is ItemState.RUNNING:
            raise ItemStateError(
                f"item {item_id!r} is running; its config can change once it is not"
            )
        item = self._put(item, config=config)
        self._log("edit_config", item_id)
        return self._out(item)

    async def pause_queue(self, queue: str) -> bool:
        await trio.lowlevel.checkpoint()
        check_queue_name(queue)
        if queue in self._paused:
            return False
        self._paused[queue] = self._now()
        self._log("pause_queue", queue)
        self._changed()
        return True

    async def resume_queue(self, queue: str) -> bool:
        await trio.lowlevel.checkpoint()
        check_queue_name(queue)
        if self._paused.pop(queue, None) is None:
            return False
        self._log("resume_queue", queue)
        self._changed()
        return True

    async def set_rate_limit(self, queue: str, rate: RateLimit | None) -> None:
        await trio.lowlevel.checkpoint()
        check_queue_name(queue)
        if rate is None:
            self._rates.pop(queue, None)
        else:
            rate = check_rate(rate)
            # The latest `limit` starts recorded so far count against the new limit.
            starts = self._rates[queue][1][-rate.limit :] if queue in self._rates else []
            self._rates[queue] = (rate, starts)
        self._log("set_rate_limit", queue, rate=None if rate is None else str(rate))
        self._changed()

    async def set_key_rate_limit(self, key: str, rate: RateLimit | None) -> None:
        await trio.lowlevel.checkpoint()
        key = check_key_rule(key)
        if rate is None:
            self._key_rules.pop(key, None)
        else:
            self._key_rules[key] = check_rate(rate)
        # Each key's log stays while a rule holds it (the latest starts count against a
        # changed limit); a key no rule holds any more forgets its starts.
        rules = sorted(self._key_rules)
        for held in list(self._key_starts):
            rule = rule_for(held, rules)
            if rule is None:
                del self._key_starts[held]
            else:
                self._key_starts[held] = self._key_starts[held][-self._key_rules[rule].limit :]
        self._log("set_key_rate_limit", key, rate=None if rate is None else str(rate))
        self._changed()

    async def key_rate_limits(self) -> dict[str, RateLimit]:
        await trio.lowlevel.checkpoint()
        return dict(sorted(self._key_rules.items()))

    async def prune_key_logs(self, *, limit: int | None = None) -> int:
        await trio.lowlevel.checkpoint()
        check_prune_limit(limit)
        longest = max((rule.period for rule in self._key_rules.values()), default=0.0)
        cutoff = self._now() - dt.timedelta(seconds=longest)
        stale = sorted(
            key for key, starts in self._key_starts.items() if not starts or starts[-1] < cutoff
        )
        for key in stale[:limit]:
            del self._key_starts[key]
        return len(stale[:limit])

    async def throttled_keys(self) -> dict[str, dt.datetime]:
        await trio.lowlevel.checkpoint()
        now = self._now()
        out = {}
        for key in sorted(self._key_starts):
            until = self._key_throttled(key, now)
            if until is not None:
                out[key] = until
        return out
