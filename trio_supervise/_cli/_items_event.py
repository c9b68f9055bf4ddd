"""``items event ID NAME JSON``: send an event to a durable workflow's item.

Part of the ``items`` group (``_items.register`` adds this action to its own).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .._operations import send_event
from ..queues import WorkItem, WorkQueue
from ._common import AS_JSON, DATABASE, EXIT_OK, item_json, printable, with_queue
from ._items_edit import json_value


def register(actions: Any) -> None:
    """Add ``event`` to the ``items`` group's *actions*."""
    event = actions.add_parser(
        "event",
        parents=[DATABASE, AS_JSON],
        help="send an event to an item",
        description="Send the event NAME with the payload JSON to a queued or running item: a "
        "durable workflow waiting for NAME is due at once, and one that waits for it later "
        "finds it. An unknown or finished item is refused (exit 3 or 1).",
    )
    event.add_argument("item_id", metavar="ID")
    event.add_argument("name", metavar="NAME", help="the event's name")
    event.add_argument(
        "payload", metavar="JSON", type=json_value, help="the event's payload, a JSON value"
    )
    event.set_defaults(handler=_cmd_event)


def _cmd_event(args: argparse.Namespace) -> int:
    async def body(queue: WorkQueue) -> tuple[WorkItem, str]:
        return await send_event(queue, args.item_id, args.name, args.payload)

    item, said = with_queue(args, body)
    if args.json:
        document = {"event": args.name, "payload": args.payload, "item": item_json(item)}
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        print(printable(said))
    return EXIT_OK
