"""``trio-supervise queues list | pause NAME | resume NAME``: named queues across the fleet.

A pause is stored in the database, so every worker on it stops claiming that queue at its next
claim; items already running finish and settle as usual. ``register`` adds the verb group to the
CLI's subcommands (one call in ``build_parser``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .._describe import stamp
from .._operations import pause_queue, resume_queue
from ..job import ItemState, QueueInfo
from ..queues import WorkQueue
from ._common import (
    AS_JSON,
    DATABASE,
    EXIT_OK,
    Subparsers,
    printable,
    settings_of,
    table,
    with_queue,
)
from ._known import add_service_option, known_queues, service_of

__all__ = ["register"]


def register(subparsers: Subparsers) -> None:
    """Add the ``queues`` verb group and its handlers to the CLI's *subparsers*."""
    queues = subparsers.add_parser("queues", help="list, pause and resume named queues")
    verbs = queues.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = verbs.add_parser(
        "list", parents=[DATABASE, AS_JSON], help="every queue, its counts, paused?"
    )
    listing.set_defaults(handler=_cmd_list)
    for verb, doing in (("pause", "stop claims from"), ("resume", "claim again from")):
        parser = verbs.add_parser(
            verb,
            parents=[DATABASE, AS_JSON],
            help=f"{doing} a queue, fleet-wide",
            description=f"{doing.capitalize()} the named queue, fleet-wide. A name that no item, "
            "paused queue, runner setting (runner.queues) or --service driver or schedule uses "
            "is refused as a likely typo, naming the known queues; --force takes it anyway.",
        )
        parser.add_argument("name", metavar="NAME")
        add_service_option(parser, force=f"{verb} a queue nothing is known to use")
        parser.set_defaults(handler=_cmd_switch)


def _info_json(info: QueueInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "paused": info.paused,
        "paused_at": None if info.paused_at is None else info.paused_at.isoformat(),
        "counts": {str(state): n for state, n in sorted(info.counts.items())},
    }


def _cmd_list(args: argparse.Namespace) -> int:

    infos: list[QueueInfo] = with_queue(args, lambda queue: queue.list_queues())
    if args.json:
        print(json.dumps([_info_json(info) for info in infos], indent=2, sort_keys=True))
        return EXIT_OK
    states = list(ItemState)
    rows = [
        [
            printable(info.name),
            f"paused since {stamp(info.paused_at)} UTC" if info.paused else "active",
            *(f"{info.counts.get(state, 0):,}" for state in states),
        ]
        for info in infos
    ]
    table(rows, ["queue", "status", *(str(state) for state in states)], sys.stdout)
    if not infos:
        print("no queues yet: items go to 'default' unless enqueued with --queue")
    return EXIT_OK


def _cmd_switch(args: argparse.Namespace) -> int:
    """``pause NAME`` or ``resume NAME``: says whether anything changed (exit 0 either way)."""
    service = service_of(args)
    settings = settings_of(args)

    async def body(queue: WorkQueue) -> tuple[bool, str]:
        if not args.force:
            (await known_queues(queue, settings, service)).refuse_unknown(args.name, args.action)
        if args.action == "pause":
            return await pause_queue(queue, args.name)
        return await resume_queue(queue, args.name)

    changed, said = with_queue(args, body)
    _say(args, args.name, changed, printable(said))
    return EXIT_OK


def _say(args: argparse.Namespace, name: str, changed: bool, text: str) -> None:
    if args.json:
        print(json.dumps({"queue": name, "changed": changed, "action": args.action}))
    else:
        print(text)
