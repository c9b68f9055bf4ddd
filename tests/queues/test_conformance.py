"""The store contract (``trio_supervise.testing.conformance``), run against the project's three
backends, as a third-party backend would run it against its own."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from trio_supervise.queues import MemoryQueue, SettleKind, Settlement, SQLiteQueue, WorkQueue
from trio_supervise.testing.conformance import ManualClock, StoreConformance

from .conftest import RunnerMarkedPostgresQueue, pg_schema


class TestMemoryQueue(StoreConformance):
    @asynccontextmanager
    async def open_store(self, clock: ManualClock) -> AsyncIterator[WorkQueue]:
        async with MemoryQueue(clock=clock) as queue:
            yield queue


class TestSQLiteQueue(StoreConformance):
    @asynccontextmanager
    async def open_store(self, clock: ManualClock) -> AsyncIterator[WorkQueue]:
        with tempfile.TemporaryDirectory() as folder:
            async with await SQLiteQueue.connect(Path(folder) / "queue.db", clock=clock) as queue:
                yield queue


@pytest.mark.postgres
class TestPostgresQueue(StoreConformance):
    """Each store in a fresh schema of the test database, dropped afterwards."""

    @asynccontextmanager
    async def open_store(self, clock: ManualClock) -> AsyncIterator[WorkQueue]:
        with pg_schema() as (dsn, schema):
            async with await RunnerMarkedPostgresQueue.connect(
                dsn, clock=clock, schema=schema, migrate=True, pool_size=4
            ) as queue:
                yield queue


def test_settlement_delays_are_bounded() -> None:
    """A delay past MAX_DELAY (which no backend could add to now) is refused up front."""
    with pytest.raises(ValueError, match="delay"):
        Settlement(item_id="x", lease_version=1, kind=SettleKind.CONTINUE, delay=1e300)
