"""Fixtures of the queue suite: a clock the tests move by hand, and one queue per backend.

PostgreSQL tests read ``TRIO_SUPERVISE_TEST_DSN``. When it is unset or the server cannot be
reached they are skipped, unless ``TRIO_SUPERVISE_REQUIRE_POSTGRES=1``: then they fail.
Each PostgreSQL test gets a fresh schema of its own, dropped afterwards.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest

from trio_supervise.queues import (
    MemoryQueue,
    PostgresQueue,
    Settlement,
    SQLiteQueue,
    WorkItem,
    WorkQueue,
)

START = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
BACKENDS = [
    "memory",
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
]


@attrs.define
class ManualClock:
    """A wall clock that moves only when a test says so, so leases expire without sleeping."""

    current: dt.datetime = START

    def now(self) -> dt.datetime:
        return self.current

    def advance(self, seconds: float) -> None:
        self.current += dt.timedelta(seconds=seconds)


@functools.cache
def _postgres_problem() -> str | None:
    dsn = os.environ.get("TRIO_SUPERVISE_TEST_DSN")
    if not dsn:
        return "TRIO_SUPERVISE_TEST_DSN is not set"
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=3):
            pass
    except Exception as error:
        return f"PostgreSQL at TRIO_SUPERVISE_TEST_DSN is unreachable: {type(error).__name__}"
    return None


def postgres_dsn() -> str:
    """The test DSN; skips the test (or fails it, if PostgreSQL is required) when unusable."""
    problem = _postgres_problem()
    if problem is not None:
        if os.environ.get("TRIO_SUPERVISE_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{problem}, and TRIO_SUPERVISE_REQUIRE_POSTGRES=1")
        pytest.skip(problem)
    return os.environ["TRIO_SUPERVISE_TEST_DSN"]


def new_schema_name() -> str:
    return f"ts_test_{uuid.uuid4().hex[:12]}"


def drop_schema(dsn: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@contextmanager
def pg_schema() -> Iterator[tuple[str, str]]:
    """A unique schema name in the test database, ``(dsn, schema)``; dropped afterwards."""
    dsn = postgres_dsn()
    schema = new_schema_name()
    try:
        yield dsn, schema
    finally:
        drop_schema(dsn, schema)


@asynccontextmanager
async def open_backend(
    backend: str, clock: ManualClock | None, tmp_path: Path
) -> AsyncIterator[WorkQueue]:
    """A fresh, empty queue of *backend*, with *clock* injected."""
    queue: WorkQueue
    if backend == "memory":
        queue = MemoryQueue() if clock is None else MemoryQueue(clock=clock)
        yield queue
        await queue.aclose()
    elif backend == "sqlite":
        async with await SQLiteQueue.connect(tmp_path / "queue.db", clock=clock) as queue:
            yield queue
    else:
        with pg_schema() as (dsn, schema):
            async with await RunnerMarkedPostgresQueue.connect(
                dsn, clock=clock, schema=schema, migrate=True, pool_size=4
            ) as queue:
                yield queue


class RunnerMarkedPostgresQueue(PostgresQueue):
    """A PostgreSQL queue whose settlements are marked as a runner marks its own: those of
    items without a parent (``Settlement._parentless``). So the suite's hand-built settlements
    take the path a runner's do, the one statement for a plain batch; a batch with children or
    waits still goes the general way, in a transaction (tests/queues/test_postgres.py runs the
    general way for plain batches too)."""

    async def _mark(self, settlements: Sequence[Settlement]) -> None:
        from trio_supervise import ItemNotFound
        from trio_supervise.job import mark_parentless

        for settlement in settlements:
            if not isinstance(settlement, Settlement):
                continue  # refused by settle_many, as the suite checks
            try:
                item = await self.get(settlement.item_id)
            except ItemNotFound:
                continue
            if item.parent_id is None:
                mark_parentless(settlement, True)

    async def settle_many(self, settlements: Sequence[Settlement]) -> list[bool]:
        await self._mark(settlements)
        return await super().settle_many(settlements)

    async def settle_and_claim(
        self, settlements: Sequence[Settlement], *args: Any, **kwargs: Any
    ) -> tuple[list[bool], list[WorkItem]]:
        """Marked the same way; defined here beside ``settle_many``, so the queue still declares
        ``Capability.SETTLE_AND_CLAIM`` and the suite's settle-and-claim tests run on it."""
        await self._mark(settlements)
        return await super().settle_and_claim(settlements, *args, **kwargs)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
async def queue(backend: str, clock: ManualClock, tmp_path: Path) -> AsyncIterator[WorkQueue]:
    """An empty queue of each backend, its "now" read from the test's :class:`ManualClock`."""
    async with open_backend(backend, clock, tmp_path) as queue:
        yield queue
