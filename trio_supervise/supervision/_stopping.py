"""Shutdown order and termination: once shutdown reaches a supervisor (its own, or its turn in its
parent's), its children are asked to stop in its shutdown order, each within its grace; one child
may also be terminated alone (OTP's ``terminate_child``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import attrs
import trio
import trio_util

from .._lifecycle import Shutdown
from ._child import Slot, WorkerState
from ._group import ShutdownOrder, stop_order

if TYPE_CHECKING:
    from ._supervisor import Supervisor

__all__ = ["Stopper"]


@attrs.define(eq=False)
class Stopper:
    """Stops the children of one supervisor: all of them in order at shutdown, or one alone."""

    _supervisor: Supervisor = attrs.field(repr=False)
    halt: Shutdown = attrs.field(factory=Shutdown, repr=False)
    """This run is stopping its children (shutdown reached it, or its parent terminates it)."""
    turn: Shutdown | None = attrs.field(default=None, repr=False)
    """As a nested child: begun by the parent when it is this supervisor's turn to stop."""

    @property
    def stopping(self) -> bool:
        """Whether the supervisor is stopping its children (nothing is started or restarted)."""
        return self._supervisor.shutdown.requested or self.halt.requested

    def reset(self) -> None:
        """A new run: not stopping (unless its shutdown already began)."""
        self.halt = Shutdown()

    async def wait_stopping(self) -> None:
        """Return once the supervisor is stopping its children."""
        await trio_util.wait_any(self.halt.wait, self._supervisor.shutdown.wait)  # type: ignore[no-untyped-call]

    async def stop_when_asked(self) -> None:
        """Once it is the supervisor's time to stop, stop its children in its shutdown order.

        Every live child is marked ``stopping`` as soon as shutdown reaches the supervisor (all
        at once, so the states a history records do not depend on which task Trio runs first);
        each is then asked in turn.
        """
        supervisor = self._supervisor
        await trio_util.wait_any(supervisor.shutdown.wait, self._wait_for_turn)  # type: ignore[no-untyped-call]
        slots = supervisor._table.slots
        for slot in slots:
            slot.mark_stopping()
        await self._wait_for_stop()
        reason = supervisor.shutdown.reason or (self.turn.reason if self.turn else None) or "stop"
        self.halt.begin(reason)
        order = supervisor.shutdown_order
        live = [slot for slot in stop_order(slots, order) if slot.scope]
        supervisor._log(
            logging.INFO,
            f"supervisor {supervisor.name!r} shutting down ({reason}): stopping {len(live)} "
            f"worker(s), {order} order",
            reason=reason,
        )
        for slot in live:
            slot.ask_to_stop(reason)
            if order is ShutdownOrder.REVERSE:
                await slot.wait_run_ended()

    async def _wait_for_turn(self) -> None:
        if self.turn is None or self._supervisor._parent is None:
            await trio.sleep_forever()
        else:
            await self.turn.wait()

    async def _wait_for_stop(self) -> None:
        turn = self.turn
        if self._supervisor._parent is None or turn is None:
            await self._supervisor.shutdown.wait()
            return
        await trio_util.wait_any(turn.wait, self._wait_for_own_shutdown)  # type: ignore[no-untyped-call]

    async def _wait_for_own_shutdown(self) -> None:
        """A nested supervisor's shutdown that began alone (it gave up, or shut down
        automatically); one begun by its parent's waits for the parent to give it its turn."""
        supervisor = self._supervisor
        await supervisor.shutdown.wait()
        if supervisor._parent is not None and supervisor._parent._stopping:
            await trio.sleep_forever()

    def prepare_nested_run(self, parent: Supervisor, turn: Shutdown) -> None:
        """Called by the parent before each run of this nested supervisor."""
        self.turn = turn
        supervisor = self._supervisor
        if supervisor.shutdown.requested and not parent._stopping:
            # Restarted after giving up: a fresh shutdown (the old one stays begun) and health.
            parent.shutdown.detach(supervisor.shutdown)
            supervisor.shutdown = Shutdown()
            parent.shutdown.adopt(supervisor.shutdown)
            supervisor.healthy.value = True

    async def terminate(self, slot: Slot) -> None:
        """Stop the child of *slot* within its grace, and return once it has ended; it stays
        listed, ``stopped``, and no restart takes it (a pending one is dropped)."""
        supervisor = self._supervisor
        path = supervisor._path(slot)
        if slot.pending is not None:
            slot.pending = None  # its restart skips it
            if slot.scope is None:
                slot.set_state(WorkerState.STOPPED)
        if slot.scope is not None:
            slot.held = slot.terminating = True
            slot.ask_to_stop(f"terminate_child({path!r})")
            await slot.wait_run_ended()
        else:
            await trio.lowlevel.checkpoint()
        supervisor._log(logging.INFO, f"worker {path!r} terminated", slot)
