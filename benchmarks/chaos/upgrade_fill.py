"""R9's filler: a queue made and filled by one release of the library, items in every state.

Usage: ``python upgrade_fill.py URL schema`` creates the queue schema at *URL* with the
``trio_supervise`` this process imports (R9 runs it with the previous release first on
``PYTHONPATH``) and prints the version reached; ``python upgrade_fill.py URL fill PLAN SCALE``
then writes the items and the plan, as JSON, to the file *PLAN*: by item id, its ``group``,
``kind`` (what :class:`worker.UpgradeDriver` does with it), the state it must end in
(``expect``), how many evaluations that takes (``starts``) and, for a parent, how many children
it has (``fanout``). The harness adds its audit triggers between the two.

It uses only the API of commit 5f6de71 (every release since has it). Groups (*SCALE* multiplies
the counts of the first kind):

- ``now``, ``later``: queued, due now / due in 5-14 s; they complete.
- ``expired``: claimed by a worker that then "died": running under a lease that expires 1 s
  later, rescued by the fleet.
- ``completed``, ``cancelled``, ``dead``: finished already; never evaluated again.
- ``waiting``: parents whose evaluation has fanned out (children due in 2-4 s, group
  ``waiting-child``) and that wait for them; evaluated once more to fan in.
- ``parent``: parents that fan out two children when evaluated, then fan in (three in five
  due now, the rest over 7.6-9.7 s).
- ``reschedule``: reschedule themselves three times, 0.6 s apart, then complete.
- ``flaky``: fail their first evaluation, complete the second.
- ``idempotent``: enqueued with an idempotency key (twice: the second enqueue writes nothing);
  ``limited``: a fleet-wide concurrency key, at most 2 running at once.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from typing import Any

SPEC = "chaos"
KEY_LIMIT = 2
"""The concurrency limit of the ``limited`` group's key."""
FANOUT = 3


def _entry(group: str, kind: str, expect: str, starts: int, **more: Any) -> dict[str, Any]:
    return {"group": group, "kind": kind, "expect": expect, "starts": starts, **more}


async def _fill(url: str, scale: int) -> dict[str, dict[str, Any]]:
    import trio_supervise as ts

    plan: dict[str, dict[str, Any]] = {}
    async with ts.open_queue(url, migrate=False) as queue:
        now = queue.clock.now()

        async def add(item: str, config: dict[str, Any], **fields: Any) -> ts.WorkItem:
            sleep = 0.3 + (len(plan) % 6) * 0.1
            return await queue.enqueue(
                SPEC, item_id=item, config={"sleep": sleep, **config}, **fields
            )

        def later(seconds: float) -> dt.datetime:
            return now + dt.timedelta(seconds=seconds)

        # Claimed and settled at once: finished ones, and parents waiting for their children.
        finished = {"completed": ts.SettleKind.COMPLETE, "dead": ts.SettleKind.DEAD}
        for group in finished:
            for n in range(4):
                await add(f"r9-{group}-{n}", {"kind": "complete"})
                plan[f"r9-{group}-{n}"] = _entry(group, "complete", group, 0)
        for n in range(3 * scale):
            await add(f"r9-waiting-{n}", {"kind": "parent", "fanout": FANOUT})
            plan[f"r9-waiting-{n}"] = _entry("waiting", "parent", "completed", 1, fanout=FANOUT)
        claimed = await queue.claim_due([SPEC], "r9-setup", 60.0, len(plan))
        settlements = []
        for item in claimed:
            group = plan[item.id]["group"]
            if group == "waiting":
                children = [
                    ts.NewItem(
                        spec_id=SPEC, config={"kind": "complete", "sleep": 0.3}, due_at=later(2 + n)
                    )
                    for n in range(FANOUT)
                ]
                settlement = ts.Settlement(
                    item_id=item.id,
                    lease_version=item.lease_version,
                    kind=ts.SettleKind.CONTINUE,
                    children=children,
                    wait_for_children=True,
                )
                for child in settlement.children:
                    assert child.item_id is not None
                    plan[child.item_id] = _entry("waiting-child", "complete", "completed", 1)
            else:
                error = "dead at setup" if group == "dead" else None
                settlement = ts.Settlement(
                    item_id=item.id,
                    lease_version=item.lease_version,
                    kind=finished[group],
                    error=error,
                )
            settlements.append(settlement)
        applied = await queue.settle_many(settlements)
        assert len(claimed) == len(plan) - 3 * scale * FANOUT, claimed
        assert all(applied), applied

        # Running under a lease that expires in 1 s, its owner gone.
        expired = [f"r9-expired-{n}" for n in range(6 * scale)]
        for item_id in expired:
            await add(item_id, {"kind": "complete"})
            plan[item_id] = _entry("expired", "complete", "completed", 1)
        orphans = await queue.claim_due([SPEC], "r9-dead-worker", 1.0, len(expired))
        assert sorted(item.id for item in orphans) == sorted(expired), orphans

        for n in range(4):
            await add(f"r9-cancelled-{n}", {"kind": "complete"})
            await queue.request_cancel(f"r9-cancelled-{n}")
            plan[f"r9-cancelled-{n}"] = _entry("cancelled", "complete", "cancelled", 0)

        # Queued, claimed by the fleet.
        for n in range(30 * scale):
            await add(f"r9-now-{n:03d}", {"kind": "complete"})
            plan[f"r9-now-{n:03d}"] = _entry("now", "complete", "completed", 1)
        for n in range(15 * scale):
            due = later(5 + 9 * n / (15 * scale))
            await add(f"r9-later-{n:03d}", {"kind": "complete"}, due_at=due)
            plan[f"r9-later-{n:03d}"] = _entry("later", "complete", "completed", 1)
        for n in range(20 * scale):
            config = {"kind": "parent", "fanout": 2, "child_sleep": 0.3}
            due = later(0 if n < 12 * scale else 4 + 6 * n / (20 * scale))
            await add(f"r9-parent-{n:02d}", config, due_at=due)
            plan[f"r9-parent-{n:02d}"] = _entry("parent", "parent", "completed", 2, fanout=2)
        for n in range(8 * scale):
            await add(f"r9-reschedule-{n}", {"kind": "reschedule", "left": 3, "every": 0.6})
            plan[f"r9-reschedule-{n}"] = _entry("reschedule", "reschedule", "completed", 4)
        for n in range(8 * scale):
            await add(f"r9-flaky-{n}", {"kind": "flaky"}, due_at=later(n % 4))
            plan[f"r9-flaky-{n}"] = _entry("flaky", "flaky", "completed", 2)
        for n in range(5 * scale):
            key = f"r9-key-{n}"
            first = await add(f"r9-idempotent-{n}", {"kind": "complete"}, idempotency_key=key)
            again = await queue.enqueue(SPEC, config={"kind": "complete"}, idempotency_key=key)
            assert again.id == first.id, (again.id, first.id)
            plan[first.id] = _entry("idempotent", "complete", "completed", 1)
        for n in range(6 * scale):
            await add(
                f"r9-limited-{n}",
                {"kind": "complete", "sleep": 0.6},
                concurrency_key="r9-limited",
                concurrency_limit=KEY_LIMIT,
            )
            plan[f"r9-limited-{n}"] = _entry("limited", "complete", "completed", 1)
    return plan


def main(argv: list[str]) -> int:
    import trio

    import trio_supervise as ts

    url, step = argv[0], argv[1]
    if step == "schema":
        print(trio.run(ts.migrate, url))
        return 0
    path, scale = argv[2], int(argv[3])
    plan = trio.run(_fill, url, scale)
    with open(path, "w", encoding="utf-8") as file:
        json.dump(plan, file, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
