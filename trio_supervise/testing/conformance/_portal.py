"""A Trio loop on a background thread, so a synchronous Hypothesis machine can drive a store."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import trio

T = TypeVar("T")


class Portal:
    """A Trio loop on a background thread, and a way to run coroutines in it from this one."""

    def __init__(self) -> None:
        ready = threading.Event()
        self._stop: trio.Event | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None

        async def main() -> None:
            self._stop = trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

        self._thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
        self._thread.start()
        ready.wait()

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        async def bounded() -> T:
            with trio.fail_after(30):
                return await fn(*args, **kwargs)

        return trio.from_thread.run(bounded, trio_token=self._token)

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def enter(self, context: AbstractAsyncContextManager[T]) -> tuple[T, Callable[[], None]]:
        """Enter *context* in a task of the loop's own; returns its value and a function that
        exits it (in that same task, as a context holding a nursery or cancel scope needs)."""
        leave = trio.Event()
        left = threading.Event()

        async def hold(*, task_status: trio.TaskStatus[T] = trio.TASK_STATUS_IGNORED) -> None:
            try:
                async with context as value:
                    task_status.started(value)
                    await leave.wait()
            finally:
                left.set()

        assert self._nursery is not None
        value: T = self.run(self._nursery.start, hold)

        def exit_() -> None:
            self.run_sync(leave.set)
            left.wait()

        return value, exit_

    def close(self) -> None:
        assert self._stop is not None
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join()
