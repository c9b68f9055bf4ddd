"""Start deadlines: ``start_by`` is stored as given and comes back from every read and claim
(the runner settles an item claimed after it as dead; the store only keeps it)."""

from __future__ import annotations

import datetime as dt

import pytest

from ...job import NewItem
from ...queues import WorkQueue
from ._clock import START, ManualClock


class StartByContract:
    """``start_by`` round-trips through enqueue, bulk enqueue, reads, listings and claims, to
    the microsecond and in UTC; one before ``due_at`` is refused, naming the rule."""

    async def test_start_by_comes_back_from_every_read(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """As given (UTC), from enqueue, get, a bulk enqueue, a listing and a claim; None when
        not given."""
        zone = dt.timezone(dt.timedelta(hours=2))
        deadline = (START + dt.timedelta(seconds=90, microseconds=7)).astimezone(zone)
        item = await queue.enqueue("spec", item_id="a", start_by=deadline)
        assert item.start_by == deadline
        assert item.start_by is not None
        assert item.start_by.tzinfo is dt.UTC
        done = await queue.enqueue_many(
            [
                NewItem(spec_id="spec", item_id="b", start_by=deadline + dt.timedelta(seconds=1)),
                NewItem(spec_id="spec", item_id="c"),
            ]
        )
        assert [d.item.start_by for d in done] == [deadline + dt.timedelta(seconds=1), None]
        assert (await queue.get("a")).start_by == deadline
        listed = {i.id: i.start_by for i in await queue.list_items()}
        assert listed == {"a": deadline, "b": deadline + dt.timedelta(seconds=1), "c": None}
        clock.advance(120)  # past both deadlines: the store still hands them out
        claimed = {i.id: i.start_by for i in await queue.claim_due(["spec"], "w", 30, 5)}
        assert claimed == listed

    @pytest.mark.parametrize(
        ("start_by", "rule"),
        [
            ("soon", "start_by must be a datetime"),
            (dt.datetime(2030, 1, 1), "start_by must be a timezone-aware datetime"),
            (START - dt.timedelta(seconds=1), "start_by must not be before due_at"),
        ],
    )
    async def test_a_bad_start_by_is_refused(
        self, queue: WorkQueue, start_by: object, rule: str
    ) -> None:
        """No datetime, a naive one, or one before due_at: a ValueError; nothing written."""
        with pytest.raises(ValueError, match=rule):
            await queue.enqueue("spec", due_at=START, start_by=start_by)  # type: ignore[arg-type]
        assert await queue.list_items() == []
