"""The state machine's state and the model's side of every call (what a store must do)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from hypothesis.stateful import (
    RuleBasedStateMachine,
)

from ... import DuplicateItem
from ...job import WAITING_DUE_AT, ItemState, NewItem, RateLimit, SettleKind, Settlement
from ...queues import Capability, SeedWrites, WorkQueue
from ...queues._ports import DurableJournal, capabilities_of
from ._clock import START, ManualClock
from ._model import CLIMITS, POISON, POISON_REASON, TAGS, Model
from ._portal import Portal


class MachineState(RuleBasedStateMachine):
    """Random sequences of store calls; the store must agree with the model after each.

    A subclass binds ``clock``, ``portal`` and ``open_store``; each example opens a fresh store
    (in the portal's loop) and closes it at its end.
    """

    clock: ManualClock
    portal: Portal
    open_store: Callable[[ManualClock], AbstractAsyncContextManager[WorkQueue]]

    def __init__(self) -> None:
        super().__init__()
        self.clock.current = START
        self.queue, self._close = self.portal.enter(type(self).open_store(self.clock))
        self.combines = Capability.SETTLE_AND_CLAIM in capabilities_of(self.queue)
        self.seed = self.queue if isinstance(self.queue, SeedWrites) else None
        self.journals: DurableJournal | None = (
            self.queue  # type: ignore[assignment]
            if Capability.DURABLE_JOURNAL in capabilities_of(self.queue)
            else None
        )
        self.model: dict[str, Model] = {}
        self.paused: set[str] = set()
        self.rates: dict[str, tuple[RateLimit, list[dt.datetime]]] = {}
        """Rate-limited queues: the limit, and every claim's time since it was set."""
        self.key_rates: dict[str, RateLimit] = {}
        """Key rate limits, by key or template (``KEY_RULES``)."""
        self.key_starts: dict[str, list[dt.datetime]] = {}
        """Per key a rule holds, its claims' times (the latest ``limit`` in the window)."""
        self.serial = 0

    def teardown(self) -> None:
        self._close()

    # helpers

    def now(self) -> dt.datetime:
        return self.clock.now()

    def pick(self, index: int) -> Model:
        return self.model[sorted(self.model)[index % len(self.model)]]

    def live(self, key: str) -> list[dt.datetime]:
        """The live lease expiries of *key*'s running items."""
        now = self.now()
        return [
            m.lease_expires_at
            for m in self.model.values()
            if m.ckey == key
            and m.state is ItemState.RUNNING
            and m.lease_expires_at is not None
            and m.lease_expires_at > now
        ]

    def blocked_until(self, m: Model) -> dt.datetime | None:
        """When *m*'s key frees for it with no write in between: its limit-th latest live lease
        expiry; None if it is not blocked."""
        if m.ckey is None or m.climit is None:
            return None
        live = sorted(self.live(m.ckey), reverse=True)
        return live[m.climit - 1] if len(live) >= m.climit else None

    def rate_free(self, queue: str) -> int | None:
        """How many items of *queue* its rate limit lets start now (None: it has none): the
        limit less the claims within the last period."""
        if queue not in self.rates:
            return None
        rate, starts = self.rates[queue]
        since = self.now() - dt.timedelta(seconds=rate.period)
        return max(0, rate.limit - sum(1 for start in starts if start > since))

    def throttled_until(self, queue: str) -> dt.datetime | None:
        """While *queue*'s rate limit lets nothing start: when its limit-th latest claim leaves
        the window."""
        if self.rate_free(queue) != 0:  # None (no limit) or a free slot
            return None
        rate, starts = self.rates[queue]
        return sorted(starts)[-rate.limit] + dt.timedelta(seconds=rate.period)

    def key_rule(self, key: str | None) -> RateLimit | None:
        """The rate of the rule holding *key*: the key's own, else the template ``c{tenant}``
        (every key here renders from it); None if no rule holds it."""
        if key is None:
            return None
        if key in self.key_rates:
            return self.key_rates[key]
        return self.key_rates.get("c{tenant}")

    def key_free(self, key: str | None) -> int | None:
        """How many items of *key* its rule lets start now (None: no rule holds it)."""
        rate = self.key_rule(key)
        if rate is None or key is None:
            return None
        since = self.now() - dt.timedelta(seconds=rate.period)
        return max(0, rate.limit - sum(1 for at in self.key_starts.get(key, []) if at > since))

    def key_throttled_until(self, key: str | None) -> dt.datetime | None:
        """While *key*'s rule lets nothing start: when its limit-th latest claim leaves the
        window."""
        rate = self.key_rule(key)
        if rate is None or key is None or self.key_free(key) != 0:
            return None
        starts = self.key_starts[key]
        return sorted(starts)[-rate.limit] + dt.timedelta(seconds=rate.period)

    def version(self, item: Model, which: str) -> int:
        if which == "old" and item.old_versions:
            return item.old_versions[-1]
        if which in ("old", "future"):
            return item.lease_version + 1000
        return item.lease_version

    def apply(self, s: Settlement) -> bool:
        """The model's settle: what MemoryQueue._apply does."""
        item = self.model.get(s.item_id)
        if item is None or not item.holds(s.lease_version):
            return False
        woken, item.woken = item.woken, False  # every settlement clears it
        if s.kind is SettleKind.RESCHEDULE and s.config == POISON:
            # Unstorable in any backend: that entry alone goes dead, saying why.
            s = Settlement(
                item_id=s.item_id,
                lease_version=s.lease_version,
                kind=SettleKind.DEAD,
                error=f"the reschedule outcome could not be stored: {POISON_REASON}",
            )
        poisoned = [i for i, child in enumerate(s.children) if child.config == POISON]
        if poisoned:
            # An unstorable child: the parent's entry goes dead, and no child is written.
            s = Settlement(
                item_id=s.item_id,
                lease_version=s.lease_version,
                kind=SettleKind.DEAD,
                error=f"the {s.kind} outcome could not be stored: "
                f"children[{poisoned[0]}]: {POISON_REASON}",
            )
        later = self.now() + dt.timedelta(seconds=s.delay)
        if s.kind in (SettleKind.RETRY, SettleKind.DEAD) or (
            s.kind is SettleKind.RELEASE and s.error is not None
        ):
            assert s.error is not None
            item.add_error(self.now(), s.error)
        match s.kind:
            case SettleKind.CONTINUE:
                item.requeue(later)
                item.error_count = item.attempt = 0
            case SettleKind.RELEASE:
                # Handed back; with an error (not the item's own) it is recorded, never dead.
                item.requeue(later)
                item.attempt = max(item.attempt - 1, 0)
                if s.error is not None:
                    item.error_count, item.last_error = item.error_count + 1, s.error
            case SettleKind.RESCHEDULE:
                assert s.at is not None
                # An event came while it ran: the reschedule is due at once.
                item.requeue(self.now() if woken else s.at)
                item.config, item.error_count, item.attempt = s.config, 0, 0
            case SettleKind.RETRY:
                item.requeue(later)
                item.error_count, item.last_error = item.error_count + 1, s.error
            case SettleKind.COMPLETE:
                item.finish(ItemState.COMPLETED)
                item.result = s.result
            case SettleKind.CANCEL:
                item.finish(ItemState.CANCELLED)
            case SettleKind.DEAD:
                item.finish(ItemState.DEAD)
                item.error_count, item.last_error = item.error_count + 1, s.error
        if item.state.finished:
            self.child_finished(item)
        if s.children or s.wait_for_children:
            self.create_children(item, s)
        return True

    def create_children(self, parent: Model, s: Settlement) -> None:
        """The model of writing *s*'s children: an existing id or held key is skipped."""
        created = 0
        seen: set[str] = set()
        for child in s.children:
            assert child.item_id is not None
            if child.item_id in seen:
                continue
            seen.add(child.item_id)
            key = child.idempotency_key
            holders = [m for m in self.model.values() if key is not None and m.key == key]
            held = any(not m.lapsed(self.now()) for m in holders)
            if held or child.item_id in self.model:
                continue
            for m in holders:  # a lapsed holder: its key moves to released_key
                m.key, m.released_key = None, key
            created += 1
            self.model[child.item_id] = Model(
                id=child.item_id,
                spec_id=child.spec_id,
                due_at=self.now(),
                key=child.idempotency_key,
                config=child.config,
                parent_id=parent.id,
                waited_by=(parent.id, s.lease_version) if s.wait_for_children else None,
            )
        if s.wait_for_children:
            parent.waiting_children = created
            parent.due_at = WAITING_DUE_AT if created else self.now()

    def still_waited(self, child: Model) -> bool:
        """Whether *child*'s parent still waits for it (a cancelled parent waits no more)."""
        if child.waited_by is None:
            return False
        parent = self.model.get(child.waited_by[0])
        return (
            parent is not None
            and parent.state is ItemState.QUEUED
            and parent.lease_version == child.waited_by[1]
            and parent.waiting_children > 0
        )

    def child_finished(self, child: Model) -> None:
        """*child* finished: one less for the parent that waits for it, once."""
        waited, child.waited_by = child.waited_by, None
        if waited is None:
            return
        parent = self.model.get(waited[0])
        if (
            parent is None
            or parent.state is not ItemState.QUEUED
            or parent.lease_version != waited[1]
            or parent.waiting_children <= 0
        ):
            return
        parent.waiting_children -= 1
        if parent.waiting_children == 0:
            parent.due_at = self.now()

    def settlement(
        self,
        item: Model,
        which: str,
        kind: SettleKind,
        delay: float,
        offset: float,
        n: int,
        poison: bool = False,
        result: bool = False,
    ) -> Settlement:
        return Settlement(
            item_id=item.id,
            lease_version=self.version(item, which),
            kind=kind,
            delay=delay,
            at=self.now() + dt.timedelta(seconds=offset),
            config=POISON if poison else {"n": n},
            error=f"error {n}",
            result={"r": [n]} if result and kind is SettleKind.COMPLETE else None,
        )

    # rules

    def new_entry(
        self,
        spec: str,
        offset: float,
        key: str | None,
        item_id: str | None,
        n: int,
        priority: int,
        queue: str,
        unique: Any,
        ckey: str | None = None,
        timeout: float | None = None,
    ) -> tuple[NewItem, bool]:
        """An entry with a reproducible id (the queue's own are random); whether its id was
        one of the explicit ones that may clash."""
        explicit = item_id is not None
        if item_id is None:
            self.serial += 1
            item_id = f"i{self.serial:03}"
        entry = NewItem(
            spec_id=spec,
            config={"n": n},
            due_at=self.now() + dt.timedelta(seconds=offset),
            item_id=item_id,
            idempotency_key=key,
            priority=priority,
            queue=queue,
            unique=unique if key is not None else "forever",
            evaluation_timeout=timeout,
            concurrency_key=ckey,
            concurrency_limit=None if ckey is None else CLIMITS[ckey],
            tags=TAGS[: n % 3],
            # Every third item has a start deadline, a few seconds after it is due.
            start_by=self.now() + dt.timedelta(seconds=offset + 3) if n % 3 == 1 else None,
            debounce=key is not None and n % 4 == 3,
        )
        return entry, explicit

    def model_enqueue(
        self, entries: list[tuple[NewItem, bool]]
    ) -> list[tuple[str, bool]] | type[Exception]:
        """The model's enqueue_many: per entry (item id, created), or DuplicateItem (then the
        model is unchanged)."""
        now = self.now()

        def holder(key: str | None) -> Model | None:
            if key is None:
                return None
            found = [m for m in self.model.values() if m.key == key]
            return found[0] if found and not found[0].lapsed(now) else None

        firsts: dict[str, int] = {}
        plan: list[tuple[str, Any]] = []  # ("repeat", index) | ("existing", id) | ("new", None)
        new_ids: set[str] = set()
        for index, (entry, _) in enumerate(entries):
            key = entry.idempotency_key
            if key is not None and key in firsts:
                plan.append(("repeat", firsts[key]))
                continue
            if key is not None:
                firsts[key] = index
            live = holder(key)
            if live is not None and not (entry.debounce and live.state is ItemState.RUNNING):
                # A debounced entry gives a queued holder its config and due time; a running
                # holder gives it the key (a new item, below); any other holder is kept.
                replaces = entry.debounce and live.state is ItemState.QUEUED
                plan.append(
                    ("replace" if replaces and not live.waiting_children else "existing", live.id)
                )
                continue
            assert entry.item_id is not None
            if entry.item_id in self.model or entry.item_id in new_ids:
                return DuplicateItem
            new_ids.add(entry.item_id)
            plan.append(("new", None))
        results: list[tuple[str, bool]] = []
        for (entry, _), (what, arg) in zip(entries, plan, strict=True):
            if what == "repeat":
                results.append((results[arg][0], False))
            elif what == "existing":
                results.append((arg, False))
            elif what == "replace":
                assert entry.due_at is not None
                replaced = self.model[arg]
                replaced.config = {} if entry.config is None else entry.config
                replaced.due_at = entry.due_at
                results.append((arg, False))
            else:
                assert entry.item_id is not None
                assert entry.due_at is not None
                key = entry.idempotency_key
                for m in self.model.values():
                    if key is not None and m.key == key:  # a lapsed holder: released
                        m.key, m.released_key = None, key
                scope, until = "forever", None
                if entry.unique == "unfinished":
                    scope = "unfinished"
                elif isinstance(entry.unique, float):
                    scope, until = "period", now + dt.timedelta(seconds=entry.unique)
                self.model[entry.item_id] = Model(
                    id=entry.item_id,
                    spec_id=entry.spec_id,
                    due_at=entry.due_at,
                    key=key,
                    config=entry.config,
                    priority=entry.priority,
                    queue=entry.queue,
                    tags=tuple(entry.tags),
                    scope=scope,
                    unique_until=until,
                    ckey=entry.concurrency_key,
                    climit=entry.concurrency_limit,
                    timeout=entry.evaluation_timeout,
                    start_by=entry.start_by,
                )
                results.append((entry.item_id, True))
        return results
