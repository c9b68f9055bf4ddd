"""Transactional enqueue (the outbox): an item written on the application's own transaction.

Each test runs on SQLite (a ``sqlite3`` connection to the queue's file) and PostgreSQL (a sync
``psycopg`` connection with the server's default ``search_path``, while the queue lives in a
schema of its own), on Trio's real clock with the queue's wall clock injected, as the other
durable-backend tests do.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from trio_supervise import DuplicateItem, QueueError, SchemaError
from trio_supervise.queues import ItemState, MemoryQueue, NewItem, PostgresQueue, SQLiteQueue

from ..test_runner import Recorder, make_runner, running
from .conftest import START, ManualClock, pg_schema

OUTBOX_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]

PROMPT = 0.75
"""Seconds within which a commit must wake a waiter: well before any poll interval (the
runner's default is 1 s, the one used here 60 s), and within SQLite's watch interval plenty."""


@attrs.define
class App:
    """The application's side: its own connections to the queue's database, and its table."""

    backend: str
    connect: Callable[[], Any]
    orders: str
    """The business table, as the application's connection names it."""
    schema: str | None = None
    """PostgreSQL: the queue's schema (the application's connection does not set it)."""

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        conn = self.connect()
        try:
            yield conn
        finally:
            conn.close()

    def insert_order(self, conn: Any, order_id: int) -> None:
        mark = "?" if self.backend == "sqlite" else "%s"
        conn.execute(f"INSERT INTO {self.orders} (id) VALUES ({mark})", (order_id,))

    def orders_stored(self) -> list[int]:
        with self.connection() as conn:
            rows = conn.execute(f"SELECT id FROM {self.orders} ORDER BY id").fetchall()
            conn.rollback()
        return [row[0] for row in rows]


@contextlib.asynccontextmanager
async def open_outbox(
    backend: str, clock: ManualClock | None, tmp_path: Path, *, unix_socket: bool = False
) -> AsyncIterator[tuple[SQLiteQueue | PostgresQueue, App]]:
    """A fresh queue of *backend* and the application beside it, its table created."""
    if backend == "sqlite":
        path = tmp_path / "queue.db"
        async with await SQLiteQueue.connect(path, clock=clock) as queue:
            with sqlite3.connect(path) as conn:
                conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
            yield queue, App(backend, lambda: _sqlite_app_connection(path), "orders")
        return
    import psycopg

    with pg_schema() as (dsn, schema):
        if unix_socket:
            dsn = _unix_socket_dsn(dsn)
        async with await PostgresQueue.connect(
            dsn, clock=clock, schema=schema, migrate=True, pool_size=4
        ) as queue:
            orders = f"{schema}.orders"
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"CREATE TABLE {orders} (id integer PRIMARY KEY)")
            yield queue, App(backend, lambda: psycopg.connect(dsn), orders, schema)


def _sqlite_app_connection(path: Path) -> sqlite3.Connection:
    # Trio's worker threads vary between calls: one thread at a time, not always the same one.
    return sqlite3.connect(path, timeout=5, check_same_thread=False)


def _unix_socket_dsn(dsn: str) -> str:
    """The test DSN over the server's Unix socket (skips when there is none here)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    socket_dir = "/var/run/postgresql"
    params = conninfo_to_dict(dsn)
    port = params.get("port", "5432")
    if not os.path.exists(f"{socket_dir}/.s.PGSQL.{port}"):
        pytest.skip(f"no PostgreSQL Unix socket in {socket_dir}")
    return make_conninfo(**{**params, "host": socket_dir})


@pytest.fixture(params=OUTBOX_BACKENDS)
def outbox_backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
async def outbox(
    outbox_backend: str, clock: ManualClock, tmp_path: Path
) -> AsyncIterator[tuple[SQLiteQueue | PostgresQueue, App]]:
    async with open_outbox(outbox_backend, clock, tmp_path) as pair:
        yield pair


async def in_thread(fn: Callable[[], Any]) -> Any:
    return await trio.to_thread.run_sync(fn)


# -- commit and rollback ------------------------------------------------------------------------


async def test_a_commit_stores_the_item_with_the_business_write(
    outbox: tuple[SQLiteQueue | PostgresQueue, App],
) -> None:
    """The item enqueued on the application's transaction is stored once it commits, as
    enqueue would have stored it."""
    queue, app = outbox

    def place_order() -> Any:
        with app.connection() as conn:
            app.insert_order(conn, 1)
            item = queue.enqueue_on(
                conn, "ship", config={"order": 1}, idempotency_key="order-1", priority=3
            )
            conn.commit()
        return item

    item = await in_thread(place_order)
    assert (item.spec_id, item.config, item.state, item.priority) == (
        "ship",
        {"order": 1},
        ItemState.QUEUED,
        3,
    )
    assert item.due_at == item.created_at == START
    assert await queue.get(item.id) == item
    assert app.orders_stored() == [1]


async def test_a_rollback_leaves_no_item(outbox: tuple[SQLiteQueue | PostgresQueue, App]) -> None:
    """Rolled back with the business write, the item was never there."""
    queue, app = outbox

    def abandon_order() -> str:
        with app.connection() as conn:
            app.insert_order(conn, 1)
            item = queue.enqueue_on(conn, "ship", config={"order": 1})
            conn.rollback()
        return item.id

    item_id = await in_thread(abandon_order)
    assert await queue.list_items() == []
    assert await queue.counts() == {}
    assert app.orders_stored() == []
    with pytest.raises(LookupError):
        await queue.get(item_id)


async def test_an_error_leaves_the_transaction_usable(
    outbox: tuple[SQLiteQueue | PostgresQueue, App],
) -> None:
    """A duplicate item id raises DuplicateItem, writes nothing of the call, and the business
    write still commits (PostgreSQL would otherwise have aborted the transaction); the
    connection's search_path is its own again either way."""
    queue, app = outbox
    await queue.enqueue("ship", item_id="taken")

    def place_order() -> None:
        with app.connection() as conn:
            app.insert_order(conn, 1)
            before = search_path(conn)
            with pytest.raises(DuplicateItem):
                queue.enqueue_on(conn, "ship", item_id="taken")
            assert search_path(conn) == before
            queue.enqueue_on(conn, "ship", item_id="new")
            assert search_path(conn) == before
            app.insert_order(conn, 2)
            conn.commit()

    await in_thread(place_order)
    assert sorted(item.id for item in await queue.list_items()) == ["new", "taken"]
    assert app.orders_stored() == [1, 2]


async def test_a_duplicate_is_named_even_when_written_in_the_same_transaction(
    outbox: tuple[SQLiteQueue | PostgresQueue, App],
) -> None:
    """The id an enqueue_many_on batch repeats is named in its DuplicateItem, also when that item
    was enqueued earlier in the same, uncommitted transaction; nothing of the batch is written
    and the transaction goes on (the insert is tried first, the id looked up after it failed)."""
    queue, app = outbox

    def place_order() -> None:
        with app.connection() as conn:
            queue.enqueue_on(conn, "ship", item_id="first")
            with pytest.raises(DuplicateItem) as raised:
                queue.enqueue_many_on(
                    conn,
                    [
                        NewItem(spec_id="ship", item_id="fresh"),
                        NewItem(spec_id="ship", item_id="first"),
                    ],
                )
            assert raised.value.item_id == "first"
            app.insert_order(conn, 1)
            conn.commit()

    await in_thread(place_order)
    assert [item.id for item in await queue.list_items()] == ["first"]
    assert app.orders_stored() == [1]


def search_path(conn: Any) -> str | None:
    """PostgreSQL's search_path on *conn* (None on SQLite): the queue's schema must not stay."""
    if isinstance(conn, sqlite3.Connection):
        return None
    return str(conn.execute("SHOW search_path").fetchone()[0])


async def test_an_existing_key_returns_the_existing_item(
    outbox: tuple[SQLiteQueue | PostgresQueue, App],
) -> None:
    """An idempotency key that is already stored returns that item and adds none."""
    queue, app = outbox
    first = await queue.enqueue("ship", idempotency_key="order-1", config={"v": 1})

    def again() -> Any:
        with app.connection() as conn:
            item = queue.enqueue_on(conn, "ship", idempotency_key="order-1", config={"v": 2})
            conn.commit()
        return item

    assert await in_thread(again) == first
    assert len(await queue.list_items()) == 1


async def test_a_batch_commits_or_rolls_back_whole(
    outbox: tuple[SQLiteQueue | PostgresQueue, App],
) -> None:
    """enqueue_many_on says per entry whether it created the item or a key matched; the batch
    is there after a commit and none of it after a rollback."""
    queue, app = outbox
    held = await queue.enqueue("ship", idempotency_key="order-1")
    entries = [
        NewItem(spec_id="ship", idempotency_key="order-1"),
        NewItem(spec_id="ship", idempotency_key="order-2", config={"n": 2}),
        NewItem(spec_id="bill", item_id="bill-2", unique="unfinished", idempotency_key="bill-2"),
    ]

    def batch(commit: bool) -> Any:
        with app.connection() as conn:
            app.insert_order(conn, 2)
            done = queue.enqueue_many_on(conn, entries)
            conn.commit() if commit else conn.rollback()
        return done

    await in_thread(lambda: batch(commit=False))
    assert [item.id for item in await queue.list_items()] == [held.id]
    done = await in_thread(lambda: batch(commit=True))
    assert [each.created for each in done] == [False, True, True]
    assert done[0].item == held
    assert done[2].item.unique_scope == "unfinished"
    assert {item.id for item in await queue.list_items()} == {held.id, done[1].item.id, "bill-2"}
    assert await queue.get_by_key("order-2") == done[1].item
    assert await in_thread(lambda: queue.enqueue_many_on(None, [])) == []


async def test_bad_arguments_are_refused_before_anything_is_written(
    outbox: tuple[SQLiteQueue | PostgresQueue, App],
) -> None:
    """The same checks as enqueue, naming the field; the transaction is untouched."""
    queue, app = outbox

    def bad() -> None:
        with app.connection() as conn:
            with pytest.raises(ValueError, match="priority"):
                queue.enqueue_on(conn, "ship", priority=10**9)
            if app.backend == "sqlite":
                assert not conn.in_transaction
            else:
                assert conn.info.transaction_status == 0  # IDLE: nothing was sent

    await in_thread(bad)


async def test_the_row_factory_of_the_connection_is_kept(
    outbox: tuple[SQLiteQueue | PostgresQueue, App],
) -> None:
    """The queue reads its rows by column name, and gives the connection back as it was."""
    queue, app = outbox

    def run() -> None:
        with app.connection() as conn:
            before = conn.row_factory
            queue.enqueue_on(conn, "ship")
            assert conn.row_factory is before
            conn.commit()

    await in_thread(run)
    assert len(await queue.list_items()) == 1


# -- wake-ups -----------------------------------------------------------------------------------


@pytest.mark.parametrize("injected", [True, False], ids=["manual-clock", "system-clock"])
async def test_a_commit_wakes_a_waiter_and_only_the_commit(
    outbox_backend: str, tmp_path: Path, injected: bool
) -> None:
    """wait_for_work blocked on an empty queue stays blocked while the transaction is open (no
    NOTIFY before commit, no data_version change) and returns promptly after the commit."""
    async with open_outbox(outbox_backend, ManualClock() if injected else None, tmp_path) as (
        queue,
        app,
    ):
        await _waits_for_the_commit(queue, app)


async def test_a_unix_socket_dsn_works(tmp_path: Path) -> None:
    """Over a Unix-socket DSN (the queue's and the application's), the same: commit wakes."""
    pytest.importorskip("psycopg")
    async with open_outbox("postgres", ManualClock(), tmp_path, unix_socket=True) as (queue, app):
        await _waits_for_the_commit(queue, app)


async def _waits_for_the_commit(queue: SQLiteQueue | PostgresQueue, app: App) -> None:
    woke: list[float] = []

    async def waiter() -> None:
        await queue.wait_for_work(["ship"])
        woke.append(trio.current_time())

    # A first wait returns at once (the warm-up item is due) and starts PostgreSQL's listener.
    await queue.enqueue("ship", item_id="warm-up")
    with trio.fail_after(5):
        await queue.wait_for_work(["ship"])
    [warm] = await queue.claim_due(["ship"], "w", 30, 1)
    await queue.complete(warm.id, warm.lease_version)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(0.3)
        assert woke == []
        conn = await in_thread(app.connect)
        try:
            await in_thread(lambda: app.insert_order(conn, 1))
            await in_thread(lambda: queue.enqueue_on(conn, "ship", item_id="order-1"))
            await trio.sleep(0.5)
            assert woke == [], "woke before the commit"
            committed = trio.current_time()
            await in_thread(conn.commit)
        finally:
            await in_thread(conn.close)
        with trio.fail_after(5):
            while not woke:  # noqa: ASYNC110 - the waiter's own return is what is measured
                await trio.sleep(0.01)
    assert woke[0] - committed < PROMPT
    assert [item.id for item in await queue.claim_due(["ship"], "w", 30, 5)] == ["order-1"]


async def test_another_process_s_commit_wakes_a_sqlite_waiter(tmp_path: Path) -> None:
    """The same look at data_version serves any other process's write: its enqueue wakes a
    waiter here within moments, not at the end of a poll interval."""
    path = tmp_path / "queue.db"
    script = (
        "import sys, trio\n"
        "from trio_supervise.queues import SQLiteQueue\n"
        "async def main():\n"
        "    async with await SQLiteQueue.connect(sys.argv[1]) as queue:\n"
        "        await queue.enqueue('ship', item_id='elsewhere')\n"
        "trio.run(main)\n"
    )
    async with await SQLiteQueue.connect(path) as queue:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(queue.wait_for_work, ["ship"])
                await trio.sleep(0.2)
                await trio.run_process([sys.executable, "-c", script, str(path)])
                done = trio.current_time()
            woke = trio.current_time()
        assert woke - done < PROMPT
        assert (await queue.get("elsewhere")).spec_id == "ship"


async def test_a_rollback_wakes_no_waiter(
    outbox: tuple[SQLiteQueue | PostgresQueue, App],
) -> None:
    """Nothing became due: a waiter stays blocked through the rollback."""
    queue, app = outbox

    def abandon() -> None:
        with app.connection() as conn:
            queue.enqueue_on(conn, "ship")
            conn.rollback()

    with trio.move_on_after(1.0) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(queue.wait_for_work, ["ship"])
            await trio.sleep(0.2)
            await in_thread(abandon)
    assert scope.cancelled_caught


async def test_a_commit_wakes_a_runner(outbox: tuple[SQLiteQueue | PostgresQueue, App]) -> None:
    """An idle runner (poll interval 60 s) runs the item within moments of the commit."""
    queue, app = outbox
    driver = Recorder(spec_ids=("job",))

    def place_order() -> None:
        with app.connection() as conn:
            app.insert_order(conn, 1)
            queue.enqueue_on(conn, "job", item_id="order-1")
            conn.commit()

    async with running(make_runner(queue, driver, poll_interval=60)):
        await trio.sleep(0.3)  # the runner is idle, waiting for work
        committed = trio.current_time()
        await in_thread(place_order)
        with trio.fail_after(5):
            while (await queue.get("order-1")).state is not ItemState.COMPLETED:  # noqa: ASYNC110
                await trio.sleep(0.01)
    assert driver.starts["order-1"][0] - committed < PROMPT


# -- connections that cannot hold the item --------------------------------------------------


async def test_a_connection_without_a_transaction_in_autocommit_mode_is_refused(
    outbox: tuple[SQLiteQueue | PostgresQueue, App],
) -> None:
    """In autocommit mode with no transaction open the item would commit alone: refused, with
    the fix; inside an explicit transaction the same connection works."""
    queue, app = outbox

    def run() -> None:
        with app.connection() as conn:
            if app.backend == "sqlite":
                conn.isolation_level = None
                with pytest.raises(ValueError, match="BEGIN IMMEDIATE"):
                    queue.enqueue_on(conn, "ship")
                conn.execute("BEGIN IMMEDIATE")
                queue.enqueue_on(conn, "ship", item_id="explicit")
                conn.execute("COMMIT")
            else:
                conn.autocommit = True
                with pytest.raises(ValueError, match=r"conn\.transaction"):
                    queue.enqueue_on(conn, "ship")
                with conn.transaction():
                    queue.enqueue_on(conn, "ship", item_id="explicit")

    await in_thread(run)
    assert [item.id for item in await queue.list_items()] == ["explicit"]


async def test_a_connection_to_another_database_is_refused(
    outbox: tuple[SQLiteQueue | PostgresQueue, App], tmp_path: Path
) -> None:
    """A connection to a database without the queue says so, naming the queue's database."""
    queue, app = outbox
    if app.backend == "sqlite":

        def other() -> None:
            with (
                contextlib.closing(sqlite3.connect(tmp_path / "other.db")) as conn,
                pytest.raises(ValueError, match="queue's database"),
            ):
                queue.enqueue_on(conn, "ship")

    else:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        dsn = os.environ["TRIO_SUPERVISE_TEST_DSN"]
        elsewhere = make_conninfo(**{**conninfo_to_dict(dsn), "dbname": "postgres"})

        def other() -> None:
            with (
                psycopg.connect(elsewhere) as conn,
                pytest.raises(SchemaError, match="queue's database"),
            ):
                queue.enqueue_on(conn, "ship")

    await in_thread(other)


async def test_a_wrong_kind_of_connection_is_a_type_error(
    outbox: tuple[SQLiteQueue | PostgresQueue, App],
) -> None:
    """Anything but the backend's own sync connection is refused by type."""
    queue, _ = outbox
    with pytest.raises(TypeError, match="conn must be"):
        queue.enqueue_on(object(), "ship")


async def test_a_closed_queue_refuses(outbox: tuple[SQLiteQueue | PostgresQueue, App]) -> None:
    """After aclose the queue is closed for enqueue_on too."""
    queue, app = outbox
    await queue.aclose()
    with app.connection() as conn, pytest.raises(QueueError, match="closed"):
        queue.enqueue_on(conn, "ship")


async def test_the_memory_queue_offers_no_transactional_enqueue() -> None:
    """A memory queue has no transactions: a clear NotImplementedError, pointing at enqueue."""
    queue = MemoryQueue()
    with pytest.raises(NotImplementedError, match="no transactions"):
        queue.enqueue_on(object(), "ship")


async def test_sqlite_in_memory_queue_refuses(tmp_path: Path) -> None:
    """Another connection to ':memory:' is another database: refused with why."""
    async with await SQLiteQueue.connect(":memory:") as queue:
        with (
            contextlib.closing(sqlite3.connect(":memory:")) as conn,
            pytest.raises(ValueError, match="memory"),
        ):
            queue.enqueue_on(conn, "ship")
