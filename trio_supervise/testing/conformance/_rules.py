"""The state machine's rules: random calls by producers, workers and operators."""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import (
    invariant,
    precondition,
    rule,
)

from ... import DuplicateItem, ItemNotFound, ItemStateError, LeaseLost
from ...job import (
    MAX_ERRORS,
    Enqueued,
    EntryKind,
    ItemState,
    JournalEntry,
    Lease,
    LeaseStatus,
    NewItem,
    RateLimit,
    SettleKind,
    Settlement,
    WorkItem,
    child_item_id,
)
from ...queues import Capability, KeyRateLimitStore, RateLimitStore
from ...queues._ports import capabilities_of
from ._machine import MachineState
from ._model import (
    CKEYS,
    CLIMITS,
    DURATIONS,
    EVENTS,
    IDS,
    KEYS,
    POISON,
    QUEUES,
    SPECS,
    TAGS,
    UNIQUE,
    WORKERS,
    Model,
    outcome,
    view,
)


class ProducerRules(MachineState):
    """Enqueueing, alone and in batches, and reads by key."""

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
                tags=entry.tags,
                start_by=entry.start_by,
                debounce=entry.debounce,
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


class WorkerRules(MachineState):
    """Claims, renewals and settlements, children included."""

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
        if (free := self.rate_free(queue)) is not None:
            limit = min(limit, free)
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
                and self.key_free(m.ckey) != 0  # a key at its rate is left out
            ),
            key=lambda m: (m.priority, m.due_at, m.id),
        )[:limit]
        ranks: dict[str, int] = {}
        expected = []
        for m in window:
            if m.ckey is not None:
                ranks[m.ckey] = ranks.get(m.ckey, 0) + 1
                free = self.key_free(m.ckey)
                if ranks[m.ckey] > min(
                    CLIMITS[m.ckey] - live[m.ckey], 10**9 if free is None else free
                ):
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
        for queue in {item.queue for item in got} & self.rates.keys():
            # A claim that started items keeps the claims still in the window and its own,
            # the latest `limit` of them: all a window of one period needs.
            rate, starts = self.rates[queue]
            since = now - dt.timedelta(seconds=rate.period)
            kept = [at for at in starts if at > since]
            kept += [now] * sum(1 for item in got if item.queue == queue)
            self.rates[queue] = (rate, kept[-rate.limit :])
        for ckey in {item.concurrency_key for item in got} - {None}:
            if (key_rate := self.key_rule(ckey)) is not None and ckey is not None:
                since = now - dt.timedelta(seconds=key_rate.period)
                log = [at for at in self.key_starts.get(ckey, []) if at > since]
                log += [now] * sum(1 for item in got if item.concurrency_key == ckey)
                self.key_starts[ckey] = log[-key_rate.limit :]

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
        if batch or self.seed is None:
            got = self.portal.run(self.queue.renew_many, [Lease(m.id, version, owner)], lease)
            assert got == {m.id: expected}
        else:
            status = outcome(self.portal, self.seed.renew, m.id, owner, version, lease)
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
        seed = self.seed  # the single-item writes, where the store has them
        if seed is not None and kind is SettleKind.COMPLETE:
            got = outcome(self.portal, seed.complete, m.id, s.lease_version)
        elif seed is not None and kind is SettleKind.RELEASE:
            s = attrs.evolve(s, error=None)  # the seed's release carries no error
            got = outcome(self.portal, seed.release, m.id, s.lease_version, delay)
        elif seed is not None and kind is SettleKind.RESCHEDULE:
            assert s.at is not None
            got = outcome(self.portal, seed.reschedule, m.id, s.lease_version, s.at, s.config)
        else:
            [applied] = self.portal.run(self.queue.settle_many, [s])
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

    @precondition(lambda self: self.model and self.combines)
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

    @precondition(lambda self: self.model and self.seed is not None)
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
            assert self.seed is not None
            got = outcome(self.portal, self.seed.mark_error, m.id, version, f"mark {n}.{each}")
            if m.holds(version):
                assert got is None
                m.error_count, m.last_error = m.error_count + 1, f"mark {n}.{each}"
                m.add_error(self.now(), f"mark {n}.{each}")
            else:
                assert got is LeaseLost


class OperatorRules(MachineState):
    """Cancel, retry, delete, edit, prune, list, pause; the clock moving; the invariants."""

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

    @precondition(lambda self: self.journals is not None and self.model)
    @rule(
        index=st.integers(0, 99),
        which=st.sampled_from(["fresh", "fresh", "old"]),
        name=st.sampled_from(EVENTS),
    )
    def suspend_on_wait(self, index: int, which: str, name: str) -> None:
        """What a workflow does at a wait: its pending wait recorded at the next journal
        position (under the current lease only, else LeaseLost), then its reschedule to the
        wait's deadline, a day away."""
        journals = self.journals
        assert journals is not None
        m = self.pick(index)
        version = self.version(m, which)
        deadline = self.now() + dt.timedelta(days=1)
        wait = JournalEntry(
            position=m.journal,
            kind=EntryKind.WAIT,
            name=name,
            started_at=self.now(),
            wake_at=deadline,
        )
        got = outcome(self.portal, journals.record_entry, m.id, version, wait)
        if not m.holds(version):
            assert got is LeaseLost
            return
        assert got is None
        m.journal += 1
        m.waits.add(name)
        suspend = Settlement(
            item_id=m.id,
            lease_version=version,
            kind=SettleKind.RESCHEDULE,
            at=deadline,
            config=m.config,
        )
        assert self.portal.run(self.queue.settle_many, [suspend]) == [self.apply(suspend)]

    @precondition(lambda self: self.journals is not None)
    @rule(
        index=st.integers(0, 99),
        aim=st.sampled_from(["missing", "any", "waiting", "waiting"]),
        name=st.sampled_from(EVENTS),
    )
    def send_event(self, index: int, aim: str, name: str) -> None:
        """An event for an unknown item is refused, for a finished one too; one a queued item
        waits for makes it due at once; one for a running item makes its next reschedule due
        at once. ``waiting``: an item with a pending wait, the event it waits for."""
        journals = self.journals
        assert journals is not None
        waiting = sorted(m.id for m in self.model.values() if m.waits)
        if aim == "missing" or not self.model:
            assert outcome(self.portal, journals.send_event, "missing", name, 1) is ItemNotFound
            return
        if aim == "waiting" and waiting:
            m = self.model[waiting[index % len(waiting)]]
            name = sorted(m.waits)[index % len(m.waits)]
        else:
            m = self.pick(index)
        got = outcome(self.portal, journals.send_event, m.id, name, {"n": index})
        if m.state.finished:
            assert got is ItemStateError
            return
        assert got is None
        if m.state is ItemState.RUNNING:
            m.woken = True
        elif name in m.waits and not m.waiting_children and m.due_at > self.now():
            m.due_at = self.now()

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
        tags=st.none() | st.lists(st.sampled_from(TAGS), unique=True, max_size=2),
    )
    def list_page(
        self,
        index: int,
        cursor: bool,
        states: list[ItemState] | None,
        specs: list[str] | None,
        limit: int,
        tags: list[str] | None,
    ) -> None:
        after = self.pick(index) if cursor else None

        async def call() -> list[WorkItem]:
            return await self.queue.list_items(
                states=states,
                spec_ids=specs,
                limit=limit,
                after=None if after is None else after.id,
                tags=tags,
            )

        expected = sorted(
            (
                m
                for m in self.model.values()
                if (states is None or m.state in states)
                and (specs is None or m.spec_id in specs)
                and set(tags or ()) <= set(m.tags)
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

    @precondition(lambda self: Capability.RATE_LIMITS in capabilities_of(self.queue))
    @rule(
        queue=st.sampled_from(QUEUES),
        rate=st.sampled_from([None, RateLimit(1, 2.0), RateLimit(2, 5.0)]),
    )
    def limit_rate(self, queue: str, rate: RateLimit | None) -> None:
        """A rate limit is stored for the fleet; a new one counts the claims the store kept
        under the old (its latest `limit` ones); None lifts it (and forgets them)."""
        assert isinstance(self.queue, RateLimitStore)
        self.portal.run(self.queue.set_rate_limit, queue, rate)
        if rate is None:
            self.rates.pop(queue, None)
        else:
            kept = self.rates[queue][1][-rate.limit :] if queue in self.rates else []
            self.rates[queue] = (rate, kept)
        listed = self.portal.run(self.queue.list_queues)
        assert {i.name: i.rate_limit for i in listed if i.rate_limit} == {
            name: limit for name, (limit, _) in self.rates.items()
        }
        assert {i.name: i.throttled_until for i in listed if i.throttled_until} == {
            name: until for name in self.rates if (until := self.throttled_until(name))
        }

    @precondition(lambda self: Capability.KEY_RATE_LIMITS in capabilities_of(self.queue))
    @rule(
        key=st.sampled_from(["c1", "c{tenant}"]),
        rate=st.sampled_from([None, RateLimit(1, 2.0), RateLimit(2, 5.0)]),
    )
    def limit_key_rate(self, key: str, rate: RateLimit | None) -> None:
        """A key rate limit is stored for the fleet; each key's claims kept so far count
        against the rule that holds it now (its latest `limit`); a key no rule holds forgets
        them."""
        assert isinstance(self.queue, KeyRateLimitStore)
        self.portal.run(self.queue.set_key_rate_limit, key, rate)
        if rate is None:
            self.key_rates.pop(key, None)
        else:
            self.key_rates[key] = rate
        for held in list(self.key_starts):
            if (held_rate := self.key_rule(held)) is None:
                del self.key_starts[held]
            else:
                self.key_starts[held] = self.key_starts[held][-held_rate.limit :]
        assert self.portal.run(self.queue.key_rate_limits) == self.key_rates
        assert self.portal.run(self.queue.throttled_keys) == {
            key: until for key in CLIMITS if (until := self.key_throttled_until(key))
        }

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
                max(
                    at,
                    self.blocked_until(m) or at,
                    self.throttled_until(m.queue) or at,
                    self.key_throttled_until(m.ckey) or at,
                )
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
