"""The console's audit trail kept by a store (``Capability.AUDIT_TRAIL``): entries recorded,
read back newest first as recorded, and pruned by age."""

from __future__ import annotations

import datetime as dt

import pytest

from ..._audit import AuditEntry
from ...queues import AuditStore, WorkQueue
from ...queues._ports import Capability
from ._clock import START, ManualClock
from ._support import needs


def entry(at: dt.datetime, target: str, *, ok: bool = True, who: str = "alice") -> AuditEntry:
    """An entry for *target* at *at*."""
    return AuditEntry(
        at=at, who=who, address="127.0.0.1", action="retry", target=target, ok=ok, result="done"
    )


def trail_store(queue: WorkQueue) -> AuditStore:
    """*queue* as the :class:`AuditStore` it declares it is."""
    assert isinstance(queue, AuditStore), "a store declaring AUDIT_TRAIL is an AuditStore"
    return queue


class AuditContract:
    """The audit trail: what is recorded comes back as recorded, newest first; retention
    deletes the oldest entries past an age, in bounded batches."""

    @needs(Capability.AUDIT_TRAIL)
    async def test_entries_come_back_newest_first_as_recorded(self, queue: WorkQueue) -> None:
        """Every field comes back as recorded; newest first by ``at``, the later recorded
        first among equal times; ``limit`` bounds how many."""
        trail = trail_store(queue).audit
        assert await trail.recent() == []
        second = START + dt.timedelta(seconds=1)
        await trail.record(entry(START, "item:a"))
        await trail.record(entry(second, "item:b", ok=False, who="bob"))
        await trail.record(entry(START, "item:c"))
        assert [e.target for e in await trail.recent()] == ["item:b", "item:c", "item:a"]
        [newest] = await trail.recent(1)
        assert newest == entry(second, "item:b", ok=False, who="bob")
        assert await trail.recent(0) == []
        with pytest.raises(ValueError, match="limit must be an integer >= 0"):
            await trail.recent(-1)

    @needs(Capability.AUDIT_TRAIL)
    async def test_hostile_text_is_recorded_as_its_escape(self, queue: WorkQueue) -> None:
        """A NUL or a lone surrogate in what an entry says (a client's user name) is kept as
        its escape: recording never fails on it, and it comes back as the entry holds it."""
        trail = trail_store(queue).audit
        hostile = entry(START, "item:<script>", who="eve\x00\udcff")
        assert hostile.who == "eve\\x00\\udcff"
        await trail.record(hostile)
        assert await trail.recent() == [hostile]

    @needs(Capability.AUDIT_TRAIL)
    async def test_prune_deletes_the_oldest_entries_past_the_age(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Entries recorded at least ``older_than`` seconds ago by the store's clock are
        deleted, oldest first, at most ``limit`` a call; ``dry_run`` counts them only."""
        store = trail_store(queue)
        for n in range(4):
            await store.audit.record(entry(START + dt.timedelta(hours=n), f"item:{n}"))
        clock.advance(10 * 3600)  # entries are 10, 9, 8 and 7 hours old
        assert await store.prune_audit(8 * 3600, dry_run=True) == 3
        assert len(await store.audit.recent()) == 4
        assert await store.prune_audit(8 * 3600, limit=2) == 2
        assert [e.target for e in await store.audit.recent()] == ["item:3", "item:2"]
        assert await store.prune_audit(8 * 3600) == 1
        assert await store.prune_audit(8 * 3600) == 0
        assert [e.target for e in await store.audit.recent()] == ["item:3"]

    @needs(Capability.AUDIT_TRAIL)
    @pytest.mark.parametrize(
        ("older_than", "limit", "rule"),
        [
            (-1, None, "older_than must be a number of seconds"),
            (True, None, "older_than must be a number of seconds"),
            (1e300, None, "older_than must be a number of seconds"),
            (60, 0, "limit must be None or an integer >= 1"),
        ],
    )
    async def test_bad_prune_arguments_are_refused(
        self, queue: WorkQueue, older_than: float, limit: int | None, rule: str
    ) -> None:
        """A negative, boolean or huge age, or a limit below 1: refused naming the argument."""
        store = trail_store(queue)
        await store.audit.record(entry(START, "item:a"))
        with pytest.raises(ValueError, match=rule):
            await store.prune_audit(older_than, limit=limit)
        assert len(await store.audit.recent()) == 1
