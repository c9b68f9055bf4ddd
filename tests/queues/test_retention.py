"""Retention and editing on every backend: ``prune``, ``delete`` and ``edit_config``."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio

from trio_supervise import ConfigError, ItemNotFound, ItemStateError
from trio_supervise.queues import ItemState, SettleKind, Settlement, WorkQueue, _sql
from trio_supervise.queues.sql._sqlite_db import migrate_path

from .conftest import ManualClock, pg_schema

DAY = 86_400.0


async def finish(queue: WorkQueue, item_id: str, kind: SettleKind, **extra: object) -> None:
    """Enqueue *item_id*, claim it and settle it with *kind* (complete, cancel or dead)."""
    await queue.enqueue("spec", item_id=item_id, **extra)  # type: ignore[arg-type]
    [item] = await queue.claim_due(["spec"], "w", 30, 1)
    error = "boom" if kind is SettleKind.DEAD else None
    await queue.settle_many(
        [Settlement(item_id=item.id, lease_version=item.lease_version, kind=kind, error=error)]
    )


async def ids(queue: WorkQueue) -> set[str]:
    return {item.id for item in await queue.list_items(limit=1000)}


async def test_prune_deletes_finished_items_past_their_state_age(
    queue: WorkQueue, clock: ManualClock
) -> None:
    """Each state keeps its items for its own age; unfinished items are never touched."""
    await finish(queue, "old-done", SettleKind.COMPLETE)
    await finish(queue, "old-cancelled", SettleKind.CANCEL)
    await finish(queue, "old-dead", SettleKind.DEAD)
    clock.advance(3 * DAY)
    await finish(queue, "new-done", SettleKind.COMPLETE)
    await queue.enqueue("spec", item_id="waiting", due_at=clock.now())
    await queue.enqueue("other", item_id="queued-long-ago")
    clock.advance(1 * DAY)
    ages = {ItemState.COMPLETED: 2 * DAY, ItemState.CANCELLED: 2 * DAY, ItemState.DEAD: 7 * DAY}
    assert await queue.prune(ages, dry_run=True) == {
        ItemState.COMPLETED: 1,
        ItemState.CANCELLED: 1,
        ItemState.DEAD: 0,
    }
    assert await ids(queue) == {
        "old-done",
        "old-cancelled",
        "old-dead",
        "new-done",
        "waiting",
        "queued-long-ago",
    }
    assert await queue.prune(ages) == {
        ItemState.COMPLETED: 1,
        ItemState.CANCELLED: 1,
        ItemState.DEAD: 0,
    }
    assert await ids(queue) == {"old-dead", "new-done", "waiting", "queued-long-ago"}
    counts = await queue.counts()
    assert counts.get(("spec", ItemState.COMPLETED)) == 1
    assert counts.get(("spec", ItemState.CANCELLED)) is None


async def test_an_age_of_zero_prunes_everything_finished_up_to_now(
    queue: WorkQueue, clock: ManualClock
) -> None:
    """The age is inclusive: an item updated exactly ``older_than`` ago is old enough."""
    await finish(queue, "a", SettleKind.COMPLETE)
    assert await queue.prune({ItemState.COMPLETED: 0}) == {ItemState.COMPLETED: 1}
    assert await ids(queue) == set()


async def test_prune_takes_the_oldest_first_in_batches_of_limit(
    queue: WorkQueue, clock: ManualClock
) -> None:
    """With a limit, one call deletes at most that many per state, the oldest first."""
    for n in range(5):
        await finish(queue, f"i{n}", SettleKind.COMPLETE)
        clock.advance(60)
    ages = {ItemState.COMPLETED: 0.0}
    assert await queue.prune(ages, limit=2, dry_run=True) == {ItemState.COMPLETED: 2}
    assert await queue.prune(ages, limit=2) == {ItemState.COMPLETED: 2}
    assert await ids(queue) == {"i2", "i3", "i4"}
    assert await queue.prune(ages, limit=2) == {ItemState.COMPLETED: 2}
    assert await queue.prune(ages, limit=2) == {ItemState.COMPLETED: 1}
    assert await queue.prune(ages, limit=2) == {ItemState.COMPLETED: 0}


async def test_a_retried_item_is_no_longer_prunable(queue: WorkQueue, clock: ManualClock) -> None:
    """Retention reads the state now: an old dead item retried by hand is queued, and kept."""
    await finish(queue, "d", SettleKind.DEAD)
    clock.advance(DAY)
    await queue.retry("d")
    assert await queue.prune({ItemState.DEAD: 0.0}) == {ItemState.DEAD: 0}
    assert await ids(queue) == {"d"}


async def test_a_pruned_key_and_id_are_free_again(queue: WorkQueue, clock: ManualClock) -> None:
    """Once pruned, an item's idempotency key and id may be used by a new item."""
    await finish(queue, "k", SettleKind.COMPLETE, idempotency_key="K")
    await queue.prune({ItemState.COMPLETED: 0.0})
    again = await queue.enqueue("spec", item_id="k", idempotency_key="K")
    assert again.state is ItemState.QUEUED


@pytest.mark.parametrize(
    ("older_than", "limit", "message"),
    [
        ({ItemState.QUEUED: 1.0}, None, "only finished items are pruned"),
        ({ItemState.RUNNING: 1.0}, None, "only finished items are pruned"),
        ({ItemState.DEAD: -1.0}, None, r"older_than\[dead\] must be a number of seconds"),
        ({ItemState.DEAD: float("nan")}, None, r"older_than\[dead\]"),
        ({ItemState.DEAD: "7d"}, None, r"older_than\[dead\]"),
        ({ItemState.DEAD: 1.0}, 0, "limit must be None or an integer >= 1"),
        ({ItemState.DEAD: 1.0}, True, "limit must be None or an integer >= 1"),
    ],
)
async def test_prune_refuses_bad_arguments(
    queue: WorkQueue, older_than: dict[ItemState, object], limit: object, message: str
) -> None:
    """A bad state, age or limit is a ValueError naming it, and nothing is deleted."""
    await finish(queue, "a", SettleKind.DEAD)
    with pytest.raises(ValueError, match=message):
        await queue.prune(older_than, limit=limit)  # type: ignore[arg-type]
    assert await ids(queue) == {"a"}


async def test_many_pruners_at_once_delete_each_item_once(
    queue: WorkQueue, clock: ManualClock
) -> None:
    """Concurrent batches never fail or double count: together they delete each item once."""
    for n in range(60):
        await finish(queue, f"i{n:02}", SettleKind.COMPLETE)
    totals: list[int] = []

    async def pruner() -> None:
        while True:
            got = await queue.prune({ItemState.COMPLETED: 0.0}, limit=7)
            totals.append(got[ItemState.COMPLETED])
            if not got[ItemState.COMPLETED]:
                return

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(pruner)
    assert sum(totals) == 60
    assert await ids(queue) == set()


# -- delete and edit_config ----------------------------------------------------------------------


async def test_delete_removes_a_finished_or_queued_item(queue: WorkQueue) -> None:
    """delete returns the item as it was; its id can be enqueued again."""
    await finish(queue, "done", SettleKind.COMPLETE)
    await queue.enqueue("spec", item_id="q", idempotency_key="Q")
    deleted = await queue.delete("done")
    assert (deleted.id, deleted.state) == ("done", ItemState.COMPLETED)
    assert (await queue.delete("q")).state is ItemState.QUEUED
    assert await ids(queue) == set()
    with pytest.raises(ItemNotFound):
        await queue.get("done")
    assert (await queue.enqueue("spec", idempotency_key="Q")).id != "q"


async def test_delete_refuses_a_running_item_and_a_missing_one(queue: WorkQueue) -> None:
    """A running item must be cancelled first; an unknown id is ItemNotFound."""
    await queue.enqueue("spec", item_id="r")
    [running] = await queue.claim_due(["spec"], "w", 30, 1)
    with pytest.raises(ItemStateError, match="running; cancel it first"):
        await queue.delete("r")
    assert (await queue.get("r")).lease_version == running.lease_version
    with pytest.raises(ItemNotFound):
        await queue.delete("missing")


async def test_edit_config_fixes_a_queued_or_dead_item(
    queue: WorkQueue, clock: ManualClock
) -> None:
    """The new config is stored as given (and updated_at moves); nothing else changes."""
    await queue.enqueue("other", item_id="q", config={"a": 1})
    clock.advance(5)
    edited = await queue.edit_config("q", {"a": 2})
    assert edited.config == {"a": 2}
    assert edited.updated_at == clock.now()
    assert (await queue.get("q")).config == {"a": 2}
    await finish(queue, "d", SettleKind.DEAD)
    dead = await queue.edit_config("d", None)
    assert (dead.config, dead.state, dead.last_error) == ({}, ItemState.DEAD, "boom")


async def test_edit_config_refuses_running_missing_and_bad_configs(queue: WorkQueue) -> None:
    """Running: ItemStateError; missing: ItemNotFound; not JSON: ConfigError; nothing written."""
    await queue.enqueue("spec", item_id="r", config={"a": 1})
    await queue.claim_due(["spec"], "w", 30, 1)
    with pytest.raises(ItemStateError, match="running"):
        await queue.edit_config("r", {"a": 2})
    with pytest.raises(ItemNotFound):
        await queue.edit_config("missing", {})
    with pytest.raises(ConfigError, match="config"):
        await queue.edit_config("r", {"bad": {1, 2}})
    with pytest.raises(ConfigError, match="NUL"):
        await queue.edit_config("r", {"bad": "\x00"})
    assert (await queue.get("r")).config == {"a": 1}


# -- the index that serves pruning -----------------------------------------------------------------


async def test_sqlite_prune_walks_the_finished_index(tmp_path: Path) -> None:
    """Both prune statements range over trio_supervise_items_finished_idx, with no sort."""
    path = tmp_path / "q.db"
    await migrate_path(path)
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, created_at, updated_at)"
            " VALUES (?, 's', ?, 0, 0, ?)",
            [(f"i{n}", "completed" if n % 10 else "queued", n) for n in range(5000)],
        )
        conn.execute("ANALYZE")
        params = {"state": "completed", "now": 10_000, "age_us": 0, "limit": 100}
        for name in ("prune", "prune_count"):
            query = _sql.load_queries("sqlite")[name]
            rows = conn.execute(f"EXPLAIN QUERY PLAN {query}", params).fetchall()
            plan = "\n".join(str(row[-1]) for row in rows)
            assert "trio_supervise_items_finished_idx" in plan, plan
            assert "TEMP B-TREE" not in plan, plan


@pytest.mark.postgres
async def test_postgres_prune_walks_the_finished_index() -> None:
    """Even as a generic plan (the state a parameter), prune uses the partial finished index."""
    import psycopg

    from trio_supervise.queues import PostgresQueue

    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(dsn, schema=schema, migrate=True):
            pass

        def explain() -> str:
            with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}") as c:
                c.execute(
                    "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, created_at,"
                    " updated_at) SELECT 'i' || g, 's', CASE WHEN g % 10 = 0 THEN 'queued' ELSE"
                    " 'completed' END, now(), now(), now() - g * interval '1 second'"
                    " FROM generate_series(1, 50000) AS g"
                )
                c.execute("ANALYZE trio_supervise_items")
                c.execute("SET plan_cache_mode = force_generic_plan")
                query = _sql.load_queries("postgres")["prune"]
                sql = query.replace("%(state)s", "$1").replace("%(now)s", "$2")
                sql = sql.replace("%(age_us)s", "$3").replace("%(limit)s", "$4")
                c.execute(f"PREPARE p(text, timestamptz, bigint, bigint) AS {sql}".encode())
                rows = c.execute(b"EXPLAIN EXECUTE p('completed', NULL, 0, 100)").fetchall()
                return "\n".join(str(row[0]) for row in rows)

        plan = await trio.to_thread.run_sync(explain)
        assert "trio_supervise_items_finished_idx" in plan, plan
        assert "Seq Scan" not in plan, plan


# -- counts kept by the database (what /metrics and the status page read) -------------------------


async def test_counts_follow_every_write_and_prune(queue: WorkQueue, clock: ManualClock) -> None:
    """Enqueue, claim, settle, retry, delete and prune all move the counts, exactly."""
    await finish(queue, "done", SettleKind.COMPLETE)
    await finish(queue, "dead", SettleKind.DEAD)
    await queue.enqueue("spec", item_id="q", queue="mail")
    await queue.enqueue("other", item_id="o")
    await queue.claim_due(["other"], "w", 30, 1)
    assert dict(await queue.counts()) == {
        ("spec", ItemState.COMPLETED): 1,
        ("spec", ItemState.DEAD): 1,
        ("spec", ItemState.QUEUED): 1,
        ("other", ItemState.RUNNING): 1,
    }
    await queue.retry("dead")
    await queue.delete("q")
    await queue.prune({ItemState.COMPLETED: 0.0})
    assert dict(await queue.counts()) == {
        ("spec", ItemState.QUEUED): 1,
        ("other", ItemState.RUNNING): 1,
    }
    by_queue = {info.name: dict(info.counts) for info in await queue.list_queues()}
    assert by_queue == {"default": {ItemState.QUEUED: 1, ItemState.RUNNING: 1}}


async def test_sqlite_counts_are_kept_for_writes_from_outside(tmp_path: Path) -> None:
    """Rows written by another program (plain SQL) are counted too: the triggers see them."""
    from trio_supervise.queues import SQLiteQueue

    path = tmp_path / "q.db"
    await migrate_path(path)
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, created_at, updated_at)"
            " VALUES (?, 's', ?, 0, 0, 0)",
            [(f"i{n}", "completed" if n % 4 else "queued") for n in range(100)],
        )
        conn.execute("UPDATE trio_supervise_items SET state = 'dead' WHERE id = 'i1'")
        conn.execute("DELETE FROM trio_supervise_items WHERE id IN ('i2', 'i4')")
    async with await SQLiteQueue.connect(path) as queue:
        assert dict(await queue.counts()) == {
            ("s", ItemState.COMPLETED): 73,
            ("s", ItemState.DEAD): 1,
            ("s", ItemState.QUEUED): 24,
        }


@pytest.mark.postgres
async def test_postgres_counts_stay_exact_under_concurrent_writers_and_folds() -> None:
    """Eight writers at once, folds in between, writes with another search_path and a
    TRUNCATE: the counts always equal a count of the rows."""
    import psycopg

    from trio_supervise.queues import PostgresQueue

    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(
            dsn, schema=schema, migrate=True, pool_size=8
        ) as queue:

            async def worker(n: int) -> None:
                for k in range(25):
                    await queue.enqueue("spec", item_id=f"w{n}-{k}")
                    for item in await queue.claim_due(["spec"], f"w{n}", 30, 2):
                        kind = SettleKind.COMPLETE if k % 3 else SettleKind.DEAD
                        error = "boom" if kind is SettleKind.DEAD else None
                        await queue.settle_many(
                            [Settlement(item_id=item.id, lease_version=item.lease_version,
                                        kind=kind, error=error)]
                        )  # fmt: skip

            async with trio.open_nursery() as nursery:
                for n in range(8):
                    nursery.start_soon(worker, n)

            def sql(statement: str, path: str = schema) -> list[tuple[object, ...]]:
                with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={path}") as c:
                    cursor = c.execute(statement.encode())
                    return cursor.fetchall() if cursor.description else []

            def truth() -> dict[tuple[str, ItemState], int]:
                rows = sql(
                    "SELECT spec_id, state, count(*) FROM trio_supervise_items GROUP BY 1, 2"
                )
                return {(str(s), ItemState(str(t))): int(str(n)) for s, t, n in rows}

            assert dict(await queue.counts()) == truth()
            assert sum(truth().values()) == 200
            await trio.to_thread.run_sync(sql, "SELECT trio_supervise_fold_counts()")
            assert sql("SELECT count(*) FROM trio_supervise_count_deltas") == [(0,)]
            assert dict(await queue.counts()) == truth()
            # A write naming the table by its schema, from a session whose search_path is
            # elsewhere, is counted in that schema (the functions pin their search_path).
            await trio.to_thread.run_sync(
                sql,
                f'INSERT INTO "{schema}".trio_supervise_items (id, spec_id, due_at, created_at,'
                " updated_at) VALUES ('outside', 'x', now(), now(), now())",
                "public",
            )
            assert (await queue.counts())[("x", ItemState.QUEUED)] == 1
            await trio.to_thread.run_sync(sql, "TRUNCATE trio_supervise_items")
            assert dict(await queue.counts()) == {}
