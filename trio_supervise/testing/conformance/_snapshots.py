"""Reads that take several statements read one snapshot, on every backend (issue 29, class 3):
a list never shows an item twice, nor misses one, however the items move meanwhile.

Under the real clock: the durable backends read and write in threads of their own, so a list
runs beside the claims and settlements that move its items between states.
"""

from __future__ import annotations

import collections

import trio

from ...job import ItemState, SettleKind, Settlement
from ...queues import WorkQueue

ITEMS = 60
LISTS = 150


async def _churn(queue: WorkQueue, stop: trio.Event) -> int:
    """Claim and hand back items until *stop*: each one moves queued -> running -> queued."""
    moves = 0
    while not stop.is_set():
        claimed = await queue.claim_due(["job"], "w", 60, 7)
        if claimed:
            await queue.settle_many(
                [
                    Settlement(
                        item_id=item.id, lease_version=item.lease_version, kind=SettleKind.RELEASE
                    )
                    for item in claimed
                ]
            )
            moves += len(claimed)
        await trio.lowlevel.checkpoint()
    return moves


class SnapshotReadsContract:
    """Reads of many statements read one snapshot."""

    async def test_a_list_of_every_state_shows_each_item_once_while_items_move(
        self,
        queue: WorkQueue,
    ) -> None:
        """Listing every state (one statement per state on SQL) while a writer moves items between
        queued and running: each list holds every item exactly once, and so do the queues'
        counts."""
        for index in range(ITEMS):
            await queue.enqueue("job", item_id=f"i{index:03d}")
        stop = trio.Event()
        moved: list[int] = []
        problems: collections.Counter[str] = collections.Counter()

        async def churn() -> None:
            moved.append(await _churn(queue, stop))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(churn)
            for _ in range(LISTS):
                items = await queue.list_items(limit=10 * ITEMS)
                ids = [item.id for item in items]
                if len(ids) != len(set(ids)):
                    problems["an item twice"] += 1
                if len(set(ids)) != ITEMS:
                    problems["an item missing"] += 1
                [info] = await queue.list_queues()
                if sum(info.counts.values()) != ITEMS:
                    problems["queue counts off"] += 1
                await trio.lowlevel.checkpoint()
            stop.set()
        assert moved[0] > 0
        assert problems == {}
        states = {item.state for item in await queue.list_items(limit=10 * ITEMS)}
        assert states <= {ItemState.QUEUED, ItemState.RUNNING}
