"""Durable workflows on the memory queue in virtual time: steps run once per item incarnation,
sleeps and waits suspend the item, events wake it, replay is checked, stale owners record
nothing."""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
import pytest
import trio

from trio_supervise import (
    DriverRegistry,
    ItemState,
    MemoryQueue,
    RestartPolicy,
    RunnerSettings,
    Workflow,
    durable_workflow,
    run_due_pass,
)
from trio_supervise.job import EntryKind
from trio_supervise.testing import Harness

DAY = 86_400.0


@attrs.frozen
class Job:
    who: str = "ann"


@attrs.frozen
class User:
    name: str
    number: int


async def one_pass(queue: MemoryQueue, workflow: Any) -> Any:
    """One due pass of *workflow* over *queue*; its stats."""
    registry: DriverRegistry[None] = DriverRegistry()
    registry.register(workflow)
    return await run_due_pass(queue, registry, RunnerSettings(worker_id="w"), lambda: None)


def steps_counted(runner: Any, workflow: str) -> dict[str, float]:
    """The runner's ``trio_supervise_workflow_steps_total`` by outcome (those counted)."""
    counted = {}
    for outcome in ("ran", "replayed", "retried", "failed"):
        value = runner.metrics.registry.get_sample_value(
            "trio_supervise_workflow_steps_total", {"workflow": workflow, "outcome": outcome}
        )
        if value:
            counted[outcome] = value
    return counted


async def finished(harness: Harness, item_id: str) -> Any:
    """Wait (at most 40 virtual days) until *item_id* is finished; return it."""
    states: dict[str, Any] = {}

    def done() -> bool:
        item = harness.queue.items.get(item_id)
        states["item"] = item
        return item is not None and item.state.finished

    await harness.wait_until(done, timeout=40 * DAY, poll=3600)
    return states["item"]


async def test_steps_run_once_across_sleeps_and_their_results_come_back_typed(
    harness: Harness, autojump_clock: trio.testing.MockClock
) -> None:
    """A step before a 3-day sleep runs once; after the sleep its recorded result comes back
    as the attrs class its function declares, and the item completes with the return value."""
    ran: dict[str, int] = {}
    seen: list[User] = []

    def create(name: str) -> User:
        ran["create"] = ran.get("create", 0) + 1
        return User(name=name, number=7)

    @durable_workflow("onboard", config_type=Job)
    async def onboard(wf: Workflow[Any], config: Job) -> dict[str, Any]:
        user = await wf.step("create-user", create, config.who)
        seen.append(user)
        await wf.sleep(dt.timedelta(days=3))
        return {"user": user.name, "at": wf.now().isoformat()}

    runner = await harness.run_drivers(onboard)
    await harness.queue.enqueue("onboard", item_id="w", config={"who": "bob"})
    item = await finished(harness, "w")
    assert steps_counted(runner, "onboard") == {"ran": 1, "replayed": 1}
    assert item.state is ItemState.COMPLETED
    assert ran == {"create": 1}
    assert seen == [User("bob", 7), User("bob", 7)]
    assert item.result == {"user": "bob", "at": "2030-01-04T00:00:00+00:00"}
    journal = await harness.queue.read_journal("w")
    assert [(e.kind, e.name) for e in journal.entries] == [
        (EntryKind.STEP, "create-user"),
        (EntryKind.SLEEP, "sleep"),
    ]
    assert journal.entries[0].result == {"name": "bob", "number": 7}


async def test_a_failing_step_is_retried_by_its_policy_then_fails_the_item_naming_it(
    harness: Harness, autojump_clock: trio.testing.MockClock
) -> None:
    """A step that raises is run again after its policy's backoff; one that succeeds on its
    third attempt records 3 attempts; one that never does is an item error naming the step,
    and the item's earlier steps do not run again on the item's retry."""
    tries: dict[str, int] = {"flaky": 0, "broken": 0, "first": 0}

    def first() -> int:
        tries["first"] += 1
        return 1

    def flaky() -> str:
        tries["flaky"] += 1
        if tries["flaky"] < 3:
            raise ConnectionError("try again")
        return "ok"

    def broken() -> None:
        tries["broken"] += 1
        raise ValueError("no such user")

    policy = RestartPolicy(min_backoff=1, max_backoff=10, max_restarts=2)

    @durable_workflow("steps", config_type=Job)
    async def steps(wf: Workflow[Any], config: Job) -> None:
        await wf.step("first", first)
        await wf.step("flaky", flaky, retry=policy)
        await wf.step("broken", broken, retry=policy)

    settings = RunnerSettings(worker_id="w", poll_interval=3600, max_errors=2)
    runner = await harness.run_drivers(steps, settings=settings)
    await harness.queue.enqueue("steps", item_id="s")
    item = await finished(harness, "s")
    assert item.state is ItemState.DEAD
    assert "step 'broken' failed after 3 attempts: ValueError: no such user" in item.last_error
    assert tries == {"first": 1, "flaky": 3, "broken": 6}  # 3 per evaluation, 2 evaluations
    # /metrics: first and flaky ran once each and replayed once; flaky retried twice, broken
    # twice per evaluation, and failed once per evaluation.
    counted = steps_counted(runner, "steps")
    assert counted == {"ran": 2, "replayed": 2, "retried": 6, "failed": 2}
    entries = (await harness.queue.read_journal("s")).entries
    assert [(e.name, e.attempts) for e in entries] == [("first", 1), ("flaky", 3)]


async def test_an_event_sent_before_the_wait_is_kept_and_one_sent_later_wakes_the_item(
    harness: Harness, autojump_clock: trio.testing.MockClock
) -> None:
    """The first wait takes the event sent before it at once; the second suspends the item
    until its event is sent two days later, which makes it due at once."""

    @durable_workflow("events", config_type=Job)
    async def events(wf: Workflow[Any], config: Job) -> list[Any]:
        got: list[Any] = []
        got.append(await wf.wait_for_event("a", timeout=dt.timedelta(days=7)))
        got.append(await wf.wait_for_event("b", timeout=dt.timedelta(days=7)))
        return got

    await harness.queue.enqueue("events", item_id="e")
    await harness.queue.send_event("e", "a", {"n": 1})
    await harness.run_drivers(events)
    await harness.advance(2 * DAY + 1234)
    assert harness.queue.items["e"].state is ItemState.QUEUED
    sent_at = harness.now
    await harness.queue.send_event("e", "b", [2])
    item = await finished(harness, "e")
    assert item.result == [{"n": 1}, [2]]
    assert harness.queue.items["e"].updated_at == harness.at(sent_at)


async def test_a_wait_times_out_with_none(
    harness: Harness, autojump_clock: trio.testing.MockClock
) -> None:
    """With no event, the wait returns None once its timeout passes (and not before)."""

    @durable_workflow("lonely", config_type=Job)
    async def lonely(wf: Workflow[Any], config: Job) -> Any:
        payload = await wf.wait_for_event("never", timeout=dt.timedelta(days=7))
        return {"payload": payload, "at": wf.now().isoformat()}

    await harness.run_drivers(lonely)
    await harness.queue.enqueue("lonely", item_id="l")
    item = await finished(harness, "l")
    assert item.result == {"payload": None, "at": "2030-01-08T00:00:00+00:00"}


async def test_a_replay_asking_for_another_step_ends_the_item_dead_naming_both(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A journal recorded by one version of the code and replayed by another that asks for a
    different step at a recorded position: dead, the message naming both."""
    queue = MemoryQueue()
    version = {"n": 1}

    @durable_workflow("changing", config_type=Job)
    async def changing(wf: Workflow[Any], config: Job) -> None:
        await wf.step("a", lambda: 1)
        await wf.sleep(dt.timedelta(hours=1))
        await wf.step("b" if version["n"] == 1 else "c", lambda: 2)

    await queue.enqueue("changing", item_id="x")
    await one_pass(queue, changing)
    await trio.sleep(3600)
    await one_pass(queue, changing)
    assert queue.items["x"].state is ItemState.COMPLETED
    await queue.retry("x")
    version["n"] = 2
    await one_pass(queue, changing)
    item = queue.items["x"]
    assert item.state is ItemState.DEAD
    assert item.last_error is not None
    assert "asks for step 'c' at journal position 2" in item.last_error
    assert "recorded step 'b'" in item.last_error
    assert item.last_error.startswith("discarded: ")  # dead at once, never retried


async def test_a_version_marker_keeps_old_items_on_the_old_path(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``patched`` is False for an item whose journal went past the marker's place under the
    old code (it replays the old path) and True for a new item (which records the marker)."""
    queue = MemoryQueue()
    patched_code = {"on": False}
    ran: list[str] = []

    @durable_workflow("versioned", config_type=Job)
    async def versioned(wf: Workflow[Any], config: Job) -> str:
        await wf.sleep(dt.timedelta(hours=1))
        if patched_code["on"] and await wf.patched("new-greeting"):
            path = await wf.step("greet-v2", lambda: "v2")
        else:
            path = await wf.step("greet", lambda: "v1")
        ran.append(path)
        await wf.sleep(dt.timedelta(hours=1), name="after")
        return path

    async def run() -> None:
        await one_pass(queue, versioned)

    await queue.enqueue("versioned", item_id="old")
    await run()
    await trio.sleep(3600)
    await run()  # old: greets v1, sleeps
    patched_code["on"] = True
    await queue.enqueue("versioned", item_id="new")
    await run()  # new: sleeps
    await trio.sleep(3600)
    await run()  # old replays v1 and completes; new records the marker and greets v2
    await trio.sleep(3600)
    await run()
    assert queue.items["old"].result == "v1"
    assert queue.items["new"].result == "v2"
    kinds = [e.kind for e in (await queue.read_journal("new")).entries]
    assert kinds == [EntryKind.SLEEP, EntryKind.PATCH, EntryKind.STEP, EntryKind.SLEEP]


async def test_a_stale_owner_records_nothing_and_its_evaluation_writes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A step whose record is refused (the lease moved on while it ran) ends its evaluation
    with nothing written: the item stays with the new owner, the step's result unrecorded."""
    queue = MemoryQueue()

    async def slow() -> int:
        await trio.sleep(120)  # the lease (30 s, renewals stopped below) expires meanwhile
        return 1

    @durable_workflow("slow", config_type=Job)
    async def slow_wf(wf: Workflow[Any], config: Job) -> None:
        await wf.step("slow", slow)

    await queue.enqueue("slow", item_id="s")
    [claimed] = await queue.claim_due(["slow"], "other", 1, 1)
    item = queue.items["s"]
    from trio_supervise.durable import DurableWorkflow

    assert isinstance(slow_wf, DurableWorkflow)
    slow_wf.store = queue

    async def thief() -> None:
        await trio.sleep(60)
        [stolen] = await queue.claim_due(["slow"], "thief", 300, 1)
        assert stolen.lease_version != claimed.lease_version

    async with trio.open_nursery() as nursery:
        nursery.start_soon(thief)
        with pytest.raises(Exception, match="lease lost"):
            await slow_wf.evaluate(None, item, Job())
    assert (await queue.read_journal("s")).entries == ()
    assert queue.items["s"].lease_owner == "thief"


async def test_a_runner_whose_step_record_is_refused_writes_nothing_more(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """When the item changed hands while a step ran (here the step itself hands it over), the
    step's record is refused and the runner settles nothing: no error, no outcome, the item
    left to its new owner, as with a lost lease."""
    queue = MemoryQueue()

    async def hand_over() -> int:
        [item] = [i for i in queue.items.values() if i.id == "s"]
        await queue.release("s", item.lease_version, 0)
        [stolen] = await queue.claim_due(["handed"], "thief", 300, 1)
        assert stolen.id == "s"
        return 1

    @durable_workflow("handed", config_type=Job)
    async def handed(wf: Workflow[Any], config: Job) -> None:
        await wf.step("hand-over", hand_over)

    await queue.enqueue("handed", item_id="s")
    stats = await one_pass(queue, handed)
    assert stats.failed == 1
    item = queue.items["s"]
    assert (item.state, item.lease_owner, item.error_count) == (ItemState.RUNNING, "thief", 0)
    assert (await queue.read_journal("s")).entries == ()
    # The refused record is the only write refused: no outcome was even tried.
    assert [e.op for e in queue.events if not e.applied] == ["record_entry"]


def test_bad_arguments_are_refused_naming_them() -> None:
    """A workflow's name and config type are checked where it is declared."""
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        durable_workflow("", config_type=Job)
    with pytest.raises(TypeError, match="config_type must be an attrs class"):
        durable_workflow("x", config_type=dict)


async def test_bad_durations_and_results_are_item_errors_naming_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A negative sleep, a wait whose timeout is not a timedelta, and a step whose result no
    store can keep each fail the item with a message naming the argument or the step."""
    queue = MemoryQueue()

    @durable_workflow("bad", config_type=Job)
    async def bad(wf: Workflow[Any], config: Job) -> None:
        if config.who == "sleep":
            await wf.sleep(dt.timedelta(seconds=-1))
        elif config.who == "wait":
            await wf.wait_for_event("e", timeout=5)  # type: ignore[arg-type]
        else:
            await wf.step("unstorable", object)

    for who in ("sleep", "wait", "step"):
        await queue.enqueue("bad", item_id=who, config={"who": who})
    await one_pass(queue, bad)
    errors = {i: queue.items[i].last_error or "" for i in ("sleep", "wait", "step")}
    assert "duration must be a datetime.timedelta >= 0" in errors["sleep"]
    assert "timeout must be a datetime.timedelta >= 0, got 5" in errors["wait"]
    assert "step 'unstorable' result" in errors["step"]


async def test_a_workflow_outside_a_runner_needs_a_store_with_journals() -> None:
    """Evaluated by hand with no store bound, a workflow says what it needs."""

    @durable_workflow("lost", config_type=Job)
    async def lost(wf: Workflow[Any], config: Job) -> None:
        await wf.step("s", lambda: 1)

    from trio_supervise import DriverError, WorkItem

    item = WorkItem(
        id="x",
        spec_id="lost",
        due_at=dt.datetime.now(dt.UTC),
        created_at=dt.datetime.now(dt.UTC),
        updated_at=dt.datetime.now(dt.UTC),
    )
    with pytest.raises(DriverError, match="durable-journal capability"):
        await lost.evaluate(None, item, Job())
