"""Crash points in the testing harness: a durable workflow crashed where the test says, and
what runs again after the lease expires."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio
import trio.testing

from trio_supervise import ItemState, Workflow, durable_workflow
from trio_supervise.testing import CrashPlan, Harness, crashing

LEASE = 60.0  # the harness's runner settings keep the default lease


@attrs.frozen
class Job:
    pass


def counting() -> tuple[dict[str, int], Any]:
    """A workflow of two steps counting how often each runs, and the counts."""
    runs = {"create": 0, "mail": 0}

    def create() -> str:
        runs["create"] += 1
        return "u1"

    def mail(user: str) -> str:
        runs["mail"] += 1
        return f"mailed {user}"

    @durable_workflow("signup", config_type=Job)
    async def signup(wf: Workflow[Any], config: Job) -> str:
        user = await wf.step("create", create)
        return str(await wf.step("mail", mail, user))

    return runs, signup


@pytest.mark.parametrize(
    ("plan", "runs", "crashed"),
    [
        (CrashPlan(before_record="create"), {"create": 2, "mail": 1}, "before-record create"),
        (CrashPlan(after_step="create"), {"create": 1, "mail": 1}, "after-step create"),
        (CrashPlan(before_settle=True), {"create": 1, "mail": 1}, "before-settle"),
    ],
)
async def test_a_crash_runs_again_only_what_was_not_recorded(
    harness: Harness,
    autojump_clock: trio.testing.MockClock,
    plan: CrashPlan,
    runs: dict[str, int],
    crashed: str,
) -> None:
    """Crashed between a step's return and its record, the step runs again; crashed after
    its record, or after the outcome but before it is written, nothing runs again. Either way
    the item waits out its lease, is claimed again and completes with the same result."""
    counts, signup = counting()
    await harness.run_drivers(crashing(signup, plan))
    await harness.queue.enqueue("signup", item_id="s")

    def done() -> bool:
        return harness.queue.items["s"].state is ItemState.COMPLETED

    took = await harness.wait_until(done, timeout=3600, poll=1)
    assert plan.crashed == [f"{crashed} @s"]
    assert counts == runs
    assert harness.queue.items["s"].result == "mailed u1"
    assert took == LEASE  # claimed again the moment the crashed lease expired
    assert [e.name for e in (await harness.queue.read_journal("s")).entries] == [
        "create",
        "mail",
    ]
