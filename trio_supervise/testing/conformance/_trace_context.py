"""Trace context: the W3C ``traceparent`` an item carries, stored as given and returned by
every read and claim (a runner continues its trace from it)."""

from __future__ import annotations

import pytest

from ...job import NewItem
from ...queues import WorkQueue

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class TraceContextContract:
    """An item's ``traceparent`` comes back from every read and claim as given; None
    without one; a value that is not a W3C traceparent is refused naming the field."""

    async def test_the_traceparent_comes_back_from_every_read(self, queue: WorkQueue) -> None:
        """Enqueue's item, a read, a claim and a listing carry the traceparent given."""
        item = await queue.enqueue("spec", item_id="a", traceparent=TRACEPARENT)
        [plain] = await queue.enqueue_many([NewItem(spec_id="spec", item_id="b")])
        assert (item.traceparent, plain.item.traceparent) == (TRACEPARENT, None)
        assert (await queue.get("a")).traceparent == TRACEPARENT
        [claimed] = await queue.claim_due(["spec"], "w", 30, 1)
        assert (claimed.id, claimed.traceparent) == ("a", TRACEPARENT)
        assert [i.traceparent for i in await queue.list_items()] == [TRACEPARENT, None]

    @pytest.mark.parametrize(
        "bad",
        [
            "trace me",
            TRACEPARENT.upper(),
            "ff" + TRACEPARENT[2:],
            "00-" + "0" * 32 + TRACEPARENT[35:],
            TRACEPARENT[:36] + "0" * 16 + TRACEPARENT[52:],
            TRACEPARENT + "-extra",
            TRACEPARENT + "\n",
            42,
        ],
    )
    async def test_a_bad_traceparent_is_refused(self, queue: WorkQueue, bad: object) -> None:
        """Not ``00-<32 hex>-<16 hex>-<2 hex>`` (lowercase, version ff or an all-zero id
        invalid): refused before anything is written, alone or in a batch."""
        rule = "traceparent must be a W3C traceparent"
        with pytest.raises(ValueError, match=rule):
            await queue.enqueue("spec", traceparent=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=f"entry 1: {rule}"):
            await queue.enqueue_many(
                [NewItem(spec_id="spec"), NewItem(spec_id="spec", traceparent=bad)]  # type: ignore[arg-type]
            )
        assert await queue.counts() == {}
