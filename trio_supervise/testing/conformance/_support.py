"""What a contract test asks of a store beyond its ports, and skipping where the store has not it.

A test needing an optional part says so with :func:`needs`; :class:`StoreConformance` skips it,
before the test starts, for a store without that part (a skip raised inside a Trio test loses
its reason under pytest-trio, and one raised in an async fixture is reported as a pass).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Literal, TypeVar, cast

import attrs

from ... import LeaseLost
from ...job import JSONValue, Lease, LeaseStatus, SettleKind, Settlement, WorkItem, check_json
from ...queues import SeedWrites, WorkQueue
from ...queues._ports import Capability, capabilities_of

SettleAndClaim = Callable[..., Awaitable[tuple[list[bool], list[WorkItem]]]]
F = TypeVar("F", bound=Callable[..., object])

SEED_WRITES: Final = "seed-writes"
"""The seed's single-item writes (:class:`~trio_supervise.queues.SeedWrites`), of which a test
of ``mark_error`` needs the store's own: not a capability a store declares but a protocol it
implements or not."""

Need = Capability | Literal["seed-writes"]
_ATTRIBUTE = "_trio_supervise_conformance_needs"


def needs(*parts: Need, when: Mapping[str, object] | None = None) -> Callable[[F], F]:
    """Mark a contract test as needing optional *parts* of the store; with *when*, only the
    cases of a parametrized test whose parameters have those values."""

    def mark(test: F) -> F:
        rules = (*getattr(test, _ATTRIBUTE, ()), (frozenset(parts), dict(when or {})))
        setattr(test, _ATTRIBUTE, rules)
        return test

    return mark


def needed_by(test: object, params: Mapping[str, object]) -> frozenset[Need]:
    """What *test*, run with *params*, was marked as needing."""
    rules: tuple[tuple[frozenset[Need], dict[str, object]], ...] = getattr(test, _ATTRIBUTE, ())
    wanted: set[Need] = set()
    for parts, when in rules:
        if all(params.get(name) == value for name, value in when.items()):
            wanted |= parts
    return frozenset(wanted)


def has(store: WorkQueue) -> frozenset[Need]:
    """Which optional parts *store* has."""
    parts: set[Need] = set(capabilities_of(store))
    if isinstance(store, SeedWrites):
        parts.add(SEED_WRITES)
    return frozenset(parts)


def seed_writes(queue: WorkQueue) -> SeedWrites:
    """The store's single-item writes (``renew``, ``complete``, ``release``, ``reschedule``,
    ``mark_error``). A store without them gets them written over its worker port (as the
    built-in stores write them): one renewal in ``renew_many``, one settlement in
    ``settle_many``, ``LeaseLost`` where either is refused; only ``mark_error``, which no
    settlement expresses, needs the store's own (a test calling it needs ``SEED_WRITES``)."""
    if isinstance(queue, SeedWrites):
        return queue
    return _OverPorts(queue)


@attrs.frozen
class _OverPorts:
    """The seed's single-item writes over a store's worker port."""

    store: WorkQueue

    async def renew(
        self, item_id: str, worker_id: str, lease_version: int, lease: float
    ) -> LeaseStatus:
        statuses = await self.store.renew_many([Lease(item_id, lease_version, worker_id)], lease)
        status = statuses.get(item_id, LeaseStatus.LOST)
        if status is LeaseStatus.LOST:
            raise LeaseLost(item_id, lease_version, "renewal refused")
        return status

    async def release(self, item_id: str, lease_version: int, delay: float) -> None:
        await self._settle(item_id, lease_version, SettleKind.RELEASE, delay=delay)

    async def reschedule(
        self, item_id: str, lease_version: int, at: dt.datetime, config: JSONValue
    ) -> None:
        await self._settle(
            item_id, lease_version, SettleKind.RESCHEDULE, at=at, config=check_json(config)
        )

    async def complete(self, item_id: str, lease_version: int) -> None:
        await self._settle(item_id, lease_version, SettleKind.COMPLETE)

    async def mark_error(self, item_id: str, lease_version: int, error: str) -> None:
        raise AssertionError("a test calling mark_error must need SEED_WRITES")

    async def _settle(
        self, item_id: str, lease_version: int, kind: SettleKind, **fields: Any
    ) -> None:
        settlement = Settlement(item_id=item_id, lease_version=lease_version, kind=kind, **fields)
        [applied] = await self.store.settle_many([settlement])
        if not applied:
            raise LeaseLost(item_id, lease_version)


def settle_and_claim(queue: WorkQueue) -> SettleAndClaim:
    """The store's ``settle_and_claim``, for a test marked
    ``@needs(Capability.SETTLE_AND_CLAIM)``."""
    assert Capability.SETTLE_AND_CLAIM in capabilities_of(queue), (
        "a test using settle_and_claim() must need Capability.SETTLE_AND_CLAIM"
    )
    return cast(SettleAndClaim, queue.settle_and_claim)  # type: ignore[attr-defined]


def settle_then_claim(queue: WorkQueue) -> SettleAndClaim:
    """The store's ``settle_and_claim`` where it declares one, else ``settle_many`` then
    ``claim_due``: what the contract says the combined call is the same as."""
    if Capability.SETTLE_AND_CLAIM in capabilities_of(queue):
        return settle_and_claim(queue)

    async def apart(
        settlements: Sequence[Settlement],
        spec_ids: Sequence[str],
        worker_id: str,
        lease: float,
        limit: int,
        *,
        queue: str = "default",
    ) -> tuple[list[bool], list[WorkItem]]:
        applied = await store.settle_many(settlements)
        return applied, await store.claim_due(spec_ids, worker_id, lease, limit, queue=queue)

    store = queue
    return apart


S = dt.timedelta(seconds=1)
"""One second, for due times and expiries written as ``START + n * S``."""


async def claim_one(queue: WorkQueue, worker: str = "w1", lease: float = 30) -> WorkItem:
    """Claim the one due item of spec ``"spec"``."""
    [item] = await queue.claim_due(["spec"], worker, lease, 1)
    return item
