"""Schema versions: a fresh schema equals the migrated one; newer schemas are refused."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_supervise import RateLimit, SchemaError
from trio_supervise.queues import (
    ItemState,
    PostgresQueue,
    SQLiteQueue,
    WorkQueue,
    _sql,
    migrate,
)
from trio_supervise.queues.sql import _postgres, _postgres_db, _sqlite_db

from .conftest import ManualClock, pg_schema

# -- the files -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_sql_files_are_consistent(backend: _sql.Backend) -> None:
    """Migrations are numbered 1..n; every query the backend uses is defined once."""
    steps = _sql.migrations(backend)
    assert [m.version for m in steps] == list(range(1, len(steps) + 1))
    assert _sql.latest_version(backend) == len(steps)
    queries = _sql.load_queries(backend)
    for name in ("create_version_table", "schema_version", "claim_due", "next_due_at"):
        assert queries[name].strip()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_queries_are_loaded_without_their_comment_lines(backend: _sql.Backend) -> None:
    """The queries as loaded hold no line that is only a comment; the rest is kept as written."""
    raw = _sql._sql_dir(backend).joinpath("queries.sql").read_text(encoding="utf-8")
    raw = _sql._ITEM_COLUMNS.sub(lambda m: _sql.item_columns(backend, m.group(1)), raw)
    for name, query in _sql.load_queries(backend).items():
        lines = query.splitlines()
        assert not [line for line in lines if line.lstrip().startswith("--")], name
        assert all(line in raw for line in lines), name


def test_postgres_queries_are_short_enough_for_psycopg_to_cache_their_parse() -> None:
    """psycopg parses a query's placeholders again on every call unless the query is shorter
    than its cache's limit: every PostgreSQL query, as loaded, is (the claim was not, with its
    comments)."""
    psycopg_queries = pytest.importorskip("psycopg._queries")
    limit = getattr(psycopg_queries, "MAX_CACHED_STATEMENT_LENGTH", 4096)
    queries = {**_sql.load_queries("postgres"), "settle_alone": _postgres._SETTLE_ALONE}
    too_long = {name: len(query) for name, query in queries.items() if len(query) >= limit}
    assert not too_long


def test_sql_files_ship_in_the_package() -> None:
    """The .sql files are package data next to the code (and so land in the wheel)."""
    from importlib import resources

    root = resources.files("trio_supervise.queues").joinpath("sql")
    for backend in ("sqlite", "postgres"):
        for name in (
            "schema.sql",
            "queries.sql",
            "migrations/0001_initial.sql",
            "migrations/0002_attempts_and_reads.sql",
            "migrations/0003_job_model_claiming.sql",
            "migrations/0004_job_model_producing.sql",
        ):
            assert root.joinpath(backend, name).is_file()


# -- SQLite ----------------------------------------------------------------------------------


def _sqlite_shape(path: Path) -> dict[str, Any]:
    with sqlite3.connect(path) as conn:
        shape: dict[str, Any] = {}
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        for table in tables:
            shape[f"columns:{table}"] = conn.execute(f"PRAGMA table_info({table})").fetchall()
            for index in conn.execute(f"PRAGMA index_list({table})").fetchall():
                name = index[1]
                shape[f"index:{name}"] = (
                    index[2:],
                    conn.execute(f"PRAGMA index_xinfo({name})").fetchall(),
                )
        shape["sql"] = sorted(
            " ".join(str(row[0]).split())
            for row in conn.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL")
        )
        shape["versions"] = conn.execute(
            "SELECT version FROM trio_supervise_schema_version ORDER BY version"
        ).fetchall()
        return shape


def _sqlite_migrate(path: Path, *, fresh: bool, upto: int | None = None) -> int:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        return _sqlite_db.migrate_connection(conn, 0, where=str(path), fresh=fresh, upto=upto)
    finally:
        conn.close()


def test_sqlite_fresh_schema_equals_migrated(tmp_path: Path) -> None:
    """schema.sql on an empty file gives exactly what replaying every migration gives."""
    latest = _sql.latest_version("sqlite")
    assert _sqlite_migrate(tmp_path / "fresh.db", fresh=True) == latest
    assert _sqlite_migrate(tmp_path / "steps.db", fresh=False) == latest
    fresh, steps = _sqlite_shape(tmp_path / "fresh.db"), _sqlite_shape(tmp_path / "steps.db")
    assert fresh["versions"] == [(latest,)]
    assert steps["versions"] == [(v,) for v in range(1, latest + 1)]
    del fresh["versions"], steps["versions"]
    assert fresh == steps
    assert "columns:trio_supervise_items" in fresh


async def test_sqlite_migrate_is_idempotent(tmp_path: Path) -> None:
    """Migrating twice changes nothing the second time and reports the same version."""
    path = tmp_path / "q.db"
    latest = _sql.latest_version("sqlite")
    assert await migrate(f"sqlite:///{path}") == latest
    before = _sqlite_shape(path)
    assert await migrate(f"sqlite:///{path}") == latest
    async with await SQLiteQueue.connect(path, migrate=False) as queue:
        assert await migrate(queue) == latest
    assert _sqlite_shape(path) == before


async def test_sqlite_newer_schema_is_refused(tmp_path: Path) -> None:
    """A file whose schema is newer than this release knows is refused, even with migrate."""
    path = tmp_path / "q.db"
    await migrate(f"sqlite:///{path}")
    newer = _sql.latest_version("sqlite") + 1
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO trio_supervise_schema_version (version, applied_at) VALUES (?, 0)",
            (newer,),
        )
    for allow in (True, False):
        with pytest.raises(SchemaError, match=f"version {newer}, newer"):
            await SQLiteQueue.connect(path, migrate=allow)
    with pytest.raises(SchemaError, match="newer"):
        await migrate(f"sqlite:///{path}")


async def test_sqlite_concurrent_migrators(tmp_path: Path) -> None:
    """Several migrators of one file at once leave one schema and one version row."""
    path = tmp_path / "q.db"
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(_sqlite_db.migrate_path, path)
    assert _sqlite_shape(path)["versions"] == [(_sql.latest_version("sqlite"),)]


@pytest.mark.parametrize("round_", range(5))
async def test_many_openers_of_a_fresh_sqlite_file(tmp_path: Path, round_: int) -> None:
    """Queues and migrators opening one new file at once (processes starting together) all
    open it: the WAL switch that SQLite refuses without waiting while another connection
    migrates is tried again rather than failing the open."""
    path = tmp_path / f"fresh-{round_}.db"
    opened: list[int] = []

    async def open_queue() -> None:
        async with await SQLiteQueue.connect(path) as queue:
            opened.append(len(await queue.list_items()))

    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(open_queue)
            nursery.start_soon(_sqlite_db.migrate_path, path)
    assert opened == [0] * 6
    assert _sqlite_shape(path)["versions"] == [(_sql.latest_version("sqlite"),)]


# -- PostgreSQL ------------------------------------------------------------------------------


def _pg_shape(dsn: str, schema: str) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name, ordinal_position, data_type, is_nullable, "
            "column_default FROM information_schema.columns WHERE table_schema = %s "
            "ORDER BY table_name, ordinal_position",
            (schema,),
        ).fetchall()
        indexes = conn.execute(
            "SELECT indexname, replace(indexdef, %s, 'S') FROM pg_indexes "
            "WHERE schemaname = %s ORDER BY indexname",
            (schema, schema),
        ).fetchall()
        constraints = conn.execute(
            "SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid) "
            "FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace "
            "WHERE n.nspname = %s ORDER BY 1, 2",
            (schema,),
        ).fetchall()
        versions = conn.execute(
            f'SELECT version FROM "{schema}".trio_supervise_schema_version ORDER BY version'
        ).fetchall()
    return {
        # A default naming a sequence names its schema (not on this connection's search path).
        "columns": [
            (*row[:5], None if row[5] is None else row[5].replace(f"{schema}.", "S."))
            for row in columns
        ],
        "indexes": indexes,
        "constraints": [(t.replace(schema, "S"), n, d) for t, n, d in constraints],
        "versions": versions,
    }


def _pg_migrate(dsn: str, schema: str, *, fresh: bool) -> int:
    with _postgres_db.open_connection(dsn, schema=schema) as conn:
        return _postgres_db.migrate_connection(conn, where=schema, schema=schema, fresh=fresh)


@pytest.mark.postgres
def test_postgres_fresh_schema_equals_migrated() -> None:
    """schema.sql on an empty schema gives exactly what replaying every migration gives."""
    latest = _sql.latest_version("postgres")
    with pg_schema() as (dsn, fresh_schema), pg_schema() as (_, steps_schema):
        assert _pg_migrate(dsn, fresh_schema, fresh=True) == latest
        assert _pg_migrate(dsn, steps_schema, fresh=False) == latest
        fresh, steps = _pg_shape(dsn, fresh_schema), _pg_shape(dsn, steps_schema)
    assert fresh["versions"] == [(latest,)]
    assert steps["versions"] == [(v,) for v in range(1, latest + 1)]
    del fresh["versions"], steps["versions"]
    assert fresh == steps
    assert fresh["columns"]
    assert fresh["indexes"]
    assert fresh["constraints"]


@pytest.mark.postgres
async def test_postgres_migrate_is_idempotent_and_concurrent_safe() -> None:
    """Many migrators at once (advisory lock) leave one schema; migrating again is a no-op."""
    latest = _sql.latest_version("postgres")
    with pg_schema() as (dsn, schema):
        results: list[int] = []

        async def one() -> None:
            results.append(await _postgres_db.migrate_dsn(dsn, schema=schema))

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(one)
        assert results == [latest] * 4
        before = _pg_shape(dsn, schema)
        assert before["versions"] == [(latest,)]
        assert await _postgres_db.migrate_dsn(dsn, schema=schema) == latest
        assert _pg_shape(dsn, schema) == before


@pytest.mark.postgres
async def test_postgres_newer_schema_is_refused() -> None:
    """A database whose schema is newer than this release knows is refused, even with migrate."""
    import psycopg

    with pg_schema() as (dsn, schema):
        await _postgres_db.migrate_dsn(dsn, schema=schema)
        newer = _sql.latest_version("postgres") + 1
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                f'INSERT INTO "{schema}".trio_supervise_schema_version (version) VALUES (%s)',
                (newer,),
            )
        for allow in (True, False):
            with pytest.raises(SchemaError, match=f"version {newer}, newer"):
                await PostgresQueue.connect(dsn, schema=schema, migrate=allow)
        with pytest.raises(SchemaError, match="newer"):
            await _postgres_db.migrate_dsn(dsn, schema=schema)


# -- upgrading a version-1 database that holds work ------------------------------------------

V1_ROWS = [
    # id, state, due (s from the epoch), lease expiry (s), error count
    ("queued", "queued", 10, None, 0),
    ("running-live", "running", 10, 4_000_000_000, 0),
    ("running-expired", "running", 10, 20, 1),
    ("completed", "completed", 10, None, 0),
    ("cancelled", "cancelled", 10, None, 0),
    ("dead", "dead", 10, None, 3),
]


async def _check_upgraded(queue: WorkQueue) -> None:
    """Every version-1 item is there as it was (attempt 0); the claimable ones are claimed."""
    items = {item.id: item for item in await queue.list_items()}
    assert sorted(items) == sorted(row[0] for row in V1_ROWS)
    for item_id, state, _, _, errors in V1_ROWS:
        assert (items[item_id].state, items[item_id].error_count) == (ItemState(state), errors)
        assert items[item_id].attempt == 0
        assert (items[item_id].queue, items[item_id].priority) == ("default", 0)
    expected: dict[tuple[str, ItemState], int] = {}
    for _, state, _, _, _ in V1_ROWS:  # the items already there were counted by the migration
        expected[("spec", ItemState(state))] = expected.get(("spec", ItemState(state)), 0) + 1
    assert dict(await queue.counts()) == expected
    claimed = await queue.claim_due(["spec"], "w", 30, 10)
    assert sorted(i.id for i in claimed) == ["queued", "running-expired"]
    assert {i.attempt for i in claimed} == {1}
    for finished in ("completed", "cancelled", "dead"):
        assert (await queue.retry(finished)).state is ItemState.QUEUED
    assert len(await queue.claim_due(["spec"], "w", 30, 10)) == 3
    assert dict(await queue.counts()) == {("spec", ItemState.RUNNING): len(V1_ROWS)}


@pytest.mark.parametrize("version", [1, 2, 4, 6, 9, 10])
async def test_sqlite_older_version_with_items_migrates_losing_nothing(
    tmp_path: Path, version: int
) -> None:
    """A file of an older version (the last release's, 4, and those before each new migration)
    with items in every state migrates to the latest: nothing lost, all claimable."""
    path = tmp_path / f"v{version}.db"
    assert _sqlite_migrate(path, fresh=False, upto=version) == version
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, lease_owner, "
            "lease_expires_at, lease_version, error_count, created_at, updated_at) "
            "VALUES (?, 'spec', ?, ?, ?, ?, 1, ?, 0, 0)",
            [
                (i, s, due * 10**6, None if exp is None else "old", exp and exp * 10**6, e)
                for i, s, due, exp, e in V1_ROWS
            ],
        )
        if version >= 10:  # key rate rules and a key's log (schema 0010), kept
            conn.executemany(
                "INSERT INTO trio_supervise_key_rates (key, rate_limit, period_us, starts) "
                "VALUES (?, ?, ?, ?)",
                [("t:{tenant}", 2, 10**6, "[]"), ("t:acme", None, None, "[1]")],
            )
    clock = ManualClock(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
    async with await SQLiteQueue.connect(path, clock=clock) as queue:
        await _check_upgraded(queue)
        if version >= 10:
            assert await queue.key_rate_limits() == {"t:{tenant}": RateLimit(2, 1)}
    latest = _sql.latest_version("sqlite")
    assert _sqlite_shape(path)["versions"] == [(v,) for v in range(1, latest + 1)]


@pytest.mark.postgres
@pytest.mark.parametrize("version", [1, 2, 4, 5, 6, 7, 9, 12, 13])
async def test_postgres_older_version_with_items_migrates_losing_nothing(version: int) -> None:
    """A schema of an older version with items in every state, two of them holding keys,
    migrates to the latest (the claim, lease, key, spec and listing indexes rebuilt on the
    way): nothing lost, every state listed, the claimable items claimed, the keys still unique
    and found."""
    import psycopg

    with pg_schema() as (dsn, schema):
        with _postgres_db.open_connection(dsn, schema=schema) as conn:
            reached = _postgres_db.migrate_connection(
                conn, where=schema, schema=schema, upto=version
            )
            assert reached == version
        with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}") as conn:
            for item_id, state, due, expires, errors in V1_ROWS:
                conn.execute(
                    "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, lease_owner, "
                    "lease_expires_at, lease_version, error_count, created_at, updated_at) "
                    "VALUES (%s, 'spec', %s, to_timestamp(%s), %s, to_timestamp(%s), 1, %s, "
                    "now(), now())",
                    (item_id, state, due, expires and "old", expires, errors),
                )
            conn.execute(
                "UPDATE trio_supervise_items SET idempotency_key = 'key-' || id "
                "WHERE id IN ('queued', 'completed')"
            )
            if version >= 13:  # key rate rules and a key's log (schema 0013), kept
                conn.execute(
                    "INSERT INTO trio_supervise_key_rates (key, rate_limit, period_us, starts) "
                    "VALUES ('t:{tenant}', 2, 1000000, '{}'), ('t:acme', NULL, NULL, '{}')"
                )
        clock = ManualClock(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
        async with await PostgresQueue.connect(
            dsn, schema=schema, migrate=True, clock=clock
        ) as queue:
            for state in ItemState:  # each state's page, the running one from the lease index
                held = sorted(row[0] for row in V1_ROWS if row[1] == str(state))
                for specs in (None, ["spec"]):
                    page = await queue.list_items(states=[state], spec_ids=specs)
                    assert sorted(item.id for item in page) == held
            await _check_upgraded(queue)
            if version >= 13:
                assert await queue.key_rate_limits() == {"t:{tenant}": RateLimit(2, 1)}
            for holder in ("queued", "completed"):
                again = await queue.enqueue("spec", idempotency_key=f"key-{holder}")
                assert again.id == holder
                assert (await queue.get_by_key(f"key-{holder}")).id == holder
        twin = (
            "INSERT INTO trio_supervise_items (id, spec_id, due_at, idempotency_key, "
            "created_at, updated_at) VALUES ('twin', 'spec', now(), 'key-queued', now(), now())"
        )
        with (
            psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}") as conn,
            pytest.raises(psycopg.errors.UniqueViolation),
        ):
            conn.execute(twin)


# -- item incarnations (SQLite 0005, PostgreSQL 0008): a parent and its children upgraded ------


async def _check_incarnations(queue: WorkQueue) -> None:
    """A parent written before the migration still lists its children; the first claim after it
    gets a version above every stored one (parent versions included); a child no longer waited
    for by a cancelled parent may be deleted."""
    assert [c.id for c in await queue.list_children("parent")] == ["parent.5.0000", "parent.5.0001"]
    claimed = await queue.claim_due(["spec"], "w", 30, 10)
    assert sorted(item.id for item in claimed) == ["orphan", "parent.5.0001", "queued"]
    assert min(item.lease_version for item in claimed) > 9
    for item in claimed:
        assert await queue.release(item.id, item.lease_version, 0) is None
    assert (await queue.get("cancelled-parent")).waiting_children == 0
    await queue.delete("orphan")


def _incarnation_rows() -> list[tuple[str, str, str | None, int | None, int, int]]:
    # id, state, parent_id, parent_version, lease_version, waiting_children
    return [
        ("queued", "queued", None, None, 3, 0),
        ("parent", "completed", None, None, 5, 0),
        ("parent.5.0000", "completed", "parent", None, 1, 0),
        ("parent.5.0001", "queued", "parent", None, 0, 0),
        ("cancelled-parent", "cancelled", None, None, 9, 1),
        ("orphan", "queued", "cancelled-parent", 9, 0, 0),
    ]


async def test_sqlite_version_4_with_children_migrates_keeping_lineage(tmp_path: Path) -> None:
    """Migration 0005 keeps a parent's children listed, starts lease versions above every
    stored one, and ends the wait of a parent cancelled while waiting."""
    path = tmp_path / "v4.db"
    assert _sqlite_migrate(path, fresh=False, upto=4) == 4
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, parent_id, "
            "parent_version, lease_version, waiting_children, created_at, updated_at) "
            "VALUES (?, 'spec', ?, 0, ?, ?, ?, ?, 0, 0)",
            _incarnation_rows(),
        )
    clock = ManualClock(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
    async with await SQLiteQueue.connect(path, clock=clock) as queue:
        await _check_incarnations(queue)


@pytest.mark.postgres
async def test_postgres_version_7_with_children_migrates_keeping_lineage() -> None:
    """Migration 0008 keeps a parent's children listed, starts lease versions above every
    stored one, and ends the wait of a parent cancelled while waiting."""
    import psycopg

    with pg_schema() as (dsn, schema):
        with _postgres_db.open_connection(dsn, schema=schema) as conn:
            assert _postgres_db.migrate_connection(conn, where=schema, schema=schema, upto=7) == 7
        with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}") as conn:
            for row in _incarnation_rows():
                conn.execute(
                    "INSERT INTO trio_supervise_items (id, spec_id, state, due_at, parent_id, "
                    "parent_version, lease_version, waiting_children, created_at, updated_at) "
                    "VALUES (%s, 'spec', %s, to_timestamp(0), %s, %s, %s, %s, now(), now())",
                    row,
                )
        clock = ManualClock(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
        async with await PostgresQueue.connect(
            dsn, schema=schema, migrate=True, clock=clock
        ) as queue:
            await _check_incarnations(queue)
