"""The runner's named queues: each served under its own limit, priorities honoured, pauses kept."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import trio_supervise as ts

from .test_runner import Recorder, make_runner, running


async def test_a_flood_in_one_queue_never_starves_another(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """100 slow mail items take only mail's 2 slots; default's items run at once beside them."""
    queue = ts.MemoryQueue()
    driver = Recorder()
    for n in range(100):
        await queue.enqueue("job", item_id=f"mail-{n:03}", queue="mail", config={"sleep": 10})
    for n in range(3):
        await queue.enqueue("job", item_id=f"web-{n}", config={"sleep": 1})
    runner = make_runner(queue, driver, queues={"default": 3, "mail": 2})
    async with running(runner):
        await trio.sleep(25)
    assert {driver.starts[f"web-{n}"][0] for n in range(3)} == {0.0}
    assert sorted(t[0] for i, t in driver.starts.items() if i.startswith("mail")) == [
        0.0,
        0.0,
        10.0,
        10.0,
        20.0,
        20.0,
    ]
    assert driver.peak == 5


async def test_a_runner_claims_higher_priorities_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With one slot, the item with the lowest priority number runs first, then by due time."""
    queue = ts.MemoryQueue()
    driver = Recorder()
    await queue.enqueue("job", item_id="normal", config={"sleep": 1})
    await queue.enqueue("job", item_id="lazy", priority=50, config={"sleep": 1})
    await queue.enqueue("job", item_id="urgent", priority=-50, config={"sleep": 1})
    async with running(make_runner(queue, driver, concurrency=1, claim_batch=1)):
        await trio.sleep(5)
    assert {i: t[0] for i, t in driver.starts.items()} == {
        "urgent": 0.0,
        "normal": 1.0,
        "lazy": 2.0,
    }


async def test_a_paused_queue_waits_and_in_flight_items_finish(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Pausing mid-run lets the running item finish; the rest wait until the queue resumes."""
    queue = ts.MemoryQueue()
    driver = Recorder()
    for n in range(3):
        await queue.enqueue("job", item_id=f"m{n}", queue="mail", config={"sleep": 2})
    async with running(make_runner(queue, driver, queues={"mail": 1})):
        await trio.sleep(1)
        await queue.pause_queue("mail")
        await trio.sleep(10)
        assert sorted(driver.ends) == ["m0"]
        assert (await queue.get("m1")).state is ts.ItemState.QUEUED
        await queue.resume_queue("mail")
        await trio.sleep(10)
    assert driver.starts["m1"] == [11.0]
    assert sorted(driver.ends) == ["m0", "m1", "m2"]


class CountingQueue(ts.MemoryQueue):
    """The memory queue, counting claim calls."""

    claims = 0

    async def claim_due(self, *args: Any, **kwargs: Any) -> list[ts.WorkItem]:
        self.claims += 1
        return await super().claim_due(*args, **kwargs)


async def test_a_concurrency_key_limits_a_runner_across_its_slots(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Six items of key "acme" (limit 2) and two plain ones, four slots: at most two acme items
    run at once, the plain ones start at once beside them, and the runner neither spins nor
    stalls while acme's items wait for a slot."""
    queue = CountingQueue()
    driver = Recorder()
    for n in range(6):
        await queue.enqueue(
            "job",
            item_id=f"acme-{n}",
            priority=-1,
            concurrency_key="acme",
            concurrency_limit=2,
            config={"sleep": 10},
        )
    for n in range(2):
        await queue.enqueue("job", item_id=f"plain-{n}", config={"sleep": 10})
    async with running(make_runner(queue, driver, concurrency=4)):
        await trio.sleep(35)
    starts = {i: t[0] for i, t in driver.starts.items()}
    assert sorted(t for i, t in starts.items() if i.startswith("acme")) == [
        0.0,
        0.0,
        10.0,
        10.0,
        20.0,
        20.0,
    ]
    assert (starts["plain-0"], starts["plain-1"]) == (0.0, 0.0)
    assert (await queue.get("acme-5")).state is ts.ItemState.COMPLETED
    # A waiting acme item does not make the runner claim again and again (next_due_at puts it
    # at its key's next free slot): a claim per start, plus a few that found nothing.
    assert queue.claims < 16


async def test_a_rate_limit_spaces_the_starts_and_the_runner_waits_without_spinning(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Ten quick mail items under 3 per 10 s (set by the runner's settings), four slots: they
    start in threes, 10 s apart, while default's items start at once; waiting for the window
    costs no claims (next_due_at says when it frees)."""
    queue = CountingQueue()
    driver = Recorder()
    for n in range(10):
        await queue.enqueue("job", item_id=f"mail-{n}", queue="mail", config={"sleep": 0.5})
    for n in range(2):
        await queue.enqueue("job", item_id=f"web-{n}", config={"sleep": 0.5})
    runner = make_runner(
        queue, driver, queues={"default": 2, "mail": 4}, rate_limits={"mail": "3/10s"}
    )
    async with running(runner):
        await trio.sleep(35)
    starts = sorted(t[0] for i, t in driver.starts.items() if i.startswith("mail"))
    assert starts == [0.0] * 3 + [10.0] * 3 + [20.0] * 3 + [30.0]
    assert (driver.starts["web-0"], driver.starts["web-1"]) == ([0.0], [0.0])
    assert queue.claims < 30
    [mail] = [info for info in await queue.list_queues() if info.name == "mail"]
    assert mail.rate_limit == ts.RateLimit(3, 10)


async def test_a_key_rate_limit_spaces_each_tenants_starts_and_the_runner_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Per tenant 2 per 10 s (the runner's settings, a template): acme's 6 items, first in the
    queue, start in twos 10 s apart, globex's 2 start at once beside them; waiting for a key's
    window costs no claims (next_due_at says when it frees)."""
    queue = CountingQueue()
    driver = Recorder()
    for tenant, count in (("acme", 6), ("globex", 2)):
        for n in range(count):
            await queue.enqueue(
                "job",
                item_id=f"{tenant}-{n}",
                concurrency_key=f"partner:{tenant}",
                concurrency_limit=100,
                config={"sleep": 0.5},
            )
    runner = make_runner(
        queue, driver, concurrency=4, key_rate_limits={"partner:{tenant}": "2/10s"}
    )
    async with running(runner):
        await trio.sleep(35)
    starts = sorted(t[0] for i, t in driver.starts.items() if i.startswith("acme"))
    assert starts == [0.0, 0.0, 10.0, 10.0, 20.0, 20.0]
    assert (driver.starts["globex-0"], driver.starts["globex-1"]) == ([0.0], [0.0])
    assert queue.claims < 16
    assert await queue.key_rate_limits() == {"partner:{tenant}": ts.RateLimit(2, 10)}


def test_runner_settings_read_key_rate_limits_and_refuse_bad_ones() -> None:
    """``key_rate_limits`` takes keys or templates to rates; a bad one names key and rule."""
    settings = ts.RunnerSettings(worker_id="w", key_rate_limits={"p:{tenant}": "100/1m"})
    assert settings.key_rate_limits == {"p:{tenant}": ts.RateLimit(100, 60)}
    with pytest.raises(
        ValueError, match=re.escape("key_rate_limits: key 'p:{x}': key rate limit's key")
    ):
        ts.RunnerSettings(worker_id="w", key_rate_limits={"p:{x}": "100/1m"})
    with pytest.raises(ValueError, match="key_rate_limits: key 'p': rate must be N/PERIOD"):
        ts.RunnerSettings(worker_id="w", key_rate_limits={"p": "lots"})


def test_runner_settings_read_rate_limits_and_refuse_bad_ones() -> None:
    """``rate_limits`` takes RateLimits or their short form; a bad one names queue and rule."""
    settings = ts.RunnerSettings(worker_id="w", rate_limits={"mail": "100/1m"})
    assert settings.rate_limits == {"mail": ts.RateLimit(100, 60)}
    with pytest.raises(ValueError, match="rate_limits: queue 'mail': rate must be N/PERIOD"):
        ts.RunnerSettings(worker_id="w", rate_limits={"mail": "lots"})


async def test_a_driver_declares_a_concurrency_key_per_tenant() -> None:
    """A driver's concurrency_key template ("{tenant}") and limit apply in
    DriverRegistry.enqueue; an explicit key wins; no tenant means no key."""

    class PerTenant(Recorder):
        concurrency_key = "mail:{tenant}"
        concurrency_limit = 3

    class Odd(Recorder):
        concurrency_key = "{customer}"

    registry: ts.DriverRegistry[None] = ts.DriverRegistry()
    registry.register(PerTenant())
    queue = ts.MemoryQueue()
    item = await registry.enqueue(queue, "job", tenant_id="acme")
    assert (item.concurrency_key, item.concurrency_limit) == ("mail:acme", 3)
    item = await registry.enqueue(queue, "job", tenant_id="acme", concurrency_key="vip")
    assert (item.concurrency_key, item.concurrency_limit) == ("vip", 3)
    item = await registry.enqueue(queue, "job", concurrency_key="vip", concurrency_limit=1)
    assert (item.concurrency_key, item.concurrency_limit) == ("vip", 1)
    with pytest.raises(ts.DriverError, match=r"concurrency_key '\{customer\}' may use only"):
        ts.DriverRegistry[None]().register(Odd())

    class ByTenant(Recorder):
        concurrency_key = "{tenant}"

    registry = ts.DriverRegistry[None]().register(ByTenant())
    assert (await registry.enqueue(queue, "job")).concurrency_key is None
    item = await registry.enqueue(queue, "job", tenant_id="t1")
    assert (item.concurrency_key, item.concurrency_limit) == ("t1", 1)


def test_queue_limits_are_checked() -> None:
    """queues maps names to limits >= 1; anything else is refused naming the queue and rule."""
    settings = ts.RunnerSettings(worker_id="w", queues={"default": 20, "mail": 5})
    assert settings.queue_limits == {"default": 20, "mail": 5}
    assert ts.RunnerSettings(worker_id="w", concurrency=7).queue_limits == {"default": 7}
    with pytest.raises(ValueError, match="queues: the limit of queue 'mail' must be an int >= 1"):
        ts.RunnerSettings(worker_id="w", queues={"mail": 0})
    with pytest.raises(ValueError, match="queues must be a non-empty mapping"):
        ts.RunnerSettings(worker_id="w", queues={})
    with pytest.raises(ValueError, match="queues: queue must be a non-empty string"):
        ts.RunnerSettings(worker_id="w", queues={"": 1})


def test_queues_come_from_the_settings_file(tmp_path: Path) -> None:
    """A settings file sets per-queue limits; a bad limit is refused naming its queue."""
    path = tmp_path / "s.toml"
    path.write_text("[runner]\nqueues = {default = 20, mail = 5}\n")
    assert ts.load_settings(path, env={}).runner.queue_limits == {"default": 20, "mail": 5}
    path.write_text("[runner]\nqueues = {mail = 0}\n")
    with pytest.raises(
        ts.SettingsError,
        match=r"runner\.queues: the limit of queue 'mail' must be an int >= 1, got 0",
    ):
        ts.load_settings(path, env={})


def test_a_bad_queue_name_in_the_settings_names_the_field(tmp_path: Path) -> None:
    """A queue name the queues refuse is refused by the settings too, naming runner.queues."""
    path = tmp_path / "s.toml"
    path.write_text(f'[runner]\nqueues = {{"{"q" * 201}" = 2}}\n')
    with pytest.raises(
        ts.SettingsError, match=r"runner\.queues: queue must be a non-empty string of at most 200"
    ):
        ts.load_settings(path, env={})
