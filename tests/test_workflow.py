"""Drivers, the registry, settings and run_due_pass: the seed's tests, ported, and more."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import attrs
import pytest
import trio

import trio_supervise as ts
from trio_supervise.job import first_line
from trio_supervise.queues import LeaseStatus, Settlement, WorkItem
from trio_supervise.run import raise_specific

EPOCH = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


class Context:
    """The drivers' context in these tests: nothing in it."""


@attrs.define
class Driver:
    """The seed's test driver: its behaviour is read from the item's config."""

    valid: bool = True
    name: str = "driver"
    spec_ids: Sequence[str] = ("spec",)

    def validate_specs(self) -> None:
        if not self.valid:
            raise ValueError("invalid")

    async def evaluate(self, context: Context, item: WorkItem) -> ts.Outcome:
        if "sleep" in item.config:
            await trio.sleep(item.config["sleep"])
        if item.config.get("fail"):
            raise RuntimeError("planned")
        if item.config.get("interrupt"):
            raise KeyboardInterrupt
        if item.config.get("reschedule"):
            return ts.Reschedule(EPOCH, {"next": True})
        if item.config.get("stop"):
            return ts.Stop()
        return ts.Continue()


@attrs.define
class FakeQueue:
    """The seed's fake queue: records every call, hands out its items in order."""

    items: list[WorkItem] = attrs.Factory(list)
    released: list[str] = attrs.Factory(list)
    release_delays: list[float] = attrs.Factory(list)
    completed: list[str] = attrs.Factory(list)
    rescheduled: list[tuple[str, Any]] = attrs.Factory(list)
    errors: list[str] = attrs.Factory(list)
    error_texts: list[str] = attrs.Factory(list)
    error_times: list[float] = attrs.Factory(list)
    renewals: list[tuple[str, str, int]] = attrs.Factory(list)
    renewal_times: list[float] = attrs.Factory(list)
    renewal_error: Exception | None = None
    claim_limits: list[int] = attrs.Factory(list)
    settled: list[Settlement] = attrs.Factory(list)
    write_failures: int = 0
    """The next this many writes (release, complete, reschedule, mark_error) fail transiently."""
    write_attempts: list[tuple[str, float]] = attrs.Factory(list)

    async def _attempt(self, op: str) -> None:
        self.write_attempts.append((op, trio.current_time()))
        if self.write_failures:
            self.write_failures -= 1
            raise ts.QueueUnavailable("database is locked")

    async def claim_due(
        self, spec_ids: Sequence[str], worker_id: str, lease: float, limit: int
    ) -> list[WorkItem]:
        self.claim_limits.append(limit)
        taken, self.items = self.items[:limit], self.items[limit:]
        return taken

    async def renew(
        self, item_id: str, worker_id: str, lease_version: int, lease: float
    ) -> LeaseStatus:
        self.renewals.append((item_id, worker_id, lease_version))
        self.renewal_times.append(trio.current_time())
        if self.renewal_error is not None:
            raise self.renewal_error
        return LeaseStatus.HELD

    async def release(self, item_id: str, lease_version: int, delay: float) -> None:
        await self._attempt("release")
        self.released.append(item_id)
        self.release_delays.append(delay)

    async def complete(self, item_id: str, lease_version: int) -> None:
        await self._attempt("complete")
        self.completed.append(item_id)

    async def reschedule(
        self, item_id: str, lease_version: int, at: dt.datetime, config: Any
    ) -> None:
        await self._attempt("reschedule")
        self.rescheduled.append((item_id, config))

    async def mark_error(self, item_id: str, lease_version: int, error: str) -> None:
        await self._attempt("mark_error")
        self.errors.append(item_id)
        self.error_texts.append(error)
        self.error_times.append(trio.current_time())

    async def settle_many(self, settlements: Sequence[Settlement]) -> list[bool]:
        self.settled.extend(settlements)
        return [True] * len(settlements)


def item(item_id: str, fail: bool = False, **config: Any) -> WorkItem:
    return WorkItem(
        id=item_id,
        tenant_id="tenant",
        subject_id="subject",
        spec_id="spec",
        config={"fail": fail, **config},
        lease_version=1,
        due_at=EPOCH,
        created_at=EPOCH,
        updated_at=EPOCH,
    )


def settings(**changes: Any) -> ts.RunnerSettings:
    values: dict[str, Any] = {
        "worker_id": "worker",
        "lease": 60,
        "requeue_delay": 5,
        "claim_batch": 10,
        "concurrency": 3,
    }
    return ts.RunnerSettings(**{**values, **changes})


def registry(*drivers: Any) -> ts.DriverRegistry[Context]:
    made: ts.DriverRegistry[Context] = ts.DriverRegistry()
    for driver in drivers or (Driver(),):
        made.register(driver)
    return made


async def context() -> Context:
    return Context()


# -- the seed's tests -------------------------------------------------------------------------


async def test_due_pass_releases_success_and_marks_failures(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Continue releases, Stop completes, an error is marked and released; stats count both."""
    queue = FakeQueue([item("ok"), item("done", stop=True), item("bad", fail=True)])
    stats = await ts.run_due_pass(queue, registry(), settings(), context)  # type: ignore[arg-type]
    assert stats == ts.PassStats(claimed=3, failed=1)
    assert sorted(queue.released) == ["bad", "ok"]
    assert queue.release_delays == [5, 5]
    assert queue.completed == ["done"]
    assert queue.errors == ["bad"]
    assert [first_line(text) for text in queue.error_texts] == ["RuntimeError: planned"]


async def test_context_failure_releases_every_claim(autojump_clock: trio.testing.MockClock) -> None:
    """A context that fails to build marks and releases every claimed item, then raises."""
    queue = FakeQueue([item("one"), item("two")])

    async def broken() -> Context:
        raise RuntimeError("context failed")

    with pytest.raises(RuntimeError, match="context failed"):
        await ts.run_due_pass(queue, registry(), settings(), broken)  # type: ignore[arg-type]
    assert queue.released == ["one", "two"]
    assert queue.errors == ["one", "two"]
    assert queue.error_texts == ["RuntimeError: context failed"] * 2


async def test_due_pass_atomically_reschedules_driver_state(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Reschedule writes the new due time and config in one call, nothing else."""
    queue = FakeQueue([item("recurring", reschedule=True)])
    await ts.run_due_pass(queue, registry(), settings(), context)  # type: ignore[arg-type]
    assert queue.rescheduled == [("recurring", {"next": True})]
    assert queue.released == []
    assert queue.completed == []


async def test_due_pass_claims_only_work_that_can_start(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The claim limit is claim_batch clamped to the concurrency."""
    queue = FakeQueue([item("one"), item("two"), item("queued")])
    stats = await ts.run_due_pass(
        queue,  # type: ignore[arg-type]
        registry(),
        settings(concurrency=2),
        context,
    )
    assert stats.claimed == 2
    assert queue.claim_limits == [2]
    assert len(queue.items) == 1


async def test_long_evaluate_renews_its_lease(autojump_clock: trio.testing.MockClock) -> None:
    """A 3.5 s evaluation under a 3 s lease renews exactly three times, at 1, 2 and 3 s."""
    queue = FakeQueue([item("slow", sleep=3.5)])
    stats = await ts.run_due_pass(
        queue,  # type: ignore[arg-type]
        registry(),
        settings(lease=3, concurrency=1),
        context,
    )
    assert stats.failed == 0
    assert queue.renewals == [("slow", "worker", 1)] * 3
    assert queue.renewal_times == [1.0, 2.0, 3.0]
    assert queue.released == ["slow"]
    assert trio.current_time() == 3.5


async def test_expired_lease_stops_evaluation(autojump_clock: trio.testing.MockClock) -> None:
    """A 5 s evaluation whose first renewal (at 1 s) fails is cancelled at 1 s, as an error."""
    queue = FakeQueue([item("expired", sleep=5)], renewal_error=ts.LeaseLost("expired", 1))
    stats = await ts.run_due_pass(
        queue,  # type: ignore[arg-type]
        registry(),
        settings(lease=3, concurrency=1),
        context,
    )
    assert stats.failed == 1
    assert len(queue.renewals) == 1
    assert queue.errors == ["expired"]
    assert queue.error_times == [1.0]
    assert queue.error_texts[0].startswith("lease renewal failed: lease lost on item 'expired'")
    assert trio.current_time() == 1.0


NO_JITTER = ts.RestartPolicy(1, 30, jitter=ts.JitterMode.NONE)


async def test_a_write_failing_transiently_is_written_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A write that fails transiently is written again after the claim_retry backoff; with two
    writes (mark_error, release) each is retried alone, so the error is recorded once."""
    queue = FakeQueue([item("done", stop=True)], write_failures=3)
    tuned = settings(concurrency=1, claim_retry=NO_JITTER)
    await ts.run_due_pass(queue, registry(), tuned, context)  # type: ignore[arg-type]
    assert queue.completed == ["done"]
    assert queue.write_attempts == [("complete", t) for t in (0.0, 1.0, 3.0, 7.0)]

    queue = FakeQueue([item("bad", fail=True)], write_failures=2)
    await ts.run_due_pass(queue, registry(), tuned, context)  # type: ignore[arg-type]
    assert (queue.errors, queue.released) == (["bad"], ["bad"])
    assert queue.write_attempts == [
        ("mark_error", 7.0),
        ("mark_error", 8.0),
        ("mark_error", 10.0),
        ("release", 10.0),
    ]


async def test_a_write_is_retried_with_renewals_until_the_lease_runs_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The lease is renewed on while a write is retried; when renewals fail too, the write is
    given up as the lease expires (3 s after the claim)."""
    queue = FakeQueue([item("done", stop=True)], write_failures=2)
    tuned = settings(lease=3, concurrency=1, claim_retry=NO_JITTER)
    await ts.run_due_pass(queue, registry(), tuned, context)  # type: ignore[arg-type]
    assert queue.completed == ["done"]

    queue = FakeQueue(
        [item("done", stop=True)], write_failures=100, renewal_error=ts.QueueUnavailable("down")
    )
    start = trio.current_time()
    await ts.run_due_pass(queue, registry(), tuned, context)  # type: ignore[arg-type]
    assert queue.completed == []
    assert [t - start for _, t in queue.write_attempts] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    assert [t - start for t in queue.renewal_times][:2] == [1.0, 2.0]  # on, while retried


def test_registry_fails_duplicate_ownership_and_invalid_specs() -> None:
    """The registry refuses a spec owned twice and names the driver whose specs are invalid."""
    made: ts.DriverRegistry[Context] = ts.DriverRegistry()
    assert made.is_empty()
    made.register(Driver(valid=False))
    assert made.spec_ids() == ["spec"]
    assert made.names() == ["driver"]
    assert made.for_spec("spec") is not None
    with pytest.raises(ts.DriverError, match=r"^driver 'driver': ValueError: invalid$"):
        made.validate_all()
    with pytest.raises(ts.DriverError, match="spec 'spec' is claimed by both 'driver' and 'other'"):
        made.register(Driver(name="other"))


# -- the registry -----------------------------------------------------------------------------


def test_registry_sorts_spec_ids_and_looks_them_up() -> None:
    """spec_ids() is sorted over every driver; for_spec finds the owner or None."""
    first = Driver(name="first", spec_ids=("zeta", "alpha"))
    second = Driver(name="second", spec_ids=("mid",))
    made = registry(first, second)
    assert made.spec_ids() == ["alpha", "mid", "zeta"]
    assert made.for_spec("mid") is second
    assert made.for_spec("nope") is None
    assert made.names() == ["first", "second"]
    made.validate_all()


def test_a_refused_driver_registers_nothing() -> None:
    """A driver refused for its second spec leaves no trace of its first."""
    made = registry(Driver(name="owner", spec_ids=("b",)))
    with pytest.raises(ts.DriverError, match="claimed by both 'owner' and 'late'"):
        made.register(Driver(name="late", spec_ids=("a", "b")))
    assert made.spec_ids() == ["b"]
    assert made.names() == ["owner"]


@pytest.mark.parametrize(
    ("driver", "message"),
    [
        (Driver(spec_ids="spec"), "spec_ids must be a sequence of ids, not a string"),
        (Driver(spec_ids=()), "driver 'driver' owns no spec ids"),
        (Driver(spec_ids=("a", "a")), "spec 'a' is listed twice by 'driver'"),
        (Driver(spec_ids=("",)), "spec_id must be a non-empty string"),
        (Driver(spec_ids=("s" * 201,)), "spec_id must be a non-empty string of at most 200"),
        (Driver(name=""), "driver name must be a non-empty string"),
    ],
)
def test_registry_refuses_malformed_drivers(driver: Driver, message: str) -> None:
    """Malformed drivers are refused at registration with a message saying what is wrong."""
    with pytest.raises(ts.DriverError, match=message):
        registry(driver)


def test_registry_refuses_a_config_type_that_is_not_attrs() -> None:
    """config_type must be an attrs class."""

    @attrs.define
    class Untyped(Driver):
        config_type: Any = dict

    with pytest.raises(ts.DriverError, match="config_type must be an attrs class"):
        registry(Untyped())


def test_registry_refuses_two_drivers_with_one_name() -> None:
    """Driver names are unique, so errors that name a driver are unambiguous."""
    with pytest.raises(ts.DriverError, match="a driver named 'driver' is registered already"):
        registry(Driver(), Driver(spec_ids=("other",)))


# -- outcomes and settings --------------------------------------------------------------------


def test_reschedule_refuses_a_naive_datetime() -> None:
    """Reschedule.at must be timezone-aware, and is stored in UTC."""
    with pytest.raises(ValueError, match="timezone-aware"):
        ts.Reschedule(dt.datetime(2030, 1, 1), {})
    plus_two = dt.timezone(dt.timedelta(hours=2))
    at = ts.Reschedule(dt.datetime(2030, 1, 1, 2, tzinfo=plus_two), {}).at
    assert at == EPOCH
    assert at.tzinfo is dt.UTC


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"worker_id": ""}, ValueError, "worker_id must be a non-empty string"),
        ({"lease": 0}, ValueError, "lease must be >= 3 seconds, got 0"),
        ({"lease": 2.5}, ValueError, "lease must be >= 3 seconds"),
        ({"lease": float("nan")}, ValueError, "lease must be a finite number"),
        ({"lease": "60"}, TypeError, "lease must be a number of seconds"),
        ({"requeue_delay": -1}, ValueError, "requeue_delay must be >= 0 seconds"),
        ({"claim_batch": 0}, ValueError, "claim_batch must be >= 1, got 0"),
        ({"concurrency": 0}, ValueError, "concurrency must be >= 1, got 0"),
        ({"concurrency": True}, TypeError, "concurrency must be an int"),
        ({"poll_interval": 0}, ValueError, "poll_interval must be positive"),
        ({"shutdown_grace": -1}, ValueError, "shutdown_grace must be >= 0"),
        ({"max_errors": 0}, ValueError, "max_errors must be >= 1"),
        ({"retry": 5}, TypeError, "retry"),
        ({"settle_batch": 0}, ValueError, "settle_batch must be >= 1"),
    ],
)
def test_settings_are_checked_at_construction(
    changes: dict[str, Any], error: type[Exception], message: str
) -> None:
    """Bad settings raise at construction, naming the field and the rule."""
    with pytest.raises(error, match=message):
        settings(**changes)


@pytest.mark.parametrize(("lease", "interval"), [(3, 1.0), (60, 20.0), (4.5, 1.5)])
def test_renewal_interval_is_a_third_of_the_lease(lease: float, interval: float) -> None:
    """Leases are renewed every lease / 3 seconds, never more often than once a second."""
    assert settings(lease=lease).renew_interval == interval


@pytest.mark.parametrize(
    ("claim_batch", "concurrency", "limit"), [(10, 3, 3), (1, 3, 1), (2, 5, 2)]
)
def test_claim_limit_is_clamped(claim_batch: int, concurrency: int, limit: int) -> None:
    """A pass claims clamp(claim_batch, 1, concurrency) items."""
    assert settings(claim_batch=claim_batch, concurrency=concurrency).claim_limit == limit


# -- the due pass beyond the seed --------------------------------------------------------------


async def test_nothing_due_builds_no_context(autojump_clock: trio.testing.MockClock) -> None:
    """An empty claim returns empty stats without building the context."""
    built: list[int] = []

    async def counting() -> Context:
        built.append(1)
        return Context()

    stats = await ts.run_due_pass(FakeQueue(), registry(), settings(), counting)  # type: ignore[arg-type]
    assert stats == ts.PassStats()
    assert built == []


async def test_an_item_without_a_driver_is_an_error(autojump_clock: trio.testing.MockClock) -> None:
    """An item whose spec has no driver is marked with an error that names the spec."""
    orphan = attrs.evolve(item("orphan"), spec_id="gone")
    queue = FakeQueue([orphan])
    stats = await ts.run_due_pass(queue, registry(), settings(), context)  # type: ignore[arg-type]
    assert stats == ts.PassStats(claimed=1, failed=1)
    assert queue.error_texts == ["no driver registered for spec 'gone'"]
    assert queue.released == ["orphan"]


async def test_a_driver_interrupt_propagates_bare(autojump_clock: trio.testing.MockClock) -> None:
    """KeyboardInterrupt from a driver leaves the pass as itself, not wrapped in a group."""
    queue = FakeQueue([item("calm", sleep=10), item("panic", interrupt=True)])
    with pytest.raises(KeyboardInterrupt):
        await ts.run_due_pass(queue, registry(), settings(), context)  # type: ignore[arg-type]
    assert queue.errors == []


@attrs.frozen
class Digest:
    """A typed config."""

    days: int
    label: str = "digest"


@attrs.define
class DigestDriver:
    """Counts days in a typed config."""

    name: str = "digest-driver"
    spec_ids: Sequence[str] = ("digest",)
    config_type: type[Digest] = Digest
    seen: list[Any] = attrs.Factory(list)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: Context, item: WorkItem) -> ts.Outcome:
        self.seen.append(item.config)
        return ts.Reschedule(EPOCH, attrs.evolve(item.config, days=item.config.days + 1))


async def test_typed_config_round_trips(autojump_clock: trio.testing.MockClock) -> None:
    """The driver sees its attrs config; the rescheduled instance is written back as JSON."""
    driver = DigestDriver()
    queue = FakeQueue([attrs.evolve(item("d"), spec_id="digest", config={"days": 1})])
    stats = await ts.run_due_pass(queue, registry(driver), settings(), context)  # type: ignore[arg-type]
    assert stats.failed == 0
    assert driver.seen == [Digest(days=1)]
    assert queue.rescheduled == [("d", {"days": 2, "label": "digest"})]


async def test_a_config_that_does_not_fit_is_an_item_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A bad typed config is dead at once, naming the spec and the field; the pass goes on."""
    driver = DigestDriver()
    queue = FakeQueue(
        [
            attrs.evolve(item("bad"), spec_id="digest", config={"days": "seven"}),
            attrs.evolve(item("good"), spec_id="digest", config={"days": 1}),
        ]
    )
    stats = await ts.run_due_pass(queue, registry(driver), settings(), context)  # type: ignore[arg-type]
    assert stats == ts.PassStats(claimed=2, failed=1)
    [dead] = [s for s in queue.settled if s.kind is ts.SettleKind.DEAD]
    assert (dead.item_id, dead.error) == (
        "bad",
        "invalid config for spec 'digest': days: expected int, got str",
    )
    assert [item_id for item_id, _ in queue.rescheduled] == ["good"]


async def test_due_pass_on_the_memory_queue(autojump_clock: trio.testing.MockClock) -> None:
    """Against the real in-memory queue: outcomes, errors and fencing all land."""
    queue = ts.MemoryQueue()
    await queue.enqueue("spec", item_id="ok", config={})
    await queue.enqueue("spec", item_id="done", config={"stop": True})
    await queue.enqueue("spec", item_id="bad", config={"fail": True})
    stats = await ts.run_due_pass(queue, registry(), settings(), context)
    assert stats == ts.PassStats(claimed=3, failed=1)
    assert (await queue.get("done")).state is ts.ItemState.COMPLETED
    bad = await queue.get("bad")
    assert (bad.state, bad.error_count, first_line(bad.last_error)) == (
        ts.ItemState.QUEUED,
        1,
        "RuntimeError: planned",
    )
    assert (await queue.get("ok")).due_at == EPOCH + dt.timedelta(seconds=5)


async def test_due_pass_honours_retry_backoff_and_dead(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With retry and max_errors set, errors back off per the policy and end dead."""
    queue = ts.MemoryQueue()
    await queue.enqueue("spec", item_id="bad", config={"fail": True})
    policy = ts.RestartPolicy(2, 60, jitter=ts.JitterMode.NONE)
    tuned = settings(retry=policy, max_errors=3)
    times = []
    for _ in range(3):
        await queue.wait_for_work(["spec"])
        times.append(trio.current_time())
        await ts.run_due_pass(queue, registry(), tuned, context)
    bad = await queue.get("bad")
    assert times == [0.0, 2.0, 6.0]
    assert (bad.state, bad.error_count) == (ts.ItemState.DEAD, 3)


async def test_cancel_requested_is_settled_as_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A cancel request seen at renewal cancels the evaluation and the item, not as an error."""
    queue = ts.MemoryQueue()
    await queue.enqueue("spec", item_id="long", config={"sleep": 100})

    async def request_later() -> None:
        await trio.sleep(30)
        await queue.request_cancel("long")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(request_later)
        stats = await ts.run_due_pass(queue, registry(), settings(lease=60), context)
    assert stats == ts.PassStats(claimed=1, failed=0)
    assert trio.current_time() == 40.0  # the renewal after the request (every 20 s)
    long = await queue.get("long")
    assert (long.state, long.error_count) == (ts.ItemState.CANCELLED, 0)


async def test_a_claimed_item_flagged_for_cancel_is_not_evaluated(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An item claimed with cancel_requested (its owner died) is cancelled without evaluation."""
    queue = FakeQueue([attrs.evolve(item("orphan", fail=True), cancel_requested=True)])
    stats = await ts.run_due_pass(queue, registry(), settings(), context)  # type: ignore[arg-type]
    assert stats == ts.PassStats(claimed=1, failed=0)
    assert [s.kind for s in queue.settled] == [ts.SettleKind.CANCEL]
    assert queue.errors == []


def test_raise_specific_unwraps_the_one_real_error() -> None:
    """A group of one real error plus Cancelled siblings is raised as that error."""
    interrupt = KeyboardInterrupt()
    group = BaseExceptionGroup("x", [BaseExceptionGroup("y", [interrupt])])
    with pytest.raises(KeyboardInterrupt) as caught:
        raise_specific(group)
    assert caught.value is interrupt
    two = ExceptionGroup("x", [ValueError(), TypeError()])
    with pytest.raises(ExceptionGroup):
        raise_specific(two)


@pytest.mark.parametrize(
    "outcome",
    [
        ts.Stop(),
        ts.Stop(result={"n": 1}),
        ts.Continue(delay=2.0),
        ts.Reschedule(at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), config={"done": 1}),
    ],
)
def test_an_outcome_s_settlement_is_a_frozen_settlement_like_any_other(outcome: Any) -> None:
    """The settlement built per evaluation (filled by plain stores on a twin of its layout) is a
    Settlement: exactly that class, frozen, equal to the one built field by field, and it
    copies and pickles as one."""
    import copy
    import pickle

    from trio_supervise.job import outcome_settlement

    item = WorkItem(
        id="i",
        spec_id="s",
        config={},
        lease_version=3,
        due_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        updated_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    )
    settlement = outcome_settlement(outcome, item, driver_name="d", requeue_delay=1.0)
    assert type(settlement) is Settlement
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        settlement.delay = 5.0  # type: ignore[misc]
    by_fields = Settlement(
        item_id="i",
        lease_version=3,
        kind=settlement.kind,
        delay=settlement.delay,
        at=settlement.at,
        config=settlement.config,
        result=settlement.result,
    )
    assert settlement == by_fields
    assert copy.copy(settlement) == settlement
    assert pickle.loads(pickle.dumps(settlement)) == settlement
