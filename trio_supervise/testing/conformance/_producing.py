"""The WorkQueue contract, run against every backend (memory, SQLite, PostgreSQL).

"Now" is a ManualClock the tests advance, so leases expire without any real sleep.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
import pytest
import trio

from ... import (
    ConfigError,
    DuplicateItem,
    ItemNotFound,
)
from ...job import (
    MAX_ID_LENGTH,
    MAX_JSON_DEPTH,
    MAX_NAME_LENGTH,
    ItemState,
    NewItem,
    SettleKind,
    Settlement,
    storable_text,
)
from ...queues import WorkQueue
from ._clock import START, ManualClock
from ._support import SEED_WRITES, S, claim_one, needs, seed_writes

WIDE = "\U0001f600"  # four bytes in UTF-8: the widest character an index entry holds


SURROGATE = "bad \udcff byte"


def nested(depth: int) -> object:
    """A config of *depth* nested lists and objects, alternating."""
    value: object = 1
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@attrs.frozen
class _Watering:
    litres: float
    plants: tuple[str, ...] = ()


class ProducingContract:
    """Enqueueing and reading items: fields, limits, unstorable values, queues and priorities."""

    # -- producing and inspecting
    async def test_enqueue_defaults(self, queue: WorkQueue) -> None:
        """A new item is queued, due now, with an empty config, no lease and no errors."""
        item = await queue.enqueue("spec")
        assert item.state is ItemState.QUEUED
        assert item.due_at == item.created_at == item.updated_at == START
        assert item.config == {}
        assert (item.lease_version, item.lease_owner, item.lease_expires_at) == (0, None, None)
        assert (item.error_count, item.last_error, item.cancel_requested) == (0, None, False)
        assert await queue.get(item.id) == item

    async def test_enqueue_stores_every_field(self, queue: WorkQueue) -> None:
        """Config, tenant, subject, due time, id and key come back exactly as given."""
        config = {"a": [1, 2.5, None, True], "b": {"c": "ü"}, "n": -3}
        item = await queue.enqueue(
            "spec",
            config=config,
            tenant_id="t",
            subject_id="s",
            due_at=START + 90 * S,
            item_id="id-1",
            idempotency_key="key-1",
        )
        got = await queue.get("id-1")
        assert got == item
        assert (got.config, got.tenant_id, got.subject_id) == (config, "t", "s")
        assert (got.due_at, got.idempotency_key) == (START + 90 * S, "key-1")

    async def test_enqueue_refuses_bad_arguments(self, queue: WorkQueue) -> None:
        """A config that is not JSON, or an empty spec id, is refused and nothing is stored."""
        with pytest.raises(ConfigError):
            await queue.enqueue("spec", config={"x": object()})
        with pytest.raises(ValueError, match="spec_id"):
            await queue.enqueue("")
        with pytest.raises(ValueError, match="timezone-aware"):
            await queue.enqueue("spec", due_at=dt.datetime(2030, 1, 1))
        assert await queue.counts() == {}

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("item_id", "i" * (MAX_ID_LENGTH + 1)),
            ("idempotency_key", "k" * (MAX_ID_LENGTH + 1)),
            ("idempotency_key", ""),
            ("spec_id", "s" * (MAX_NAME_LENGTH + 1)),
            ("queue", "q" * (MAX_NAME_LENGTH + 1)),
            ("concurrency_key", "c" * (MAX_NAME_LENGTH + 1)),
        ],
    )
    async def test_identifiers_past_their_limit_are_refused_alike(
        self, queue: WorkQueue, field: str, value: str
    ) -> None:
        """An empty or over-long identifier is refused up front with the field and the limit named,
        the same on every backend (PostgreSQL used to refuse a long id or key alone, when writing
        its index entry, with an opaque error); nothing is written, alone or in a batch."""
        limit = MAX_ID_LENGTH if field in ("item_id", "idempotency_key") else MAX_NAME_LENGTH
        fields: dict[str, Any] = {"spec_id": "spec", field: value}
        rule = f"{field} must be a non-empty string of at most {limit} characters"
        with pytest.raises(ValueError, match=rule):
            await queue.enqueue(fields.pop("spec_id"), **fields)
        entry = NewItem(**{"spec_id": "spec", field: value})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=f"^entry 1: {rule}"):
            await queue.enqueue_many([NewItem(spec_id="spec"), entry])
        assert await queue.counts() == {}

    async def test_identifiers_at_their_limit_are_stored_on_every_backend(
        self, queue: WorkQueue
    ) -> None:
        """The longest id, key, spec id, queue name and concurrency key, in four-byte characters,
        fit every backend's indexes: stored, found by id and key, claimed and settled."""
        item_id, key = WIDE * MAX_ID_LENGTH, WIDE * (MAX_ID_LENGTH - 1) + "k"
        spec, name = WIDE * MAX_NAME_LENGTH, WIDE * (MAX_NAME_LENGTH - 1) + "q"
        item = await queue.enqueue(
            spec,
            item_id=item_id,
            idempotency_key=key,
            queue=name,
            concurrency_key=WIDE * MAX_NAME_LENGTH,
        )
        assert (await queue.get(item_id)).idempotency_key == key
        assert (await queue.enqueue(spec, idempotency_key=key, queue=name)).id == item.id
        [claimed] = await queue.claim_due([spec], "w1", 30, 1, queue=name)
        assert claimed.id == item_id
        done = Settlement(
            item_id=item_id, lease_version=claimed.lease_version, kind=SettleKind.COMPLETE
        )
        assert await queue.settle_many([done]) == [True]
        assert (await queue.get(item_id)).state is ItemState.COMPLETED

    async def test_idempotent_enqueue(self, queue: WorkQueue, clock: ManualClock) -> None:
        """An enqueue with a key an item already carries returns that item, in any state."""
        first = await queue.enqueue("spec", idempotency_key="k", config={"v": 1})
        again = await queue.enqueue("spec", idempotency_key="k", config={"v": 2})
        assert again == first
        claimed = await claim_one(queue)
        await seed_writes(queue).complete(claimed.id, claimed.lease_version)
        clock.advance(5)
        after = await queue.enqueue("other", idempotency_key="k", item_id="new-id")
        assert after.id == first.id
        assert after.state is ItemState.COMPLETED
        assert await queue.counts() == {("spec", ItemState.COMPLETED): 1}

    async def test_duplicate_item_id(self, queue: WorkQueue) -> None:
        """An explicit id that exists already raises DuplicateItem and changes nothing."""
        item = await queue.enqueue("spec", item_id="x", config={"v": 1})
        with pytest.raises(DuplicateItem):
            await queue.enqueue("spec", item_id="x", config={"v": 2})
        assert await queue.get("x") == item

    async def test_get_missing(self, queue: WorkQueue) -> None:
        """Getting an unknown id raises ItemNotFound."""
        with pytest.raises(ItemNotFound):
            await queue.get("nope")

    async def test_counts_and_list_items(self, queue: WorkQueue) -> None:
        """Counts group by (spec, state); listing filters by both and orders by due time, then
        id."""
        await queue.enqueue("a", item_id="a2", due_at=START + 2 * S)
        await queue.enqueue("a", item_id="a1", due_at=START + 2 * S)
        await queue.enqueue("a", item_id="a0", due_at=START + 9 * S)
        await queue.enqueue("b", item_id="b0", due_at=START - S)
        [b0] = await queue.claim_due(["b"], "w", 10, 5)
        assert await queue.counts() == {("a", ItemState.QUEUED): 3, ("b", ItemState.RUNNING): 1}
        assert [i.id for i in await queue.list_items()] == ["b0", "a1", "a2", "a0"]
        assert [i.id for i in await queue.list_items(limit=2)] == ["b0", "a1"]
        assert await queue.list_items(limit=0) == []
        assert [i.id for i in await queue.list_items(spec_ids=["a"])] == ["a1", "a2", "a0"]
        running = await queue.list_items(states=[ItemState.RUNNING])
        assert running == [await queue.get("b0")]
        assert running[0].lease_version == b0.lease_version
        assert await queue.list_items(states=[ItemState.DEAD]) == []
        assert await queue.list_items(states=[ItemState.QUEUED], spec_ids=["b"]) == []
        with pytest.raises(ValueError, match="limit"):
            await queue.list_items(limit=-1)

    # -- unstorable values (issue 12, class 1)
    async def test_enqueue_refuses_what_no_backend_can_store(self, queue: WorkQueue) -> None:
        """Lone surrogates, NULs and nesting past MAX_JSON_DEPTH are a ConfigError naming the
        field."""
        bad_configs = [
            ({"x": SURROGATE}, "config must not contain lone surrogates"),
            ({SURROGATE: 1}, "config must not contain lone surrogates"),
            (["\x00"], "config must not contain NUL"),
            (nested(MAX_JSON_DEPTH + 1), "config is nested too deeply .more than 64 levels."),
            (nested(50_000), "config is nested too deeply .more than 64 levels."),
        ]
        for config, message in bad_configs:
            with pytest.raises(ConfigError, match=message):
                await queue.enqueue("spec", config=config)
        for field in ("tenant_id", "subject_id", "item_id", "idempotency_key"):
            with pytest.raises(ConfigError, match=f"{field} must not contain lone surrogates"):
                await queue.enqueue("spec", **{field: SURROGATE})  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="spec_id must not contain lone surrogates"):
            await queue.enqueue(SURROGATE)
        assert await queue.counts() == {}
        deepest = await queue.enqueue("spec", config=nested(MAX_JSON_DEPTH))
        assert (await queue.get(deepest.id)).config == nested(MAX_JSON_DEPTH)

    async def test_reschedule_refuses_an_unstorable_config(self, queue: WorkQueue) -> None:
        """A Reschedule's new config is checked like an enqueued one; the item keeps its lease."""
        await queue.enqueue("spec", item_id="x")
        item = await claim_one(queue)
        for config in ({"x": SURROGATE}, nested(MAX_JSON_DEPTH + 1)):
            with pytest.raises(ConfigError, match="config"):
                await seed_writes(queue).reschedule("x", item.lease_version, START, config)
        assert (await queue.get("x")).state is ItemState.RUNNING

    @needs(SEED_WRITES)
    async def test_error_text_is_stored_escaped_never_dropped(self, queue: WorkQueue) -> None:
        """A NUL or a lone surrogate in an error is written as an escape, by every write."""
        await queue.enqueue("spec", item_id="m")
        await queue.enqueue("spec", item_id="s")
        m, s = await queue.claim_due(["spec"], "w", 30, 2)
        await seed_writes(queue).mark_error("m", m.lease_version, f"{SURROGATE} and \x00")
        assert (await queue.get("m")).last_error == "bad \\udcff byte and \\x00"
        [applied] = await queue.settle_many(
            [
                Settlement(
                    item_id="s", lease_version=s.lease_version, kind=SettleKind.DEAD, error="\udcff"
                )
            ]
        )
        assert applied
        assert (await queue.get("s")).last_error == "\\udcff"
        assert storable_text("plain ü") == "plain ü"

    async def test_a_poisoned_entry_never_takes_its_batch_down(self, queue: WorkQueue) -> None:
        """One unstorable entry of settle_many goes dead, saying why; its batch-mates are
        settled."""
        for n in range(4):
            await queue.enqueue("spec", item_id=f"i{n}")
        v = {i.id: i.lease_version for i in await queue.claim_due(["spec"], "w", 30, 4)}
        results = await queue.settle_many(
            [
                Settlement(item_id="i0", lease_version=v["i0"], kind=SettleKind.COMPLETE),
                Settlement(
                    item_id="i1", lease_version=v["i1"], kind=SettleKind.RETRY, error=SURROGATE
                ),
                Settlement(
                    item_id="i2",
                    lease_version=v["i2"],
                    kind=SettleKind.RESCHEDULE,
                    at=START,
                    config={"x": SURROGATE},
                ),
                Settlement(item_id="i3", lease_version=v["i3"], kind=SettleKind.CONTINUE, delay=5),
            ]
        )
        assert results == [True, True, True, True]
        got = {i.id: i for i in await queue.list_items()}
        assert got["i0"].state is ItemState.COMPLETED
        assert (got["i1"].state, got["i1"].last_error) == (ItemState.QUEUED, "bad \\udcff byte")
        assert got["i2"].state is ItemState.DEAD
        assert got["i2"].last_error == (
            "the reschedule outcome could not be stored: config must not contain lone surrogates "
            "(such as '\\udcff') in its strings"
        )
        assert got["i2"].config == {}
        assert (got["i3"].state, got["i3"].due_at) == (ItemState.QUEUED, START + 5 * S)
        assert await queue.claim_due(["spec"], "w", 30, 10) == [await queue.get("i1")]

    # -- listing with a cursor (class 11)
    async def test_list_items_pages_with_a_cursor(self, queue: WorkQueue) -> None:
        """Pages after an item's id cover the filtered list exactly once, in (due_at, id) order."""
        for n in range(9):
            await queue.enqueue("a" if n % 3 else "b", item_id=f"i{n}", due_at=START + (n % 4) * S)
        [done] = await queue.claim_due(["a", "b"], "w", 30, 1)
        await seed_writes(queue).complete(done.id, done.lease_version)
        await queue.claim_due(["b"], "w", 30, 1)
        for states, specs in [
            (None, None),
            ([ItemState.QUEUED], None),
            ([ItemState.QUEUED, ItemState.COMPLETED], ["a"]),
            (None, ["b"]),
        ]:
            everything = [i.id for i in await queue.list_items(states=states, spec_ids=specs)]
            pages: list[str] = []
            after = None
            while True:
                page = await queue.list_items(states=states, spec_ids=specs, limit=2, after=after)
                if not page:
                    break
                pages += [i.id for i in page]
                after = page[-1].id
            assert pages == everything
        with pytest.raises(ItemNotFound):
            await queue.list_items(after="nope")

    # -- priorities, named queues, pausing
    async def test_claim_orders_by_priority_then_due_time_then_id(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A lower priority number is claimed first; within a priority, earlier due, then id."""
        await queue.enqueue("spec", item_id="late-urgent", priority=-5, due_at=START - S)
        await queue.enqueue("spec", item_id="b-normal", due_at=START - 9 * S)
        await queue.enqueue("spec", item_id="a-normal", due_at=START - 9 * S)
        await queue.enqueue("spec", item_id="lazy", priority=7, due_at=START - 60 * S)
        await queue.enqueue("spec", item_id="urgent", priority=-5, due_at=START - 2 * S)
        claimed = await queue.claim_due(["spec"], "w", 30, 10)
        assert [i.id for i in claimed] == ["urgent", "late-urgent", "a-normal", "b-normal", "lazy"]
        assert [i.priority for i in claimed] == [-5, -5, 0, 0, 7]

    async def test_an_expired_lease_is_rescued_in_priority_order(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Rescue is part of claiming, in the same (priority, due_at, id) order."""
        await queue.enqueue("spec", item_id="stuck", priority=-1)
        await claim_one(queue, lease=5)
        await queue.enqueue("spec", item_id="fresh")
        clock.advance(6)
        assert [i.id for i in await queue.claim_due(["spec"], "w2", 30, 2)] == ["stuck", "fresh"]

    async def test_priority_is_range_checked(self, queue: WorkQueue) -> None:
        """A priority outside -100..100, or not an int, is refused naming the rule; nothing
        stored."""
        for bad in (-101, 101, 1.5, True, "1"):
            with pytest.raises(ValueError, match=r"priority must be an integer from -100"):
                await queue.enqueue("spec", priority=bad)  # type: ignore[arg-type]
        for bad_queue in ("", 5):
            with pytest.raises(ValueError, match="queue must be a non-empty string"):
                await queue.enqueue("spec", queue=bad_queue)  # type: ignore[arg-type]
        assert await queue.list_items() == []

    async def test_a_claim_serves_one_named_queue(self, queue: WorkQueue) -> None:
        """Items carry their queue (default "default"); a claim takes only its queue's items."""
        plain = await queue.enqueue("spec", item_id="plain")
        mail = await queue.enqueue("spec", item_id="mail-1", queue="mail")
        assert (plain.queue, mail.queue) == ("default", "mail")
        assert (await queue.get("mail-1")).queue == "mail"
        assert [i.id for i in await queue.claim_due(["spec"], "w", 30, 10)] == ["plain"]
        assert [i.id for i in await queue.claim_due(["spec"], "w", 30, 10, queue="mail")] == [
            "mail-1"
        ]

    async def test_a_paused_queue_is_not_claimed_until_resumed(
        self, queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Pausing stops claims from that queue only; running items still settle; resume
        restores."""
        await queue.enqueue("spec", item_id="running", queue="mail")
        [running] = await queue.claim_due(["spec"], "w", 30, 1, queue="mail")
        await queue.enqueue("spec", item_id="waiting", queue="mail")
        await queue.enqueue("spec", item_id="other")
        assert await queue.pause_queue("mail") is True
        assert await queue.pause_queue("mail") is False
        assert await queue.claim_due(["spec"], "w", 30, 10, queue="mail") == []
        assert await queue.next_due_at(["spec"], queues=["mail"]) is None
        assert await queue.next_due_at(["spec"]) == START
        await seed_writes(queue).complete("running", running.lease_version)
        assert (await queue.get("running")).state is ItemState.COMPLETED
        infos = {info.name: info for info in await queue.list_queues()}
        assert (infos["mail"].paused, infos["mail"].paused_at) == (True, START)
        assert infos["mail"].counts == {ItemState.QUEUED: 1, ItemState.COMPLETED: 1}
        assert not infos["default"].paused
        assert [i.id for i in await queue.claim_due(["spec"], "w", 30, 10)] == ["other"]
        assert await queue.resume_queue("mail") is True
        assert await queue.resume_queue("mail") is False
        assert [i.id for i in await queue.claim_due(["spec"], "w", 30, 10, queue="mail")] == [
            "waiting"
        ]

    async def test_pausing_a_queue_with_no_items_lists_it(self, queue: WorkQueue) -> None:
        """A paused queue is listed even before it holds an item, so an operator sees the pause."""
        await queue.pause_queue("later")
        [info] = await queue.list_queues()
        assert (info.name, info.paused, dict(info.counts)) == ("later", True, {})

    async def test_wait_for_work_ignores_unserved_and_paused_queues(self, queue: WorkQueue) -> None:
        """Due items of another queue, or of a paused one, do not wake a waiter of its queues."""
        await queue.enqueue("spec", queue="mail")
        await queue.enqueue("spec", queue="paused")
        await queue.pause_queue("paused")
        with trio.move_on_after(0.2) as scope:
            await queue.wait_for_work(["spec"], queues=["default", "paused"])
        assert scope.cancelled_caught
        with trio.fail_after(5):
            await queue.wait_for_work(["spec"], queues=["mail"])

    async def test_enqueue_accepts_an_attrs_config(self, queue: WorkQueue) -> None:
        """An attrs config instance is unstructured by the shared converter, on every backend."""
        item = await queue.enqueue("spec", config=_Watering(litres=1.5, plants=("fern",)))
        assert item.config == {"litres": 1.5, "plants": ["fern"]}
        assert (await queue.get(item.id)).config == {"litres": 1.5, "plants": ["fern"]}

    async def test_enqueue_stores_an_evaluation_timeout(self, queue: WorkQueue) -> None:
        """An item's evaluation timeout comes back as given; a bad one is refused, nothing
        stored."""
        item = await queue.enqueue("spec", item_id="t", evaluation_timeout=2.5)
        assert (item.timeout, (await queue.get("t")).timeout) == (2.5, 2.5)
        assert (await queue.enqueue("spec")).timeout is None
        for bad in (0, -1, float("inf"), "5"):
            with pytest.raises(ValueError, match="timeout must be a positive number"):
                await queue.enqueue("spec", item_id="bad", evaluation_timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(ItemNotFound):
            await queue.get("bad")

    async def test_a_completed_item_keeps_its_result(self, queue: WorkQueue) -> None:
        """A complete settlement's JSON result is stored with the item, single and batched."""
        await queue.enqueue("spec", item_id="one")
        await queue.enqueue("spec", item_id="two")
        one, two = await queue.claim_due(["spec"], "w", 30, 2)
        await queue.settle_many(
            [
                Settlement(
                    item_id="one",
                    lease_version=one.lease_version,
                    kind=SettleKind.COMPLETE,
                    result={"sent": 3, "to": ["a"]},
                ),
                Settlement(
                    item_id="two", lease_version=two.lease_version, kind=SettleKind.COMPLETE
                ),
            ]
        )
        assert (await queue.get("one")).result == {"sent": 3, "to": ["a"]}
        assert (await queue.get("two")).result is None

    async def test_an_unstorable_result_makes_only_its_entry_dead(self, queue: WorkQueue) -> None:
        """A result no backend can store becomes that entry's dead outcome, saying why."""
        await queue.enqueue("spec", item_id="bad")
        [bad] = await queue.claim_due(["spec"], "w", 30, 1)
        settled = await queue.settle_many(
            [
                Settlement(
                    item_id="bad",
                    lease_version=bad.lease_version,
                    kind=SettleKind.COMPLETE,
                    result={"x": "\x00"},
                )
            ]
        )
        assert settled == [True]
        got = await queue.get("bad")
        assert got.state is ItemState.DEAD
        assert got.last_error is not None
        assert got.last_error.startswith("the complete outcome could not be stored: result")
