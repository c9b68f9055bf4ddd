"""The WorkQueue contract, run against every backend (memory, SQLite, PostgreSQL).

"Now" is a ManualClock the tests advance, so leases expire without any real sleep.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest
import trio

from trio_supervise import (
    ConfigError,
    DuplicateItem,
    ItemNotFound,
    ItemStateError,
    LeaseLost,
)
from trio_supervise.job import (
    MAX_ID_LENGTH,
    MAX_JSON_DEPTH,
    MAX_NAME_LENGTH,
    storable_text,
)
from trio_supervise.queues import (
    MAX_ERRORS,
    ErrorEntry,
    ItemState,
    Lease,
    LeaseStatus,
    NewItem,
    SettleKind,
    Settlement,
    WorkItem,
    WorkQueue,
)

from .conftest import START, ManualClock

S = dt.timedelta(seconds=1)


async def claim_one(queue: WorkQueue, worker: str = "w1", lease: float = 30) -> WorkItem:
    [item] = await queue.claim_due(["spec"], worker, lease, 1)
    return item


# -- producing and inspecting ----------------------------------------------------------------


async def test_enqueue_defaults(queue: WorkQueue) -> None:
    """A new item is queued, due now, with an empty config, no lease and no errors."""
    item = await queue.enqueue("spec")
    assert item.state is ItemState.QUEUED
    assert item.due_at == item.created_at == item.updated_at == START
    assert item.config == {}
    assert (item.lease_version, item.lease_owner, item.lease_expires_at) == (0, None, None)
    assert (item.error_count, item.last_error, item.cancel_requested) == (0, None, False)
    assert await queue.get(item.id) == item


async def test_enqueue_stores_every_field(queue: WorkQueue) -> None:
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


async def test_enqueue_refuses_bad_arguments(queue: WorkQueue) -> None:
    """A config that is not JSON, or an empty spec id, is refused and nothing is stored."""
    with pytest.raises(ConfigError):
        await queue.enqueue("spec", config={"x": object()})
    with pytest.raises(ValueError, match="spec_id"):
        await queue.enqueue("")
    with pytest.raises(ValueError, match="timezone-aware"):
        await queue.enqueue("spec", due_at=dt.datetime(2030, 1, 1))
    assert await queue.counts() == {}


WIDE = "\U0001f600"  # four bytes in UTF-8: the widest character an index entry holds


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
    queue: WorkQueue, field: str, value: str
) -> None:
    """An empty or over-long identifier is refused up front with the field and the limit named,
    the same on every backend (PostgreSQL used to refuse a long id or key alone, when writing
    its index entry, with an opaque error); nothing is written, alone or in a batch."""
    limit = MAX_ID_LENGTH if field in ("item_id", "idempotency_key") else MAX_NAME_LENGTH
    fields: dict[str, Any] = {"spec_id": "spec", field: value}
    rule = f"{field} must be a non-empty string of at most {limit} characters"
    with pytest.raises(ValueError, match=rule):
        await queue.enqueue(fields.pop("spec_id"), **fields)
    entry = NewItem(**{"spec_id": "spec", field: value})
    with pytest.raises(ValueError, match=f"^entry 1: {rule}"):
        await queue.enqueue_many([NewItem(spec_id="spec"), entry])
    assert await queue.counts() == {}


async def test_identifiers_at_their_limit_are_stored_on_every_backend(queue: WorkQueue) -> None:
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


async def test_idempotent_enqueue(queue: WorkQueue, clock: ManualClock) -> None:
    """An enqueue with a key an item already carries returns that item, in any state."""
    first = await queue.enqueue("spec", idempotency_key="k", config={"v": 1})
    again = await queue.enqueue("spec", idempotency_key="k", config={"v": 2})
    assert again == first
    claimed = await claim_one(queue)
    await queue.complete(claimed.id, claimed.lease_version)
    clock.advance(5)
    after = await queue.enqueue("other", idempotency_key="k", item_id="new-id")
    assert after.id == first.id
    assert after.state is ItemState.COMPLETED
    assert await queue.counts() == {("spec", ItemState.COMPLETED): 1}


async def test_duplicate_item_id(queue: WorkQueue) -> None:
    """An explicit id that exists already raises DuplicateItem and changes nothing."""
    item = await queue.enqueue("spec", item_id="x", config={"v": 1})
    with pytest.raises(DuplicateItem):
        await queue.enqueue("spec", item_id="x", config={"v": 2})
    assert await queue.get("x") == item


async def test_get_missing(queue: WorkQueue) -> None:
    """Getting an unknown id raises ItemNotFound."""
    with pytest.raises(ItemNotFound):
        await queue.get("nope")


async def test_counts_and_list_items(queue: WorkQueue) -> None:
    """Counts group by (spec, state); listing filters by both and orders by due time, then id."""
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


# -- claiming --------------------------------------------------------------------------------


async def test_claim_orders_by_due_time_then_id(queue: WorkQueue) -> None:
    """Claims come in due-time order, ties broken by id, and stop at the limit."""
    for item_id, offset in [("c", 0), ("b", -5), ("a", 0), ("d", -5), ("e", -9)]:
        await queue.enqueue("spec", item_id=item_id, due_at=START + offset * S)
    first = await queue.claim_due(["spec"], "w", 30, 3)
    assert [i.id for i in first] == ["e", "b", "d"]
    rest = await queue.claim_due(["spec"], "w", 30, 10)
    assert [i.id for i in rest] == ["a", "c"]
    assert await queue.claim_due(["spec"], "w", 30, 10) == []


async def test_changing_a_returned_item_in_place_changes_nothing_stored(queue: WorkQueue) -> None:
    """Every item a queue hands out (enqueue's, a claim's, a settle-and-claim's, a read's, a
    listing's) holds its own config and result: a driver or caller that changes them in place
    (a nested list, a key added) changes nothing stored, as a durable backend, which decodes
    each row afresh, never could. Nor does changing the config given to enqueue after the call."""
    config: dict[str, Any] = {"steps": [1, {"n": 2}], "flat": "x"}
    [done] = await queue.enqueue_many([NewItem(spec_id="spec", item_id="a", config=config)])
    config["steps"].append("caller")
    config["new"] = True
    assert done.item is not None
    done.item.config["steps"][1]["n"] = "enqueue"  # type: ignore[index]
    original = {"steps": [1, {"n": 2}], "flat": "x"}
    [claimed] = await queue.claim_due(["spec"], "w", 30, 1)
    assert claimed.config == original
    claimed.config["steps"].append("driver")  # type: ignore[index,union-attr]
    claimed.config["flat"] = "driver"  # type: ignore[index]
    assert (await queue.get("a")).config == original
    read = await queue.get("a")
    read.config["steps"][1]["n"] = "reader"  # type: ignore[index]
    [listed] = await queue.list_items(spec_ids=["spec"])
    listed.config.clear()  # type: ignore[union-attr]
    assert (await queue.get("a")).config == original
    await queue.settle_many(
        [
            Settlement(
                item_id="a",
                lease_version=claimed.lease_version,
                kind=SettleKind.COMPLETE,
                result={"sent": [1]},
            )
        ]
    )
    finished = await queue.get("a")
    finished.result["sent"].append(2)  # type: ignore[index,union-attr]
    assert (await queue.get("a")).result == {"sent": [1]}
    await queue.retry("a")
    _, [again] = await queue.settle_and_claim([], ["spec"], "w", 30, 1)
    again.config["steps"].append("again")  # type: ignore[index,union-attr]
    again.result["sent"].append("again")  # type: ignore[index,union-attr]
    stored = await queue.get("a")
    assert (stored.config, stored.result) == (original, {"sent": [1]})


async def test_a_runner_s_settlement_is_stored_as_is_and_a_changed_copy_checked_again(
    queue: WorkQueue,
) -> None:
    """A runner's own settlement (its config and result checked and copied once, by the runner)
    is stored as given on every backend; one evolved from it (a wrapper changing the config or
    result) is checked like any hand-built one: an unstorable value makes that entry dead,
    saying why, and the batch goes on."""
    from trio_supervise import Reschedule, Stop
    from trio_supervise.job import outcome_settlement

    for item_id in ("kept", "done", "bad-config", "bad-result"):
        await queue.enqueue("spec", item_id=item_id, config={"n": 0})
    items = {item.id: item for item in await queue.claim_due(["spec"], "w", 30, 4)}
    at = START + dt.timedelta(days=1)

    def settled(outcome: object, item_id: str) -> Settlement:
        return outcome_settlement(outcome, items[item_id], driver_name="d", requeue_delay=1.0)

    batch = [
        settled(Reschedule(at, {"n": 1, "deep": [{"x": "ü"}]}), "kept"),
        settled(Stop({"sent": [1, 2]}), "done"),
        attrs.evolve(settled(Reschedule(at, {"n": 1}), "bad-config"), config={"x": "\udcff"}),
        attrs.evolve(settled(Stop({"ok": True}), "bad-result"), result={"x": "\x00"}),
    ]
    assert await queue.settle_many(batch) == [True, True, True, True]
    kept = await queue.get("kept")
    assert (kept.state, kept.config, kept.due_at) == (
        ItemState.QUEUED,
        {"n": 1, "deep": [{"x": "ü"}]},
        at,
    )
    assert (await queue.get("done")).result == {"sent": [1, 2]}
    for item_id, kind in (("bad-config", "reschedule"), ("bad-result", "complete")):
        bad = await queue.get(item_id)
        assert bad.state is ItemState.DEAD, item_id
        assert bad.last_error is not None
        assert bad.last_error.startswith(f"the {kind} outcome could not be stored"), bad.last_error


async def test_a_claimed_item_is_the_stored_item(queue: WorkQueue, clock: ManualClock) -> None:
    """A claim returns every field as stored (the same item a read returns after it), however
    it is claimed: a plain claim, a settle-and-claim, the keyed path; with a rich config, an
    error history, a result, a uniqueness period and a timeout (the claims' decoders read
    their rows their own way)."""
    config = {"a": [1, 2.5, None, True, {"deep": ["ü", "\u2603", 10**15]}], "b": "", "c": {}}
    await queue.enqueue(
        "spec",
        item_id="rich",
        config=config,
        tenant_id="t",
        subject_id="s",
        idempotency_key="k",
        unique=dt.timedelta(hours=1),
        priority=-2,
        queue="named",
        evaluation_timeout=2.5,
    )
    await queue.enqueue("spec", item_id="keyed", concurrency_key="ck", concurrency_limit=2)
    await queue.enqueue("spec", item_id="empty", config=[])
    await queue.enqueue("spec", item_id="list", config=["x", {}])
    [claimed] = await queue.claim_due(["spec"], "w1", 30, 5, queue="named")
    assert claimed == await queue.get("rich")
    assert (claimed.config, claimed.timeout, claimed.priority) == (config, 2.5, -2)
    assert claimed.unique_until == START + dt.timedelta(hours=1)
    assert claimed.lease_expires_at == START + 30 * S
    # An error history and a result, then claimed again (a retried completed item keeps it).
    await queue.settle_many(
        [
            Settlement(
                item_id="rich",
                lease_version=claimed.lease_version,
                kind=SettleKind.RETRY,
                error="boom\nline 2",
            )
        ]
    )
    [again] = await queue.claim_due(["spec"], "w2", 30, 5, queue="named")
    assert again == await queue.get("rich")
    assert (again.error_count, again.last_error) == (1, "boom\nline 2")
    assert [e.error for e in again.errors] == ["boom\nline 2"]
    await queue.settle_many(
        [
            Settlement(
                item_id="rich",
                lease_version=again.lease_version,
                kind=SettleKind.COMPLETE,
                result={"r": [1, "ü"]},
            )
        ]
    )
    clock.advance(1)
    await queue.retry("rich")
    # The default queue's items, through settle_and_claim and the keyed path.
    _, claimed_named = await queue.settle_and_claim([], ["spec"], "w3", 30, 5, queue="named")
    assert claimed_named == [await queue.get("rich")]
    assert claimed_named[0].result == {"r": [1, "ü"]}
    assert len(claimed_named[0].errors) == 1
    first = await queue.claim_due(["spec"], "w4", 30, 1)
    [settled], rest = await queue.settle_and_claim(
        [
            Settlement(
                item_id=first[0].id,
                lease_version=first[0].lease_version,
                kind=SettleKind.RELEASE,
            )
        ],
        ["spec"],
        "w4",
        30,
        5,
    )
    assert settled
    claimed_all = first[1:] + rest
    assert sorted(item.id for item in claimed_all) == ["empty", "keyed", "list"]
    for item in claimed_all:
        assert item == await queue.get(item.id)
    by_id = {item.id: item for item in claimed_all}
    assert by_id["empty"].config == []
    assert by_id["list"].config == ["x", {}]
    assert (by_id["keyed"].concurrency_key, by_id["keyed"].concurrency_limit) == ("ck", 2)


async def test_claim_waits_for_due_time(queue: WorkQueue, clock: ManualClock) -> None:
    """An item is claimable from its due time on, and not a microsecond before."""
    await queue.enqueue("spec", due_at=START + 10 * S)
    clock.advance(10 - 1e-6)
    assert await queue.claim_due(["spec"], "w", 30, 1) == []
    clock.advance(1e-6)
    assert len(await queue.claim_due(["spec"], "w", 30, 1)) == 1


async def test_claim_filters_by_spec(queue: WorkQueue) -> None:
    """Only items of the named specs are claimed; no specs claims nothing."""
    await queue.enqueue("a", item_id="1")
    await queue.enqueue("b", item_id="2")
    await queue.enqueue("c", item_id="3")
    assert await queue.claim_due([], "w", 30, 10) == []
    assert [i.id for i in await queue.claim_due(["a", "c"], "w", 30, 10)] == ["1", "3"]
    assert [i.id for i in await queue.claim_due(["a", "b", "c"], "w", 30, 10)] == ["2"]


async def test_claim_limits_and_arguments(queue: WorkQueue) -> None:
    """A zero limit claims nothing; a negative limit or a lease that is not positive is refused."""
    await queue.enqueue("spec")
    assert await queue.claim_due(["spec"], "w", 30, 0) == []
    with pytest.raises(ValueError, match="limit"):
        await queue.claim_due(["spec"], "w", 30, -1)
    for lease in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="lease"):
            await queue.claim_due(["spec"], "w", lease, 1)
    assert (await queue.list_items())[0].state is ItemState.QUEUED


async def test_claim_takes_a_lease(queue: WorkQueue) -> None:
    """A claim sets the owner, the expiry (now + lease) and a strictly larger version."""
    item = await queue.enqueue("spec")
    claimed = await claim_one(queue, "w1", 12.5)
    assert claimed.id == item.id
    assert claimed.state is ItemState.RUNNING
    assert claimed.lease_owner == "w1"
    assert claimed.lease_expires_at == START + 12.5 * S
    assert claimed.lease_version > item.lease_version
    assert claimed.lease == Lease(item.id, claimed.lease_version, "w1")
    assert await queue.get(item.id) == claimed


async def test_lease_expiry_and_rescue(queue: WorkQueue, clock: ManualClock) -> None:
    """A running item is claimable again once its lease expires, under a new version."""
    await queue.enqueue("spec")
    old = await claim_one(queue, "w1", 10)
    clock.advance(9.999)
    assert await queue.claim_due(["spec"], "w2", 10, 5) == []
    clock.advance(0.001)
    new = await claim_one(queue, "w2", 10)
    assert new.id == old.id
    assert new.lease_owner == "w2"
    assert new.lease_version > old.lease_version
    assert new.lease_expires_at == START + 20 * S
    with pytest.raises(LeaseLost):
        await queue.complete(old.id, old.lease_version)
    with pytest.raises(LeaseLost):
        await queue.renew(old.id, "w1", old.lease_version, 10)
    assert await queue.get(new.id) == new


async def test_an_expired_lease_can_still_be_renewed_until_rescued(
    queue: WorkQueue, clock: ManualClock
) -> None:
    """Expiry alone takes nothing away: the owner may renew until someone else claims."""
    await queue.enqueue("spec")
    item = await claim_one(queue, "w1", 10)
    clock.advance(15)
    assert await queue.renew(item.id, "w1", item.lease_version, 10) is LeaseStatus.HELD
    assert (await queue.get(item.id)).lease_expires_at == START + 25 * S
    assert await queue.claim_due(["spec"], "w2", 10, 1) == []


async def test_concurrent_claimers_never_share_an_item(queue: WorkQueue) -> None:
    """Many claimers at once receive disjoint sets of items, and together all of them."""
    ids = {f"item-{n:03}" for n in range(60)}
    for item_id in sorted(ids):
        await queue.enqueue("spec", item_id=item_id)
    claims: dict[str, list[str]] = {}

    async def claimer(worker: str) -> None:
        mine = claims.setdefault(worker, [])
        while True:
            got = await queue.claim_due(["spec"], worker, 60, 3)
            if not got:
                return
            mine.extend(item.id for item in got)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for n in range(12):
                nursery.start_soon(claimer, f"w{n}")
    everything = [item_id for mine in claims.values() for item_id in mine]
    assert len(everything) == len(set(everything)) == 60
    assert set(everything) == ids
    for worker, mine in claims.items():
        for item_id in mine:
            assert (await queue.get(item_id)).lease_owner == worker


# -- renewing --------------------------------------------------------------------------------


async def test_renew_extends_the_lease(queue: WorkQueue, clock: ManualClock) -> None:
    """Renewal sets the expiry to now + lease and says the lease is held."""
    await queue.enqueue("spec")
    item = await claim_one(queue, "w1", 10)
    clock.advance(8)
    assert await queue.renew(item.id, "w1", item.lease_version, 20) is LeaseStatus.HELD
    got = await queue.get(item.id)
    assert got.lease_expires_at == START + 28 * S
    assert got.lease_version == item.lease_version
    clock.advance(19)
    assert await queue.claim_due(["spec"], "w2", 10, 1) == []


async def test_renew_checks_owner_and_version(queue: WorkQueue) -> None:
    """Renewal by another owner, an old version, or of an unknown item is refused."""
    await queue.enqueue("spec")
    item = await claim_one(queue, "w1", 10)
    with pytest.raises(LeaseLost):
        await queue.renew(item.id, "w2", item.lease_version, 10)
    with pytest.raises(LeaseLost):
        await queue.renew(item.id, "w1", item.lease_version + 1, 10)
    with pytest.raises(LeaseLost):
        await queue.renew("nope", "w1", 1, 10)
    with pytest.raises(ValueError, match="lease"):
        await queue.renew(item.id, "w1", item.lease_version, 0)
    assert await queue.get(item.id) == item


async def test_renew_many_mixed(queue: WorkQueue, clock: ManualClock) -> None:
    """renew_many renews the fresh leases and reports stale ones as LOST, changing nothing."""
    for n in range(4):
        await queue.enqueue("spec", item_id=f"i{n}")
    items = await queue.claim_due(["spec"], "w1", 10, 4)
    await queue.request_cancel("i2")
    await queue.complete("i3", items[3].lease_version)
    stale_i3 = await queue.get("i3")
    clock.advance(5)
    statuses = await queue.renew_many(
        [
            items[0].lease,
            Lease("i1", items[1].lease_version, "intruder"),
            items[2].lease,
            items[3].lease,
            Lease("missing", 1, "w1"),
        ],
        30,
    )
    assert statuses == {
        "i0": LeaseStatus.HELD,
        "i1": LeaseStatus.LOST,
        "i2": LeaseStatus.CANCEL_REQUESTED,
        "i3": LeaseStatus.LOST,
        "missing": LeaseStatus.LOST,
    }
    assert (await queue.get("i0")).lease_expires_at == START + 35 * S
    assert (await queue.get("i1")).lease_expires_at == START + 10 * S
    assert (await queue.get("i2")).lease_expires_at == START + 35 * S
    assert await queue.get("i3") == stale_i3
    assert await queue.renew_many([], 30) == {}


# -- fencing ---------------------------------------------------------------------------------

StaleWrite = Callable[[WorkQueue, WorkItem], Awaitable[object]]

STALE_WRITES: dict[str, StaleWrite] = {
    "complete": lambda q, i: q.complete(i.id, i.lease_version),
    "release": lambda q, i: q.release(i.id, i.lease_version, 0),
    "reschedule": lambda q, i: q.reschedule(i.id, i.lease_version, START, {"x": 1}),
    "mark_error": lambda q, i: q.mark_error(i.id, i.lease_version, "boom"),
    "renew": lambda q, i: q.renew(i.id, i.lease_owner or "", i.lease_version, 10),
}


@pytest.mark.parametrize("write", sorted(STALE_WRITES))
@pytest.mark.parametrize("how", ["rescued", "settled", "wrong-version"])
async def test_every_stale_write_is_refused(
    queue: WorkQueue, clock: ManualClock, write: str, how: str
) -> None:
    """A write under a lease that is not current raises LeaseLost and changes nothing."""
    await queue.enqueue("spec", item_id="x")
    held = await claim_one(queue, "w1", 10)
    stale = held
    if how == "rescued":
        clock.advance(10)
        await claim_one(queue, "w2", 10)
    elif how == "settled":
        await queue.release("x", held.lease_version, 0)
    else:
        stale = WorkItem(**{**_fields(held), "lease_version": held.lease_version + 1000})
    before = await queue.get("x")
    with pytest.raises(LeaseLost) as info:
        await STALE_WRITES[write](queue, stale)
    assert info.value.item_id == "x"
    assert info.value.lease_version == stale.lease_version
    assert await queue.get("x") == before
    assert await queue.settle_many(
        [
            Settlement(
                item_id="x", lease_version=stale.lease_version, kind=kind, error="e", at=START
            )
            for kind in SettleKind
        ]
    ) == [False] * len(SettleKind)
    assert await queue.get("x") == before


def _fields(item: WorkItem) -> dict[str, object]:
    import attrs

    return attrs.asdict(item, recurse=False)


async def test_writes_to_unknown_items_are_refused(queue: WorkQueue) -> None:
    """Fenced writes naming an item that does not exist raise LeaseLost."""
    with pytest.raises(LeaseLost):
        await queue.complete("nope", 1)
    with pytest.raises(LeaseLost):
        await queue.mark_error("nope", 1, "e")
    assert await queue.counts() == {}


# -- settling --------------------------------------------------------------------------------


async def test_release_keeps_the_error_count(queue: WorkQueue, clock: ManualClock) -> None:
    """release hands the item back due after the delay, lease cleared, errors untouched."""
    await queue.enqueue("spec", item_id="x")
    item = await claim_one(queue)
    await queue.mark_error("x", item.lease_version, "boom")
    clock.advance(3)
    await queue.release("x", item.lease_version, 7.5)
    got = await queue.get("x")
    assert got.state is ItemState.QUEUED
    assert got.due_at == START + 10.5 * S
    assert (got.lease_owner, got.lease_expires_at) == (None, None)
    assert (got.error_count, got.last_error) == (1, "boom")
    assert got.lease_version == item.lease_version
    with pytest.raises(ValueError, match="delay"):
        await queue.release("x", item.lease_version, -1)


async def test_mark_error_keeps_the_lease(queue: WorkQueue) -> None:
    """mark_error counts the error and records it; the lease stays held."""
    await queue.enqueue("spec", item_id="x")
    item = await claim_one(queue)
    await queue.mark_error("x", item.lease_version, "one")
    await queue.mark_error("x", item.lease_version, "two")
    got = await queue.get("x")
    assert (got.state, got.error_count, got.last_error) == (ItemState.RUNNING, 2, "two")
    assert got.lease_expires_at == item.lease_expires_at
    assert await queue.renew("x", "w1", item.lease_version, 30) is LeaseStatus.HELD


async def test_reschedule_sets_due_time_and_config_together(
    queue: WorkQueue, clock: ManualClock
) -> None:
    """reschedule writes the next due time and the new config in one write and clears errors."""
    await queue.enqueue("spec", item_id="x", config={"run": 0})
    item = await claim_one(queue)
    await queue.mark_error("x", item.lease_version, "flaky")
    clock.advance(1)
    await queue.reschedule("x", item.lease_version, START + dt.timedelta(days=1), {"run": 1})
    got = await queue.get("x")
    assert (got.state, got.due_at, got.config) == (
        ItemState.QUEUED,
        START + dt.timedelta(days=1),
        {"run": 1},
    )
    assert (got.error_count, got.last_error) == (0, "flaky")
    assert (got.lease_owner, got.lease_expires_at) == (None, None)
    with pytest.raises(LeaseLost):
        await queue.reschedule("x", item.lease_version, START, {"run": 2})
    assert await queue.get("x") == got


async def test_reschedule_refuses_a_non_json_config(queue: WorkQueue) -> None:
    """A reschedule with a config that is not JSON raises ConfigError and changes nothing."""
    await queue.enqueue("spec", item_id="x")
    item = await claim_one(queue)
    with pytest.raises(ConfigError):
        await queue.reschedule("x", item.lease_version, START, {"bad": {1, 2}})
    assert await queue.get("x") == item


async def test_complete_finishes_for_good(queue: WorkQueue, clock: ManualClock) -> None:
    """A completed item keeps its due time, loses its lease and is never claimed again."""
    await queue.enqueue("spec", item_id="x", due_at=START - S)
    item = await claim_one(queue)
    await queue.complete("x", item.lease_version)
    got = await queue.get("x")
    assert (got.state, got.due_at, got.lease_owner, got.lease_expires_at) == (
        ItemState.COMPLETED,
        START - S,
        None,
        None,
    )
    clock.advance(86_400)
    assert await queue.claim_due(["spec"], "w", 30, 10) == []
    assert await queue.next_due_at(["spec"]) is None


async def test_error_count_semantics(queue: WorkQueue, clock: ManualClock) -> None:
    """retry and dead add one; continue and reschedule reset; release leaves the count alone."""

    async def settle(kind: SettleKind, **extra: object) -> WorkItem:
        item = await claim_one(queue)
        assert await queue.settle_many(
            [Settlement(item_id="x", lease_version=item.lease_version, kind=kind, **extra)]  # type: ignore[arg-type]
        ) == [True]
        return await queue.get("x")

    await queue.enqueue("spec", item_id="x")
    got = await settle(SettleKind.RETRY, error="e1", delay=2)
    assert (got.state, got.error_count, got.last_error) == (ItemState.QUEUED, 1, "e1")
    assert got.due_at == START + 2 * S
    clock.advance(2)
    got = await settle(SettleKind.RETRY, error="e2")
    assert (got.error_count, got.last_error, got.due_at) == (2, "e2", START + 2 * S)
    got = await settle(SettleKind.RELEASE)
    assert (got.error_count, got.last_error) == (2, "e2")
    got = await settle(SettleKind.CONTINUE, delay=1)
    assert (got.error_count, got.last_error, got.due_at) == (0, "e2", START + 3 * S)
    clock.advance(1)
    got = await settle(SettleKind.RETRY, error="e3")
    got = await settle(SettleKind.RESCHEDULE, at=START, config={"k": 1})
    assert (got.error_count, got.config, got.due_at) == (0, {"k": 1}, START)
    got = await settle(SettleKind.RETRY, error="e4")
    got = await settle(SettleKind.DEAD, error="last")
    assert (got.state, got.error_count, got.last_error) == (ItemState.DEAD, 2, "last")
    assert await queue.claim_due(["spec"], "w", 30, 1) == []


async def test_error_history_is_appended_in_order(queue: WorkQueue, clock: ManualClock) -> None:
    """mark_error, retry and dead each append {at, worker, attempt, error}; other outcomes don't."""
    await queue.enqueue("spec", item_id="x")
    item = await claim_one(queue, "w1")
    await queue.mark_error("x", item.lease_version, "marked")
    clock.advance(1)
    assert await queue.settle_many(
        [
            Settlement(
                item_id="x", lease_version=item.lease_version, kind=SettleKind.RETRY, error="e1"
            )
        ]
    ) == [True]
    item = await claim_one(queue, "w2")
    assert await queue.settle_many(
        [Settlement(item_id="x", lease_version=item.lease_version, kind=SettleKind.CONTINUE)]
    ) == [True]
    item = await claim_one(queue, "w3")
    clock.advance(1)
    assert await queue.settle_many(
        [
            Settlement(
                item_id="x", lease_version=item.lease_version, kind=SettleKind.DEAD, error="e2"
            )
        ]
    ) == [True]
    got = await queue.get("x")
    assert got.errors == (
        ErrorEntry(at=START, worker="w1", attempt=1, error="marked"),
        ErrorEntry(at=START + S, worker="w1", attempt=1, error="e1"),
        ErrorEntry(at=START + 2 * S, worker="w3", attempt=1, error="e2"),
    )
    assert [each.error for each in (await queue.list_items())[0].errors] == ["marked", "e1", "e2"]


async def test_error_history_is_bounded(queue: WorkQueue, clock: ManualClock) -> None:
    """Past MAX_ERRORS errors the oldest are dropped; the newest MAX_ERRORS stay, in order."""
    await queue.enqueue("spec", item_id="x")
    item = await claim_one(queue)
    for n in range(MAX_ERRORS + 3):
        await queue.mark_error("x", item.lease_version, f"e{n}")
    got = await queue.get("x")
    assert [each.error for each in got.errors] == [f"e{n}" for n in range(3, MAX_ERRORS + 3)]
    assert got.error_count == MAX_ERRORS + 3


async def test_error_history_is_kept_across_retry(queue: WorkQueue) -> None:
    """retry() puts a dead item back with its error history: it is history, not state."""
    await queue.enqueue("spec", item_id="x")
    item = await claim_one(queue)
    await queue.settle_many(
        [
            Settlement(
                item_id="x", lease_version=item.lease_version, kind=SettleKind.DEAD, error="gone"
            )
        ]
    )
    got = await queue.retry("x")
    assert [each.error for each in got.errors] == ["gone"]
    item = await claim_one(queue, "w2")
    await queue.mark_error("x", item.lease_version, "again")
    assert [(e.worker, e.error) for e in (await queue.get("x")).errors] == [
        ("w1", "gone"),
        ("w2", "again"),
    ]


async def test_error_history_stores_unstorable_text_escaped(queue: WorkQueue) -> None:
    """An error with a NUL or a lone surrogate is kept in the history escaped, like last_error."""
    await queue.enqueue("spec", item_id="x")
    item = await claim_one(queue)
    await queue.mark_error("x", item.lease_version, "nul \x00 and \udcff")
    got = await queue.get("x")
    assert got.errors[0].error == got.last_error == storable_text("nul \x00 and \udcff")


async def test_settle_many_mixed(queue: WorkQueue, clock: ManualClock) -> None:
    """settle_many applies fresh entries and reports stale ones, each on its own, in order."""
    for n in range(5):
        await queue.enqueue("spec", item_id=f"i{n}")
    items = {i.id: i for i in await queue.claim_due(["spec"], "w1", 10, 5)}
    await queue.complete("i4", items["i4"].lease_version)
    clock.advance(1)
    v = {item_id: item.lease_version for item_id, item in items.items()}
    results = await queue.settle_many(
        [
            Settlement(item_id="i0", lease_version=v["i0"], kind=SettleKind.COMPLETE),
            Settlement(item_id="i1", lease_version=v["i1"] + 7, kind=SettleKind.COMPLETE),
            Settlement(
                item_id="i1", lease_version=v["i1"], kind=SettleKind.RETRY, error="x", delay=4
            ),
            Settlement(item_id="i1", lease_version=v["i1"], kind=SettleKind.COMPLETE),
            Settlement(item_id="i2", lease_version=v["i2"], kind=SettleKind.CANCEL),
            Settlement(
                item_id="i3",
                lease_version=v["i3"],
                kind=SettleKind.RESCHEDULE,
                at=START + 60 * S,
                config=[1, "two"],
            ),
            Settlement(item_id="i4", lease_version=v["i4"], kind=SettleKind.RELEASE),
            Settlement(item_id="ghost", lease_version=1, kind=SettleKind.COMPLETE),
        ]
    )
    assert results == [True, False, True, False, True, True, False, False]
    got = {i.id: i for i in await queue.list_items()}
    assert got["i0"].state is ItemState.COMPLETED
    assert (got["i1"].state, got["i1"].error_count, got["i1"].due_at) == (
        ItemState.QUEUED,
        1,
        START + 5 * S,
    )
    assert got["i2"].state is ItemState.CANCELLED
    assert (got["i3"].due_at, got["i3"].config) == (START + 60 * S, [1, "two"])
    assert got["i4"].state is ItemState.COMPLETED
    assert await queue.settle_many([]) == []


_AWKWARD_IDS = ['q"uote', "back\\slash", 'a","b', "com,ma", "{brace}", " spaced ", "NULL", "ü☃"]


async def test_settle_many_takes_ids_of_any_text(queue: WorkQueue, clock: ManualClock) -> None:
    """Item ids holding quotes, backslashes, commas, braces, spaces, the word NULL or non-ASCII
    text are settled in one batch, each as asked (a backend may write a batch as text it builds
    itself, and must quote every one right)."""
    for item_id in _AWKWARD_IDS:
        await queue.enqueue("spec", item_id=item_id)
    items = await queue.claim_due(["spec"], "w1", 30, len(_AWKWARD_IDS))
    assert sorted(item.id for item in items) == sorted(_AWKWARD_IDS)
    kinds = [SettleKind.COMPLETE, SettleKind.CONTINUE, SettleKind.CANCEL]
    settlements = [
        Settlement(item_id=item.id, lease_version=item.lease_version, kind=kinds[n % 3])
        for n, item in enumerate(items)
    ]
    stale = Settlement(item_id='q"uote', lease_version=999, kind=SettleKind.COMPLETE)
    assert await queue.settle_many([*settlements, stale]) == [True] * len(items) + [False]
    expected = {
        SettleKind.COMPLETE: ItemState.COMPLETED,
        SettleKind.CONTINUE: ItemState.QUEUED,
        SettleKind.CANCEL: ItemState.CANCELLED,
    }
    for settlement in settlements:
        assert (await queue.get(settlement.item_id)).state is expected[settlement.kind]


async def test_settle_many_a_large_batch(queue: WorkQueue, clock: ManualClock) -> None:
    """A batch of 150 mixed outcomes (more than one statement takes), with stale and repeated
    entries among them, gives every entry what it would get on its own."""
    n = 150
    for k in range(n):
        await queue.enqueue("spec", item_id=f"i{k:03d}", config={"k": k})
    items = await queue.claim_due(["spec"], "w1", 30, n)
    assert len(items) == n
    v = {item.id: item.lease_version for item in items}
    clock.advance(1)
    kinds = [
        SettleKind.COMPLETE,
        SettleKind.RETRY,
        SettleKind.CONTINUE,
        SettleKind.RESCHEDULE,
        SettleKind.DEAD,
        SettleKind.CANCEL,
        SettleKind.RELEASE,
    ]
    batch: list[Settlement] = []
    expected: list[bool] = []
    for k in range(n):
        item_id, kind = f"i{k:03d}", kinds[k % len(kinds)]
        fresh = Settlement(
            item_id=item_id,
            lease_version=v[item_id],
            kind=kind,
            delay=k % 3,
            at=START + (100 + k) * S if kind is SettleKind.RESCHEDULE else None,
            config={"next": k} if kind is SettleKind.RESCHEDULE else None,
            result={"done": k} if kind is SettleKind.COMPLETE else None,
            error=f"e{k}" if kind in (SettleKind.RETRY, SettleKind.DEAD) else None,
        )
        if k % 11 == 5:  # a stale version first: refused, the fresh one after it applies
            batch.append(attrs.evolve(fresh, lease_version=v[item_id] + 1))
            expected.append(False)
        batch.append(fresh)
        expected.append(True)
        if k % 13 == 7:  # the same (id, version) again: applied once, the repeat refused
            batch.append(batch[-1])
            expected.append(False)
    batch.append(Settlement(item_id="ghost", lease_version=1, kind=SettleKind.COMPLETE))
    expected.append(False)
    assert await queue.settle_many(batch) == expected
    got = {i.id: i for i in await queue.list_items(limit=1000)}
    for k in range(n):
        item, kind = got[f"i{k:03d}"], kinds[k % len(kinds)]
        assert (item.lease_owner, item.lease_expires_at) == (None, None)
        if kind is SettleKind.COMPLETE:
            assert (item.state, item.result) == (ItemState.COMPLETED, {"done": k})
        elif kind is SettleKind.RETRY:
            assert (item.state, item.due_at, item.error_count, item.last_error) == (
                ItemState.QUEUED,
                START + (1 + k % 3) * S,
                1,
                f"e{k}",
            )
            assert [e.error for e in item.errors] == [f"e{k}"]
        elif kind is SettleKind.CONTINUE:
            assert (item.state, item.due_at, item.attempt) == (
                ItemState.QUEUED,
                START + (1 + k % 3) * S,
                0,
            )
        elif kind is SettleKind.RESCHEDULE:
            assert (item.state, item.due_at, item.config) == (
                ItemState.QUEUED,
                START + (100 + k) * S,
                {"next": k},
            )
        elif kind is SettleKind.DEAD:
            assert (item.state, item.error_count, item.last_error) == (ItemState.DEAD, 1, f"e{k}")
        elif kind is SettleKind.CANCEL:
            assert item.state is ItemState.CANCELLED
        else:
            assert (item.state, item.due_at, item.attempt) == (
                ItemState.QUEUED,
                START + (1 + k % 3) * S,
                0,
            )


async def test_renew_many_a_large_batch(queue: WorkQueue, clock: ManualClock) -> None:
    """600 leases in one renew_many (more than one statement takes), some stale, some named
    twice: the fresh ones are renewed, the rest reported LOST."""
    n = 600
    await queue.enqueue_many([NewItem(spec_id="spec", item_id=f"i{k:03d}") for k in range(n)])
    items = await queue.claim_due(["spec"], "w1", 10, n)
    assert len(items) == n
    clock.advance(5)
    leases = []
    for k, item in enumerate(items):
        if k % 7 == 3:
            leases.append(Lease(item.id, item.lease_version, "intruder"))
        else:
            leases.append(item.lease)
        if k % 50 == 0:
            leases.append(leases[-1])
    statuses = await queue.renew_many(leases, 30)
    assert len(statuses) == n
    for k, item in enumerate(items):
        stale = k % 7 == 3
        assert statuses[item.id] is (LeaseStatus.LOST if stale else LeaseStatus.HELD)
        got = await queue.get(item.id)
        assert got.lease_expires_at == START + (10 if stale else 35) * S


# -- cancellation and retry ------------------------------------------------------------------


async def test_cancel_a_queued_item_at_once(queue: WorkQueue) -> None:
    """Cancelling a queued item finishes it as cancelled straight away."""
    await queue.enqueue("spec", item_id="x")
    got = await queue.request_cancel("x")
    assert (got.state, got.cancel_requested) == (ItemState.CANCELLED, True)
    assert await queue.get("x") == got
    assert await queue.claim_due(["spec"], "w", 30, 1) == []


async def test_cancel_a_running_item_flags_it(queue: WorkQueue, clock: ManualClock) -> None:
    """Cancelling a running item flags it; the owner hears it on renewal and settles it."""
    await queue.enqueue("spec", item_id="x")
    item = await claim_one(queue)
    got = await queue.request_cancel("x")
    assert (got.state, got.cancel_requested) == (ItemState.RUNNING, True)
    assert got.lease_version == item.lease_version
    assert await queue.renew("x", "w1", item.lease_version, 30) is LeaseStatus.CANCEL_REQUESTED
    assert await queue.request_cancel("x") == await queue.get("x")
    await queue.settle_many(
        [Settlement(item_id="x", lease_version=item.lease_version, kind=SettleKind.CANCEL)]
    )
    assert (await queue.get("x")).state is ItemState.CANCELLED


async def test_a_flagged_item_is_claimed_with_its_flag(
    queue: WorkQueue, clock: ManualClock
) -> None:
    """When the owner of a flagged item dies, the rescuer sees the flag on the claimed item."""
    await queue.enqueue("spec", item_id="x")
    await claim_one(queue, "w1", 10)
    await queue.request_cancel("x")
    clock.advance(10)
    rescued = await claim_one(queue, "w2", 10)
    assert rescued.cancel_requested


async def test_cancel_leaves_finished_items_alone(queue: WorkQueue) -> None:
    """Cancelling a finished item changes nothing; an unknown one raises ItemNotFound."""
    await queue.enqueue("spec", item_id="x")
    item = await claim_one(queue)
    await queue.complete("x", item.lease_version)
    done = await queue.get("x")
    assert await queue.request_cancel("x") == done
    with pytest.raises(ItemNotFound):
        await queue.request_cancel("nope")


async def test_retry_puts_a_finished_item_back(queue: WorkQueue, clock: ManualClock) -> None:
    """retry requeues a dead or cancelled item with no errors and no cancel flag."""
    await queue.enqueue("spec", item_id="x")
    item = await claim_one(queue)
    await queue.settle_many(
        [Settlement(item_id="x", lease_version=item.lease_version, kind=SettleKind.DEAD, error="e")]
    )
    clock.advance(5)
    got = await queue.retry("x")
    assert (got.state, got.due_at, got.error_count, got.cancel_requested) == (
        ItemState.QUEUED,
        START + 5 * S,
        0,
        False,
    )
    assert await queue.get("x") == got
    await queue.request_cancel("x")
    got = await queue.retry("x", at=START + 60 * S)
    assert (got.state, got.due_at, got.cancel_requested) == (
        ItemState.QUEUED,
        START + 60 * S,
        False,
    )
    got = await queue.retry("x")
    assert got.due_at == START + 5 * S


async def test_retry_refuses_running_and_unknown_items(queue: WorkQueue) -> None:
    """A running item cannot be retried; an unknown one raises ItemNotFound."""
    await queue.enqueue("spec", item_id="x")
    item = await claim_one(queue)
    with pytest.raises(ItemStateError):
        await queue.retry("x")
    assert await queue.get("x") == item
    with pytest.raises(ItemNotFound):
        await queue.retry("nope")


# -- waiting ---------------------------------------------------------------------------------


async def test_next_due_at(queue: WorkQueue, clock: ManualClock) -> None:
    """The earliest due time of queued items or lease expiry of running ones, per spec."""
    assert await queue.next_due_at(["spec"]) is None
    await queue.enqueue("spec", item_id="late", due_at=START + 100 * S)
    await queue.enqueue("other", item_id="o", due_at=START + 1 * S)
    assert await queue.next_due_at(["spec"]) == START + 100 * S
    assert await queue.next_due_at(["spec", "other"]) == START + 1 * S
    await queue.enqueue("spec", item_id="now")
    assert await queue.next_due_at(["spec"]) == START
    await claim_one(queue, "w", 40)
    assert await queue.next_due_at(["spec"]) == START + 40 * S
    assert await queue.next_due_at([]) is None


async def test_wait_for_work_returns_when_work_is_due(queue: WorkQueue) -> None:
    """wait_for_work returns at once when something is due already."""
    await queue.enqueue("spec")
    with trio.fail_after(5):
        await queue.wait_for_work(["spec"])


async def test_wait_for_work_wakes_on_enqueue(queue: WorkQueue) -> None:
    """A waiter wakes when this process enqueues due work, long before its poll bound."""
    woke = trio.Event()

    async def waiter() -> None:
        await queue.wait_for_work(["spec"])
        woke.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.sleep(0.2)
            assert not woke.is_set()
            await queue.enqueue("other")
            await queue.enqueue("spec", due_at=START + 3600 * S)
            await trio.sleep(0.2)
            assert not woke.is_set()
            await queue.enqueue("spec")
            await woke.wait()


async def test_wait_for_work_wakes_on_release(queue: WorkQueue) -> None:
    """A waiter wakes when a running item is handed back due now."""
    await queue.enqueue("spec", item_id="x")
    item = await claim_one(queue, "w1", 3600)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def release_soon() -> None:
                await trio.sleep(0.1)
                await queue.release("x", item.lease_version, 0)

            nursery.start_soon(release_soon)
            await queue.wait_for_work(["spec"])
    assert (await queue.get("x")).state is ItemState.QUEUED


async def test_aclose_is_idempotent(queue: WorkQueue) -> None:
    """Closing twice is fine."""
    await queue.aclose()
    await queue.aclose()


# -- unstorable values (issue 12, class 1) ---------------------------------------------------

SURROGATE = "bad \udcff byte"


def nested(depth: int) -> object:
    """A config of *depth* nested lists and objects, alternating."""
    value: object = 1
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


async def test_enqueue_refuses_what_no_backend_can_store(queue: WorkQueue) -> None:
    """Lone surrogates, NULs and nesting past MAX_JSON_DEPTH are a ConfigError naming the field."""
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


async def test_reschedule_refuses_an_unstorable_config(queue: WorkQueue) -> None:
    """A Reschedule's new config is checked like an enqueued one; the item keeps its lease."""
    await queue.enqueue("spec", item_id="x")
    item = await claim_one(queue)
    for config in ({"x": SURROGATE}, nested(MAX_JSON_DEPTH + 1)):
        with pytest.raises(ConfigError, match="config"):
            await queue.reschedule("x", item.lease_version, START, config)
    assert (await queue.get("x")).state is ItemState.RUNNING


async def test_error_text_is_stored_escaped_never_dropped(queue: WorkQueue) -> None:
    """A NUL or a lone surrogate in an error is written as an escape, by every write."""
    await queue.enqueue("spec", item_id="m")
    await queue.enqueue("spec", item_id="s")
    m, s = await queue.claim_due(["spec"], "w", 30, 2)
    await queue.mark_error("m", m.lease_version, f"{SURROGATE} and \x00")
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


async def test_a_poisoned_entry_never_takes_its_batch_down(queue: WorkQueue) -> None:
    """One unstorable entry of settle_many goes dead, saying why; its batch-mates are settled."""
    for n in range(4):
        await queue.enqueue("spec", item_id=f"i{n}")
    v = {i.id: i.lease_version for i in await queue.claim_due(["spec"], "w", 30, 4)}
    results = await queue.settle_many(
        [
            Settlement(item_id="i0", lease_version=v["i0"], kind=SettleKind.COMPLETE),
            Settlement(item_id="i1", lease_version=v["i1"], kind=SettleKind.RETRY, error=SURROGATE),
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


def test_settlement_delays_are_bounded() -> None:
    """A delay past MAX_DELAY (which no backend could add to now) is refused up front."""
    with pytest.raises(ValueError, match="delay"):
        Settlement(item_id="x", lease_version=1, kind=SettleKind.CONTINUE, delay=1e300)


# -- attempts (class 2) ----------------------------------------------------------------------


async def test_the_claim_counts_attempts(queue: WorkQueue, clock: ManualClock) -> None:
    """Every claim adds one (a rescue too); a successful evaluation or retry sets it to zero."""
    item = await queue.enqueue("spec", item_id="x")
    assert item.attempt == 0
    first = await claim_one(queue, lease=5)
    assert first.attempt == 1
    clock.advance(6)
    second = await claim_one(queue, "w2")  # rescued: its worker died, no error written
    assert second.attempt == 2
    assert (await queue.get("x")).attempt == 2
    await queue.release("x", second.lease_version, 0)  # handed back at shutdown: not counted
    assert (await queue.get("x")).attempt == 1
    third = await claim_one(queue)
    await queue.mark_error("x", third.lease_version, "boom")
    [ok] = await queue.settle_many(
        [
            Settlement(
                item_id="x", lease_version=third.lease_version, kind=SettleKind.RETRY, error="e"
            )
        ]
    )
    assert ok
    assert (await queue.get("x")).attempt == 2
    fourth = await claim_one(queue)
    assert fourth.attempt == 3
    await queue.settle_many(
        [Settlement(item_id="x", lease_version=fourth.lease_version, kind=SettleKind.CONTINUE)]
    )
    assert (await queue.get("x")).attempt == 0
    fifth = await claim_one(queue)
    await queue.settle_many(
        [
            Settlement(
                item_id="x", lease_version=fifth.lease_version, kind=SettleKind.DEAD, error="e"
            )
        ]
    )
    assert (await queue.get("x")).attempt == 1
    assert (await queue.retry("x")).attempt == 0


# -- listing with a cursor (class 11) --------------------------------------------------------


async def test_list_items_pages_with_a_cursor(queue: WorkQueue) -> None:
    """Pages after an item's id cover the filtered list exactly once, in (due_at, id) order."""
    for n in range(9):
        await queue.enqueue("a" if n % 3 else "b", item_id=f"i{n}", due_at=START + (n % 4) * S)
    [done] = await queue.claim_due(["a", "b"], "w", 30, 1)
    await queue.complete(done.id, done.lease_version)
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


# -- priorities, named queues, pausing -------------------------------------------------------


async def test_claim_orders_by_priority_then_due_time_then_id(
    queue: WorkQueue, clock: ManualClock
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
    queue: WorkQueue, clock: ManualClock
) -> None:
    """Rescue is part of claiming, in the same (priority, due_at, id) order."""
    await queue.enqueue("spec", item_id="stuck", priority=-1)
    await claim_one(queue, lease=5)
    await queue.enqueue("spec", item_id="fresh")
    clock.advance(6)
    assert [i.id for i in await queue.claim_due(["spec"], "w2", 30, 2)] == ["stuck", "fresh"]


async def test_priority_is_range_checked(queue: WorkQueue) -> None:
    """A priority outside -100..100, or not an int, is refused naming the rule; nothing stored."""
    for bad in (-101, 101, 1.5, True, "1"):
        with pytest.raises(ValueError, match=r"priority must be an integer from -100"):
            await queue.enqueue("spec", priority=bad)  # type: ignore[arg-type]
    for bad_queue in ("", 5):
        with pytest.raises(ValueError, match="queue must be a non-empty string"):
            await queue.enqueue("spec", queue=bad_queue)  # type: ignore[arg-type]
    assert await queue.list_items() == []


async def test_a_claim_serves_one_named_queue(queue: WorkQueue) -> None:
    """Items carry their queue (default "default"); a claim takes only its queue's items."""
    plain = await queue.enqueue("spec", item_id="plain")
    mail = await queue.enqueue("spec", item_id="mail-1", queue="mail")
    assert (plain.queue, mail.queue) == ("default", "mail")
    assert (await queue.get("mail-1")).queue == "mail"
    assert [i.id for i in await queue.claim_due(["spec"], "w", 30, 10)] == ["plain"]
    assert [i.id for i in await queue.claim_due(["spec"], "w", 30, 10, queue="mail")] == ["mail-1"]


async def test_a_paused_queue_is_not_claimed_until_resumed(
    queue: WorkQueue, clock: ManualClock
) -> None:
    """Pausing stops claims from that queue only; running items still settle; resume restores."""
    await queue.enqueue("spec", item_id="running", queue="mail")
    [running] = await queue.claim_due(["spec"], "w", 30, 1, queue="mail")
    await queue.enqueue("spec", item_id="waiting", queue="mail")
    await queue.enqueue("spec", item_id="other")
    assert await queue.pause_queue("mail") is True
    assert await queue.pause_queue("mail") is False
    assert await queue.claim_due(["spec"], "w", 30, 10, queue="mail") == []
    assert await queue.next_due_at(["spec"], queues=["mail"]) is None
    assert await queue.next_due_at(["spec"]) == START
    await queue.complete("running", running.lease_version)
    assert (await queue.get("running")).state is ItemState.COMPLETED
    infos = {info.name: info for info in await queue.list_queues()}
    assert (infos["mail"].paused, infos["mail"].paused_at) == (True, START)
    assert infos["mail"].counts == {ItemState.QUEUED: 1, ItemState.COMPLETED: 1}
    assert not infos["default"].paused
    assert [i.id for i in await queue.claim_due(["spec"], "w", 30, 10)] == ["other"]
    assert await queue.resume_queue("mail") is True
    assert await queue.resume_queue("mail") is False
    assert [i.id for i in await queue.claim_due(["spec"], "w", 30, 10, queue="mail")] == ["waiting"]


async def test_pausing_a_queue_with_no_items_lists_it(queue: WorkQueue) -> None:
    """A paused queue is listed even before it holds an item, so an operator sees the pause."""
    await queue.pause_queue("later")
    [info] = await queue.list_queues()
    assert (info.name, info.paused, dict(info.counts)) == ("later", True, {})


async def test_wait_for_work_ignores_unserved_and_paused_queues(queue: WorkQueue) -> None:
    """Due items of another queue, or of a paused one, do not wake a waiter of its queues."""
    await queue.enqueue("spec", queue="mail")
    await queue.enqueue("spec", queue="paused")
    await queue.pause_queue("paused")
    with trio.move_on_after(0.2) as scope:
        await queue.wait_for_work(["spec"], queues=["default", "paused"])
    assert scope.cancelled_caught
    with trio.fail_after(5):
        await queue.wait_for_work(["spec"], queues=["mail"])


@attrs.frozen
class _Watering:
    litres: float
    plants: tuple[str, ...] = ()


async def test_enqueue_accepts_an_attrs_config(queue: WorkQueue) -> None:
    """An attrs config instance is unstructured by the shared converter, on every backend."""
    item = await queue.enqueue("spec", config=_Watering(litres=1.5, plants=("fern",)))
    assert item.config == {"litres": 1.5, "plants": ["fern"]}
    assert (await queue.get(item.id)).config == {"litres": 1.5, "plants": ["fern"]}


async def test_enqueue_stores_an_evaluation_timeout(queue: WorkQueue) -> None:
    """An item's evaluation timeout comes back as given; a bad one is refused, nothing stored."""
    item = await queue.enqueue("spec", item_id="t", evaluation_timeout=2.5)
    assert (item.timeout, (await queue.get("t")).timeout) == (2.5, 2.5)
    assert (await queue.enqueue("spec")).timeout is None
    for bad in (0, -1, float("inf"), "5"):
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            await queue.enqueue("spec", item_id="bad", evaluation_timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(ItemNotFound):
        await queue.get("bad")


async def test_a_completed_item_keeps_its_result(queue: WorkQueue) -> None:
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
            Settlement(item_id="two", lease_version=two.lease_version, kind=SettleKind.COMPLETE),
        ]
    )
    assert (await queue.get("one")).result == {"sent": 3, "to": ["a"]}
    assert (await queue.get("two")).result is None


async def test_an_unstorable_result_makes_only_its_entry_dead(queue: WorkQueue) -> None:
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
