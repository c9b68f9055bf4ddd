"""Uniqueness scopes of idempotency keys, run against every backend (memory, SQLite,
PostgreSQL), and concurrent enqueuers of one key on the durable ones."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio

from trio_supervise.queues import (
    Enqueued,
    ItemState,
    NewItem,
    PostgresQueue,
    SQLiteQueue,
    WorkItem,
    WorkQueue,
)
from trio_supervise.testing.conformance._uniqueness import finish

from .conftest import ManualClock, pg_schema

# -- concurrent enqueuers ---------------------------------------------------------------------

ENQUEUERS = 16


async def _race(queues: list[WorkQueue], key: str) -> set[str]:
    """ENQUEUERS tasks enqueue with *key* at once, spread over *queues*; the ids they got."""
    got: set[str] = set()

    async def one(queue: WorkQueue) -> None:
        item = await queue.enqueue("spec", idempotency_key=key, unique="unfinished")
        got.add(item.id)

    async with trio.open_nursery() as nursery:
        for n in range(ENQUEUERS):
            nursery.start_soon(one, queues[n % len(queues)])
    return got


async def _lapsed_holder(queue: WorkQueue, key: str) -> WorkItem:
    holder = await queue.enqueue("spec", idempotency_key=key, unique="unfinished")
    await finish(queue, holder)
    return holder


@pytest.mark.parametrize("lapsed", [False, True])
async def test_concurrent_enqueuers_make_one_item_on_sqlite(
    tmp_path: Path, clock: ManualClock, lapsed: bool
) -> None:
    """16 concurrent enqueuers of one key through four queue objects on one SQLite file create
    exactly one item (also when a lapsed holder of the key is there)."""
    path = tmp_path / "q.db"
    queues: list[WorkQueue] = [await SQLiteQueue.connect(path, clock=clock) for _ in range(4)]
    try:
        if lapsed:
            await _lapsed_holder(queues[0], "k")
        got = await _race(queues, "k")
        assert len(got) == 1
        counts = await queues[0].counts()
        assert counts[("spec", ItemState.QUEUED)] == 1
    finally:
        for queue in queues:
            await queue.aclose()


@pytest.mark.postgres
@pytest.mark.parametrize("lapsed", [False, True])
async def test_concurrent_enqueuers_make_one_item_on_postgres(lapsed: bool) -> None:
    """16 concurrent enqueuers of one key on 16 connections create exactly one item (also when
    a lapsed holder of the key is there)."""
    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(
            dsn, schema=schema, migrate=True, pool_size=ENQUEUERS, listen=False
        ) as queue:
            if lapsed:
                await _lapsed_holder(queue, "k")
            got = await _race([queue], "k")
            assert len(got) == 1
            counts = await queue.counts()
            assert counts[("spec", ItemState.QUEUED)] == 1


@pytest.mark.postgres
@pytest.mark.parametrize("lapsed", [False, True])
async def test_the_core_on_16_application_connections(lapsed: bool) -> None:
    """The enqueue core, run by 16 threads at once, each in its own transaction on its own
    connection (as the application's code would), creates exactly one item."""
    import psycopg

    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(
            dsn, schema=schema, migrate=True, listen=False
        ) as queue:
            if lapsed:
                await _lapsed_holder(queue, "k")
            barrier = threading.Barrier(ENQUEUERS)
            got: list[Enqueued] = []
            lock = threading.Lock()

            def enqueuer() -> None:
                with psycopg.connect(dsn, options=f"-c search_path={schema}") as conn:
                    barrier.wait()
                    with conn.transaction():
                        [done], _ = queue._enqueue_rows(
                            conn,
                            [NewItem(spec_id="spec", idempotency_key="k", unique="unfinished")],
                        )
                with lock:
                    got.append(done)

            def run_all() -> None:
                threads = [threading.Thread(target=enqueuer) for _ in range(ENQUEUERS)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()

            await trio.to_thread.run_sync(run_all)
            assert len(got) == ENQUEUERS
            assert len({each.item.id for each in got}) == 1
            assert sum(each.created for each in got) == 1
            counts = await queue.counts()
            assert counts[("spec", ItemState.QUEUED)] == 1
