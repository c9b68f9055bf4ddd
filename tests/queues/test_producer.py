"""Producers outside Trio (``trio_supervise.producer``): items enqueued on the application's
own ``sqlite3`` or psycopg connection (sync, and ``AsyncConnection`` under asyncio), under the
rules of ``queue.enqueue``, committed or rolled back with the application's transaction and
seen by runners at the commit. On SQLite and PostgreSQL, on Trio's real clock, as the other
outbox tests (``test_outbox.py``, whose application side these reuse)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_supervise import ConfigError, DuplicateItem, SchemaError
from trio_supervise.producer import Producer
from trio_supervise.queues import ItemState, NewItem, PostgresQueue, SQLiteQueue

from ..test_runner import Recorder, make_runner, running
from .conftest import pg_schema
from .test_outbox import OUTBOX_BACKENDS, PROMPT, App, in_thread, open_outbox


def producer_for(app: App) -> Producer:
    return Producer(schema=app.schema)


@pytest.mark.parametrize("backend", OUTBOX_BACKENDS)
async def test_a_commit_stores_the_item_and_wakes_a_runner(backend: str, tmp_path: Path) -> None:
    """An item enqueued on the application's transaction is stored at its commit, as enqueue
    stores one, and an idle runner (poll interval 60 s) runs it within moments: on PostgreSQL
    the insert's NOTIFY, delivered at the commit, wakes it."""
    driver = Recorder(spec_ids=("job",))
    async with open_outbox(backend, None, tmp_path) as (queue, app):
        producer = producer_for(app)

        def place_order() -> Any:
            with app.connection() as conn:
                app.insert_order(conn, 1)
                item = producer.enqueue(
                    conn, "job", item_id="order-1", config={"order": 1}, priority=3
                )
                conn.commit()
            return item

        async with running(make_runner(queue, driver, poll_interval=60)):
            await trio.sleep(0.3)  # the runner is idle, waiting for work
            committed = trio.current_time()
            item = await in_thread(place_order)
            with trio.fail_after(5):
                while (await queue.get("order-1")).state is not ItemState.COMPLETED:  # noqa: ASYNC110
                    await trio.sleep(0.01)
        assert app.orders_stored() == [1]
    assert (item.spec_id, item.config, item.priority, item.state) == (
        "job",
        {"order": 1},
        3,
        ItemState.QUEUED,
    )
    assert driver.starts["order-1"][0] - committed < PROMPT


@pytest.mark.parametrize("backend", OUTBOX_BACKENDS)
async def test_rolled_back_with_the_callers_transaction_no_item(
    backend: str, tmp_path: Path
) -> None:
    """Rolled back with the business write, the item was never there."""
    async with open_outbox(backend, None, tmp_path) as (queue, app):
        producer = producer_for(app)

        def abandon_order() -> None:
            with app.connection() as conn:
                app.insert_order(conn, 1)
                producer.enqueue(conn, "job", config={"order": 1})
                conn.rollback()

        await in_thread(abandon_order)
        assert await queue.list_items() == []
        assert app.orders_stored() == []


@pytest.mark.parametrize("backend", OUTBOX_BACKENDS)
async def test_the_rules_of_enqueue_hold(backend: str, tmp_path: Path) -> None:
    """A bad value is refused naming the field, before anything is written, and the
    transaction goes on; a held idempotency key returns its item; an explicit id that
    exists is a DuplicateItem."""
    async with open_outbox(backend, None, tmp_path) as (queue, app):
        producer = producer_for(app)

        def produce() -> tuple[list[bool], str]:
            with app.connection() as conn:
                app.insert_order(conn, 1)
                with pytest.raises(ValueError, match="priority"):
                    producer.enqueue(conn, "job", priority=10**9)
                with pytest.raises(ConfigError, match="config"):
                    producer.enqueue(conn, "job", config={"bad": float("nan")})
                first = producer.enqueue(conn, "job", item_id="a", idempotency_key="k")
                done = producer.enqueue_many(
                    conn, [NewItem(spec_id="job", idempotency_key="k"), NewItem(spec_id="job")]
                )
                with pytest.raises(DuplicateItem, match="'a'"):
                    producer.enqueue(conn, "job", item_id="a")
                conn.commit()
            assert done[0].item == first
            return [each.created for each in done], done[1].item.id

        created, other = await in_thread(produce)
        assert created == [False, True]
        assert sorted(item.id for item in await queue.list_items()) == sorted(["a", other])
        assert app.orders_stored() == [1]


def test_a_url_enqueues_in_a_transaction_of_its_own(tmp_path: Path) -> None:
    """Given a database URL, the producer connects, enqueues, commits and disconnects; no
    Trio runs here."""
    path = tmp_path / "queue.db"
    trio.run(_migrate_sqlite, path)
    producer = Producer()
    item = producer.enqueue(f"sqlite:///{path}", "job", idempotency_key="k")
    again = producer.enqueue(f"sqlite:///{path}", "job", idempotency_key="k")
    assert again == item
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT id FROM trio_supervise_items").fetchall() == [(item.id,)]
    with pytest.raises(ValueError, match="memory://"):
        producer.enqueue("memory://", "job")
    with pytest.raises(TypeError, match="sqlite3 is synchronous"):
        asyncio.run(producer.enqueue_async(f"sqlite:///{path}", "job"))


async def _migrate_sqlite(path: Path) -> None:
    async with await SQLiteQueue.connect(path):
        pass


def test_connections_that_cannot_hold_an_item_are_refused(tmp_path: Path) -> None:
    """An in-memory database, a file without the queue's schema, something that is not a
    connection, a sqlite3 connection to the asyncio call: refused saying why, nothing
    written."""
    producer = Producer()
    memory = sqlite3.connect(":memory:")
    with pytest.raises(ValueError, match="in-memory database"):
        producer.enqueue(memory, "job")
    bare = sqlite3.connect(tmp_path / "other.db")
    with pytest.raises(SchemaError, match="has no queue schema"):
        producer.enqueue(bare, "job")
    bare.rollback()
    with pytest.raises(TypeError, match=r"conn must be a sqlite3\.Connection, a psycopg"):
        producer.enqueue(object(), "job")
    with pytest.raises(TypeError, match=r"conn must be a psycopg\.AsyncConnection"):
        asyncio.run(producer.enqueue_async(object(), "job"))
    with pytest.raises(TypeError, match="sqlite3 is synchronous"):
        asyncio.run(producer.enqueue_async(memory, "job"))


@pytest.mark.postgres
def test_an_asyncio_connection_commits_and_rolls_back_with_the_app() -> None:
    """Under asyncio, on a ``psycopg.AsyncConnection``: the item commits with the business
    write (and its NOTIFY reaches a listener at the commit), a rolled-back one leaves
    nothing, and a sync connection handed to the async call is refused."""
    import psycopg

    with pg_schema() as (dsn, schema):
        trio.run(_migrate_postgres, dsn, schema)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {schema}.orders (id integer PRIMARY KEY)")
        producer = Producer(schema=schema)

        async def failed_request(conn: Any) -> None:
            async with conn.transaction():
                await conn.execute(f"INSERT INTO {schema}.orders VALUES (2)")
                await producer.enqueue_async(conn, "job", config={"order": 2})
                raise RuntimeError("the request failed")

        async def app() -> str:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                async with conn.transaction():
                    await conn.execute(f"INSERT INTO {schema}.orders VALUES (1)")
                    item = await producer.enqueue_async(conn, "job", config={"order": 1})
                with pytest.raises(RuntimeError):
                    await failed_request(conn)
                with pytest.raises(ValueError, match="priority"):
                    await producer.enqueue_async(conn, "job", priority=10**9)
            return item.id

        with psycopg.connect(dsn, autocommit=True) as listener:
            listener.execute(f'LISTEN "trio_supervise:{schema}"')
            item_id = asyncio.run(app())
            heard = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
            stored = listener.execute(
                f"SELECT id, config->>'order' FROM {schema}.trio_supervise_items"
            ).fetchall()
            orders = listener.execute(f"SELECT id FROM {schema}.orders").fetchall()
            with psycopg.connect(dsn) as sync, pytest.raises(TypeError, match="AsyncConnection"):
                asyncio.run(producer.enqueue_async(sync, "job"))
            with pytest.raises(TypeError, match="enqueue_async"):
                producer.enqueue(_ClosedAsync.closed(dsn), "job")
    assert len(heard) == 1
    assert "job" in heard[0]
    assert stored == [(item_id, "1")]
    assert orders == [(1,)]


class _ClosedAsync:
    @staticmethod
    def closed(dsn: str) -> Any:
        """An ``AsyncConnection``, closed (only its type matters)."""
        import psycopg

        async def connect() -> Any:
            conn = await psycopg.AsyncConnection.connect(dsn)
            await conn.close()
            return conn

        return asyncio.run(connect())


async def _migrate_postgres(dsn: str, schema: str) -> None:
    async with await PostgresQueue.connect(dsn, schema=schema, migrate=True):
        pass


@pytest.mark.postgres
def test_a_connection_has_its_schema_version_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The version of the queue's schema is read on a connection's first enqueue only (two
    round trips fewer on each later one); another connection, or the same one reconnected to
    another server process, is checked again."""
    import psycopg

    from trio_supervise.queues.sql import _outside

    checks: list[int] = []
    version = getattr(_outside, "postgres_version")  # noqa: B009 - not exported

    def counted(cur: Any) -> int:
        checks.append(1)
        return int(version(cur))

    monkeypatch.setattr(_outside, "postgres_version", counted)
    with pg_schema() as (dsn, schema):
        trio.run(_migrate_postgres, dsn, schema)
        producer = Producer(schema=schema)
        with psycopg.connect(dsn) as conn:
            for _ in range(3):
                with conn.transaction():
                    producer.enqueue(conn, "job")
            assert len(checks) == 1
        with psycopg.connect(dsn) as other, other.transaction():
            producer.enqueue(other, "job")
        assert len(checks) == 2
