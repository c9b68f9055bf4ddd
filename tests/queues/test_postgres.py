"""What only the PostgreSQL queue does: the database clock, NOTIFY wake-ups, error mapping."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import attrs
import pytest
import trio

from trio_supervise import QueueError, QueueFailed, QueueUnavailable, SchemaError
from trio_supervise.queues import (
    ItemState,
    Lease,
    LeaseStatus,
    NewItem,
    PostgresQueue,
    SettleKind,
    Settlement,
    WorkItem,
    WorkQueue,
    migrate,
    open_queue,
    redact_dsn,
)
from trio_supervise.queues import _sql as _queries
from trio_supervise.queues.sql._operator import listing_statement
from trio_supervise.queues.sql._postgres import _CODEC
from trio_supervise.queues.sql._postgres_arrays import int_array as _int_array
from trio_supervise.queues.sql._postgres_arrays import text_array as _text_array
from trio_supervise.queues.sql._postgres_listen import due_hint as _due_hint
from trio_supervise.queues.sql._postgres_listen import due_payload as _due_payload
from trio_supervise.queues.sql._rows import item_decoder as _item_decoder

from .conftest import ManualClock, pg_schema, postgres_dsn

pytestmark = pytest.mark.postgres


def _sql(dsn: str, schema: str, query: str, options: str = "") -> list[tuple[object, ...]]:
    import psycopg

    options = f"-c search_path={schema} {options}"
    with psycopg.connect(dsn, autocommit=True, options=options) as conn:
        cursor = conn.execute(query.encode())
        return cursor.fetchall() if cursor.description else []


_LITERALS = {
    "queue": "'default'",
    "spec_ids": "'{s}'",
    "queues": "NULL",
    "keys": "'{k1,k2}'",
    "now": "NULL",
    "lease_now": "NULL",
    "limit": "10",
    "worker_id": "'w'",
    "lease_us": "1000000",
    "rated": "false",
    "key_caps": "NULL",
}


def _literal_query(name: str, **values: str) -> str:
    """The named PostgreSQL query with its parameters written in as SQL literals (the defaults
    above, *values* overriding), for EXPLAIN: one claim window of 10 in the default queue."""
    text = _queries.load_queries("postgres")[name]
    for key, literal in {**_LITERALS, **values}.items():
        text = text.replace(f"%({key})s", literal)
    return text


async def test_database_clock_is_the_default() -> None:
    """Without an injected clock, due times and leases come from the database's now()."""
    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(dsn, schema=schema, migrate=True) as queue:
            [[db_now]] = await trio.to_thread.run_sync(_sql, dsn, schema, "SELECT now()")
            assert isinstance(db_now, dt.datetime)
            item = await queue.enqueue("spec")
            assert abs(item.due_at - db_now) < dt.timedelta(seconds=5)
            [claimed] = await queue.claim_due(["spec"], "w", 60, 1)
            assert claimed.lease_expires_at is not None
            lease = claimed.lease_expires_at - item.due_at
            assert dt.timedelta(seconds=59) < lease < dt.timedelta(seconds=65)
            assert await queue.claim_due(["spec"], "w2", 60, 1) == []


async def test_an_enqueue_returns_the_times_the_database_stored() -> None:
    """With the database's clock, what every enqueue shape returns (created_at, due_at and the
    rest) is the item as stored: one statement's now() for a batch, read back with its insert."""
    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(dsn, schema=schema, migrate=True) as queue:
            later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
            items = [
                await queue.enqueue("spec"),
                await queue.enqueue("spec", item_id="explicit"),
                await queue.enqueue("spec", idempotency_key="k", due_at=later),
            ]
            done = await queue.enqueue_many(
                [NewItem(spec_id="a"), NewItem(spec_id="b", idempotency_key="k2")]
            )
            items += [each.item for each in done]
            assert len({each.item.created_at for each in done}) == 1
            for item in items:
                assert await queue.get(item.id) == item


async def test_database_clock_lease_expiry_and_due_times() -> None:
    """In database-clock mode a short lease expires by the database's clock."""
    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(dsn, schema=schema, migrate=True) as queue:
            future = await queue.enqueue(
                "spec", due_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
            )
            await queue.enqueue("spec", item_id="now")
            [claimed] = await queue.claim_due(["spec"], "w1", 0.2, 5)
            assert claimed.id == "now"
            with trio.fail_after(10):
                await queue.wait_for_work(["spec"])  # wakes when the lease expires
            [rescued] = await queue.claim_due(["spec"], "w2", 30, 5)
            assert rescued.id == "now"
            assert rescued.lease_version > claimed.lease_version
            assert (await queue.get(future.id)).state.value == "queued"


async def test_notify_wakes_a_waiter_in_another_queue() -> None:
    """An enqueue through one connection wakes wait_for_work on another (LISTEN/NOTIFY)."""
    with pg_schema() as (dsn, schema):
        clock = ManualClock()
        async with (
            await PostgresQueue.connect(dsn, clock=clock, schema=schema, migrate=True) as waiter,
            await PostgresQueue.connect(dsn, clock=clock, schema=schema) as producer,
        ):
            await _wakes(waiter, lambda: producer.enqueue("spec"))


async def _wakes(waiter: PostgresQueue, act: Any) -> None:
    """*act()* wakes a ``wait_for_work(["spec"])`` of *waiter* that had not woken before it."""
    woke = trio.Event()

    async def wait() -> None:
        await waiter.wait_for_work(["spec"])
        woke.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            await trio.sleep(0.5)
            assert not woke.is_set()
            await act()
            await woke.wait()


@pytest.mark.parametrize("parentless", [True, False], ids=["one-statement", "transaction"])
async def test_a_settlement_making_work_due_wakes_a_waiter_in_another_queue(
    parentless: bool,
) -> None:
    """settle_many's NOTIFY: an outcome due again at once, and a completion freeing a key's
    slot for an item it blocked, each wake wait_for_work on another connection; both when the
    batch is a runner's of items without a parent (one statement sending its own NOTIFY) and
    when it is written the general way (in a transaction)."""
    from trio_supervise.job import mark_parentless as _S_PARENTLESS

    with pg_schema() as (dsn, schema):
        clock = ManualClock()
        async with (
            await PostgresQueue.connect(dsn, clock=clock, schema=schema, migrate=True) as waiter,
            await PostgresQueue.connect(dsn, clock=clock, schema=schema) as worker,
        ):

            async def settled_wakes(settlement: Settlement) -> None:
                if parentless:
                    _S_PARENTLESS(settlement, True)

                async def settle() -> None:
                    assert await worker.settle_many([settlement]) == [True]

                await _wakes(waiter, settle)

            await worker.enqueue("spec", item_id="again")
            [item] = await worker.claim_due(["spec"], "w", 60, 1)
            await settled_wakes(
                Settlement(
                    item_id=item.id, lease_version=item.lease_version, kind=SettleKind.CONTINUE
                )
            )
            [item] = await worker.claim_due(["spec"], "w", 60, 1)
            await worker.complete(item.id, item.lease_version)
            for item_id in ("k1", "k2"):
                await worker.enqueue(
                    "spec", item_id=item_id, concurrency_key="k", concurrency_limit=1
                )
            [first] = await worker.claim_due(["spec"], "w", 60, 2)
            await settled_wakes(
                Settlement(
                    item_id=first.id, lease_version=first.lease_version, kind=SettleKind.COMPLETE
                )
            )
            assert [each.id for each in await worker.claim_due(["spec"], "w", 60, 2)] == ["k2"]


async def test_a_runner_s_batch_of_parentless_items_is_one_statement() -> None:
    """A batch of a runner's settlements of items without a parent (``_parentless``) is one
    statement in autocommit (settle_alone): one round trip. A batch holding anything else (a
    child's settlement, whose parent's fan-in must commit with it, or a settlement not marked
    by a runner) is written the general way, in one transaction: the fan-in done, the plain
    item settled too."""
    from trio_supervise.job import mark_parentless as _S_PARENTLESS

    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(
            dsn, schema=schema, migrate=True, listen=False, pool_size=1
        ) as queue:
            token = trio.lowlevel.current_trio_token()

            def complete(item: WorkItem, parentless: bool) -> Settlement:
                settlement = Settlement(
                    item_id=item.id, lease_version=item.lease_version, kind=SettleKind.COMPLETE
                )
                if parentless:
                    _S_PARENTLESS(settlement, True)
                return settlement

            def trips(batch: list[Settlement]) -> int:
                def call() -> None:
                    assert trio.from_thread.run(
                        lambda: queue.settle_many(batch), trio_token=token
                    ) == [True] * len(batch)

                return _round_trips(queue, call)

            await queue.enqueue("parent", item_id="p")
            [parent] = await queue.claim_due(["parent"], "w", 60, 1)
            fan_out = Settlement(
                item_id="p",
                lease_version=parent.lease_version,
                kind=SettleKind.CONTINUE,
                children=[NewItem(spec_id="spec", item_id="child")],
                wait_for_children=True,
            )
            assert await queue.settle_many([fan_out]) == [True]
            for n in range(4):
                await queue.enqueue("spec", item_id=f"plain-{n}")
            claimed = {item.id: item for item in await queue.claim_due(["spec"], "w", 60, 5)}
            assert sorted(claimed) == ["child", "plain-0", "plain-1", "plain-2", "plain-3"]
            alone = [complete(claimed[f"plain-{n}"], True) for n in (0, 1)]
            assert await trio.to_thread.run_sync(trips, alone) == 1
            unmarked = [complete(claimed["plain-2"], False)]
            assert await trio.to_thread.run_sync(trips, unmarked) > 1
            mixed = [complete(claimed["child"], False), complete(claimed["plain-3"], True)]
            assert await trio.to_thread.run_sync(trips, mixed) > 1
            for item_id in claimed:
                assert (await queue.get(item_id)).state is ItemState.COMPLETED
            waited = await queue.get("p")
            assert (waited.state, waited.waiting_children) == (ItemState.QUEUED, 0)


async def test_a_runner_fans_in_on_postgres() -> None:
    """End to end on PostgreSQL: a runner's parent fans out children and waits; the children's
    settlements (not parentless) count toward it, and the parent completes with their results,
    while a plain item beside them is settled by the one-statement way."""
    import trio_supervise as ts

    from ..test_fan_in import Child, Parent

    class Quick(Child):
        """test_fan_in's child, without its sleep (real time here), and the plain item's too."""

        spec_ids = ("child", "plain")

        async def evaluate(self, queue: WorkQueue, item: WorkItem) -> ts.Outcome:
            return ts.Stop(result=item.config.get("n", -1) * 10)

    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(dsn, schema=schema, migrate=True) as queue:
            registry: ts.DriverRegistry[WorkQueue] = ts.DriverRegistry()
            registry.register(Parent())
            registry.register(Quick())
            settings = ts.RunnerSettings(worker_id="w", poll_interval=0.05, concurrency=8)
            runner = ts.WorkflowRunner(
                queue=queue, registry=registry, settings=settings, build_context=lambda: queue
            )
            await queue.enqueue("parent", item_id="p", config={"n": 3})
            await queue.enqueue("plain", item_id="plain")
            async with trio.open_nursery() as nursery:
                await nursery.start(runner.run)
                with trio.fail_after(20):
                    while (await queue.get("p")).state is not ItemState.COMPLETED:  # noqa: ASYNC110
                        await trio.sleep(0.05)  # polling the database: nothing to wait on
                assert (await queue.get("p")).result == [0, 10, 20]
                assert (await queue.get("plain")).state is ItemState.COMPLETED
                runner.shutdown.begin("done")


async def test_listener_reconnects_after_the_connection_drops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """When the LISTEN connection is killed, the listener reconnects and wakes waiters again."""
    with pg_schema() as (dsn, schema):
        async with (
            await PostgresQueue.connect(dsn, schema=schema, migrate=True) as waiter,
            await PostgresQueue.connect(dsn, schema=schema) as producer,
        ):
            with trio.move_on_after(0.3):
                await waiter.wait_for_work(["spec"])  # starts the listener
            kill = (
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                f"WHERE query LIKE 'LISTEN %{schema}%' AND pid <> pg_backend_pid()"
            )
            with caplog.at_level(logging.WARNING, logger="trio_supervise.queues"):
                killed = await trio.to_thread.run_sync(_sql, dsn, schema, kill)
                assert killed == [(True,)]
                await trio.sleep(1.5)  # the listener notices, backs off, reconnects
            assert "reconnecting" in caplog.text
            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(waiter.wait_for_work, ["spec"])
                    await trio.sleep(0.3)
                    await producer.enqueue("spec")


def _listen(dsn: str, channel: str) -> Any:
    """A connection that LISTENs on *channel* (the test's own, beside the queue's listener)."""
    import psycopg
    from psycopg import sql

    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    return conn


def _payloads(conn: Any, count: int) -> list[str]:
    """The payloads of the next *count* notifications on *conn*, in the order sent."""
    got = [n.payload for n in conn.notifies(timeout=10, stop_after=count)]
    assert len(got) == count, got
    return got


def _notify(dsn: str, channel: str, payload: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


async def _until_listening(dsn: str, schema: str, count: int = 1) -> None:
    """Return once *count* connections LISTEN for the queue (the listener connects in its own
    thread; a closed one's server process ends soon after)."""
    query = (
        "SELECT count(*) FROM pg_stat_activity "
        f"WHERE query LIKE 'LISTEN %{schema}%' AND pid <> pg_backend_pid()"
    )
    with trio.fail_after(10):
        while (await trio.to_thread.run_sync(_sql, dsn, schema, query)) != [(count,)]:  # noqa: ASYNC110
            await trio.sleep(0.05)


async def test_closing_the_queue_closes_its_listen_connection() -> None:
    """The listener's connection lives from the first wait until aclose, not beyond."""
    with pg_schema() as (dsn, schema):
        queue = await PostgresQueue.connect(dsn, schema=schema, migrate=True)
        try:
            with trio.move_on_after(0.1):
                await queue.wait_for_work(["spec"])  # starts the listener
            await _until_listening(dsn, schema)
        finally:
            await queue.aclose()
        await _until_listening(dsn, schema, 0)


def test_an_enqueue_s_payload_names_queue_and_spec_id() -> None:
    """The payload of an enqueue's notification reads back as its (queue, spec id); any other
    payload (a spec id, a queue name, from settlements, resumes or older versions) reads as no
    hint, and a pair too long for NOTIFY goes as the spec id alone."""
    for queue, spec_id in [("default", "noop"), ("mail", '["x", "y"]'), ("q\x1f", "sp\u00e9c")]:
        assert _due_hint(_due_payload(queue, spec_id)) == (queue, spec_id)
    for payload in ["noop", "mail", "[", "[1, 2]", '["a"]', '["a", "b", "c"]', '{"a": "b"}']:
        assert _due_hint(payload) is None
    long = "s" * 7990
    assert _due_payload("default", long) == long


async def test_an_enqueue_notifies_each_due_queue_and_spec_once() -> None:
    """One enqueue (one batch) sends one notification per (queue, spec id) of its items due now
    (none for items due later or for an existing key's item); an item with a concurrency key
    sends its spec id alone (the waiter looks whether its key is free)."""
    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(dsn, schema=schema, migrate=True) as queue:
            await queue.enqueue("a", idempotency_key="k")
            conn = await trio.to_thread.run_sync(_listen, dsn, queue.channel)
            try:
                later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
                await queue.enqueue_many(
                    [
                        NewItem(spec_id="a", queue="q1"),
                        NewItem(spec_id="a", queue="q1"),
                        NewItem(spec_id="b", queue="q2"),
                        NewItem(spec_id="c", queue="q2", due_at=later),
                        NewItem(spec_id="a", idempotency_key="k"),
                        NewItem(spec_id="f", queue="q1", concurrency_key="key"),
                        NewItem(spec_id="f", queue="q1", concurrency_key="key"),
                    ]
                )
                await queue.enqueue("e")  # a marker: notifications arrive in commit order
                payloads = await trio.to_thread.run_sync(_payloads, conn, 4)
            finally:
                await trio.to_thread.run_sync(conn.close)
        assert sorted(payloads[:3]) == sorted(
            [_due_payload("q1", "a"), _due_payload("q2", "b"), "f"]
        )
        assert _due_hint(payloads[3]) == ("default", "e")


async def test_an_enqueue_s_notification_is_written_as_the_payload_function_writes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The insert statement writes each due item's notification itself, byte for byte as
    _due_payload does (JSON escapes, non-ASCII text, and the spec id alone once the pair would
    be 8000 bytes or more), for generated and explicit ids alike.

    A spec id within MAX_NAME_LENGTH never makes the pair that long; the statement keeps the
    fallback so that no payload can fail an insert, and this test lifts the limit to reach it."""
    from trio_supervise.job import _checks

    monkeypatch.setattr(_checks, "MAX_NAME_LENGTH", 10_000)
    pair = len(_due_payload("q", ""))  # the pair's bytes around a spec id of plain ASCII
    cases = [
        ("default", "noop"),
        ("q\x1f\n\t", 'sp\u00e9c "quoted" \\ back\x7f\u2028'),
        ("mail", '["x", "y"]'),
        ("q", "s" * (7999 - pair)),  # 7999 bytes: still the pair
        ("q", "s" * (8000 - pair)),  # 8000 bytes: the spec id alone
    ]
    assert len(_due_payload(*cases[-2]).encode()) == 7999
    assert _due_payload(*cases[-1]) == cases[-1][1]
    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(
            dsn, schema=schema, migrate=True, listen=False
        ) as queue:
            conn = await trio.to_thread.run_sync(_listen, dsn, queue.channel)
            try:
                for n, (name, spec_id) in enumerate(cases):
                    await queue.enqueue(spec_id, queue=name, item_id=f"id-{n}" if n % 2 else None)
                payloads = await trio.to_thread.run_sync(_payloads, conn, len(cases))
            finally:
                await trio.to_thread.run_sync(conn.close)
        assert payloads == [_due_payload(name, spec_id) for name, spec_id in cases]


def _round_trips(queue: PostgresQueue, call: Any) -> int:
    """How often the server answered the queue's (one) connection during *call()*: its round
    trips, read from libpq's trace of the messages (of the one connection of each of its
    pools of writes: the callers' and the worker's)."""
    import os
    import tempfile

    import psycopg

    pools = (queue._lanes.caller.pool, queue._lanes.worker.pool)
    fd, path = tempfile.mkstemp()
    try:
        for pool in pools:
            with pool.connection() as conn:
                conn.pgconn.trace(fd)
                conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            call()
        finally:
            for pool in pools:
                with pool.connection() as conn:
                    conn.pgconn.untrace()
        count, last = 0, ""
        with open(path) as trace:
            for line in trace:
                side = line[:2]
                if side == "B\t" and last == "F\t":
                    count += 1
                if side in ("F\t", "B\t"):
                    last = side
        return count
    finally:
        os.close(fd)
        os.unlink(path)


async def test_an_enqueue_takes_few_round_trips() -> None:
    """An enqueue without a key, with an explicit id or not, is one statement in autocommit
    (the insert returns its created_at and sends its NOTIFY): one round trip. One with a key is
    a transaction: BEGIN, the release of lapsed keys, the look at the holders, the insert (if
    the key is free), COMMIT."""
    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(
            dsn, schema=schema, migrate=True, listen=False, pool_size=1
        ) as queue:
            token = trio.lowlevel.current_trio_token()

            def enqueue(**kwargs: Any) -> Any:
                return lambda: trio.from_thread.run(
                    lambda: queue.enqueue("spec", **kwargs), trio_token=token
                )

            def trips(**kwargs: Any) -> int:
                return _round_trips(queue, enqueue(**kwargs))

            for n in range(6):  # past psycopg's threshold for preparing a statement
                await queue.enqueue("spec", item_id=f"warm-{n}", idempotency_key=f"warm-{n}")
            found = {
                "plain": await trio.to_thread.run_sync(lambda: trips()),
                "id": await trio.to_thread.run_sync(lambda: trips(item_id="x")),
                "key": await trio.to_thread.run_sync(lambda: trips(idempotency_key="k")),
                "key again": await trio.to_thread.run_sync(lambda: trips(idempotency_key="k")),
            }
            assert found == {"plain": 1, "id": 1, "key": 5, "key again": 4}


async def test_a_failed_keyed_enqueue_leaves_its_connection_clean() -> None:
    """A keyed enqueue whose insert fails (its explicit id exists) raises DuplicateItem naming
    it, writes and announces nothing, and leaves the one connection of the pool idle: the next
    enqueue on it (its marker the first notification to arrive) and reads work as before."""
    from trio_supervise import DuplicateItem

    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(
            dsn, schema=schema, migrate=True, listen=False, pool_size=1
        ) as queue:
            await queue.enqueue("spec", item_id="taken")
            conn = await trio.to_thread.run_sync(_listen, dsn, queue.channel)
            try:
                with pytest.raises(DuplicateItem, match="taken"):
                    await queue.enqueue_many(
                        [
                            NewItem(spec_id="a", idempotency_key="k1", item_id="fresh"),
                            NewItem(spec_id="b", idempotency_key="k2", item_id="taken"),
                        ]
                    )
                marker = await queue.enqueue("marker", idempotency_key="k1")
                [payload] = await trio.to_thread.run_sync(_payloads, conn, 1)
            finally:
                await trio.to_thread.run_sync(conn.close)
            assert _due_hint(payload) == ("default", "marker")
            assert sorted(item.id for item in await queue.list_items()) == sorted(
                ["taken", marker.id]
            )

            def status() -> object:
                with queue._lanes.caller.pool.connection() as pooled:
                    return pooled.info.transaction_status

            assert await trio.to_thread.run_sync(status) == 0  # IDLE


async def test_a_notification_naming_a_served_queue_and_spec_ends_the_wait() -> None:
    """wait_for_work returns on a notification naming one of its queues and spec ids without
    looking in the database again (here nothing is stored at all); a notification for another
    queue or spec id, or one without a hint, makes it look again and keep waiting."""
    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(dsn, schema=schema, migrate=True) as waiter:
            with trio.move_on_after(0.1):
                await waiter.wait_for_work(["spec"])  # starts the listener
            await _until_listening(dsn, schema)
            channel = waiter.channel
            woke = trio.Event()

            async def wait() -> None:
                await waiter.wait_for_work(["spec", "other"], queues=["mail", "post"])
                woke.set()

            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(wait)
                    for payload in [
                        _due_payload("default", "spec"),
                        _due_payload("mail", "third"),
                        "spec",
                        "mail",
                    ]:
                        await trio.to_thread.run_sync(_notify, dsn, channel, payload)
                    await trio.sleep(0.3)
                    assert not woke.is_set()
                    await trio.to_thread.run_sync(
                        _notify, dsn, channel, _due_payload("post", "other")
                    )
                    await woke.wait()
            # Without queues, any queue's notification of a served spec id ends the wait.
            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(waiter.wait_for_work, ["spec"])
                    await trio.sleep(0.1)
                    await trio.to_thread.run_sync(
                        _notify, dsn, channel, _due_payload("anything", "spec")
                    )


async def test_a_notification_no_waiter_serves_wakes_nobody() -> None:
    """A notification naming a queue and spec id that no waiter of this process serves wakes no
    waiter (none looks in the database for it); one without a hint wakes every waiter, and one
    naming a served pair marks that waiter due. (The listener's calls, made here by hand.)"""
    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(
            dsn, schema=schema, migrate=True, listen=False
        ) as queue:
            returned = trio.Event()

            async def wait() -> None:
                await queue.wait_for_work(["spec"], queues=["mail"])
                returned.set()

            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(wait)
                    while not queue._wakeups.waiters:  # noqa: ASYNC110 - a private set, no event
                        await trio.sleep(0.01)
                    generation = queue._changes.value
                    queue._wakeups.notified(("default", "spec"))
                    queue._wakeups.notified(("mail", "other"))
                    assert queue._changes.value == generation
                    queue._wakeups.notified(None)
                    assert queue._changes.value == generation + 1
                    assert not returned.is_set()
                    queue._wakeups.notified(("mail", "spec"))
                    await returned.wait()
            assert not queue._wakeups.waiters


async def test_claim_is_served_by_the_claim_index() -> None:
    """On 100k rows over priorities and queues, the claim walks the partial
    (queue, priority, due_at, id) index of queued rows in order (no sort below its limit, no
    scan of other queues), and finds expired leases in a range of the lease index: the running
    rows with live leases are in neither walk, so no claim visits them."""
    with pg_schema() as (dsn, schema):
        await migrate_schema(dsn, schema)
        fill = (
            "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, lease_expires_at, "
            "created_at, updated_at, priority, queue) SELECT 'i' || g, 's' || (g % 3), "
            "CASE g % 10 WHEN 0 THEN 'queued' WHEN 1 THEN 'running' ELSE 'completed' END, "
            "now() - g * interval '1 second', "
            "CASE WHEN g % 10 = 1 THEN now() + interval '1 minute' END, now(), now(), "
            "g % 7 - 3, CASE WHEN g % 4 = 0 THEN 'mail' ELSE 'default' END "
            "FROM generate_series(1, 100000) AS g; ANALYZE trio_supervise_items"
        )
        await trio.to_thread.run_sync(_sql, dsn, schema, fill)
        claim = _literal_query("claim_due", spec_ids="'{s1,s2}'")
        plan = await trio.to_thread.run_sync(_sql, dsn, schema, f"EXPLAIN {claim}")
        lines = [str(row[0]) for row in plan]
        text = "\n".join(lines)
        assert "trio_supervise_items_claim_idx" in text
        assert "trio_supervise_items_lease_idx" in text
        assert "Seq Scan" not in text
        _assert_walk_in_order(lines, "items_claim_idx", "claim_due")


async def test_claim_does_not_walk_running_rows() -> None:
    """Running rows with live leases sit before every queued row in (priority, due_at, id)
    order; a claim reaches the queued rows without visiting them (no row filtered out of
    either walk), and an expired lease among them is still rescued in order."""
    with pg_schema() as (dsn, schema):
        await migrate_schema(dsn, schema)
        fill = (
            "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, lease_expires_at, "
            "lease_owner, created_at, updated_at) SELECT 'i' || lpad(g::text, 6, '0'), 's', "
            "CASE WHEN g <= 300 THEN 'running' ELSE 'queued' END, "
            "now() - interval '1 day' + g * interval '1 second', "
            "CASE WHEN g = 150 THEN now() - interval '1 second' "
            "WHEN g <= 300 THEN now() + interval '1 hour' END, "
            "CASE WHEN g <= 300 THEN 'other' END, now(), now() "
            "FROM generate_series(1, 5000) AS g; ANALYZE trio_supervise_items"
        )
        await trio.to_thread.run_sync(_sql, dsn, schema, fill)
        claim = _literal_query("claim_due")
        plan = await trio.to_thread.run_sync(
            _sql, dsn, schema, f"EXPLAIN (ANALYZE, TIMING off) {claim}"
        )
        text = "\n".join(str(row[0]) for row in plan)
        assert "trio_supervise_items_claim_idx" in text, text
        assert "Rows Removed by Filter" not in text.split("CTE claimed")[0], text
        leased = await trio.to_thread.run_sync(
            _sql,
            dsn,
            schema,
            "SELECT id FROM trio_supervise_items WHERE lease_owner = 'w' ORDER BY id",
        )
        assert [row[0] for row in leased] == ["i000150"] + [f"i{n:06}" for n in range(301, 310)]


async def test_only_items_holding_a_key_are_in_the_key_index() -> None:
    """Items without an idempotency key (most of them) are not in the key's unique index, so a
    claim or settlement of one writes no entry there; a held key is still unique, found through
    the index."""
    with pg_schema() as (dsn, schema):
        await migrate_schema(dsn, schema)
        fill = (
            "INSERT INTO trio_supervise_items (id, spec_id, due_at, idempotency_key, created_at, "
            "updated_at) SELECT 'i' || g, 's', now(), CASE WHEN g <= 3 THEN 'k' || g END, "
            "now(), now() FROM generate_series(1, 2000) AS g; ANALYZE trio_supervise_items"
        )
        await trio.to_thread.run_sync(_sql, dsn, schema, fill)
        [(tuples,)] = await trio.to_thread.run_sync(
            _sql,
            dsn,
            schema,
            "SELECT reltuples FROM pg_class "
            "WHERE oid = 'trio_supervise_items_idempotency_key_idx'::regclass",
        )
        assert tuples == 3
        plan = await trio.to_thread.run_sync(
            _sql,
            dsn,
            schema,
            "EXPLAIN SELECT * FROM trio_supervise_items WHERE idempotency_key = ANY('{k1,k2}')",
        )
        assert "trio_supervise_items_idempotency_key_idx" in "\n".join(str(r[0]) for r in plan)
        queue = await PostgresQueue.connect(dsn, schema=schema)
        try:
            again = await queue.enqueue("s", idempotency_key="k1")
            assert again.id == "i1"
            fresh = await queue.enqueue("s", idempotency_key="k9")
            assert (await queue.get_by_key("k9")).id == fresh.id
        finally:
            await queue.aclose()


async def test_next_due_at_reads_a_few_rows_however_many_are_queued() -> None:
    """Without live keyed leases, next_due_at finds the earliest queued row by walking the state
    index in due_at order, and the earliest lease among the running rows: no plan node reads
    every queued row (it did, and a runner waiting on a long queue paid for it on each wait)."""
    import re

    with pg_schema() as (dsn, schema):
        await migrate_schema(dsn, schema)
        fill = (
            "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, lease_expires_at, "
            "lease_owner, created_at, updated_at) SELECT 'i' || g, 's', "
            "CASE WHEN g <= 20 THEN 'running' ELSE 'queued' END, "
            "now() + g * interval '1 second', "
            "CASE WHEN g <= 20 THEN now() + interval '1 hour' END, "
            "CASE WHEN g <= 20 THEN 'other' END, now(), now() "
            "FROM generate_series(1, 5000) AS g; ANALYZE trio_supervise_items"
        )
        await trio.to_thread.run_sync(_sql, dsn, schema, fill)
        text = _literal_query("next_due_at")
        plan = await trio.to_thread.run_sync(
            _sql, dsn, schema, f"EXPLAIN (ANALYZE, TIMING off) {text}"
        )
        lines = "\n".join(str(row[0]) for row in plan)
        assert max(int(n) for n in re.findall(r"actual rows=(\d+)", lines)) <= 20, lines
        async with await PostgresQueue.connect(dsn, schema=schema) as queue:
            due = await queue.next_due_at(["s"])
            [[expected]] = await trio.to_thread.run_sync(
                _sql, dsn, schema, "SELECT due_at FROM trio_supervise_items WHERE id = 'i21'"
            )
        assert due == expected


async def test_keyed_claims_stay_on_the_claim_index_and_cheap_to_plan() -> None:
    """On 100k rows, a fifth of them keyed (some running), every claim statement walks the claim
    index in order (the only sort is the keyed path's row_number over its few window rows), and
    no claim or next_due_at is costed past the JIT threshold (a per-row count would be)."""
    with pg_schema() as (dsn, schema):
        await migrate_schema(dsn, schema)
        fill = (
            "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, lease_expires_at, "
            "created_at, updated_at, priority, queue, concurrency_key, concurrency_limit) "
            "SELECT 'i' || g, 's' || (g % 3), "
            "CASE g % 10 WHEN 0 THEN 'queued' WHEN 1 THEN 'running' ELSE 'completed' END, "
            "now() - g * interval '1 second', "
            "CASE WHEN g % 10 = 1 THEN now() + interval '1 minute' END, now(), now(), "
            "g % 7 - 3, CASE WHEN g % 4 = 0 THEN 'mail' ELSE 'default' END, "
            "CASE WHEN g % 5 = 0 THEN 'k' || (g % 50) END, CASE WHEN g % 5 = 0 THEN 1 END "
            "FROM generate_series(1, 100000) AS g; ANALYZE trio_supervise_items"
        )
        await trio.to_thread.run_sync(_sql, dsn, schema, fill)
        for name in ("claim_due", "claim_keys", "claim_keyed", "next_due_at"):
            text = _literal_query(name, spec_ids="'{s1,s2}'")
            plan = await trio.to_thread.run_sync(
                _sql, dsn, schema, f"EXPLAIN {text}", "-c jit=on -c jit_above_cost=100000"
            )
            lines = [str(row[0]) for row in plan]
            assert not any("JIT" in line for line in lines), (name, lines)
            if name != "next_due_at":
                _assert_walk_in_order(lines, "items_claim_idx", name)


def _assert_walk_in_order(lines: list[str], index: str, name: str) -> None:
    """No Sort between the walk of *index* and its Limit: its ancestors (the lines above it,
    each less indented) up to the Limit. Above it, a sort of `limit` rows is fine."""
    at = next(n for n, line in enumerate(lines) if index in line)
    depth, between = _indent(lines[at]), []
    for line in reversed(lines[:at]):
        if _indent(line) < depth:
            depth = _indent(line)
            if line.strip().startswith(("->  Limit", "Limit  ")):
                break
            between.append(line.strip())
    else:
        raise AssertionError(f"{name}: the {index} walk has no Limit above it")
    assert not any(line.startswith("->  Sort") for line in between), (name, between)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


async def test_the_settlement_s_array_literals_read_back_as_their_values() -> None:
    """The text and integer arrays a settlement sends as literals are read by PostgreSQL as the
    very values they were built from (quotes, backslashes, commas, braces, spaces, NULL,
    empty text; repeated and mixed integers); a list holding anything else is left to psycopg."""
    texts = ['q"', "\\", '","', "a,b", "{}", " x ", "NULL", "", "ü☃", '\\"', "plain"]
    numbers = [[], [0], [7, 7, 7], [1, -2, 2**62, 0]]
    assert _text_array(["a", 1]) == ["a", 1]  # type: ignore[list-item]
    assert _int_array([1, True]) == [1, True]
    with pg_schema() as (dsn, schema):
        for values in ([], ["one"], texts, texts[::-1]):
            [[got]] = await trio.to_thread.run_sync(
                _sql_params, dsn, schema, "SELECT %s::text[]", (_text_array(values),)
            )
            assert got == values
        for ints in numbers:
            [[got]] = await trio.to_thread.run_sync(
                _sql_params, dsn, schema, "SELECT %s::bigint[]", (_int_array(ints),)
            )
            assert got == ints


def _sql_params(dsn: str, schema: str, query: str, params: tuple[Any, ...]) -> list[Any]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}") as conn:
        return conn.execute(query, params).fetchall()


def test_a_claim_s_columns_are_read_by_name_and_a_missing_one_is_refused() -> None:
    """The claims' rows are read by the names of their columns (from the cursor): in another
    order they give the same item, and a row without one of WorkItem's fields is refused,
    naming it, instead of read into the wrong fields."""
    fields = tuple(field.name for field in attrs.fields(WorkItem))
    at = dt.datetime(2001, 2, 3, tzinfo=dt.UTC)
    values: dict[str, Any] = {name: f"{name}-value" for name in fields}
    values.update(
        config='{"n": 1}',
        result='"done"',
        errors="[]",
        tags='["a"]',
        state="running",
        cancel_requested=True,
    )
    values.update(dict.fromkeys(("due_at", "created_at", "updated_at"), at))
    values.update(lease_expires_at=None, unique_until=at, start_by=None)
    columns = (*fields, "keyed")  # the claims' own lists
    item = _item_decoder(columns, _CODEC)([*values.values(), 0])
    assert (item.config, item.result, item.state) == ({"n": 1}, "done", ItemState.RUNNING)
    assert type(item) is WorkItem
    assert (item.unique_until, item.lease_expires_at) == (at, None)
    swapped = (fields[1], fields[0], *fields[2:])
    assert _item_decoder(swapped, _CODEC)([values[name] for name in swapped]) == item
    with pytest.raises(RuntimeError, match=f"without the columns \\['{fields[-1]}'\\]"):
        _item_decoder(fields[:-1], _CODEC)


async def test_callers_blocked_on_a_key_take_no_renewal_s_connection_and_hear_why() -> None:
    """More callers than connections, each stuck behind an idempotency key an application's
    open transaction holds: lease renewals still land at once (the worker port has connections
    of its own), and every caller gets QueueUnavailable within connect_timeout, saying the pool
    was busy or a lock was held, instead of waiting for as long as the transaction stays open."""
    import psycopg

    timeout = 1.0
    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(
            dsn, schema=schema, migrate=True, listen=False, pool_size=2, connect_timeout=timeout
        ) as queue:
            app = await trio.to_thread.run_sync(lambda: psycopg.connect(dsn, autocommit=False))
            await trio.to_thread.run_sync(
                lambda: queue.enqueue_on(app, "noise", idempotency_key="hot")
            )
            await queue.enqueue("job", item_id="a")
            [item] = await queue.claim_due(["job"], "w", 3, 1)
            lease = Lease("a", item.lease_version, "w")
            answers: list[tuple[str, float]] = []
            renewals: list[float] = []

            async def caller() -> None:
                start = trio.current_time()
                try:
                    await queue.enqueue("noise", idempotency_key="hot")
                    answer = "ok"
                except QueueUnavailable as error:
                    answer = str(error)
                answers.append((answer, trio.current_time() - start))

            async def release_the_key(after: float) -> None:  # bounds the test, fixed or not
                await trio.sleep(after)
                await trio.to_thread.run_sync(app.rollback)

            try:
                with trio.fail_after(30):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(release_the_key, 4 * timeout)
                        for _ in range(6):  # three callers a connection
                            nursery.start_soon(caller)
                        for _ in range(5):
                            await trio.sleep(timeout / 3)
                            start = trio.current_time()
                            statuses = await queue.renew_many([lease], 3)
                            renewals.append(trio.current_time() - start)
                            assert statuses == {"a": LeaseStatus.HELD}
            finally:
                await trio.to_thread.run_sync(app.close)
    assert max(renewals) < timeout / 3
    assert len(answers) == 6
    assert all(answer != "ok" and seconds < timeout + 0.5 for answer, seconds in answers)
    assert any("busy" in answer for answer, _ in answers)
    assert any("lock" in answer for answer, _ in answers)


async def test_the_pool_s_sessions_are_utc_and_claimed_times_too() -> None:
    """The queue's connections run in UTC, so psycopg loads every time as ``datetime.UTC``
    (which needs no conversion); a session in another zone still reads the same instants,
    converted to UTC."""
    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(
            dsn, schema=schema, migrate=True, pool_size=1, listen=False
        ) as queue:
            rows = await queue._run(lambda conn: conn.execute("SHOW TimeZone").fetchall())
            assert rows == [{"TimeZone": "UTC"}]
            for item_id in ("a", "b"):
                await queue.enqueue("spec", item_id=item_id, idempotency_key=item_id, unique=60)
            [claimed] = await queue.claim_due(["spec"], "w", 30, 1)
            times = [claimed.due_at, claimed.created_at, claimed.updated_at]
            times += [claimed.lease_expires_at, claimed.unique_until]
            assert all(t is not None and t.tzinfo is dt.UTC for t in times)
            # A session in another zone (one the pool did not set up, say): the same instants.
            await queue._run(lambda conn: conn.execute("SET TimeZone TO 'Asia/Kolkata'"))
            [other] = await queue.claim_due(["spec"], "w", 30, 1)
            assert other == await queue.get("b")
            times = [other.due_at, other.created_at, other.updated_at]
            times += [other.lease_expires_at, other.unique_until]
            assert all(t is not None and t.tzinfo is dt.UTC for t in times)


async def migrate_schema(dsn: str, schema: str) -> None:
    async with await PostgresQueue.connect(dsn, schema=schema, migrate=True):
        pass


async def test_missing_schema_is_a_clear_error() -> None:
    """Opening a database without the schema says how to create it."""
    with pg_schema() as (dsn, schema), pytest.raises(SchemaError, match="trio-supervise migrate"):
        await PostgresQueue.connect(dsn, schema=schema)


async def test_open_queue_and_migrate_by_url() -> None:
    """open_queue accepts postgresql:// and postgres:// URLs; migrate() applies the schema."""
    with pg_schema() as (dsn, schema):
        url = f"{dsn}?options=-csearch_path%3D{schema}"
        await trio.to_thread.run_sync(_sql, dsn, "public", f"CREATE SCHEMA {schema}")
        with pytest.raises(SchemaError):
            async with open_queue(url):
                pass
        assert await migrate(url) >= 1
        assert await migrate(url.replace("postgresql://", "postgres://")) >= 1
        async with open_queue(url.replace("postgresql://", "postgres://")) as queue:
            assert isinstance(queue, PostgresQueue)
            await queue.enqueue("spec", item_id="x")
            assert await migrate(queue) >= 1
        [[count]] = await trio.to_thread.run_sync(
            _sql, dsn, schema, "SELECT count(*) FROM trio_supervise_items"
        )
        assert count == 1


def test_redact_dsn() -> None:
    """Passwords are masked in URLs, query strings and key/value DSNs."""
    assert redact_dsn("postgresql://u:s3cret@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact_dsn("postgres://u:p%40ss@h/db?sslmode=require") == (
        "postgres://u:***@h/db?sslmode=require"
    )
    assert redact_dsn("postgresql://h/db?user=u&password=s3cret&x=1") == (
        "postgresql://h/db?user=u&password=***&x=1"
    )
    assert redact_dsn("host=h password=s3cret user=u") == "host=h password=*** user=u"
    assert redact_dsn("host=h password = 'a b\\' c' user=u") == "host=h password = *** user=u"
    assert redact_dsn("postgresql://u@h/db") == "postgresql://u@h/db"
    assert redact_dsn("sqlite:///x.db") == "sqlite:///x.db"


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://postgres:Sup3rS3cretPw@127.0.0.1:1/test",
        "host=127.0.0.1 port=1 user=postgres password=Sup3rS3cretPw dbname=test",
    ],
)
async def test_no_password_in_errors_or_logs(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """An unreachable server is QueueUnavailable, and the password appears nowhere."""
    with caplog.at_level(logging.DEBUG), pytest.raises(QueueUnavailable) as info:
        await PostgresQueue.connect(dsn, connect_timeout=2)
    error: BaseException | None = info.value
    seen = []
    while error is not None:
        seen += [str(error), repr(error)]
        error = error.__cause__ or error.__context__
    assert len(seen) >= 4  # ours and psycopg's, chained
    everything = "\n".join([*seen, caplog.text])
    assert "Sup3rS3cretPw" not in everything
    assert "127.0.0.1" in str(info.value)


async def test_query_errors_are_queue_errors() -> None:
    """A failing statement surfaces as QueueError with psycopg's error as the cause."""
    import psycopg

    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(dsn, schema=schema, migrate=True) as queue:
            await trio.to_thread.run_sync(
                _sql, dsn, schema, "ALTER TABLE trio_supervise_items ADD CHECK (spec_id <> 'x')"
            )
            with pytest.raises(QueueError) as info:
                await queue.enqueue("x")
            assert not isinstance(info.value, QueueUnavailable)
            assert isinstance(info.value.__cause__, psycopg.errors.CheckViolation)
            await trio.to_thread.run_sync(_sql, dsn, schema, "DROP TABLE trio_supervise_items")
            with pytest.raises(SchemaError):
                await queue.get("x")
        with pytest.raises(QueueError, match="closed"):
            await queue.get("x")


async def test_arguments_are_checked() -> None:
    """Bad pool sizes and schema names are refused before connecting."""
    with pytest.raises(ValueError, match="pool_size"):
        await PostgresQueue.connect("postgresql://x/y", pool_size=0)
    with pytest.raises(ValueError, match="schema"):
        await PostgresQueue.connect("postgresql://x/y", schema="a; DROP")


async def test_the_lanes_sizes_and_timeout_are_checked_before_connecting() -> None:
    """Each pool size must be an int of at least 1 and connect_timeout a positive number of
    seconds, named when refused."""
    with pytest.raises(ValueError, match="worker_pool_size must be at least 1, got 0"):
        await PostgresQueue.connect("postgresql://x/y", worker_pool_size=0)
    with pytest.raises(TypeError, match="read_pool_size must be an int, got bool"):
        await PostgresQueue.connect("postgresql://x/y", read_pool_size=True)
    with pytest.raises(ValueError, match="connect_timeout must be a positive number"):
        await PostgresQueue.connect("postgresql://x/y", connect_timeout=float("nan"))


async def test_a_service_sizes_its_postgres_lanes_from_its_settings() -> None:
    """A service opening a PostgreSQL URL gives its queue the connections its settings'
    postgres table asks for."""
    from trio_supervise import ChildSpec, HttpSettings, Service, ServiceHandle, Settings
    from trio_supervise._settings import PostgresSettings

    seen: dict[str, float] = {}

    async def probe(*, service: ServiceHandle) -> None:
        lanes = service.queue._lanes  # type: ignore[attr-defined]
        seen.update(
            worker=lanes.worker.limiter.total_tokens,
            caller=lanes.caller.limiter.total_tokens,
            read=lanes.read.limiter.total_tokens,
            timeout=lanes.timeout,
        )
        service.shutdown.begin("seen")
        await service.shutdown.wait()

    with pg_schema() as (dsn, schema):
        await migrate_schema(dsn, schema)
        pools = PostgresSettings(
            pool_size=3, worker_pool_size=5, read_pool_size=1, connect_timeout=2.5
        )
        service = Service(
            workers=[ChildSpec("probe", probe)],
            settings=Settings(http=HttpSettings(enabled=False), postgres=pools),
            queue_url=f"{dsn}?options=-csearch_path%3D{schema}",
        )
        with trio.fail_after(20):
            assert await service.run() == 0
    assert seen == {"worker": 5, "caller": 3, "read": 1, "timeout": 2.5}


async def test_cancelling_a_finished_or_flagged_item_writes_nothing() -> None:
    """request_cancel on a finished item, or on a running one already flagged, returns it as it
    is and writes no new version of its row (its xmin stays)."""
    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(
            dsn, schema=schema, migrate=True, listen=False
        ) as queue:
            await queue.enqueue("spec", item_id="done")
            await queue.enqueue("spec", item_id="flagged")
            done, _ = await queue.claim_due(["spec"], "w", 30, 2)
            await queue.complete("done", done.lease_version)
            await queue.request_cancel("flagged")
            query = "SELECT id, xmin::text FROM trio_supervise_items ORDER BY id"
            before = await trio.to_thread.run_sync(_sql, dsn, schema, query)
            for item_id in ("done", "flagged"):
                assert await queue.request_cancel(item_id) == await queue.get(item_id)
            assert await trio.to_thread.run_sync(_sql, dsn, schema, query) == before


# -- issue 12: unstorable rows, indexed status reads, fault classes ---------------------------


@pytest.mark.parametrize("parentless", [True, False], ids=["one-statement", "transaction"])
async def test_a_row_the_database_refuses_goes_dead_alone(parentless: bool) -> None:
    """A batch failing on one row's data is split: that row goes dead, saying why; whether it
    was a runner's batch of items without a parent (the one statement, which then falls back)
    or written the general way."""
    from trio_supervise.job import mark_parentless as _S_PARENTLESS

    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(
            dsn, schema=schema, migrate=True, clock=ManualClock()
        ) as queue:
            for item_id in ("a", "poison", "b"):
                await queue.enqueue("spec", item_id=item_id)
            v = {i.id: i.lease_version for i in await queue.claim_due(["spec"], "w", 30, 3)}
            poison = (
                "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "RAISE EXCEPTION 'poisoned row' USING ERRCODE = '22000'; END $$; "
                "CREATE TRIGGER poison BEFORE UPDATE ON trio_supervise_items FOR EACH ROW "
                "WHEN (NEW.id = 'poison' AND NEW.state = 'completed') EXECUTE FUNCTION poison()"
            )
            await trio.to_thread.run_sync(_sql, dsn, schema, poison)
            done = [
                Settlement(item_id=item_id, lease_version=v[item_id], kind=SettleKind.COMPLETE)
                for item_id in ("a", "poison", "b")
            ]
            for settlement in done:
                _S_PARENTLESS(settlement, parentless)
            assert await queue.settle_many(done) == [True, True, True]
            got = {i.id: i for i in await queue.list_items()}
    assert got["a"].state is got["b"].state is ItemState.COMPLETED
    assert got["poison"].state is ItemState.DEAD
    assert (got["poison"].last_error or "").startswith(
        "the complete outcome could not be stored: poisoned row"
    )


async def test_status_reads_are_served_by_indexes() -> None:
    """Listing one state walks the (state, due_at, id) index in order, with no sort."""
    with pg_schema() as (dsn, schema):
        await migrate_schema(dsn, schema)
        fill = (
            "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, created_at, updated_at)"
            " SELECT 'i' || g, 's' || (g % 3), CASE WHEN g % 10 = 0 THEN 'queued' ELSE "
            "'completed' END, now() - g * interval '1 second', now(), now() "
            "FROM generate_series(1, 20000) AS g; ANALYZE trio_supervise_items"
        )
        await trio.to_thread.run_sync(_sql, dsn, schema, fill)
        queries = _queries.load_queries("postgres")
        for name in ("list_state", "list_state_specs"):
            query = _first_page(queries[name], "completed")
            plan = await trio.to_thread.run_sync(
                _sql, dsn, schema, f"EXPLAIN (ANALYZE, TIMING off) {query}"
            )
            lines = [str(row[0]) for row in plan]
            _assert_walk_in_order(lines, "items_state_due_idx", name)
            # Nothing is sorted, above the walk or beside it.
            assert not [line for line in lines if "Sort  " in line and "rows=0 " not in line]


def _first_page(query: str, state: str) -> str:
    """A listing statement with its parameters written in as literals: the first page of 50
    of *state* (of spec s1, in a statement that filters by spec), no tags."""
    literals = {
        "state": f"'{state}'",
        "after_due": "'-infinity'",
        "after_id": "''",
        "limit": "50",
        "spec_ids": "'{s1}'",
        "tags": "NULL",
    }
    for key, value in literals.items():
        query = query.replace(f"%({key})s", value)
    return query


async def test_a_listing_plans_no_arm_that_cannot_return_rows() -> None:
    """Each state's page is one statement that can return rows of that state: no arm of another
    state's for the planner to plan (at 1.1M rows one such arm got a parallel plan whose two
    workers started, 3-4 ms, to read nothing), and none parallel even where parallel plans are
    cheap."""
    with pg_schema() as (dsn, schema):
        await migrate_schema(dsn, schema)
        fill = (
            "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, lease_expires_at, "
            "created_at, updated_at) SELECT 'i' || g, 's' || (g % 3), "
            "(ARRAY['queued','running','completed','cancelled','dead'])[1 + g % 5], "
            "now() - g * interval '1 second', "
            "CASE WHEN g % 5 = 1 THEN now() + interval '1 minute' END, now(), now() "
            "FROM generate_series(1, 20000) AS g; ANALYZE trio_supervise_items"
        )
        await trio.to_thread.run_sync(_sql, dsn, schema, fill)
        queries = _queries.load_queries("postgres")
        cheap = "-c parallel_setup_cost=0 -c parallel_tuple_cost=0"
        for specs in (False, True):
            for state in ItemState:
                query = _first_page(listing_statement(queries, state, specs=specs), str(state))
                plan = await trio.to_thread.run_sync(
                    _sql, dsn, schema, f"EXPLAIN (ANALYZE, TIMING off) {query}", cheap
                )
                text = "\n".join(str(row[0]) for row in plan)
                where = (state, specs)
                assert "One-Time Filter: false" not in text, (where, text)
                assert "Gather" not in text, (where, text)
                assert "rows=0 loops" not in text.splitlines()[0], (where, text)


_READ_PARAMS = {
    "after_due": "'-infinity'::timestamptz",
    "after_id": "''::text",
    "limit": "50",
    "spec_ids": "'{s1,s2}'::text[]",
    "queues": "NULL::text[]",
    "now": "NULL::timestamptz",
    "lease_now": "NULL::timestamptz",
    "tags": "NULL::jsonb",
}


def _prepared(name: str, state: str | None) -> tuple[str, str]:
    """The named query as PREPARE p(...) AS ... (its parameters as $n) and the EXECUTE that
    runs it with *state* and _READ_PARAMS, for the plans a prepared statement gets."""
    import re

    text = _queries.load_queries("postgres")[name]
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", text)))
    values = {**_READ_PARAMS, "state": f"'{state}'::text"}
    for n, key in enumerate(names, 1):
        text = text.replace(f"%({key})s", f"${n}")
    args = ", ".join(values[key] for key in names)
    return f"PREPARE p AS {text}", f"EXECUTE p({args})"


@pytest.mark.parametrize("plans", ["auto", "force_generic_plan"])
async def test_reads_of_running_items_are_served_by_the_lease_index(plans: str) -> None:
    """Running items are in neither the spec index nor the listing index (schema 0007: a claim
    writes no entry there); on 100k completed, 10k queued and 400 running rows (some holding a
    concurrency key with a live lease), no read by state or spec scans the table: listing a
    state and next_due_at (both of its ways) read their index ranges, the running rows from
    the lease index, under custom plans and generic ones alike."""
    import re

    import psycopg

    with pg_schema() as (dsn, schema):
        await migrate_schema(dsn, schema)
        fill = (
            "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, lease_expires_at, "
            "lease_owner, created_at, updated_at, queue, concurrency_key, concurrency_limit) "
            "SELECT 'i' || g, 's' || (g % 3), "
            "CASE WHEN g <= 100000 THEN 'completed' WHEN g <= 110000 THEN 'queued' "
            "ELSE 'running' END, now() - (g % 5000) * interval '1 second', "
            "CASE WHEN g > 110000 THEN now() + interval '1 minute' END, "
            "CASE WHEN g > 110000 THEN 'w' END, now(), now(), "
            "CASE WHEN g % 4 = 0 THEN 'mail' ELSE 'default' END, "
            "CASE WHEN g % 50 = 0 THEN 'k' || (g % 7) END, CASE WHEN g % 50 = 0 THEN 1 END "
            "FROM generate_series(1, 110400) AS g"
        )
        await trio.to_thread.run_sync(_sql, dsn, schema, fill)
        await trio.to_thread.run_sync(_sql, dsn, schema, "VACUUM ANALYZE trio_supervise_items")

        def plans_of(runs: list[tuple[str, str | None]]) -> dict[str, list[str]]:
            got = {}
            options = f"-c search_path={schema} -c plan_cache_mode={plans}"
            with psycopg.connect(dsn, autocommit=True, options=options) as conn:
                for name, state in runs:
                    prepare, execute = _prepared(name, state)
                    conn.execute(prepare.encode())
                    for _ in range(6):  # past the custom plans a prepared statement starts with
                        conn.execute(execute.encode()).fetchall()
                    plan = conn.execute(f"EXPLAIN (ANALYZE, TIMING off) {execute}".encode())
                    got[f"{name} {state}"] = [str(row[0]) for row in plan]
                    conn.execute("DEALLOCATE p")
            return got

        queries = _queries.load_queries("postgres")
        names = {text: name for name, text in queries.items()}
        runs = [
            (names[listing_statement(queries, state, specs=specs)], str(state))
            for specs in (False, True)
            for state in ItemState
        ]
        found = await trio.to_thread.run_sync(plans_of, [*runs, ("next_due_at", None)])
        await trio.to_thread.run_sync(
            _sql, dsn, schema, "UPDATE trio_supervise_items SET concurrency_key = NULL"
        )
        await trio.to_thread.run_sync(_sql, dsn, schema, "VACUUM ANALYZE trio_supervise_items")
        unkeyed = await trio.to_thread.run_sync(plans_of, [("next_due_at", None)])
    for where, lines in [*found.items(), ("next_due_at, no key", unkeyed["next_due_at None"])]:
        text = "\n".join(lines)
        scans = [line for line in lines if "Seq Scan on trio_supervise_items" in line]
        assert all("never executed" in line for line in scans), (where, text)
        if where != "next_due_at None":  # the keyed way reads the specs' queued rows, as before
            # A page's rows, or the running ones (400): never the queued or completed ones.
            assert max(int(n) for n in re.findall(r"actual rows=(\d+)", text)) <= 400, where
        if where.startswith(("list_running", "next_due_at")):
            assert "trio_supervise_items_lease_idx" in text, (where, text)
        elif where.endswith((" queued", " completed")):
            _assert_walk_in_order(lines, "items_state_due_idx", where)


async def test_permanent_faults_are_queue_failed() -> None:
    """A missing database and a read-only transaction are QueueFailed, not retried as transient."""
    import psycopg

    from trio_supervise.queues.sql._postgres_db import map_error

    dsn = postgres_dsn()
    missing = _with_dbname(dsn, "trio_supervise_no_such_db")
    with pytest.raises(QueueFailed, match="does not exist"):
        await PostgresQueue.connect(missing, connect_timeout=3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = on")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("CREATE TEMP TABLE t (x int)")
    assert isinstance(map_error(info.value, dsn), QueueFailed)


def _with_dbname(dsn: str, dbname: str) -> str:
    from psycopg.conninfo import make_conninfo

    return make_conninfo(dsn, dbname=dbname)


def test_no_query_returns_star() -> None:
    """Every statement of either dialect names the item's columns: none returns ``*`` (a CTE's
    own ``*`` over its named columns aside), so no prepared statement changes its result's
    shape when a later migration adds a column."""
    import re

    for backend in ("postgres", "sqlite"):
        for name, query in _queries.load_queries(backend).items():
            outer = re.sub(r"FROM queued UNION ALL SELECT \* FROM expired|head\.\*", "", query)
            assert not re.search(r"RETURNING \*|SELECT \* FROM trio_supervise_items", outer), name
            assert "{item_columns" not in query, name


async def test_a_column_added_by_a_later_migration_leaves_running_workers_working() -> None:
    """A queue whose connections have prepared every statement it uses (psycopg prepares a
    statement on its sixth run) keeps working after another release's migration adds a
    column to the items table: no "cached plan must not change result type" (0A000), which
    made old workers' fan-ins fail during the R9 rolling upgrade."""
    import psycopg
    from psycopg import sql as pgsql

    async def round_of_everything(queue: PostgresQueue, n: int) -> None:
        await queue.enqueue("parent", item_id=f"p{n}", idempotency_key=f"k{n}")
        assert (await queue.get(f"p{n}")).id == f"p{n}"
        assert (await queue.get_by_key(f"k{n}")).id == f"p{n}"
        assert await queue.list_items(limit=5)
        [parent] = await queue.claim_due(["parent"], "w", 30, 1)
        child = NewItem(spec_id="child", item_id=f"c{n}", idempotency_key=f"ck{n}")
        settled = Settlement(
            item_id=parent.id,
            lease_version=parent.lease_version,
            kind=SettleKind.CONTINUE,
            children=[child],
            wait_for_children=True,
        )
        assert await queue.settle_many([settled]) == [True]
        assert [c.id for c in await queue.list_children(parent.id)] == [f"c{n}"]
        assert (await queue.request_cancel(f"c{n}")).state is ItemState.CANCELLED
        await queue.retry(f"c{n}")
        await queue.edit_config(f"c{n}", {"n": n})
        assert (await queue.request_cancel(f"c{n}")).state is ItemState.CANCELLED
        await queue.delete(f"c{n}")

    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(
            dsn, schema=schema, migrate=True, pool_size=1, worker_pool_size=1, read_pool_size=1
        ) as queue:
            for n in range(7):
                await round_of_everything(queue, n)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    pgsql.SQL("ALTER TABLE {}.trio_supervise_items ADD COLUMN later int").format(
                        pgsql.Identifier(schema)
                    )
                )
            for n in range(7, 10):
                await round_of_everything(queue, n)


async def test_an_event_for_a_waiting_workflow_wakes_a_waiter_in_another_queue() -> None:
    """send_event's NOTIFY: an event that makes a waiting item due wakes wait_for_work on
    another connection."""
    from trio_supervise.queues import EntryKind, JournalEntry

    with pg_schema() as (dsn, schema):
        clock = ManualClock()
        async with (
            await PostgresQueue.connect(dsn, clock=clock, schema=schema, migrate=True) as waiter,
            await PostgresQueue.connect(dsn, clock=clock, schema=schema) as sender,
        ):
            await sender.enqueue("spec", item_id="wf")
            [item] = await sender.claim_due(["spec"], "w", 30, 1)
            week = clock.now() + dt.timedelta(days=7)
            wait = JournalEntry(
                position=0, kind=EntryKind.WAIT, name="go", started_at=clock.now(), wake_at=week
            )
            await sender.record_entry("wf", item.lease_version, wait)
            await sender.reschedule("wf", item.lease_version, week, {})
            await _wakes(waiter, lambda: sender.send_event("wf", "go", {"n": 1}))
            assert (await sender.get("wf")).due_at == clock.now()


async def test_a_fan_in_s_rollback_never_leaves_psycopg_a_statement_the_server_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A settle-and-claim whose settled child makes its parent due undoes its claim (ROLLBACK
    TO SAVEPOINT) inside psycopg's pipeline. psycopg forgets and deallocates every prepared
    statement when it reads a ROLLBACK's result, which a pipeline reads late: a statement
    prepared meanwhile stayed in its cache, gone from the server, and the next claim failed
    ("prepared statement ... does not exist"). With statements prepared at their first use
    (where that showed), fan-ins and claims after them run round after round."""
    from trio_supervise.job import SettleKind, Settlement
    from trio_supervise.queues.sql import _postgres_pool

    configure = _postgres_pool.configure

    def at_first_use(conn: Any, **options: Any) -> None:
        configure(conn, **options)
        conn.prepare_threshold = 0

    monkeypatch.setattr(_postgres_pool, "configure", at_first_use)
    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(dsn, schema=schema, migrate=True) as queue:
            for round_ in range(3):
                await queue.enqueue("spec", item_id=f"p{round_}")
                [parent] = await queue.claim_due(["spec"], "w", 30, 1)
                fan_out = Settlement(
                    item_id=parent.id,
                    lease_version=parent.lease_version,
                    kind=SettleKind.CONTINUE,
                    children=[NewItem(spec_id="spec") for _ in range(2)],
                    wait_for_children=True,
                )
                _, children = await queue.settle_and_claim([fan_out], ["spec"], "w", 30, 5)
                for child in children:
                    done = Settlement(
                        item_id=child.id,
                        lease_version=child.lease_version,
                        kind=SettleKind.COMPLETE,
                    )
                    await queue.settle_and_claim([done], ["spec"], "w", 30, 5)
                assert await queue.claim_due(["spec"], "w", 30, 5) == []
                assert (await queue.get(parent.id)).state is ItemState.RUNNING


async def test_a_batch_that_only_finishes_items_wakes_no_waiter_here() -> None:
    """A waiter of this process looks at what is due (a query) when woken: a batch of
    completions that makes nothing due wakes nobody (a runner serving a second queue looked
    once per batch of the first queue's completions: P13p); one that makes something due
    later (a reschedule) does; one freeing a key's slot wakes through the NOTIFY (the
    conformance suite's test_a_waiter_wakes_when_a_blocked_key_frees)."""
    from trio_supervise.job import SettleKind, Settlement

    with pg_schema() as (dsn, schema):
        async with await PostgresQueue.connect(dsn, schema=schema, migrate=True) as queue:
            for item_id in ("a", "b"):
                await queue.enqueue("spec", item_id=item_id)
            a, b = sorted(await queue.claim_due(["spec"], "w", 30, 2), key=lambda i: i.id)
            before = queue._changes.value
            done = Settlement(item_id="a", lease_version=a.lease_version, kind=SettleKind.COMPLETE)
            assert await queue.settle_many([done]) == [True]
            assert queue._changes.value == before
            later = Settlement(
                item_id="b", lease_version=b.lease_version, kind=SettleKind.CONTINUE, delay=60
            )
            assert await queue.settle_many([later]) == [True]
            assert queue._changes.value > before
