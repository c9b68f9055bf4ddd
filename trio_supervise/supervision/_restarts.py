"""Starting and restarting: each run of a child launched in the supervisor's nursery and watched,
and how it ended acted on: restarted after its backoff with the siblings its strategy names
(within the supervisor's restart intensity), recorded as stopped, or failed. The per-child verdict
is :func:`._child.judge`; the group rules are in :mod:`._group`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import attrs
import trio

from .._lifecycle import Shutdown
from ._child import (
    Action,
    ChildSpec,
    Outcome,
    Readiness,
    Restart,
    Slot,
    Verdict,
    WorkerState,
    describe,
    error_text,
    judge,
)
from ._group import (
    RestartWindow,
    auto_shutdown_due,
    ended_for_good,
    never_restarted_with_group,
    restart_group,
)
from ._stopping import Stopper

if TYPE_CHECKING:
    from ._supervisor import Supervisor

__all__ = ["Restarter"]


@attrs.define(eq=False)
class Restarter:
    """Launches the runs of one supervisor's children and acts on how each one ends."""

    _supervisor: Supervisor = attrs.field(repr=False)
    _stopper: Stopper = attrs.field(repr=False)
    _window: RestartWindow | None = attrs.field(default=None, repr=False)

    def reset(self) -> None:
        """A new run: no restart counted against the intensity yet."""
        if self._window is not None:
            self._window.reset()

    async def launch(self, slot: Slot, restart: Restart | None) -> None:
        """Start one run of *slot*, returning once it is running (or ready, or ended).

        Only the restart a slot belongs to may launch it, and never while a run is alive.
        """
        if slot.pending is not restart:
            return
        if self._stopper.stopping:
            slot.pending = None
            if slot.scope is None:
                slot.set_state(WorkerState.STOPPED)
            return
        if slot.scope is not None:
            return
        slot.pending = None
        nursery = self._supervisor._nursery
        assert nursery is not None
        scope = trio.CancelScope()
        slot.scope, slot.held = scope, False
        child = slot.child
        slot.stop = None
        if not isinstance(child, ChildSpec):
            slot.stop = Shutdown()
            child._stopper.prepare_nested_run(self._supervisor, slot.stop)
        elif child.stop_signal:
            slot.stop = Shutdown()
        slot.begin_run()
        slot.set_state(WorkerState.STARTING)
        await nursery.start(self._run_child, slot, scope)

    async def _run_child(
        self,
        slot: Slot,
        scope: trio.CancelScope,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """One run of a child: observe how it ends, and decide."""
        readiness = Readiness(task_status, slot)
        del task_status  # only through readiness, which lets go of it once used (see Readiness)
        started_at = trio.current_time()
        outcome = Outcome.CANCELLED
        error: Exception | None = None
        decided = False
        try:
            try:
                with scope:
                    child = slot.child
                    # Each call spelled out: a per-run kwargs dict would live as long as the run.
                    if not isinstance(child, ChildSpec):
                        await child.run(task_status=readiness)
                    elif child.stop_signal and child.start:
                        await child.target(task_status=readiness, stop=slot.stop)
                    elif child.stop_signal:
                        readiness.started()
                        await child.target(stop=slot.stop)
                    elif child.start:
                        await child.target(task_status=readiness)
                    else:
                        readiness.started()
                        await child.target()
                    outcome = Outcome.EXITED
            except Exception as exc:
                outcome, error = Outcome.FAILED, exc
            slot.scope = None
            self._act_on_end(slot, outcome, error, trio.current_time() - started_at)
            decided = True
        finally:
            if slot.scope is scope:
                slot.scope = None
            if not decided and not slot.held:
                # Cancelled from above, or KeyboardInterrupt: it is not running any more.
                slot.set_state(WorkerState.STOPPED)
            slot.end_run()
        readiness.release()

    def _act_on_end(
        self, slot: Slot, outcome: Outcome, error: Exception | None, ran_for: float
    ) -> None:
        """Act on how a run ended. Synchronous, so decisions never interleave."""
        supervisor, stopping = self._supervisor, self._stopper.stopping
        slot.ended_how = describe(outcome, error)
        slot.stopped_by_supervisor = slot.held or stopping
        if error is not None:
            slot.last_error, slot.last_exception = error_text(error), error
        verdict = judge(
            slot,
            supervisor._path(slot),
            outcome,
            error,
            ran_for,
            stopping=stopping,
            jitter=supervisor._effective_jitter(),
        )
        if verdict.action is Action.RESTART:
            verdict = self._within_intensity(verdict)
        loud = verdict.level >= logging.ERROR and error is not None
        supervisor._log(
            verdict.level,
            verdict.message,
            slot,
            attempt=verdict.attempt,
            backoff_s=verdict.backoff,
            error=None if error is None else error_text(error),
            exc_info=error if loud else None,
            outcome=outcome.value if error is None else f"raised {error_text(error)}",
        )
        action = verdict.action
        if action is Action.RESTART:
            assert verdict.backoff is not None
            self._schedule(slot, verdict.backoff)
        elif action is Action.FAIL:
            supervisor._fail(slot, escalate=True)
        elif action is Action.FAIL_QUIETLY:
            supervisor._fail(slot, escalate=False)
        elif slot.held and slot.pending is not None and not self._stopper.stopping:
            pass  # stopped for its strategy group, which restarts it: stays backing-off
        else:
            slot.set_state(WorkerState.STOPPED)
            rule = supervisor.auto_shutdown
            if verdict.ends_normally and auto_shutdown_due(supervisor._table.slots, slot, rule):
                reason = f"significant worker {supervisor._path(slot)!r} ended ({rule})"
                supervisor._log(
                    logging.INFO, f"supervisor {supervisor.name!r} shutting down: {reason}", slot
                )
                supervisor.shutdown.begin(reason)

    def _within_intensity(self, verdict: Verdict) -> Verdict:
        """The restart *verdict* asks for, or giving up if it exceeds the supervisor's
        intensity."""
        window, intensity = self._window, self._supervisor.intensity
        if window is None or intensity is None or window.admit(trio.current_time()):
            return verdict
        return attrs.evolve(
            verdict,
            action=Action.FAIL,
            level=logging.ERROR,
            backoff=None,
            message=(
                f"{verdict.message.rsplit('; restart ', 1)[0]}; supervisor "
                f"{self._supervisor.name!r} exceeded its restart intensity ({window.count} "
                f"restarts within {intensity.period:g} s, at most {intensity.max_restarts}): "
                f"shutting down"
            ),
        )

    def _schedule(self, slot: Slot, delay: float) -> None:
        """Restart *slot* after *delay*, with the siblings its strategy names."""
        slots = self._supervisor._table.slots
        members: set[int] = {id(slot)}
        for sibling in restart_group(slots, slot, self._supervisor.strategy):
            if sibling is slot or ended_for_good(sibling) or sibling.terminating:
                continue  # a child being terminated is as good as terminated: never restarted
            if never_restarted_with_group(sibling):
                if sibling.scope is not None:
                    sibling.held = True
                    sibling.scope.cancel()
                continue
            members.add(id(sibling))
            if sibling.pending is not None:
                # Already waiting for an earlier restart: this one replaces it, with its members.
                sibling.pending.scope.cancel()
                members.update(id(m) for m in sibling.pending.members)
        ordered = [s for s in slots if id(s) in members]
        restart = Restart(members=ordered, delay=delay)
        for member in ordered:
            member.pending = restart
            if member.scope is not None:
                member.held = True
                member.scope.cancel()
            member.set_state(WorkerState.BACKING_OFF)
        nursery = self._supervisor._nursery
        assert nursery is not None
        nursery.start_soon(self._restart_after, restart)

    async def _restart_after(self, restart: Restart) -> None:
        stopper = self._stopper
        with restart.scope:
            with trio.move_on_after(restart.delay):
                await stopper.wait_stopping()
            if not stopper.stopping:
                for member in restart.members:
                    await member.wait_run_ended()
            for member in restart.members:
                if member.pending is not restart:
                    continue
                if not stopper.stopping:
                    member.restarts += 1
                    path = self._supervisor._path(member)
                    self._supervisor._log(
                        logging.INFO,
                        f"restarting worker {path!r} (attempt {member.attempt})",
                        member,
                        attempt=member.attempt,
                    )
                await self.launch(member, restart)
