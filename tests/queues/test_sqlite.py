"""What only the SQLite queue does, and the URL factory."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from trio_supervise import QueueFailed, QueueUnavailable, SchemaError
from trio_supervise.queues import (
    DEFAULT_DATABASE_URL,
    EntryKind,
    ItemState,
    JournalEntry,
    MemoryQueue,
    SettleKind,
    Settlement,
    SQLiteQueue,
    WorkItem,
    _sql,
    migrate,
    open_queue,
    parse_queue_url,
)

from .conftest import START, ManualClock


async def test_default_database_is_a_file_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing configured the queue lives in trio_supervise.db in the cwd, in WAL mode."""
    monkeypatch.chdir(tmp_path)
    assert DEFAULT_DATABASE_URL == "sqlite:///trio_supervise.db"
    async with open_queue() as queue:
        assert isinstance(queue, SQLiteQueue)
        await queue.enqueue("spec")
    with sqlite3.connect(tmp_path / "trio_supervise.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("SELECT count(*) FROM trio_supervise_items").fetchone() == (1,)


async def test_items_survive_reopening(tmp_path: Path) -> None:
    """The queue is durable: a second open sees the first one's items exactly."""
    clock = ManualClock()
    url = f"sqlite:///{tmp_path}/q.db"
    async with open_queue(url, clock=clock) as queue:
        item = await queue.enqueue("spec", config={"a": 1}, item_id="x")
    async with open_queue(url, clock=clock) as queue:
        assert await queue.get("x") == item
        assert item.due_at == START


async def test_without_migrate_a_missing_schema_is_refused(tmp_path: Path) -> None:
    """migrate=False on an empty file raises SchemaError naming the fix."""
    with pytest.raises(SchemaError, match="trio-supervise migrate"):
        async with open_queue(f"sqlite:///{tmp_path}/q.db", migrate=False):
            pass


async def test_memory_url(tmp_path: Path) -> None:
    """memory:// opens a MemoryQueue; migrating it is a no-op."""
    async with open_queue("memory://") as queue:
        assert isinstance(queue, MemoryQueue)
        assert await migrate(queue) == 0
    assert await migrate("memory://") == 0


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("memory://", ("memory", "")),
        ("sqlite:///rel/q.db", ("sqlite", "rel/q.db")),
        ("sqlite:////abs/q.db", ("sqlite", "/abs/q.db")),
        ("sqlite:///:memory:", ("sqlite", ":memory:")),
        ("SQLite:///a%20b.db", ("sqlite", "a b.db")),
        ("postgresql://u@h/db", ("postgres", "postgresql://u@h/db")),
        ("postgres://u@h/db", ("postgres", "postgres://u@h/db")),
    ],
)
def test_parse_queue_url(url: str, expected: tuple[str, str]) -> None:
    """Each URL form maps to its backend and target."""
    assert parse_queue_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "",
        "trio_supervise.db",
        "mysql://h/db",
        "sqlite://",
        "sqlite:///",
        "memory://x",
        "sqlite:///a.db?x=1",
    ],
)
def test_bad_urls_name_the_rule(url: str) -> None:
    """A URL that fits no form is a ValueError that spells out the forms."""
    with pytest.raises(ValueError, match=r"sqlite:///relative/path\.db"):
        parse_queue_url(url)


def test_bad_url_errors_hide_passwords() -> None:
    """Even a rejected URL never echoes its password."""
    with pytest.raises(ValueError, match="unknown queue URL scheme") as info:
        parse_queue_url("mysql://u:hunter22@h/db")
    assert "hunter22" not in str(info.value)


# -- issue 12: unstorable rows, reads beside writes, deleted files, no-create opens ----------


async def test_a_row_the_database_refuses_goes_dead_alone(tmp_path: Path) -> None:
    """A batch failing on one row's data is split: that row goes dead, saying why."""
    path = tmp_path / "q.db"
    async with await SQLiteQueue.connect(path, clock=ManualClock()) as queue:
        for item_id in ("a", "poison", "b"):
            await queue.enqueue("spec", item_id=item_id)
        v = {i.id: i.lease_version for i in await queue.claim_due(["spec"], "w", 30, 3)}
        with sqlite3.connect(path) as conn:
            conn.execute(
                "CREATE TRIGGER poison BEFORE UPDATE OF state ON trio_supervise_items "
                "WHEN NEW.id = 'poison' AND NEW.state = 'completed' "
                "BEGIN SELECT RAISE(ABORT, 'poisoned row'); END"
            )
        done = [
            Settlement(item_id=item_id, lease_version=v[item_id], kind=SettleKind.COMPLETE)
            for item_id in ("a", "poison", "b")
        ]
        assert await queue.settle_many(done) == [True, True, True]
        got = {i.id: i for i in await queue.list_items()}
    assert got["a"].state is got["b"].state is ItemState.COMPLETED
    assert got["poison"].state is ItemState.DEAD
    assert got["poison"].last_error == "the complete outcome could not be stored: poisoned row"


def _plan(path: Path, query: str, params: dict[str, object]) -> str:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(f"EXPLAIN QUERY PLAN {query}", params).fetchall()
    return "\n".join(str(row[-1]) for row in rows)


async def test_status_reads_are_served_by_indexes(tmp_path: Path) -> None:
    """Listing walks the (state, due_at, id) index with no sort; counts read the kept counts."""
    path = tmp_path / "q.db"
    await migrate(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, 0, 0)",
            [(f"i{n}", f"s{n % 3}", "completed" if n % 10 else "queued", n) for n in range(5000)],
        )
        conn.execute("ANALYZE")
    params = {"state": "completed", "after_due": 0, "after_id": "", "limit": 50, "tags": None}
    listing = _plan(path, _sql.load_queries("sqlite")["list_state"], params)
    assert "trio_supervise_items_state_due_idx" in listing
    assert "TEMP B-TREE" not in listing
    by_spec = _plan(
        path, _sql.load_queries("sqlite")["list_state_specs"], {**params, "spec_ids": '["s1"]'}
    )
    assert "trio_supervise_items_state_due_idx" in by_spec
    assert "TEMP B-TREE" not in by_spec
    counts = _plan(path, _sql.load_queries("sqlite")["counts"], {})
    assert "trio_supervise_items" not in counts  # the kept counts, not the items
    assert "SCAN trio_supervise_counts" in counts


async def test_a_keyed_claim_reads_the_rules_and_its_own_keys_only(tmp_path: Path) -> None:
    """With 5,000 keys' logs kept, a claim reads the rules from their index and the logs of its
    keys by key: no scan of every key's row (it cost 3 ms a claim at 20,000 keys)."""
    path = tmp_path / "q.db"
    await migrate(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO trio_supervise_key_rates (key, rate_limit, period_us) "
            "VALUES ('t:{tenant}', 10, 1000000)"
        )
        conn.executemany(
            "INSERT INTO trio_supervise_key_rates (key, starts) VALUES (?, '[1]')",
            [(f"t:{n}",) for n in range(5000)],
        )
        conn.execute("ANALYZE")
    plan = _plan(path, _sql.load_queries("sqlite")["key_rates_of"], {"keys": '["t:1"]', "now": 5})
    assert "trio_supervise_key_rates_rules_idx" in plan, plan
    scans = [line for line in plan.splitlines() if "SCAN trio_supervise_key_rates" in line]
    assert all("USING INDEX trio_supervise_key_rates_rules_idx" in line for line in scans), plan


async def test_the_claim_is_served_by_the_claim_index(tmp_path: Path) -> None:
    """On 100k rows over priorities and queues, the claim walks the partial
    (queue, priority, due_at, id) index in order, with no sort."""
    path = tmp_path / "q.db"
    await migrate(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, lease_expires_at, "
            "created_at, updated_at, priority, queue) VALUES (?, ?, ?, ?, ?, 0, 0, ?, ?)",
            [
                (
                    f"i{n}",
                    f"s{n % 3}",
                    ("queued", "running", "completed")[min(n % 10, 2)],
                    n,
                    n + 60 if n % 10 == 1 else None,
                    n % 7 - 3,
                    "mail" if n % 4 == 0 else "default",
                )
                for n in range(100_000)
            ],
        )
        conn.execute("ANALYZE")
    params = {
        "queue": "default",
        "spec_ids": '["s1", "s2"]',
        "now": 50_000,
        "lease_now": 50_000,
        "limit": 10,
        "worker_id": "w",
        "lease_us": 10**6,
        "version": 1,
        "key_caps": None,
    }
    plan = _plan(path, _sql.load_queries("sqlite")["claim_due"], params)
    assert "trio_supervise_items_claim_idx" in plan
    assert "TEMP B-TREE" not in plan


async def test_a_deleted_database_fails_loudly(tmp_path: Path) -> None:
    """Deleting (or replacing) the file under an open queue raises QueueFailed: no silent writes."""
    for replace in (False, True):
        path = tmp_path / f"q{replace}.db"
        async with await SQLiteQueue.connect(path) as queue:
            await queue.enqueue("spec", item_id="x")
            path.unlink()
            if replace:
                path.write_bytes(b"")
            with pytest.raises(QueueFailed, match="is gone"):
                await queue.claim_due(["spec"], "w", 30, 1)
            with pytest.raises(QueueFailed, match="is gone"):
                await queue.counts()


async def test_read_only_opens_never_create_a_database(tmp_path: Path) -> None:
    """create=False on a missing file says how to create it and leaves no file behind."""
    path = tmp_path / "typo.db"
    with pytest.raises(
        QueueFailed, match=r"no database at .*typo\.db; run `trio-supervise migrate`"
    ):
        async with open_queue(f"sqlite:///{path}", create=False):
            pass
    assert not path.exists()
    await migrate(f"sqlite:///{path}")
    async with open_queue(f"sqlite:///{path}", create=False) as queue:
        assert await queue.counts() == {}


async def test_permanent_and_transient_faults_are_told_apart(tmp_path: Path) -> None:
    """A read-only file is QueueFailed; another process's exclusive lock is QueueUnavailable."""
    path = tmp_path / "q.db"
    await migrate(f"sqlite:///{path}")
    async with await SQLiteQueue.connect(path, busy_timeout=0.2) as queue:
        await queue.enqueue("spec", item_id="x")
        blocker = sqlite3.connect(path, isolation_level=None)
        try:
            blocker.execute("BEGIN EXCLUSIVE")
            with pytest.raises(QueueUnavailable, match="locked"):
                await queue.claim_due(["spec"], "w", 30, 1)
        finally:
            blocker.close()
        assert len(await queue.claim_due(["spec"], "w", 30, 1)) == 1
    uri = f"file:{path}?mode=ro"
    async with await SQLiteQueue.connect(path) as queue:
        queue._conn.close()  # swap in a read-only connection: as if the file were read-only
        queue._conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        queue._conn.row_factory = sqlite3.Row
        with pytest.raises(QueueFailed, match="readonly"):
            await queue.enqueue("spec")


async def test_a_full_disk_is_transient(tmp_path: Path) -> None:
    """SQLITE_FULL ("database or disk is full") is QueueUnavailable: it may pass, so retry."""
    path = tmp_path / "q.db"
    async with await SQLiteQueue.connect(path) as queue:
        await queue.enqueue("spec", item_id="x")
        [[pages]] = queue._conn.execute("PRAGMA page_count").fetchall()
        queue._conn.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(QueueUnavailable, match="full"):
            await queue.enqueue("spec", config={"pad": "x" * 40_000})
        queue._conn.execute("PRAGMA max_page_count = 1073741823")
        await queue.enqueue("spec", item_id="y")


async def test_changing_directory_is_not_a_deleted_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue opened by a relative path keeps working after the process changes directory."""
    monkeypatch.chdir(tmp_path)
    async with await SQLiteQueue.connect("q.db") as queue:
        (tmp_path / "elsewhere").mkdir()
        monkeypatch.chdir(tmp_path / "elsewhere")
        await queue.enqueue("spec", item_id="x")
        assert (await queue.get("x")).id == "x"


def _item_by_name(row: sqlite3.Row) -> WorkItem:
    """*row* read field by field, by column name, through WorkItem's own converters."""
    import json

    from trio_supervise.job import ErrorEntry, stored_kind

    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

    def read(kind: str | None, value: Any) -> Any:
        if value is None or kind is None:
            return value
        if kind in ("json", "errors"):
            value = json.loads(value)
        if kind == "errors":
            return tuple(
                ErrorEntry(**{**each, "at": epoch + dt.timedelta(microseconds=each["at"])})
                for each in value
            )
        if kind == "time":
            return epoch + dt.timedelta(microseconds=value)
        if kind == "tags":
            return tuple(json.loads(value))
        return {"bool": bool, "state": ItemState, "json": lambda v: v}[kind](value)

    return WorkItem(
        **{
            field.name: read(stored_kind(field), row[field.name])
            for field in attrs.fields(WorkItem)
        }
    )


@pytest.mark.parametrize("fresh", [True, False], ids=["schema", "migrations"])
def test_rows_read_by_position_are_the_items_read_by_name(tmp_path: Path, fresh: bool) -> None:
    """The SQLite queue's positional row reader gives the WorkItem the shared by-name reader
    gives, every field set, on a fresh schema and on a migrated one (their columns are in
    different orders)."""
    from trio_supervise.queues.sql import _sqlite, _sqlite_db

    path = tmp_path / "q.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        _sqlite_db.migrate_connection(conn, 0, where=str(path), fresh=fresh)
        conn.execute(
            "INSERT INTO trio_supervise_items (id, spec_id, tenant_id, subject_id, config, state,"
            " due_at, lease_owner, lease_expires_at, lease_version, cancel_requested,"
            " error_count, last_error, idempotency_key, created_at, updated_at, attempt,"
            " priority, queue, timeout, result, errors, parent_id, waiting_children,"
            " unique_scope, unique_until, released_key, concurrency_key, concurrency_limit,"
            " parent_version) VALUES ('full', 's', 't', 'u', '{\"a\": [1, 2]}', 'running',"
            " 1700000000000001, 'w', 1700000000000002, 7, 1, 2, 'boom', NULL, -5, 123456789,"
            " 3, -2, 'mail', 2.5, '{\"r\": null}',"
            ' \'[{"at": 99, "worker": "w", "attempt": 2, "error": "boom"}]\','
            " 'parent', 2, 'period', 1700000000000003, 'old-key', 'k', 4, 6)"
        )
        conn.execute(
            "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, created_at,"
            " updated_at, idempotency_key) VALUES ('plain', 's', 'queued', 0, 0, 0, 'key')"
        )
        queue = _sqlite.SQLiteQueue(
            path=str(path), conn=conn, reader=conn, clock=ManualClock(), identity=None
        )
        cur = conn.execute("SELECT * FROM trio_supervise_items ORDER BY id")
        for row in cur.fetchall():
            assert queue._decode(cur, row) == _item_by_name(row)
        cur = conn.execute("SELECT * FROM trio_supervise_items WHERE id = 'full'")
        full = queue._decode(cur, cur.fetchone())
        assert (full.errors[0].error, full.result) == ("boom", {"r": None})
        assert (full.state, full.cancel_requested) == (ItemState.RUNNING, True)
    finally:
        conn.close()


async def test_cancelling_a_finished_or_flagged_item_writes_nothing(tmp_path: Path) -> None:
    """request_cancel on a finished item, or on a running one already flagged, returns it as it
    is and changes no row (the writer connection counts no change)."""
    async with await SQLiteQueue.connect(tmp_path / "q.db", clock=ManualClock()) as queue:
        await queue.enqueue("spec", item_id="done")
        await queue.enqueue("spec", item_id="flagged")
        done, _ = await queue.claim_due(["spec"], "w", 30, 2)
        await queue.complete("done", done.lease_version)
        await queue.request_cancel("flagged")
        changes = queue._conn.total_changes
        for item_id in ("done", "flagged"):
            assert await queue.request_cancel(item_id) == await queue.get(item_id)
        assert queue._conn.total_changes == changes


async def test_a_journal_write_cancelled_before_its_group_is_written_is_never_written(
    tmp_path: Path,
) -> None:
    """Journal writes made while another group is being written wait for its turn; one whose
    evaluation is cancelled meanwhile is dropped from the next group (never written), and the
    rest of that group is written."""
    path = tmp_path / "queue.db"
    queue = await SQLiteQueue.connect(path)
    now = dt.datetime.now(dt.UTC)

    def entry(name: str) -> JournalEntry:
        return JournalEntry(
            position=0, kind=EntryKind.STEP, name=name, started_at=now, finished_at=now
        )

    async with queue:
        for item_id in ("a", "b", "c"):
            await queue.enqueue("spec", item_id=item_id)
        items = {i.id: i for i in await queue.claim_due(["spec"], "w", 30, 3)}
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # the first group waits for the write lock
        b_scope = trio.CancelScope()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(queue.record_entry, "a", items["a"].lease_version, entry("a"))
            await trio.sleep(0.05)  # a's group is in its thread, waiting for the lock

            async def record_b() -> None:
                with b_scope:
                    await queue.record_entry("b", items["b"].lease_version, entry("b"))

            nursery.start_soon(record_b)
            nursery.start_soon(queue.record_entry, "c", items["c"].lease_version, entry("c"))
            await trio.sleep(0.05)
            b_scope.cancel()  # b waits for a's turn to end: cancelled, never written
            await trio.sleep(0.05)
            blocker.execute("COMMIT")
        blocker.close()
        written = {
            item_id: [e.name for e in (await queue.read_journal(item_id)).entries]
            for item_id in ("a", "b", "c")
        }
    assert written == {"a": ["a"], "b": [], "c": ["c"]}


async def test_a_batch_that_only_finishes_items_wakes_no_waiter_here(tmp_path: Path) -> None:
    """A waiter looks at what is due (a query) each time it is woken: a batch of completions
    that makes nothing claimable wakes nobody (a runner serving a second queue looked once per
    batch of the first queue's completions, doubling its CPU per item: P13s); a reschedule
    (due later) and the completion of a keyed item (its key's slot) do, read off the settled
    rows, as SQLite has no other channel to this process's waiters."""
    async with await SQLiteQueue.connect(tmp_path / "q.db", clock=ManualClock()) as queue:
        for item_id in ("a", "b"):
            await queue.enqueue("spec", item_id=item_id)
        await queue.enqueue("spec", item_id="k", concurrency_key="key")
        claimed = {item.id: item for item in await queue.claim_due(["spec"], "w", 30, 3)}

        def settle(item_id: str, kind: SettleKind, **changes: Any) -> Settlement:
            version = claimed[item_id].lease_version
            return Settlement(item_id=item_id, lease_version=version, kind=kind, **changes)

        for settlement, wakes in [
            (settle("a", SettleKind.COMPLETE), False),
            (settle("b", SettleKind.CONTINUE, delay=60), True),
            (settle("k", SettleKind.COMPLETE), True),
        ]:
            before = queue._changes.value
            assert await queue.settle_many([settlement]) == [True]
            assert (queue._changes.value > before) is wakes, settlement
