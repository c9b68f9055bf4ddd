"""Child items and fan-in, on every backend: children are written with their parent's fenced
settlement, and a waiting parent is due again when its last child finishes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from trio_supervise import ConfigError
from trio_supervise.job import check_child
from trio_supervise.queues import (
    WAITING_DUE_AT,
    ItemState,
    NewItem,
    SettleKind,
    Settlement,
    WorkItem,
)
from trio_supervise.testing.conformance._children import claim, fan_out, finish


def test_settlement_refuses_children_where_they_make_no_sense() -> None:
    """Children only with continue, reschedule or complete; a wait only with continue."""
    with pytest.raises(ValueError, match="a retry settlement cannot create children"):
        Settlement(
            item_id="p",
            lease_version=1,
            kind=SettleKind.RETRY,
            error="x",
            children=[NewItem(spec_id="c")],
        )
    with pytest.raises(ValueError, match="a complete settlement cannot wait for children"):
        Settlement(item_id="p", lease_version=1, kind=SettleKind.COMPLETE, wait_for_children=True)
    with pytest.raises(TypeError, match=r"children\[0\] must be a NewItem"):
        Settlement(item_id="p", lease_version=1, kind=SettleKind.CONTINUE, children=["c"])  # type: ignore[list-item]


def test_new_item_checked_names_the_child_and_the_field() -> None:
    """A bad child is refused naming where it is and what is wrong."""
    with pytest.raises(ConfigError, match=r"children\[2\]: config is not JSON-compatible"):
        check_child(NewItem(spec_id="c", config={"x": object()}), what="children[2]")
    with pytest.raises(ValueError, match=r"children\[0\]: priority must be"):
        check_child(NewItem(spec_id="c", priority=1000), what="children[0]")


@pytest.mark.postgres
@pytest.mark.parametrize(("connections", "children"), [(2, 2), (4, 8)])
async def test_children_finishing_at_once_leave_the_parent_due_once(
    connections: int, children: int
) -> None:
    """On PostgreSQL, the last children settled at the same moment on separate connections:
    the count reaches 0 exactly once (never below), and the parent is claimable once."""
    from contextlib import AsyncExitStack

    from trio_supervise.queues import PostgresQueue

    from .conftest import pg_schema

    with pg_schema() as (dsn, schema):
        async with AsyncExitStack() as stack:
            queues = [
                await stack.enter_async_context(
                    await PostgresQueue.connect(
                        dsn, schema=schema, migrate=index == 0, pool_size=2, listen=False
                    )
                )
                for index in range(connections)
            ]
            one = queues[0]
            for round_ in range(10):
                parent_id, spec = f"p{round_}", f"child{round_}"
                await one.enqueue("parent", item_id=parent_id)
                [parent] = await one.claim_due(["parent"], "w", 30, 1)
                settlement = Settlement(
                    item_id=parent_id,
                    lease_version=parent.lease_version,
                    kind=SettleKind.CONTINUE,
                    children=[NewItem(spec_id=spec) for _ in range(children)],
                    wait_for_children=True,
                )
                assert await one.settle_many([settlement]) == [True]
                claimed = await one.claim_due([spec], "w", 30, children)
                assert len(claimed) == children
                results: list[list[bool]] = []

                async def settle(
                    queue: PostgresQueue, child: WorkItem, results: list[list[bool]] = results
                ) -> None:
                    done = Settlement(
                        item_id=child.id, lease_version=child.lease_version, kind=SettleKind.DEAD,
                        error="gone",
                    )  # fmt: skip
                    results.append(await queue.settle_many([done]))

                async with trio.open_nursery() as nursery:
                    for index, child in enumerate(claimed):
                        nursery.start_soon(settle, queues[index % connections], child)
                assert results == [[True]] * children
                stored = await one.get(parent_id)
                assert (stored.state, stored.waiting_children) == (ItemState.QUEUED, 0)
                assert stored.due_at != WAITING_DUE_AT
                assert [item.id for item in await one.claim_due(["parent"], "w", 30, 5)] == [
                    parent_id
                ]
                assert await one.claim_due(["parent"], "w", 30, 5) == []


# -- the CLI ---------------------------------------------------------------------------------


def test_cli_shows_a_waiting_parent_and_lists_its_children(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`items show` says "waiting for N children" with the children per state and each child
    its parent; `items list` says it in the due column; `items list --parent` lists them."""
    from trio_supervise.queues import open_queue

    from .test_cli_reads import run

    url = f"sqlite:///{tmp_path}/q.db"

    async def setup() -> None:
        async with open_queue(url) as queue:
            await fan_out(queue, 3)
            [child] = await claim(queue, "child")
            await finish(queue, child, SettleKind.COMPLETE)

    trio.run(setup)
    code, out, _ = run(capsys, "items", "show", "p", "--database-url", url)
    assert code == 0
    lines = [line.split(None, 1) for line in out.splitlines()]
    assert ["due", "waiting for 2 children"] in lines
    assert ["children", "3 (1 completed, 2 queued)"] in lines
    code, out, _ = run(capsys, "items", "show", "p.1.0001", "--database-url", url)
    assert ["parent", "p"] in [line.split(None, 1) for line in out.splitlines()]
    code, out, _ = run(capsys, "items", "list", "--database-url", url)
    assert any("waiting for 2 children" in line for line in out.splitlines())
    code, out, _ = run(
        capsys, "items", "list", "--parent", "p", "--state", "queued", "--database-url", url
    )
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()[1:3]] == ["p.1.0001", "p.1.0002"]
    assert out.splitlines()[-1] == "2 of 2"
    code, out, _ = run(capsys, "items", "show", "p", "--json", "--database-url", url)
    document = json.loads(out)
    assert (document["waiting_children"], len(document["children"])) == (2, 3)
