"""The memory queue itself: :class:`MemoryQueue`, one part per port over the state they share,
and the abilities it declares.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import trio

from ..._clock import Clock, TrioClock
from .._ports import Capability, declared
from ._audit import AuditSide
from ._durable import DurableSide
from ._maintenance import MaintenanceSide
from ._operator import OperatorSide
from ._producer import ProducerSide
from ._worker import WorkerSide

__all__ = ["MemoryQueue"]


@attrs.define(eq=False)
class MemoryQueue(WorkerSide, ProducerSide, OperatorSide, MaintenanceSide, AuditSide, DurableSide):
    """The whole :class:`WorkQueue` protocol in memory; inspectable and resettable.

    Everything happens in the Trio thread with no await in the middle of a write, so each method
    is atomic. "Now" comes from an injectable clock; the default, :class:`TrioClock`, follows
    Trio's clock, so under ``autojump_clock`` due times and lease expiries follow virtual time.

    :ivar events: every write in order (``claim``, ``renew``, ``settle:<kind>``, ...), including
        refused stale ones (``applied=False``). A list of :class:`QueueEvent` to its readers,
        kept as plain values in the list itself, so that logging a write allocates nothing the
        garbage collector counts: each read builds the events anew (equal, not the same
        objects).
    """

    @property
    def clock(self) -> Clock:
        return self._clock

    serial_writes: ClassVar[bool] = True
    """Every call runs in this process, one at a time: a claim beside a write gains nothing."""

    @property
    def capabilities(self) -> frozenset[Capability]:
        """``SETTLE_AND_CLAIM``, ``RATE_LIMITS``, ``KEY_RATE_LIMITS``, ``AUDIT_TRAIL``,
        ``ERROR_HISTORY`` and ``DURABLE_JOURNAL``; ``SERIAL_WRITES`` while
        :attr:`serial_writes` (a runner then settles and claims in one
        :meth:`settle_and_claim`); ``EXACT_WAKEUPS`` while :attr:`exact_wakeups`."""
        found = {
            Capability.SETTLE_AND_CLAIM,
            Capability.RATE_LIMITS,
            Capability.KEY_RATE_LIMITS,
            Capability.AUDIT_TRAIL,
            Capability.ERROR_HISTORY,
            Capability.DURABLE_JOURNAL,
        }
        if self.serial_writes:
            found.add(Capability.SERIAL_WRITES)
        if self.exact_wakeups:
            found.add(Capability.EXACT_WAKEUPS)
        return declared(type(self), frozenset(found))

    @property
    def exact_wakeups(self) -> bool:
        """True with a :class:`TrioClock`: :meth:`wait_for_work` then wakes exactly when needed.

        Every write happens in this process and wakes the waiters; due times are reached on
        Trio's clock. With another clock (say one a test moves by hand), due times can arrive
        without Trio noticing, so a runner keeps polling.
        """
        return isinstance(self._clock, TrioClock)

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()
        self.closed = True

    async def __aenter__(self) -> MemoryQueue:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Closes the queue, as the durable queues' ``async with`` does."""
        await self.aclose()
