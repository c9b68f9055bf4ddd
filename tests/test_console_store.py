"""The console over what the store keeps: its audit trail and the items' error histories,
which outlive the process (SQLite here; every backend runs the store's side in the
conformance suite)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import httpx
import trio
from prometheus_client import CollectorRegistry

from trio_supervise import AuditTrail, MemoryAuditTrail, Shutdown
from trio_supervise.console import ErrorRecord, OperationsApp, serve_http
from trio_supervise.queues import MemoryQueue, SettleKind, Settlement, SQLiteQueue, WorkQueue
from trio_supervise.testing.conformance import ManualClock

from .test_http import FakeSource


@asynccontextmanager
async def console_over(
    queue: WorkQueue, audit: AuditTrail | None = None, source: FakeSource | None = None
) -> AsyncIterator[tuple[httpx.AsyncClient, OperationsApp]]:
    """A console over *queue* served on loopback (its audit trail the default unless given),
    and a client of it."""
    source = FakeSource() if source is None else source
    app = (
        OperationsApp(source, CollectorRegistry(), queue=queue)
        if audit is None
        else OperationsApp(source, CollectorRegistry(), queue=queue, audit=audit)
    )
    shutdown = Shutdown()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(partial(serve_http, app, "127.0.0.1", 0, shutdown=shutdown))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            yield client, app
        shutdown.begin("test over")


async def post(client: httpx.AsyncClient, path: str) -> httpx.Response:
    """Submit *path*'s form as the status page would, with its CSRF token."""
    found = re.search(r'name="csrf" value="([^"]+)"', (await client.get("/")).text)
    assert found is not None
    return await client.post(path, data={"csrf": found[1], "next": "/"})


async def test_a_console_records_in_the_stores_trail_by_default() -> None:
    """Given no trail, the console records its actions in the queue's own (``store.audit``);
    one given explicitly takes its place."""
    queue = MemoryQueue()
    await queue.enqueue("report", item_id="r-1")
    async with console_over(queue) as (client, _):
        assert (await post(client, "/items/r-1/cancel")).status_code == 303
    [entry] = await queue.audit.recent()
    assert (entry.action, entry.target, entry.ok) == ("cancel", "item:r-1", True)
    own = MemoryAuditTrail()
    async with console_over(queue, own) as (client, _):
        await post(client, "/queues/default/pause")
    assert [e.action for e in own.entries] == ["pause"]
    assert len(await queue.audit.recent()) == 1


async def test_audit_entries_outlive_a_restart_on_sqlite(tmp_path: Path) -> None:
    """Actions taken from a console over a SQLite file are in the file: a console over the
    file opened again shows them, newest first."""
    path = tmp_path / "queue.db"
    clock = ManualClock()
    async with await SQLiteQueue.connect(path, clock=clock) as queue:
        await queue.enqueue("report", item_id="r-1")
        async with console_over(queue) as (client, _):
            await post(client, "/items/r-1/cancel")
            clock.advance(1)
            await post(client, "/items/missing/retry")
    async with await SQLiteQueue.connect(path, clock=clock) as reopened:
        recent = await reopened.audit.recent()
        assert [(e.action, e.target, e.ok) for e in recent] == [
            ("retry", "item:missing", False),
            ("cancel", "item:r-1", True),
        ]
        async with console_over(reopened) as (client, _):
            page = (await client.get("/")).text
    assert "item:missing" in page
    assert page.index("item:missing") < page.index("item:r-1")


async def dead(queue: WorkQueue, item_id: str, error: str) -> None:
    """Enqueue *item_id* (its spec id its own id), claim it and settle it dead with *error*."""
    await queue.enqueue(item_id, item_id=item_id)
    [item] = await queue.claim_due([item_id], "w1", 30, 1)
    settlement = Settlement(
        item_id=item.id, lease_version=item.lease_version, kind=SettleKind.DEAD, error=error
    )
    assert await queue.settle_many([settlement]) == [True]


async def test_recent_errors_are_read_from_the_store_and_outlive_a_restart(
    tmp_path: Path,
) -> None:
    """The status page's recent errors are the items' recorded errors, newest first, each
    linked to its item with its traceback folded away: a console over the reopened file shows
    them, though the process that ran the items (here: none) remembers nothing. The runner's
    own errors follow, as this process's."""
    path = tmp_path / "queue.db"
    clock = ManualClock()
    async with await SQLiteQueue.connect(path, clock=clock) as queue:
        await dead(queue, "old-one", "KeyError: 'x'\nTraceback (most recent call last):\n  ...")
        clock.advance(60)
        await dead(queue, "new-one", "OSError: <gone>")
    lag = ErrorRecord(at=None, source="runner", message="event loop blocked for 2.5 s")
    async with (
        await SQLiteQueue.connect(path, clock=clock) as reopened,
        console_over(reopened, source=FakeSource(errors=[lag])) as (client, _),
    ):
        page = (await client.get("/")).text
    table = page[page.index('<table id="item-errors">') :]
    assert table.index("new-one") < table.index("old-one")
    assert "OSError: &lt;gone&gt;" in table
    assert "<summary>traceback</summary><pre>Traceback (most recent call last):" in table
    assert 'href="/items/old-one"' in table
    assert 'href="/errors"' in page
    # The runner's own errors, which no item's history holds, stay below: "in this process".
    assert page.index("In this process") < page.index("event loop blocked for 2.5 s")


async def test_the_errors_page_pages_by_cursor() -> None:
    """``/errors`` shows 50 errors a page, newest first, with a link to the next page (a
    keyset cursor); a cursor that is not one says so instead of failing."""
    clock = ManualClock()
    queue = MemoryQueue(clock=clock)
    for n in range(60):
        await dead(queue, f"i{n:02}", f"boom {n}")
        clock.advance(1)
    async with console_over(queue) as (client, _):
        first = (await client.get("/errors")).text
        found = re.search(r'<a id="next-page" href="([^"]+)"', first)
        assert found is not None
        second = (await client.get(found[1].replace("&amp;", "&"))).text
        bad = (await client.get("/errors?before=nonsense")).text
    shown = re.findall(r'href="/items/(i\d\d)"', first)
    assert shown == [f"i{n:02}" for n in range(59, 9, -1)]
    assert re.findall(r'href="/items/(i\d\d)"', second) == [f"i{n:02}" for n in range(9, -1, -1)]
    assert 'id="next-page"' not in second
    assert "not a cursor of this list" in bad
