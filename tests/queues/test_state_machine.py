"""A Hypothesis state machine drives each backend and a plain-Python model side by side.

Any difference in outcome (return values, errors, or the stored items after a step) fails.
The async queue runs in a Trio loop on a background thread; each step calls into it through
``trio.from_thread.run`` (a portal), so Hypothesis itself stays synchronous.

Examples are modest by default (more under ``HYPOTHESIS_PROFILE=ci``); set
``TRIO_SUPERVISE_MODEL_EXAMPLES=<n>`` to also run a long variant with *n* examples.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from trio_supervise import DuplicateItem, ItemNotFound, ItemStateError, LeaseLost
from trio_supervise.job import child_item_id
from trio_supervise.queues import (
    MAX_ERRORS,
    WAITING_DUE_AT,
    Enqueued,
    ItemState,
    Lease,
    LeaseStatus,
    MemoryQueue,
    NewItem,
    PostgresQueue,
    SettleKind,
    Settlement,
    SQLiteQueue,
    WorkItem,
    WorkQueue,
)

from .conftest import BACKENDS, START, ManualClock, pg_schema

T = TypeVar("T")
SPECS = ["a", "b"]
WORKERS = ["w1", "w2"]
KEYS = [None, None, "k1", "k2"]
IDS = [None, None, None, "x1", "x2"]
QUEUES = ["default", "default", "q2"]
CKEYS = [None, "c1", "c2", "c2"]
"""Concurrency keys; each has one limit (c1: one at a time, c2: two)."""
CLIMITS = {"c1": 1, "c2": 2}
UNIQUE: list[Any] = ["forever", "forever", "unfinished", 2.0]
"""Uniqueness scopes (with a key): the default, until finished, 2 s from creation."""
DURATIONS = [0.0, 0.5, 1.0, 2.5, 5.0]
CI = os.environ.get("HYPOTHESIS_PROFILE") == "ci"
POISON = {"n": "\udcff"}
POISON_REASON = "config must not contain lone surrogates (such as '\\udcff') in its strings"


class Portal:
    """A Trio loop on a background thread, and a way to run coroutines in it from this one."""

    def __init__(self) -> None:
        ready = threading.Event()
        self._stop: trio.Event | None = None
        self._token: trio.lowlevel.TrioToken | None = None

        async def main() -> None:
            self._stop = trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            ready.set()
            await self._stop.wait()

        self._thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
        self._thread.start()
        ready.wait()

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        async def bounded() -> T:
            with trio.fail_after(30):
                return await fn(*args, **kwargs)

        return trio.from_thread.run(bounded, trio_token=self._token)

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def close(self) -> None:
        assert self._stop is not None
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join()


# -- the model -------------------------------------------------------------------------------


@attrs.define
class Model:
    """One item as the protocol says it must be; versions are learned from the backend."""

    id: str
    spec_id: str
    due_at: dt.datetime
    key: str | None
    config: Any = attrs.field(factory=dict)
    state: ItemState = ItemState.QUEUED
    error_count: int = 0
    last_error: str | None = None
    cancel_requested: bool = False
    lease_owner: str | None = None
    lease_expires_at: dt.datetime | None = None
    lease_version: int = 0
    attempt: int = 0
    priority: int = 0
    queue: str = "default"
    ckey: str | None = None
    climit: int | None = None
    timeout: float | None = None
    result: Any = None
    errors: list[tuple[dt.datetime, str, int, str]] = attrs.field(factory=list)
    scope: str = "forever"
    unique_until: dt.datetime | None = None
    released_key: str | None = None
    old_versions: list[int] = attrs.field(factory=list)
    parent_id: str | None = None
    waiting_children: int = 0
    waited_by: tuple[str, int] | None = None
    """The parent (id, lease version) whose wait this child still counts toward."""

    def add_error(self, at: dt.datetime, error: str) -> None:
        """The history entry a failure writes: by the lease owner, at this attempt; bounded."""
        self.errors = [*self.errors, (at, self.lease_owner or "", self.attempt, error)]
        self.errors = self.errors[-MAX_ERRORS:]

    def lapsed(self, now: dt.datetime) -> bool:
        """True when this item's uniqueness scope no longer holds its key."""
        if self.scope == "unfinished":
            return self.state.finished
        if self.scope == "period":
            return self.unique_until is not None and self.unique_until <= now
        return False

    def claimable_at(self) -> dt.datetime | None:
        if self.state is ItemState.QUEUED:
            return self.due_at
        if self.state is ItemState.RUNNING:
            return self.lease_expires_at
        return None

    def holds(self, version: int) -> bool:
        return self.state is ItemState.RUNNING and self.lease_version == version

    def requeue(self, due_at: dt.datetime) -> None:
        self.state, self.due_at = ItemState.QUEUED, due_at
        self.lease_owner = self.lease_expires_at = None

    def finish(self, state: ItemState) -> None:
        self.state = state
        self.lease_owner = self.lease_expires_at = None

    def view(self) -> tuple[Any, ...]:
        return (
            self.id,
            self.spec_id,
            self.state,
            self.due_at,
            self.config,
            self.error_count,
            self.last_error,
            self.cancel_requested,
            self.lease_owner,
            self.lease_expires_at,
            self.lease_version,
            self.key,
            self.attempt,
            self.priority,
            self.queue,
            self.parent_id,
            self.waiting_children,
            self.ckey,
            self.climit,
            self.timeout,
            self.result,
            tuple(self.errors),
            self.scope,
            self.unique_until,
            self.released_key,
        )


def view(item: WorkItem) -> tuple[Any, ...]:
    return (
        item.id,
        item.spec_id,
        item.state,
        item.due_at,
        item.config,
        item.error_count,
        item.last_error,
        item.cancel_requested,
        item.lease_owner,
        item.lease_expires_at,
        item.lease_version,
        item.idempotency_key,
        item.attempt,
        item.priority,
        item.queue,
        item.parent_id,
        item.waiting_children,
        item.concurrency_key,
        item.concurrency_limit,
        item.timeout,
        item.result,
        tuple((e.at, e.worker, e.attempt, e.error) for e in item.errors),
        item.unique_scope,
        item.unique_until,
        item.released_key,
    )


def outcome(portal: Portal, fn: Callable[..., Awaitable[T]], *args: Any) -> T | type[Exception]:
    """What the call returned, or the type of the protocol error it raised."""
    try:
        return portal.run(fn, *args)
    except (LeaseLost, ItemNotFound, ItemStateError, DuplicateItem) as error:
        return type(error)


class QueueMachine(RuleBasedStateMachine):
    """Random sequences of protocol calls; the backend must agree with the model on each."""

    queue: WorkQueue
    clock: ManualClock
    portal: Portal
    reset: Callable[[], None]

    def __init__(self) -> None:
        super().__init__()
        self.reset()
        self.clock.current = START
        self.model: dict[str, Model] = {}
        self.paused: set[str] = set()
        self.serial = 0

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
                item.requeue(s.at)
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
            if live is not None:
                plan.append(("existing", live.id))
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
                    scope=scope,
                    unique_until=until,
                    ckey=entry.concurrency_key,
                    climit=entry.concurrency_limit,
                    timeout=entry.evaluation_timeout,
                )
                results.append((entry.item_id, True))
        return results

    @rule(
        spec=st.sampled_from(SPECS),
        offset=st.sampled_from([-2.0, 0.0, 0.5, 3.0]),
        key=st.sampled_from(KEYS),
        item_id=st.sampled_from(IDS),
        n=st.integers(0, 9),
        priority=st.sampled_from([0, 0, -3, 2]),
        queue=st.sampled_from(QUEUES),
        ckey=st.sampled_from(CKEYS),
        timeout=st.sampled_from([None, None, 2.5]),
        unique=st.sampled_from(UNIQUE),
    )
    def enqueue(
        self,
        spec: str,
        offset: float,
        key: str | None,
        item_id: str | None,
        n: int,
        priority: int,
        queue: str,
        ckey: str | None,
        timeout: float | None,
        unique: Any,
    ) -> None:
        entry, _ = pair = self.new_entry(
            spec, offset, key, item_id, n, priority, queue, unique, ckey, timeout
        )

        async def call() -> WorkItem:
            return await self.queue.enqueue(
                entry.spec_id,
                config=entry.config,
                due_at=entry.due_at,
                item_id=entry.item_id,
                idempotency_key=entry.idempotency_key,
                priority=entry.priority,
                queue=entry.queue,
                unique=entry.unique,
                evaluation_timeout=entry.evaluation_timeout,
                concurrency_key=entry.concurrency_key,
                concurrency_limit=entry.concurrency_limit,
            )

        got = outcome(self.portal, call)
        expected = self.model_enqueue([pair])
        if expected is DuplicateItem:
            assert got is DuplicateItem
        else:
            assert isinstance(got, WorkItem)
            assert isinstance(expected, list)
            assert got.id == expected[0][0]

    @rule(
        entries=st.lists(
            st.tuples(
                st.sampled_from(SPECS),
                st.sampled_from([-2.0, 0.0, 3.0]),
                st.sampled_from(KEYS),
                st.sampled_from(IDS),
                st.integers(0, 9),
                st.sampled_from(UNIQUE),
            ),
            max_size=4,
        )
    )
    def enqueue_many(
        self, entries: list[tuple[str, float, str | None, str | None, int, Any]]
    ) -> None:
        batch = [
            self.new_entry(spec, offset, key, item_id, n, 0, "default", unique)
            for spec, offset, key, item_id, n, unique in entries
        ]

        async def call() -> list[Enqueued]:
            return await self.queue.enqueue_many([entry for entry, _ in batch])

        got = outcome(self.portal, call)
        expected = self.model_enqueue(batch)
        if expected is DuplicateItem:
            assert got is DuplicateItem
        else:
            assert isinstance(got, list)
            assert [(each.item.id, each.created) for each in got] == expected

    @rule(key=st.sampled_from(["k1", "k2"]))
    def get_by_key(self, key: str) -> None:
        got = outcome(self.portal, self.queue.get_by_key, key)
        holders = [m for m in self.model.values() if m.key == key]
        released = [m for m in self.model.values() if m.released_key == key]
        if holders:
            assert isinstance(got, WorkItem)
            assert got.id == holders[0].id
        elif released:
            # The newest released holder; ties in created_at (a clock that did not move) are
            # broken by id, which the model does not predict: any of the newest will do.
            assert isinstance(got, WorkItem)
            assert got.id in {m.id for m in released}
        else:
            assert got is ItemNotFound

    @rule(
        specs=st.lists(st.sampled_from(SPECS), unique=True, max_size=2),
        worker=st.sampled_from(WORKERS),
        lease=st.sampled_from(DURATIONS[1:]),
        limit=st.integers(0, 3),
        queue=st.sampled_from(QUEUES),
    )
    def claim(self, specs: list[str], worker: str, lease: float, limit: int, queue: str) -> None:
        """The window (the first `limit` claimable items, keys at their limit left out), then
        per key only its free slots: the protocol's module doc."""
        expected = self.expected_claim(specs, limit, queue)

        async def call() -> list[WorkItem]:
            return await self.queue.claim_due(specs, worker, lease, limit, queue=queue)

        got = self.portal.run(call)
        assert [i.id for i in got] == expected
        self.claimed(got, worker, lease)

    def expected_claim(self, specs: list[str], limit: int, queue: str) -> list[str]:
        """The ids a claim takes now, in order (see :meth:`claim`)."""
        now = self.now()
        live = {key: len(self.live(key)) for key in CLIMITS}
        window = sorted(
            (
                m
                for m in self.model.values()
                if m.spec_id in specs
                and m.queue == queue
                and queue not in self.paused
                and (at := m.claimable_at()) is not None
                and at <= now
                and (m.ckey is None or live[m.ckey] < CLIMITS[m.ckey])
            ),
            key=lambda m: (m.priority, m.due_at, m.id),
        )[:limit]
        ranks: dict[str, int] = {}
        expected = []
        for m in window:
            if m.ckey is not None:
                ranks[m.ckey] = ranks.get(m.ckey, 0) + 1
                if ranks[m.ckey] > CLIMITS[m.ckey] - live[m.ckey]:
                    continue
            expected.append(m.id)
        return expected

    def claimed(self, got: list[WorkItem], worker: str, lease: float) -> None:
        """The model takes the leases of the items *got* (as the claim's answer checked)."""
        now = self.now()
        for item in got:
            m = self.model[item.id]
            assert item.lease_version > m.lease_version
            m.old_versions.append(m.lease_version)
            m.state, m.lease_owner, m.lease_version = ItemState.RUNNING, worker, item.lease_version
            m.lease_expires_at = now + dt.timedelta(seconds=lease)
            m.attempt += 1
        for key, key_limit in CLIMITS.items():
            assert len(self.live(key)) <= key_limit

    @rule(worker=st.sampled_from(WORKERS), lease=st.sampled_from(DURATIONS[1:]))
    def claim_everything(self, worker: str, lease: float) -> None:
        """A wide claim of the default queue: where batches meet keys with running items."""
        self.claim(SPECS, worker, lease, 3, "default")

    @precondition(lambda self: self.model)
    @rule(
        index=st.integers(0, 99),
        which=st.sampled_from(["fresh", "fresh", "old", "future", "owner"]),
        lease=st.sampled_from(DURATIONS[1:]),
        batch=st.booleans(),
    )
    def renew(self, index: int, which: str, lease: float, batch: bool) -> None:
        m = self.pick(index)
        owner = "intruder" if which == "owner" else (m.lease_owner or "w1")
        version = self.version(m, which)
        ok = m.holds(version) and m.lease_owner == owner
        if m.ckey is not None and m.lease_expires_at is not None:
            ok = ok and m.lease_expires_at > self.now()  # an expired keyed lease freed its slot
        expected = (
            (LeaseStatus.CANCEL_REQUESTED if m.cancel_requested else LeaseStatus.HELD)
            if ok
            else LeaseStatus.LOST
        )
        if batch:
            got = self.portal.run(self.queue.renew_many, [Lease(m.id, version, owner)], lease)
            assert got == {m.id: expected}
        else:
            status = outcome(self.portal, self.queue.renew, m.id, owner, version, lease)
            assert status == (expected if ok else LeaseLost)
        if ok:
            m.lease_expires_at = self.now() + dt.timedelta(seconds=lease)

    @precondition(lambda self: self.model)
    @rule(
        index=st.integers(0, 99),
        which=st.sampled_from(["fresh", "fresh", "old", "future"]),
        kind=st.sampled_from(SettleKind),
        delay=st.sampled_from(DURATIONS),
        offset=st.sampled_from([-1.0, 0.0, 2.0, 86_400.0]),
        n=st.integers(0, 9),
    )
    def settle_one(
        self, index: int, which: str, kind: SettleKind, delay: float, offset: float, n: int
    ) -> None:
        m = self.pick(index)
        s = self.settlement(m, which, kind, delay, offset, n)
        q = self.queue
        if kind is SettleKind.COMPLETE:
            got = outcome(self.portal, q.complete, m.id, s.lease_version)
        elif kind is SettleKind.RELEASE:
            s = attrs.evolve(s, error=None)  # the seed's release carries no error
            got = outcome(self.portal, q.release, m.id, s.lease_version, delay)
        elif kind is SettleKind.RESCHEDULE:
            assert s.at is not None
            got = outcome(self.portal, q.reschedule, m.id, s.lease_version, s.at, s.config)
        else:
            [applied] = self.portal.run(q.settle_many, [s])
            got = None if applied else LeaseLost
        assert got == (None if self.apply(s) else LeaseLost)

    @precondition(lambda self: self.model)
    @rule(
        picks=st.lists(
            st.tuples(
                st.integers(0, 99),
                st.sampled_from(["fresh", "old", "future"]),
                st.sampled_from(SettleKind),
                st.sampled_from([False, False, False, True]),
                st.booleans(),
            ),
            max_size=4,
        ),
        n=st.integers(0, 9),
    )
    def settle_many(self, picks: list[tuple[int, str, SettleKind, bool, bool]], n: int) -> None:
        """Batches of outcomes; a completion may carry a result, which the item then keeps."""
        batch = [
            self.settlement(self.pick(index), which, kind, 1.0, 5.0, n, poison, result)
            for index, which, kind, poison, result in picks
        ]
        got = self.portal.run(self.queue.settle_many, batch)
        assert got == [self.apply(s) for s in batch]

    @precondition(lambda self: self.model)
    @rule(
        picks=st.lists(
            st.tuples(
                st.integers(0, 99),
                st.sampled_from(["fresh", "old", "future"]),
                st.sampled_from(SettleKind),
                st.sampled_from([False, False, False, True]),
                st.booleans(),
            ),
            max_size=4,
        ),
        n=st.integers(0, 9),
        specs=st.lists(st.sampled_from(SPECS), unique=True, max_size=2),
        worker=st.sampled_from(WORKERS),
        lease=st.sampled_from(DURATIONS[1:]),
        limit=st.integers(0, 3),
        queue=st.sampled_from(QUEUES),
    )
    def settle_and_claim(
        self,
        picks: list[tuple[int, str, SettleKind, bool, bool]],
        n: int,
        specs: list[str],
        worker: str,
        lease: float,
        limit: int,
        queue: str,
    ) -> None:
        """One call: the batch settled as settle_many settles it, then a claim that sees it."""
        batch = [
            self.settlement(self.pick(index), which, kind, 0.0, 5.0, n, poison, result)
            for index, which, kind, poison, result in picks
        ]

        async def call() -> tuple[list[bool], list[WorkItem]]:
            combined = self.queue.settle_and_claim  # type: ignore[attr-defined]
            got: tuple[list[bool], list[WorkItem]] = await combined(
                batch, specs, worker, lease, limit, queue=queue
            )
            return got

        results, got = self.portal.run(call)
        assert results == [self.apply(s) for s in batch]
        assert [i.id for i in got] == self.expected_claim(specs, limit, queue)
        self.claimed(got, worker, lease)

    @rule()
    def claim_everything_due(self) -> None:
        """A claim of every spec in the default queue: keeps running items (parents, children)
        common enough for the fan-out and fan-in rules to meet."""
        self.claim(SPECS, "w1", 5.0, 3, "default")

    def running(self) -> list[Model]:
        return sorted(
            (m for m in self.model.values() if m.state is ItemState.RUNNING), key=lambda m: m.id
        )

    @precondition(lambda self: self.running())
    @rule(
        index=st.integers(0, 99),
        kind=st.sampled_from([SettleKind.COMPLETE, SettleKind.CANCEL, SettleKind.DEAD]),
        children_first=st.booleans(),
    )
    def finish_running(self, index: int, kind: SettleKind, children_first: bool) -> None:
        """A running item (a child, if asked and there is one) finishes: fan-in may follow."""
        running = self.running()
        children = [m for m in running if m.parent_id is not None]
        pool = children if children_first and children else running
        m = pool[index % len(pool)]
        s = self.settlement(m, "fresh", kind, 0.0, 0.0, 0)
        [applied] = self.portal.run(self.queue.settle_many, [s])
        assert applied == self.apply(s)

    @precondition(lambda self: self.running())
    @rule(
        index=st.integers(0, 99),
        which=st.sampled_from(["fresh", "fresh", "fresh", "old"]),
        kind=st.sampled_from([SettleKind.CONTINUE, SettleKind.RESCHEDULE, SettleKind.COMPLETE]),
        wait=st.booleans(),
        children=st.lists(
            st.tuples(
                st.sampled_from(SPECS),
                st.sampled_from(KEYS),
                st.sampled_from([None, None, None, "x1", "c1"]),
                st.sampled_from([False, False, False, False, True]),
            ),
            max_size=3,
        ),
        n=st.integers(0, 9),
    )
    def settle_with_children(
        self,
        index: int,
        which: str,
        kind: SettleKind,
        wait: bool,
        children: list[tuple[str, str | None, str | None, bool]],
        n: int,
    ) -> None:
        """An outcome with children (some with a held key or an existing id, some unstorable),
        perhaps waiting for them: written with the parent, or not at all."""
        running = self.running()
        self.settle_children(running[index % len(running)], which, kind, wait, children, n)

    @rule(
        children=st.lists(
            st.tuples(
                st.sampled_from(SPECS),
                st.sampled_from(KEYS),
                st.just(None),
                st.sampled_from([False, False, False, False, True]),
            ),
            min_size=1,
            max_size=3,
        ),
        n=st.integers(0, 9),
    )
    def fan_out_from_a_new_parent(
        self, children: list[tuple[str, str | None, str | None, bool]], n: int
    ) -> None:
        """A new parent is enqueued, claimed (with whatever else is due) and fans out, waiting:
        the common shape, so that fan-in is met often."""
        self.enqueue("a", -5.0, None, None, n, -100, "default", None, None, "forever")
        self.claim_everything_due()
        parent = self.model[f"i{self.serial:03}"]
        if parent.state is ItemState.RUNNING:
            self.settle_children(parent, "fresh", SettleKind.CONTINUE, True, children, n)

    def settle_children(
        self,
        m: Model,
        which: str,
        kind: SettleKind,
        wait: bool,
        children: list[tuple[str, str | None, str | None, bool]],
        n: int,
    ) -> None:
        base = self.settlement(m, which, kind, 0.0, 3.0, n)
        s = attrs.evolve(
            base,
            children=[
                NewItem(
                    spec_id=spec,
                    config=POISON if poison else {"c": n},
                    idempotency_key=key,
                    item_id=item_id,
                )
                for spec, key, item_id, poison in children
            ],
            wait_for_children=wait and kind is SettleKind.CONTINUE,
        )
        # A child id as the queue gives it (the model's children are named the same way).
        assert all(
            child.item_id == (item_id or child_item_id(m.id, s.lease_version, i))
            for i, (child, (_, _, item_id, _)) in enumerate(zip(s.children, children, strict=True))
        )
        [applied] = self.portal.run(self.queue.settle_many, [s])
        assert applied == self.apply(s)

        async def listed() -> list[WorkItem]:
            return await self.queue.list_children(m.id)

        expected = sorted(
            (c for c in self.model.values() if c.parent_id == m.id), key=lambda c: c.id
        )
        got = sorted(self.portal.run(listed), key=lambda c: c.id)
        assert [view(c) for c in got] == [c.view() for c in expected]

    @precondition(lambda self: self.model)
    @rule(
        index=st.integers(0, 99),
        which=st.sampled_from(["fresh", "old"]),
        n=st.integers(0, 9),
        times=st.sampled_from([1, 1, 1, MAX_ERRORS + 2]),
    )
    def mark_error(self, index: int, which: str, n: int, times: int) -> None:
        """Errors add to the count and the history, which keeps only the newest MAX_ERRORS."""
        m = self.pick(index)
        version = self.version(m, which)
        for each in range(times):
            got = outcome(self.portal, self.queue.mark_error, m.id, version, f"mark {n}.{each}")
            if m.holds(version):
                assert got is None
                m.error_count, m.last_error = m.error_count + 1, f"mark {n}.{each}"
                m.add_error(self.now(), f"mark {n}.{each}")
            else:
                assert got is LeaseLost

    @rule(index=st.integers(0, 99), missing=st.booleans())
    def request_cancel(self, index: int, missing: bool) -> None:
        if missing or not self.model:
            assert outcome(self.portal, self.queue.request_cancel, "missing") is ItemNotFound
            return
        m = self.pick(index)
        got = outcome(self.portal, self.queue.request_cancel, m.id)
        if m.state is ItemState.QUEUED:
            m.state, m.cancel_requested = ItemState.CANCELLED, True
            m.waiting_children = 0  # a cancelled parent waits no more
            self.child_finished(m)
        elif m.state is ItemState.RUNNING:
            m.cancel_requested = True
        assert isinstance(got, WorkItem)
        assert view(got) == m.view()

    @precondition(lambda self: self.model)
    @rule(index=st.integers(0, 99), offset=st.sampled_from([None, -1.0, 4.0]))
    def retry(self, index: int, offset: float | None) -> None:
        m = self.pick(index)
        at = None if offset is None else self.now() + dt.timedelta(seconds=offset)

        async def call() -> WorkItem:
            return await self.queue.retry(m.id, at=at)

        got = outcome(self.portal, call)
        if m.state is ItemState.RUNNING:
            assert got is ItemStateError
            return
        m.requeue(self.now() if at is None else at)
        m.error_count, m.attempt, m.cancel_requested = 0, 0, False
        m.waiting_children = 0  # a retried parent waits no more
        assert isinstance(got, WorkItem)
        assert view(got) == m.view()

    @rule(index=st.integers(0, 99), missing=st.booleans())
    def delete(self, index: int, missing: bool) -> None:
        """A deleted item is gone (its id and key free again); a running one stays."""
        if missing or not self.model:
            assert outcome(self.portal, self.queue.delete, "missing") is ItemNotFound
            return
        m = self.pick(index)
        got = outcome(self.portal, self.queue.delete, m.id)
        if m.state is ItemState.RUNNING or m.waiting_children > 0 or self.still_waited(m):
            # Running, waiting for children, or a child its parent still counts on: refused.
            assert got is ItemStateError
            return
        assert isinstance(got, WorkItem)
        assert view(got) == m.view()
        del self.model[m.id]

    @rule(index=st.integers(0, 99), missing=st.booleans(), n=st.integers(0, 9))
    def edit_config(self, index: int, missing: bool, n: int) -> None:
        """A queued or finished item takes the new config; a running one keeps its own."""
        if missing or not self.model:
            got = outcome(self.portal, self.queue.edit_config, "missing", {"e": n})
            assert got is ItemNotFound
            return
        m = self.pick(index)
        got = outcome(self.portal, self.queue.edit_config, m.id, {"e": n})
        if m.state is ItemState.RUNNING:
            assert got is ItemStateError
            return
        m.config = {"e": n}
        assert isinstance(got, WorkItem)
        assert view(got) == m.view()

    @rule(
        states=st.lists(
            st.sampled_from([ItemState.COMPLETED, ItemState.CANCELLED, ItemState.DEAD]),
            unique=True,
            min_size=1,
        ),
        dry_run=st.booleans(),
    )
    def prune(self, states: list[ItemState], dry_run: bool) -> None:
        """An age of 0 takes every finished item of those states (none with dry_run)."""
        doomed = [m for m in self.model.values() if m.state in states]

        async def call() -> dict[ItemState, int]:
            return await self.queue.prune(dict.fromkeys(states, 0.0), dry_run=dry_run)

        got = self.portal.run(call)
        assert got == {state: sum(m.state is state for m in doomed) for state in states}
        if not dry_run:
            for m in doomed:
                del self.model[m.id]

    @precondition(lambda self: self.model)
    @rule(
        index=st.integers(0, 99),
        cursor=st.booleans(),
        states=st.none() | st.lists(st.sampled_from(ItemState), unique=True, max_size=3),
        specs=st.none() | st.lists(st.sampled_from(SPECS), unique=True, max_size=2),
        limit=st.integers(0, 4),
    )
    def list_page(
        self,
        index: int,
        cursor: bool,
        states: list[ItemState] | None,
        specs: list[str] | None,
        limit: int,
    ) -> None:
        after = self.pick(index) if cursor else None

        async def call() -> list[WorkItem]:
            return await self.queue.list_items(
                states=states,
                spec_ids=specs,
                limit=limit,
                after=None if after is None else after.id,
            )

        expected = sorted(
            (
                m
                for m in self.model.values()
                if (states is None or m.state in states)
                and (specs is None or m.spec_id in specs)
                and (after is None or (m.due_at, m.id) > (after.due_at, after.id))
            ),
            key=lambda m: (m.due_at, m.id),
        )[:limit]
        assert [view(i) for i in self.portal.run(call)] == [m.view() for m in expected]

    @rule(queue=st.sampled_from(QUEUES), pause=st.booleans())
    def pause_or_resume(self, queue: str, pause: bool) -> None:
        """A pause is stored for the fleet; each call says whether it changed anything."""
        if pause:
            changed = self.portal.run(self.queue.pause_queue, queue)
            assert changed is (queue not in self.paused)
            self.paused.add(queue)
        else:
            changed = self.portal.run(self.queue.resume_queue, queue)
            assert changed is (queue in self.paused)
            self.paused.discard(queue)
        listed = self.portal.run(self.queue.list_queues)
        assert {info.name for info in listed if info.paused} == self.paused

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.5, 5.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def backend_agrees_with_model(self) -> None:
        async def everything() -> list[WorkItem]:
            return await self.queue.list_items(limit=1000)

        items = self.portal.run(everything)
        expected = sorted(self.model.values(), key=lambda m: (m.due_at, m.id))
        assert [view(i) for i in items] == [m.view() for m in expected]
        counts: dict[tuple[str, ItemState], int] = {}
        for m in expected:
            counts[(m.spec_id, m.state)] = counts.get((m.spec_id, m.state), 0) + 1
        assert dict(self.portal.run(self.queue.counts)) == counts
        for specs in (["a"], SPECS):
            times = [
                at if (until := self.blocked_until(m)) is None else max(at, until)
                for m in expected
                if m.spec_id in specs
                and m.queue not in self.paused
                and (at := m.claimable_at()) is not None
            ]
            assert self.portal.run(self.queue.next_due_at, specs) == min(times, default=None)

    @invariant()
    def no_key_runs_past_its_limit(self) -> None:
        """Never more live-leased running items of a concurrency key than its limit."""
        for key, limit in CLIMITS.items():
            assert len(self.live(key)) <= limit


# -- running it against each backend ---------------------------------------------------------


@contextmanager
def machine_for(backend: str, tmp_path: Path) -> Iterator[type[QueueMachine]]:
    """A QueueMachine subclass bound to a live queue of *backend*, emptied per example."""
    portal = Portal()
    clock = ManualClock()
    cleanup: list[Callable[[], None]] = [portal.close]
    try:
        queue: WorkQueue
        if backend == "memory":
            memory = MemoryQueue(clock=clock)
            queue = memory

            def reset() -> None:
                portal.run_sync(memory.reset)

        elif backend == "sqlite":
            path = tmp_path / "model.db"
            queue = portal.run(SQLiteQueue.connect, path, clock=clock)

            def reset() -> None:
                import sqlite3

                with sqlite3.connect(path) as conn:
                    conn.execute("DELETE FROM trio_supervise_items")
                    conn.execute("DELETE FROM trio_supervise_paused_queues")
                conn.close()

        else:
            import psycopg

            schema_cm = pg_schema()
            dsn, schema = schema_cm.__enter__()

            def leave_schema() -> None:
                schema_cm.__exit__(None, None, None)

            cleanup.append(leave_schema)

            async def connect() -> PostgresQueue:
                return await PostgresQueue.connect(
                    dsn, clock=clock, schema=schema, migrate=True, pool_size=2, listen=False
                )

            queue = portal.run(connect)

            def reset() -> None:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(
                        f'TRUNCATE "{schema}".trio_supervise_items, '
                        f'"{schema}".trio_supervise_paused_queues'.encode()
                    )

        cleanup.insert(0, lambda: portal.run(queue.aclose))

        class Bound(QueueMachine):
            pass

        Bound.queue, Bound.clock, Bound.portal = queue, clock, portal
        Bound.reset = staticmethod(reset)
        yield Bound
    finally:
        for step in cleanup:
            step()


def _run(backend: str, tmp_path: Path, examples: int, steps: int) -> None:
    with machine_for(backend, tmp_path) as machine:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=examples,
                stateful_step_count=steps,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_matches_the_model(backend: str, tmp_path: Path) -> None:
    """Every backend behaves exactly like the model under random call sequences."""
    _run(backend, tmp_path, examples=100 if CI else 30, steps=40)


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("TRIO_SUPERVISE_MODEL_EXAMPLES"),
    reason="set TRIO_SUPERVISE_MODEL_EXAMPLES=<n> for the long model run",
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_matches_the_model_long(backend: str, tmp_path: Path) -> None:
    """The same, with as many examples as TRIO_SUPERVISE_MODEL_EXAMPLES says, and longer runs."""
    _run(backend, tmp_path, examples=int(os.environ["TRIO_SUPERVISE_MODEL_EXAMPLES"]), steps=80)
