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
from trio_supervise.queues import (
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
    scope: str = "forever"
    unique_until: dt.datetime | None = None
    released_key: str | None = None
    old_versions: list[int] = attrs.field(factory=list)

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
        later = self.now() + dt.timedelta(seconds=s.delay)
        match s.kind:
            case SettleKind.CONTINUE:
                item.requeue(later)
                item.error_count = item.attempt = 0
            case SettleKind.RELEASE:
                item.requeue(later)
                item.attempt = max(item.attempt - 1, 0)
            case SettleKind.RESCHEDULE:
                assert s.at is not None
                item.requeue(s.at)
                item.config, item.error_count, item.attempt = s.config, 0, 0
            case SettleKind.RETRY:
                item.requeue(later)
                item.error_count, item.last_error = item.error_count + 1, s.error
            case SettleKind.COMPLETE:
                item.finish(ItemState.COMPLETED)
            case SettleKind.CANCEL:
                item.finish(ItemState.CANCELLED)
            case SettleKind.DEAD:
                item.finish(ItemState.DEAD)
                item.error_count, item.last_error = item.error_count + 1, s.error
        return True

    def settlement(
        self,
        item: Model,
        which: str,
        kind: SettleKind,
        delay: float,
        offset: float,
        n: int,
        poison: bool = False,
    ) -> Settlement:
        return Settlement(
            item_id=item.id,
            lease_version=self.version(item, which),
            kind=kind,
            delay=delay,
            at=self.now() + dt.timedelta(seconds=offset),
            config=POISON if poison else {"n": n},
            error=f"error {n}",
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
        unique: Any,
    ) -> None:
        entry, _ = pair = self.new_entry(spec, offset, key, item_id, n, priority, queue, unique)

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
        now = self.now()
        due = sorted(
            (m.priority, m.due_at, m.id)
            for m in self.model.values()
            if m.spec_id in specs
            and m.queue == queue
            and queue not in self.paused
            and (at := m.claimable_at()) is not None
            and at <= now
        )

        async def call() -> list[WorkItem]:
            return await self.queue.claim_due(specs, worker, lease, limit, queue=queue)

        got = self.portal.run(call)
        assert [i.id for i in got] == [item_id for _, _, item_id in due[:limit]]
        for item in got:
            m = self.model[item.id]
            assert item.lease_version > m.lease_version
            m.old_versions.append(m.lease_version)
            m.state, m.lease_owner, m.lease_version = ItemState.RUNNING, worker, item.lease_version
            m.lease_expires_at = now + dt.timedelta(seconds=lease)
            m.attempt += 1

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
            ),
            max_size=4,
        ),
        n=st.integers(0, 9),
    )
    def settle_many(self, picks: list[tuple[int, str, SettleKind, bool]], n: int) -> None:
        batch = [
            self.settlement(self.pick(index), which, kind, 1.0, 5.0, n, poison)
            for index, which, kind, poison in picks
        ]
        got = self.portal.run(self.queue.settle_many, batch)
        assert got == [self.apply(s) for s in batch]

    @precondition(lambda self: self.model)
    @rule(index=st.integers(0, 99), which=st.sampled_from(["fresh", "old"]), n=st.integers(0, 9))
    def mark_error(self, index: int, which: str, n: int) -> None:
        m = self.pick(index)
        version = self.version(m, which)
        got = outcome(self.portal, self.queue.mark_error, m.id, version, f"mark {n}")
        if m.holds(version):
            assert got is None
            m.error_count, m.last_error = m.error_count + 1, f"mark {n}"
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
        assert isinstance(got, WorkItem)
        assert view(got) == m.view()

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
                states=states, spec_ids=specs, limit=limit, after=after and after.id
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
                at
                for m in expected
                if m.spec_id in specs
                and m.queue not in self.paused
                and (at := m.claimable_at()) is not None
            ]
            assert self.portal.run(self.queue.next_due_at, specs) == min(times, default=None)


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
            cleanup.append(lambda: schema_cm.__exit__(None, None, None))

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
        Bound.reset = staticmethod(reset)  # type: ignore[method-assign]
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
