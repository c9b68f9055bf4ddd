"""Fleet-wide concurrency keys, on every backend: at most N running items per key, in the claim.

"Now" is the test's ManualClock, so leases expire without sleeping.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from trio_supervise.queues import ItemState, PostgresQueue
from trio_supervise.testing.conformance._concurrency import claim_ids

from .conftest import ManualClock, open_backend


@pytest.mark.postgres
async def test_concurrent_postgres_claimers_never_share_a_slot(
    clock: ManualClock, tmp_path: Path
) -> None:
    """Eight claims at once on four connections: only one item of a limit-1 key is leased."""
    async with open_backend("postgres", clock, tmp_path) as queue:
        assert isinstance(queue, PostgresQueue)
        for n in range(20):
            await queue.enqueue("spec", item_id=f"k{n:02}", concurrency_key="k")
            await queue.enqueue("spec", item_id=f"u{n:02}")
        got: list[str] = []

        async def claim(worker: str) -> None:
            got.extend(i.id for i in await queue.claim_due(["spec"], worker, 30, 3))

        for _ in range(3):
            async with trio.open_nursery() as nursery:
                for n in range(8):
                    nursery.start_soon(claim, f"w{n}")
        assert len([i for i in got if i.startswith("k")]) == 1
        running = await queue.list_items(states=[ItemState.RUNNING], limit=100)
        assert len([i for i in running if i.concurrency_key == "k"]) == 1


async def test_a_freed_slot_wakes_another_process_waiting_on_its_key(
    clock: ManualClock, tmp_path: Path
) -> None:
    """PostgreSQL: a settlement that frees a key's slot sends a NOTIFY, so a runner of another
    queue object (another process) waiting on the blocked item wakes at once, not at its next
    poll; the blocked item is then claimable there."""
    from .conftest import pg_schema

    with pg_schema() as (dsn, schema):
        async with (
            await PostgresQueue.connect(dsn, clock=clock, schema=schema, migrate=True) as one,
            await PostgresQueue.connect(dsn, clock=clock, schema=schema) as other,
        ):
            await one.enqueue("spec", item_id="a", concurrency_key="k")
            await one.enqueue("spec", item_id="b", concurrency_key="k")
            [held] = await one.claim_due(["spec"], "w1", 30, 10)
            assert await other.claim_due(["spec"], "w2", 30, 10) == []
            woke = trio.Event()

            async def waiter() -> None:
                # The first wait may return at once (b counts as due until the key is seen);
                # the listener is running after it, and the next wait blocks on the key.
                await other.wait_for_work(["spec"])
                await other.wait_for_work(["spec"])
                woke.set()

            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(waiter)
                    await trio.sleep(0.5)
                    assert not woke.is_set()
                    await one.complete(held.id, held.lease_version)
                    with trio.fail_after(3):  # far below the lease (30 s) the key waits for
                        await woke.wait()
            assert await claim_ids(other) == ["b"]
