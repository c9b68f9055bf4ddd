"""What a runner's parts share while it runs: the items in flight and their slots, and the
runner's state.

An item is *in flight* from its claim until its outcome is written (or given up): its lease is
renewed meanwhile, and it takes a slot of its queue until its outcome is taken for a write.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable

import attrs
import trio
import trio_util

from .._errors import QueueUnavailable
from .._lifecycle import Shutdown
from ..job import Lease, Settlement, StopReason, WorkItem
from ._observation import RunnerMetrics, RunnerState
from ._settings import RunnerSettings

__all__ = ["Control", "Flights", "InFlight"]

_RUNNING = RunnerState.RUNNING
_BACKING_OFF = RunnerState.BACKING_OFF


@attrs.define(eq=False, init=False)
class InFlight:
    """An item this runner holds a lease on, from claim until its outcome is written."""

    item: WorkItem
    renewed_at: float
    key: tuple[str, int]
    """``(item id, lease version)``: its key in the runner's in-flight set."""
    scope: trio.CancelScope | None
    """The evaluator's scope while it evaluates this item (None before and after): cancelling it
    stops this evaluation and nothing else."""
    reason: StopReason | None
    detail: str
    settling: bool
    """The outcome is being written: from now on the write's result, not a renewal, is the truth."""
    write_failures: int
    """Failed attempts at writing the outcome so far."""
    first_write_failure: float | None
    claimed_at: float
    evaluating_since: float | None
    """When its driver started, while it runs."""
    lease: Lease | None
    """The lease the renewals send, built at the first renewal."""

    def __init__(self, item: WorkItem, renewed_at: float) -> None:
        # Spelled out, one per claimed item: attrs' own would call a factory for claimed_at,
        # and a key property would build its tuple at every look-up (issue 17).
        self.item = item
        self.renewed_at = self.claimed_at = renewed_at
        self.key = (item.id, item.lease_version)
        self.scope = None
        self.reason = None
        self.detail = ""
        self.settling = False
        self.write_failures = 0
        self.first_write_failure = None
        self.evaluating_since = None
        self.lease = None

    def stop(self, reason: StopReason, detail: str = "") -> None:
        if self.reason is None or reason > self.reason:
            self.reason = reason
            self.detail = detail
        if self.scope is not None:
            self.scope.cancel()


@attrs.define(eq=False)
class Flights:
    """The items in flight, by ``(item id, lease version)``, and the slots they take per served
    queue (each queue has its own limit)."""

    metrics: RunnerMetrics
    entries: dict[tuple[str, int], InFlight] = attrs.Factory(dict)
    count: trio_util.AsyncValue[int] = attrs.Factory(lambda: trio_util.AsyncValue(0))
    """How many are in flight (updated once per batch of claims or of written outcomes)."""
    busy: dict[str, trio_util.AsyncValue[int]] = attrs.Factory(dict)
    """Per served queue, the slots taken (claims reserve theirs while they run)."""
    _freed: collections.Counter[str] = attrs.Factory(collections.Counter)

    def serve(self, queues: Iterable[str]) -> None:
        """Give each of *queues* its slot count."""
        for name in queues:
            self.busy.setdefault(name, trio_util.AsyncValue(0))

    def add(self, item: WorkItem, claimed_at: float) -> InFlight:
        """*item*, just claimed, is in flight (the caller updates :attr:`count` per batch)."""
        entry = InFlight(item, renewed_at=claimed_at)
        self.entries[entry.key] = entry
        return entry

    def free(self, entry: InFlight, *, batched: bool = False) -> None:
        """Drop *entry* from the in-flight set. Unless *batched* (a written batch's results,
        whose slots :meth:`taken` freed already) it frees its slot too; a batch's results update
        the in-flight count once, in :meth:`written`."""
        if self.entries.pop(entry.key, None) is not None:
            if batched:
                return
            busy = self.busy.get(entry.item.queue)
            if busy is not None and busy.value > 0:
                busy.value -= 1
        self.count.value = len(self.entries)

    def taken(self, batch: list[tuple[InFlight, Settlement]]) -> None:
        """*batch* was taken for a write: free its slots, once per queue (waking the claim
        loops once), so that the next claim runs beside the write.

        An item being written is no longer evaluated; it stays in flight (its lease renewed,
        drain waiting for it) until the write's answer. At most one batch is being written at
        a time, so a queue holds at most its concurrency plus one settle batch of items.
        """
        self.metrics.flush()  # the batch's evaluations are observed as it is taken
        if len(self.busy) == 1:
            [busy] = self.busy.values()
            busy.value = max(0, busy.value - len(batch))
            return
        freed = self._freed
        for entry, _ in batch:
            freed[entry.item.queue] += 1
        for queue, n in freed.items():
            slots = self.busy.get(queue)
            if slots is not None:
                slots.value = max(0, slots.value - n)
        freed.clear()

    def retake(self, entry: InFlight) -> None:
        """*entry*'s write failed and waits to be written again: it takes a slot again
        meanwhile (the next batch that takes it frees it), so failing writes cannot grow the
        in-flight set."""
        busy = self.busy.get(entry.item.queue)
        if busy is not None:
            busy.value += 1

    def written(self) -> None:
        """After a written batch's results: apply its counts, update the in-flight count once."""
        self.metrics.flush()
        self.count.value = len(self.entries)

    def is_held(self, entry: InFlight) -> bool:
        """Whether *entry* is still in flight (not written and freed meanwhile)."""
        return self.entries.get(entry.key) is entry

    def clear(self) -> None:
        """Forget every entry (the run ended: their leases expire) and every slot taken."""
        self.entries.clear()
        self._freed.clear()
        self.count.value = 0
        for busy in self.busy.values():
            busy.value = 0


@attrs.define(eq=False)
class Control:
    """A run's settings and state, as its parts read and change them."""

    settings: RunnerSettings
    shutdown: Shutdown
    state: RunnerState = RunnerState.IDLE
    claim_failures: int = 0
    """Consecutive failed claims (0 once a claim succeeds)."""
    time: Callable[[], float] = trio.current_time
    """The running clock's own ``current_time`` while the run lasts (see the runner)."""

    def queue_unreachable(self, error: Exception) -> None:
        """A renewal or write found the queue unreachable: show it until a call succeeds."""
        if isinstance(error, QueueUnavailable) and self.state is _RUNNING:
            self.state = _BACKING_OFF

    def queue_answered(self) -> None:
        """A queue call succeeded: back to running, unless claims are failing."""
        if self.state is _BACKING_OFF and not self.claim_failures:
            self.state = _RUNNING
