"""Crash a durable workflow where a test says, and see what runs again.

A :class:`CrashPlan` given to a workflow (:func:`crashing`) raises :class:`SimulatedCrash` at
the points it names, each once: right after a step's result is recorded (``after_step``),
between a step's return and its record (``before_record``: the at-least-once window), or once
the evaluation's outcome is made but before it is written (``before_settle``). The runner takes
the crash as a process that died holding the item: nothing more is written and its lease is no
longer renewed, so the item is claimed again once the lease expires (under the harness, in
virtual time), and the workflow replays.
"""

from __future__ import annotations

from typing import TypeVar

import attrs

from .._errors import LeaseLost
from ..durable import DurableWorkflow
from ..job import WorkItem

__all__ = ["CrashPlan", "SimulatedCrash", "crashing"]

ConfigT = TypeVar("ConfigT")


class SimulatedCrash(LeaseLost):
    """The crash a :class:`CrashPlan` raises: to the runner, its own lease lost (nothing more
    is written, the lease left to expire), as for a worker process that died."""


@attrs.define(kw_only=True)
class CrashPlan:
    """Where a workflow crashes, each point once (None or False: not there)."""

    after_step: str | None = None
    """Crash right after the step of this name is recorded: it is not run again."""
    before_record: str | None = None
    """Crash after the step of this name returned, before its result is recorded: it runs
    again on the next evaluation (a step is at least once)."""
    before_settle: bool = False
    """Crash once an evaluation's outcome is made, before it is written: the next evaluation
    replays every step and makes it again."""
    crashed: list[str] = attrs.field(factory=list)
    """The crashes so far, as ``"point step @item"``, in order."""

    def __call__(self, point: str, step: str, item: WorkItem) -> None:
        wanted = {
            "after-step": self.after_step,
            "before-record": self.before_record,
            "before-settle": "" if self.before_settle else None,
        }.get(point)
        if wanted is None or wanted != step:
            return
        if point == "after-step":
            self.after_step = None
        elif point == "before-record":
            self.before_record = None
        else:
            self.before_settle = False
        where = f"{point} {step}".strip()
        self.crashed.append(f"{where} @{item.id}")
        raise SimulatedCrash(item.id, item.lease_version, f"simulated crash at {where}")


def crashing(workflow: DurableWorkflow[ConfigT], plan: CrashPlan) -> DurableWorkflow[ConfigT]:
    """*workflow*, crashing where *plan* says (a copy; the original is unchanged)."""
    return attrs.evolve(workflow, hook=plan)
