"""The plain-Python model of a store the state machine checks a backend against."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs

from ... import DuplicateItem, ItemNotFound, ItemStateError, LeaseLost
from ...job import MAX_ERRORS, ItemState, WorkItem
from ._portal import Portal

T = TypeVar("T")
SPECS = ["a", "b"]
WORKERS = ["w1", "w2"]
KEYS = [None, None, "k1", "k2"]
IDS = [None, None, None, "x1", "x2"]
QUEUES = ["default", "default", "q2"]
CKEYS = [None, "c1", "c2", "c2"]
"""Concurrency keys; each has one limit (c1: one at a time, c2: two)."""
CLIMITS = {"c1": 1, "c2": 2}
EVENTS = ("e", "f")
"""Event names, waited for and sent (durable journals)."""
TAGS = ("t1", "t2")
"""An entry carries the first ``n % 3`` of them."""
UNIQUE: list[Any] = ["forever", "forever", "unfinished", 2.0]
"""Uniqueness scopes (with a key): the default, until finished, 2 s from creation."""
DURATIONS = [0.0, 0.5, 1.0, 2.5, 5.0]
POISON = {"n": "\udcff"}
POISON_REASON = "config must not contain lone surrogates (such as '\\udcff') in its strings"


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
    tags: tuple[str, ...] = ()
    start_by: dt.datetime | None = None
    waited_by: tuple[str, int] | None = None
    """The parent (id, lease version) whose wait this child still counts toward."""
    woken: bool = False
    """An event was sent while it ran: its next reschedule is due at once (durable journals)."""
    journal: int = 0
    """How many journal positions its incarnation recorded (durable journals)."""
    waits: set[str] = attrs.field(factory=set)
    """The names its journal's pending waits wait for: an event of one makes it due."""

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
            self.tags,
            self.start_by,
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
        item.tags,
        item.start_by,
    )


def outcome(portal: Portal, fn: Callable[..., Awaitable[T]], *args: Any) -> T | type[Exception]:
    """What the call returned, or the type of the protocol error it raised."""
    try:
        return portal.run(fn, *args)
    except (LeaseLost, ItemNotFound, ItemStateError, DuplicateItem) as error:
        return type(error)
