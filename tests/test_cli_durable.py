"""``items event`` and the journal in ``items show``, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import trio

from trio_supervise import DriverRegistry, RunnerSettings, Workflow, durable_workflow, run_due_pass
from trio_supervise.queues._factory import open_queue

from . import test_cli
from .test_cli import Result

cli = test_cli.cli
database_url = test_cli.database_url
"""The command-line tests' fixtures: the CLI in-process on each backend's empty database."""


@attrs.frozen
class Signup:
    email: str


@durable_workflow("signup", config_type=Signup)
async def signup(wf: Workflow[Any], config: Signup) -> Any:
    user = await wf.step("create-user", lambda: {"id": "u1", "email": config.email})
    approval = await wf.wait_for_event("approved", timeout=dt.timedelta(days=7))
    return {"user": user, "approval": approval}


def lines(shown: str) -> dict[str, str]:
    """``items show``'s lines by field name (names may hold one space: "step 0")."""
    out = {}
    for line in shown.splitlines():
        name, _, value = line.partition("  ")
        out[name.strip()] = value.strip()
    return out


def evaluate(url: str) -> None:
    """One due pass of the signup workflow over the database at *url*."""

    async def main() -> None:
        registry: DriverRegistry[None] = DriverRegistry()
        registry.register(signup)
        async with open_queue(url) as queue:
            await run_due_pass(queue, registry, RunnerSettings(worker_id="w"), lambda: None)

    trio.run(main)


def test_items_event_wakes_a_waiting_workflow_and_show_lists_its_journal(
    cli: Callable[..., Result], database_url: str
) -> None:
    """`items show` lists the recorded step and the pending wait; `items event` sends the
    event (the item due at once), and the next evaluation completes with its payload; an
    event for a finished item or an unknown one is refused."""
    assert cli("migrate").code == 0
    made = cli("items", "enqueue", "signup", '{"email": "a@example.com"}', "--id", "s-1")
    assert made.code == 0, made.err
    evaluate(database_url)
    shown = lines(cli("items", "show", "s-1").out)
    assert shown["step 0"].startswith("create-user: ")
    assert shown["step 0"].endswith('1 attempt: {"email": "a@example.com", "id": "u1"}')
    assert shown["wait 1"].startswith("approved: ")
    assert "waiting (deadline: " in shown["wait 1"]

    sent = cli("items", "event", "s-1", "approved", '{"by": "ann"}')
    assert sent.code == 0, sent.err
    assert "sent event 'approved' to 's-1' (queued, due " in sent.out
    assert lines(cli("items", "show", "s-1").out)["event 1"].startswith("approved at ")
    evaluate(database_url)
    document = json.loads(cli("items", "show", "s-1", "--json").out)
    assert document["state"] == "completed"
    assert document["result"]["approval"] == {"by": "ann"}
    assert [entry["name"] for entry in document["journal"]["entries"]] == [
        "create-user",
        "approved",
    ]

    late = cli("items", "event", "s-1", "approved", "1")
    assert (late.code, "is completed: it takes no more events" in late.err) == (1, True)
    unknown = cli("items", "event", "nobody", "approved", "null")
    assert unknown.code == 3
    assert "no item with id 'nobody'" in unknown.err
    with pytest.raises(SystemExit) as bad:
        cli("items", "event", "s-1", "approved", "{oops")
    assert bad.value.code == 2
