"""Uniqueness scopes of idempotency keys, run against every backend (memory, SQLite,
PostgreSQL), and concurrent enqueuers of one key on the durable ones."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import pytest
import trio

from trio_supervise import ItemNotFound
from trio_supervise.queues import (
    Enqueued,
    ItemState,
    NewItem,
    PostgresQueue,
    SQLiteQueue,
    WorkItem,
    WorkQueue,
)

from .conftest import START, ManualClock, pg_schema

S = dt.timedelta(seconds=1)


async def finish(queue: WorkQueue, item: WorkItem, how: str = "complete") -> None:
    """Claim *item* (the only due one of its spec) and finish it as *how*."""
    [claimed] = await queue.claim_due([item.spec_id], "w", 30, 1)
    assert claimed.id == item.id
    if how == "complete":
        await queue.complete(claimed.id, claimed.lease_version)
    else:
        from trio_supervise.queues import SettleKind, Settlement

        kind = SettleKind.CANCEL if how == "cancel" else SettleKind.DEAD
        await queue.settle_many(
            [
                Settlement(
                    item_id=claimed.id, lease_version=claimed.lease_version, kind=kind, error="x"
                )
            ]
        )


# -- forever (the default) --------------------------------------------------------------------


async def test_forever_holds_after_the_item_finished(queue: WorkQueue) -> None:
    """By default a key holds for as long as its item exists: a finished one is returned."""
    first = await queue.enqueue("spec", idempotency_key="k")
    assert first.unique_scope == "forever"
    await finish(queue, first)
    [again] = await queue.enqueue_many([NewItem(spec_id="spec", idempotency_key="k")])
    assert (again.created, again.item.id, again.item.state) == (
        False,
        first.id,
        ItemState.COMPLETED,
    )


# -- unfinished -------------------------------------------------------------------------------


async def test_unfinished_holds_while_queued_or_running(queue: WorkQueue) -> None:
    """An 'unfinished' key returns its item while it is queued, and while it runs."""
    first = await queue.enqueue("spec", idempotency_key="k", unique="unfinished")
    assert first.unique_scope == "unfinished"
    assert (await queue.enqueue("spec", idempotency_key="k", unique="unfinished")).id == first.id
    await queue.claim_due(["spec"], "w", 30, 1)
    [again] = await queue.enqueue_many([NewItem(spec_id="spec", idempotency_key="k")])
    assert (again.created, again.item.id) == (False, first.id)


@pytest.mark.parametrize("how", ["complete", "cancel", "dead"])
async def test_unfinished_frees_the_key_once_finished(queue: WorkQueue, how: str) -> None:
    """Once an 'unfinished' item is completed, cancelled or dead, the key makes a new item;
    the old one keeps the key as its released_key."""
    first = await queue.enqueue("spec", idempotency_key="k", unique="unfinished")
    await finish(queue, first, how)
    assert (await queue.get_by_key("k")).id == first.id  # released only by the next enqueue
    [new] = await queue.enqueue_many(
        [NewItem(spec_id="spec", idempotency_key="k", unique="unfinished", config={"v": 2})]
    )
    assert new.created
    assert new.item.id != first.id
    assert new.item.idempotency_key == "k"
    old = await queue.get(first.id)
    assert (old.idempotency_key, old.released_key) == (None, "k")
    assert await queue.get_by_key("k") == new.item
    assert (await queue.enqueue("spec", idempotency_key="k")).id == new.item.id


async def test_a_cancelled_queued_item_frees_an_unfinished_key(queue: WorkQueue) -> None:
    """A queued 'unfinished' item cancelled from outside frees its key too."""
    first = await queue.enqueue("spec", idempotency_key="k", unique="unfinished")
    await queue.request_cancel(first.id)
    again = await queue.enqueue("spec", idempotency_key="k")
    assert again.id != first.id


async def test_the_holders_scope_decides(queue: WorkQueue) -> None:
    """A 'forever' holder keeps its key even when the new entry asks for 'unfinished'; the new
    item's scope applies to the new item."""
    first = await queue.enqueue("spec", idempotency_key="k")
    await finish(queue, first)
    again = await queue.enqueue("spec", idempotency_key="k", unique="unfinished")
    assert again.id == first.id


async def test_released_keys_stack_up_newest_first(queue: WorkQueue) -> None:
    """Three generations of one 'unfinished' key: get_by_key finds the holder, then, once
    nothing holds it, the newest released item."""
    made = []
    for _ in range(3):
        item = await queue.enqueue("spec", idempotency_key="k", unique="unfinished")
        made.append(item)
        await finish(queue, item)
    assert len({item.id for item in made}) == 3
    assert (await queue.get_by_key("k")).id == made[2].id
    assert [(await queue.get(i.id)).released_key for i in made] == ["k", "k", None]


async def test_get_by_key_of_an_unknown_key(queue: WorkQueue) -> None:
    """get_by_key of a key nothing ever held raises ItemNotFound naming the key."""
    with pytest.raises(ItemNotFound, match="idempotency key 'nope'"):
        await queue.get_by_key("nope")


# -- period -----------------------------------------------------------------------------------


@pytest.mark.parametrize("period", [dt.timedelta(seconds=60), 60, 60.0])
async def test_a_period_holds_from_creation(
    queue: WorkQueue, clock: ManualClock, period: dt.timedelta | float
) -> None:
    """A key with a period holds for that long after its item was created (whatever its state),
    then the next enqueue makes a new item."""
    first = await queue.enqueue("spec", idempotency_key="k", unique=period)
    assert (first.unique_scope, first.unique_until) == ("period", START + 60 * S)
    await finish(queue, first)
    clock.advance(59)
    assert (await queue.enqueue("spec", idempotency_key="k")).id == first.id
    clock.advance(1)
    [new] = await queue.enqueue_many([NewItem(spec_id="spec", idempotency_key="k")])
    assert new.created
    assert new.item.unique_scope == "forever"
    assert (await queue.get(first.id)).released_key == "k"


async def test_a_period_lapses_while_queued(queue: WorkQueue, clock: ManualClock) -> None:
    """A period counts from creation even if the item never ran."""
    first = await queue.enqueue("spec", idempotency_key="k", unique=10)
    clock.advance(10)
    second = await queue.enqueue("spec", idempotency_key="k", unique=10)
    assert second.id != first.id
    assert await queue.counts() == {("spec", ItemState.QUEUED): 2}


# -- in one batch -----------------------------------------------------------------------------


async def test_a_batch_releases_and_repeats(queue: WorkQueue) -> None:
    """In one batch, a lapsed holder's key goes to the first entry with it; later entries with
    the same key report that new item."""
    first = await queue.enqueue("spec", idempotency_key="k", unique="unfinished")
    await finish(queue, first)
    done = await queue.enqueue_many(
        [NewItem(spec_id="spec", idempotency_key="k", unique="unfinished") for _ in range(3)]
    )
    assert [each.created for each in done] == [True, False, False]
    assert done[1] == done[2] == Enqueued(item=done[0].item, created=False)


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
