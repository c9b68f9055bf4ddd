"""Status reads never starve lease renewals (issue 12, class 3), on the durable backends.

300,000 finished rows, 100 tasks looping on ``counts()``/``list_items``/``get`` (what status
pages and ``/metrics`` scrapes do), and one worker renewing 10 three-second leases every second:
no renewal may come back lost or land after the lease it renews has expired. Real clock (the
durable backends' own), bounded in time.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from trio_supervise.queues import (
    LeaseStatus,
    PostgresQueue,
    SettleKind,
    Settlement,
    SQLiteQueue,
    WorkQueue,
    migrate,
)

from .conftest import pg_schema

pytestmark = pytest.mark.slow

FINISHED = 300_000
READERS = 100
LEASE = 3.0
RENEW_EVERY = 1.0
ROUNDS = 6


@asynccontextmanager
async def loaded_queue(backend: str, tmp_path: Path) -> AsyncIterator[WorkQueue]:
    """A queue of *backend* holding FINISHED completed rows, on the real clock."""
    if backend == "sqlite":
        path = tmp_path / "big.db"
        await migrate(f"sqlite:///{path}")
        with sqlite3.connect(path) as conn:
            conn.executemany(
                "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, created_at, "
                "updated_at) VALUES (?, ?, 'completed', ?, 0, 0)",
                ((f"done{n:06}", f"s{n % 4}", n) for n in range(FINISHED)),
            )
        async with await SQLiteQueue.connect(path) as queue:
            yield queue
        return
    import psycopg

    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(dsn, schema=schema, migrate=True) as queue:
            with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}") as c:
                c.execute(
                    "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, created_at, "
                    "updated_at) SELECT 'done' || g, 's' || (g % 4), 'completed', "
                    f"now() - g * interval '1 second', now(), now() FROM generate_series(1, "
                    f"{FINISHED}) AS g; ANALYZE trio_supervise_items"
                )
            yield queue


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_status_reads_never_cost_a_lease(backend: str, tmp_path: Path) -> None:
    """With 300k finished rows and 100 readers looping, a worker renewing 10 leases loses none."""
    async with loaded_queue(backend, tmp_path) as queue:
        for n in range(10):
            await queue.enqueue("work", item_id=f"w{n}")
        claimed = await queue.claim_due(["work"], "worker", LEASE, 10)
        assert len(claimed) == 10
        leases = [item.lease for item in claimed]
        expires_at = trio.current_time() + LEASE
        lost: list[str] = []
        reads = 0

        async def reader(n: int) -> None:
            nonlocal reads
            while True:
                await queue.counts()
                reads += 1
                await queue.list_items(limit=50)
                reads += 1
                await queue.get(f"w{n % 10}")
                reads += 1

        with trio.fail_after(ROUNDS * RENEW_EVERY + 30):
            async with trio.open_nursery() as nursery:
                for n in range(READERS):
                    nursery.start_soon(reader, n)
                for _ in range(ROUNDS):
                    await trio.sleep(RENEW_EVERY)
                    statuses = await queue.renew_many(leases, LEASE)
                    now = trio.current_time()
                    lost += [
                        item_id for item_id, s in statuses.items() if s is not LeaseStatus.HELD
                    ]
                    if now > expires_at:
                        lost.append(f"a renewal landed {now - expires_at:.2f} s after expiry")
                    expires_at = now + LEASE
                nursery.cancel_scope.cancel()
        assert lost == []
        assert reads >= 10  # the readers really ran beside the renewals
        # The leases are still this worker's: settling them works.
        done = await queue.settle_many(
            [
                Settlement(
                    item_id=each.item_id, lease_version=each.version, kind=SettleKind.COMPLETE
                )
                for each in leases
            ]
        )
        assert done == [True] * 10
