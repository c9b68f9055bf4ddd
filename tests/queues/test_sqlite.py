"""What only the SQLite queue does, and the URL factory."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from trio_supervise import SchemaError
from trio_supervise.queues import (
    DEFAULT_DATABASE_URL,
    MemoryQueue,
    SQLiteQueue,
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
