"""``items prune|delete|edit``: retention by hand, and fixing an item before a retry.

Part of the ``items`` group (``_items.register`` adds these actions to its own).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .._convert import nested_too_deeply, nesting_exceeds
from .._operations import delete_item
from ..maintenance import parse_period
from ..queues import ItemState, WorkItem, WorkQueue
from ._common import (
    AS_JSON,
    DATABASE,
    EXIT_OK,
    item_json,
    print_item,
    printable,
    with_queue,
)

_FINISHED = [state.value for state in ItemState if state.finished]
_BATCH = 1000
"""Items one prune batch (one short transaction) deletes per state."""
_NEVER = frozenset({"none", "forever", "never"})


def register(actions: Any) -> None:
    """Add ``prune``, ``delete`` and ``edit`` to the ``items`` group's *actions*."""
    prune = actions.add_parser(
        "prune",
        parents=[DATABASE, AS_JSON],
        help="delete old finished items",
        description="Delete finished items (completed, cancelled, dead) last updated at least "
        "--older-than ago, oldest first, in batches of 1000 (each its own short transaction, "
        "so running workers are not held up). Queued and running items are never touched. "
        "A schedule that catches missed fires up finds them by their items: keep at least "
        "its catch-up window.",
    )
    prune.add_argument(
        "--older-than",
        required=True,
        type=_age,
        metavar="AGE",
        help="seconds or text like 90s, 15m, 12h, 7d, 2w (at most 365 days)",
    )
    prune.add_argument(
        "--state",
        action="append",
        choices=_FINISHED,
        help="only items in this state (repeatable; default: all three)",
    )
    prune.add_argument(
        "--dry-run", action="store_true", help="count what would be deleted; delete nothing"
    )
    prune.set_defaults(handler=_cmd_prune)

    delete = actions.add_parser(
        "delete",
        parents=[DATABASE, AS_JSON],
        help="delete one item",
        description="Delete one item that is not running (a running item must be cancelled "
        "first). Its id and idempotency key are free again.",
    )
    delete.add_argument("item_id", metavar="ID")
    delete.set_defaults(handler=_cmd_delete)

    edit = actions.add_parser(
        "edit",
        parents=[AS_JSON],
        help="replace an item's config",
        description="Replace the config of a queued or finished item, e.g. a dead item's, "
        "before `items retry`. A running item's config cannot change (exit 1). Here --config "
        "is the item's new config; the settings file is --settings.",
    )
    edit.add_argument("item_id", metavar="ID")
    edit.add_argument(
        "--settings",
        dest="config",
        metavar="PATH",
        help="settings file (TOML); default: $TRIO_SUPERVISE_CONFIG",
    )
    edit.add_argument(
        "--database-url",
        metavar="URL",
        help="queue URL; default: settings database_url ($TRIO_SUPERVISE_DATABASE_URL)",
    )
    edit.add_argument(
        "--config", dest="new_config", required=True, type=json_value, metavar="JSON",
        help="the new config, a JSON value",
    )  # fmt: skip
    edit.set_defaults(handler=_cmd_edit)


def _age(text: str) -> float:
    if text.strip().lower() in _NEVER:
        raise argparse.ArgumentTypeError(f"an age is needed, got {printable(text)!r}")
    try:
        return parse_period(text, what="the age", forever=True)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def json_value(text: str) -> Any:
    """A command-line argument that must be a JSON value (a config, an event's payload)."""
    if nesting_exceeds(text):
        raise argparse.ArgumentTypeError(nested_too_deeply("the value"))
    try:
        return json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None


def _cmd_prune(args: argparse.Namespace) -> int:
    states = [ItemState(s) for s in args.state] if args.state else [
        ItemState(s) for s in _FINISHED
    ]  # fmt: skip
    ages = dict.fromkeys(states, args.older_than)

    async def body(queue: WorkQueue) -> dict[ItemState, int]:
        if args.dry_run:
            return await queue.prune(ages, dry_run=True)
        totals = dict.fromkeys(states, 0)
        pending = dict(ages)
        while pending:
            got = await queue.prune(pending, limit=_BATCH)
            for state, n in got.items():
                totals[state] += n
                if n < _BATCH:
                    del pending[state]
        return totals

    counts: dict[ItemState, int] = with_queue(args, body)
    if args.json:
        document = {"dry_run": args.dry_run, "counts": {str(s): n for s, n in counts.items()}}
        print(json.dumps(document, indent=2, sort_keys=True))
        return EXIT_OK
    verb = "would delete" if args.dry_run else "deleted"
    for state, n in counts.items():
        print(f"{verb} {n:,} {state}")
    return EXIT_OK


def _cmd_delete(args: argparse.Namespace) -> int:
    item, said = with_queue(args, lambda queue: delete_item(queue, args.item_id))
    if args.json:
        print(json.dumps(item_json(item), indent=2, sort_keys=True))
    else:
        print(printable(said))
    return EXIT_OK


def _cmd_edit(args: argparse.Namespace) -> int:
    item: WorkItem = with_queue(
        args, lambda queue: queue.edit_config(args.item_id, args.new_config)
    )
    if args.json:
        print_item(item, True)
    else:
        config = printable(json.dumps(item.config, sort_keys=True))
        print(f"edited {printable(item.id)} ({item.state}): config {config}")
    return EXIT_OK
