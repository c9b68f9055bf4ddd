"""Retention and editing on every backend: ``prune``, ``delete`` and ``edit_config``."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio

from trio_supervise.queues import ItemState, SettleKind, Settlement, _sql
from trio_supervise.queues.sql._sqlite_db import migrate_path

from .conftest import pg_schema

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
