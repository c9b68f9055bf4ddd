"""Shutdown: a one-way switch every part of a service can watch and trigger."""

from __future__ import annotations

import pytest
import trio
import trio.testing
import trio_util

from trio_supervise import Shutdown


def test_begin_is_one_way_and_the_first_reason_sticks() -> None:
    """Once begun, shutdown stays begun, with the reason it was first given."""
    shutdown = Shutdown()
    assert not shutdown.requested
    assert shutdown.reason is None
    shutdown.begin("SIGTERM")
    shutdown.begin("worker failed")
    assert shutdown.requested
    assert shutdown.reason == "SIGTERM"
    assert shutdown.flag.value is True


async def test_wait_returns_when_shutdown_begins(autojump_clock: trio.testing.MockClock) -> None:
    """wait blocks until shutdown begins, and returns at once after that."""
    shutdown = Shutdown()
    woke: list[float] = []

    async def waiter() -> None:
        await shutdown.wait()
        woke.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(3)
        shutdown.begin()
    assert woke == [3]
    await shutdown.wait()
    assert trio.current_time() == 3


async def test_sleep_ends_early_when_shutdown_begins(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """sleep returns False after its full time, True as soon as shutdown begins."""
    shutdown = Shutdown()
    assert await shutdown.sleep(2) is False
    assert trio.current_time() == 2

    async def begin_later() -> None:
        await trio.sleep(1)
        shutdown.begin()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(begin_later)
        assert await shutdown.sleep(10) is True
    assert trio.current_time() == 3


def test_a_child_begins_with_its_parent_but_not_the_other_way() -> None:
    """A child shutdown follows its parent's, and may begin alone without touching the parent."""
    parent = Shutdown()
    first, second = parent.child(), parent.child()
    first.begin("subtree only")
    assert not parent.requested
    assert not second.requested
    parent.begin("deploy")
    assert second.requested
    assert second.reason == "deploy"
    assert first.reason == "subtree only"


def test_a_child_of_a_begun_shutdown_begins_at_once() -> None:
    """child() of a shutdown that has begun is begun, with the parent's reason."""
    parent = Shutdown()
    parent.begin("SIGINT")
    assert parent.child().reason == "SIGINT"


def test_adopt_links_an_existing_shutdown() -> None:
    """adopt makes an existing shutdown (a nested supervisor's) follow this one, once."""
    parent, grandparent, child = Shutdown(), Shutdown(), Shutdown()
    parent.adopt(child)
    parent.adopt(child)
    grandparent.adopt(parent)
    grandparent.begin("deploy")
    assert child.requested
    assert child.reason == "deploy"

    late = Shutdown()
    parent.adopt(late)
    assert late.requested


def test_adopt_refuses_a_cycle() -> None:
    """A shutdown cannot adopt itself or one of its own ancestors."""
    parent = Shutdown()
    child = parent.child()
    with pytest.raises(ValueError, match="cycle"):
        parent.adopt(parent)
    with pytest.raises(ValueError, match="cycle"):
        child.adopt(parent)


def test_detach_stops_propagation() -> None:
    """A detached child no longer begins with its parent; detaching twice is harmless."""
    parent = Shutdown()
    child = parent.child()
    parent.detach(child)
    parent.detach(child)
    parent.begin()
    assert not child.requested


async def test_the_flag_works_with_trio_util(autojump_clock: trio.testing.MockClock) -> None:
    """The flag is a trio_util AsyncBool, so move_on_when and friends take it."""
    shutdown = Shutdown()
    assert isinstance(shutdown.flag, trio_util.AsyncBool)

    async def begin_later() -> None:
        await trio.sleep(4)
        shutdown.begin()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(begin_later)
        async with trio_util.move_on_when(shutdown.wait):
            await trio.sleep_forever()
    assert trio.current_time() == 4
