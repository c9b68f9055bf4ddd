"""A stepped wall clock never takes a lease from a live owner (R11, docs/reliability.md).

The store's clock here is a wall clock (it has ``monotonic()``) that a test steps by an hour
while time itself passes as the test says. Every lease written before a forward step looks
expired in the stepped time; the store believes the step only after it has lasted longer than
any owner takes to renew, so a live owner keeps its item (and its renewals land), and an owner
that stopped renewing is still rescued once the step is believed. A backward step is believed
at once: it can only keep an expired lease looking live for longer.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import attrs
import pytest

from trio_supervise import StepGuard, SystemClock, TrioClock, WallClock
from trio_supervise.queues import LeaseStatus, WorkQueue
from trio_supervise.queues._ports import Lease

from .conftest import START, ManualClock, open_backend

HOUR = 3600.0
LEASE = 30.0


@attrs.define
class SteppedWallClock(ManualClock):
    """A wall clock whose time passes (:meth:`advance`: both clocks) or steps (:meth:`step`:
    the wall clock alone), as an operator or NTP steps a machine's clock."""

    passed: float = 0.0

    def monotonic(self) -> float:
        return self.passed

    def advance(self, seconds: float) -> None:
        super().advance(seconds)
        self.passed += seconds

    def step(self, seconds: float) -> None:
        self.current += dt.timedelta(seconds=seconds)


def test_the_clocks_that_are_guarded() -> None:
    """The system clock and any clock with ``monotonic()`` are wall clocks; the test clocks
    (Trio's, a manual one) are not: their steps are time passing."""
    assert isinstance(SystemClock(), WallClock)
    assert isinstance(SteppedWallClock(), WallClock)
    assert not isinstance(TrioClock(), WallClock)
    assert not isinstance(ManualClock(), WallClock)


def test_a_forward_step_is_believed_once_it_has_lasted_the_hold() -> None:
    clock = SteppedWallClock()
    guard = StepGuard(clock, hold=120.0)
    assert guard.now() == START
    clock.advance(10)
    assert guard.now() == START + dt.timedelta(seconds=10)
    clock.step(HOUR)
    clock.advance(5)
    # Time goes on from where it was, at the rate it passes: 15 s since START, not an hour.
    assert guard.now() == START + dt.timedelta(seconds=15)
    clock.advance(100)
    assert guard.now() == START + dt.timedelta(seconds=115)
    clock.advance(20)  # 120 s of the step: believed
    assert guard.now() == START + dt.timedelta(seconds=HOUR + 135)
    clock.step(-2 * HOUR)  # a backward step: believed at once
    assert guard.now() == START + dt.timedelta(seconds=135 - HOUR)


def test_a_longer_hold_for_one_reading_holds_the_step_longer() -> None:
    clock = SteppedWallClock()
    guard = StepGuard(clock, hold=10.0)
    guard.now()
    clock.step(HOUR)
    assert guard.now() == START  # the step is seen (and held) from here
    clock.advance(30)
    assert guard.now(hold=60.0) == START + dt.timedelta(seconds=30)
    assert guard.now() == START + dt.timedelta(seconds=HOUR + 30)


def test_slewing_within_the_tolerance_is_not_a_step() -> None:
    clock = SteppedWallClock()
    guard = StepGuard(clock)
    guard.now()
    clock.advance(1)
    clock.step(0.5)
    assert guard.now() == START + dt.timedelta(seconds=1.5)


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


async def _claim(queue: WorkQueue, worker: str) -> list[str]:
    return [item.id for item in await queue.claim_due(["s"], worker, LEASE, 10)]


@pytest.mark.parametrize("keyed", [False, True])
async def test_a_forward_step_takes_no_lease_from_its_live_owner(
    backend: str, keyed: bool, tmp_path: Path
) -> None:
    """An hour's step: the other worker claims nothing; the owner's renewal lands (a keyed
    lease too, which is refused once really expired); after the step has lasted the hold and
    the owner has stopped renewing, the item is rescued."""
    clock = SteppedWallClock()
    async with open_backend(backend, clock, tmp_path) as queue:
        key = {"concurrency_key": "k", "concurrency_limit": 1} if keyed else {}
        await queue.enqueue("s", item_id="a", **key)  # type: ignore[arg-type]
        [item] = await queue.claim_due(["s"], "owner", LEASE, 10)
        clock.advance(1)
        clock.step(HOUR)
        assert await _claim(queue, "thief") == []
        clock.advance(10)
        renewed = await queue.renew_many([Lease("a", item.lease_version, "owner")], LEASE)
        assert renewed == {"a": LeaseStatus.HELD}
        assert await _claim(queue, "thief") == []
        # The owner stops renewing. The step is believed after the hold (120 s; the claim's
        # lease, doubled, is shorter): its renewal, in the stepped time, has expired by then.
        clock.advance(130)
        assert await _claim(queue, "rescuer") == ["a"]


async def test_a_backward_step_takes_no_lease_either(backend: str, tmp_path: Path) -> None:
    clock = SteppedWallClock()
    async with open_backend(backend, clock, tmp_path) as queue:
        await queue.enqueue("s", item_id="a")
        [item] = await queue.claim_due(["s"], "owner", LEASE, 10)
        clock.step(-HOUR)
        assert await _claim(queue, "thief") == []
        renewed = await queue.renew_many([Lease("a", item.lease_version, "owner")], LEASE)
        assert renewed == {"a": LeaseStatus.HELD}
        clock.advance(LEASE + 1)
        assert await _claim(queue, "rescuer") == ["a"]
