"""A runner waiting on a throttled queue sleeps until its window frees: the fleet's writes to
other queues do not make it read the queue again (each read of a big backlog costs a scan)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from trio_supervise import RateLimit
from trio_supervise.queues import PostgresQueue, SQLiteQueue, WorkQueue

from .conftest import ManualClock, open_backend


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_a_throttled_wait_ignores_other_queues_writes(
    backend: str, clock: ManualClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twenty enqueues into another queue during a wait on a throttled one: it reads the
    queue once, and returns once its window frees (60 s later by the queue's clock)."""
    async with open_backend(backend, clock, tmp_path) as queue:
        assert isinstance(queue, SQLiteQueue | PostgresQueue)
        await queue.set_rate_limit("mail", RateLimit(1, 60))
        await queue.enqueue("s", queue="mail")
        await queue.enqueue("s", queue="mail")
        assert len(await queue.claim_due(["s"], "w", 300, 5, queue="mail")) == 1
        reads = 0
        original = type(queue)._next_due

        async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal reads
            reads += 1
            return await original(self, *args, **kwargs)

        monkeypatch.setattr(type(queue), "_next_due", counted)
        returned = False

        async def wait(queue: WorkQueue) -> None:
            nonlocal returned
            await queue.wait_for_work(["s"], queues=["mail"])
            returned = True

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait, queue)
            for _ in range(20):
                await queue.enqueue("s", queue="other")
                await trio.sleep(0.01)
            assert (reads, returned) == (1, False)
            nursery.cancel_scope.cancel()
