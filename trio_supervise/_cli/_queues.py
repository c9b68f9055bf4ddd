"""``trio-supervise queues list | pause NAME | resume NAME | limit NAME --rate N/PERIOD |
limit-key KEY --rate N/PERIOD | keys``: named queues and key rate limits across the fleet.

A pause is stored in the database, so every worker on it stops claiming that queue at its next
claim; items already running finish and settle as usual. A rate limit too: every worker's
claims of the queue count against it (``docs/flow-control.md``). ``register`` adds the verb
group to the CLI's subcommands (one call in ``build_parser``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .._describe import stamp
from .._operations import pause_queue, resume_queue, set_key_rate_limit, set_rate_limit
from ..job import ItemState, QueueInfo, RateLimit, check_key_rule
from ..queues import KeyRateLimitStore, WorkQueue
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
    limit = verbs.add_parser(
        "limit",
        parents=[DATABASE, AS_JSON],
        help="set or lift a queue's rate limit, fleet-wide",
        description="At most N items of the named queue start in any PERIOD, across every "
        "worker (a sliding window over the starts; see the flow control docs). --rate none "
        "lifts the limit. Unknown names are refused as for pause; --force takes them.",
    )
    limit.add_argument("name", metavar="NAME")
    limit.add_argument(
        "--rate",
        required=True,
        type=_rate,
        metavar="N/PERIOD",
        help="at most N starts per PERIOD, as 100/60s, 10/s, 5/500ms, 1000/1h; or none",
    )
    add_service_option(limit, force="limit a queue nothing is known to use")
    limit.set_defaults(handler=_cmd_limit)
    limit_key = verbs.add_parser(
        "limit-key",
        parents=[DATABASE, AS_JSON],
        help="set or lift a concurrency key's rate limit, fleet-wide",
        description="At most N items of a concurrency key start in any PERIOD, across every "
        "worker. KEY is a key (tenant:acme) or a template over {tenant} and {subject} "
        "(partner:{tenant}): each key it renders has its own window. --rate none lifts it.",
    )
    limit_key.add_argument("key", metavar="KEY_OR_TEMPLATE", type=_key_rule)
    limit_key.add_argument(
        "--rate",
        required=True,
        type=_rate,
        metavar="N/PERIOD",
        help="at most N starts per PERIOD, as 100/60s, 10/s, 5/500ms, 1000/1h; or none",
    )
    limit_key.set_defaults(handler=_cmd_limit_key)
    keys = verbs.add_parser(
        "keys",
        parents=[DATABASE, AS_JSON],
        help="key rate limits, and the keys throttled now",
    )
    keys.set_defaults(handler=_cmd_keys)


def _key_rule(text: str) -> str:
    """``limit-key``'s KEY: a key or a template (else exit 2, naming the rule)."""
    try:
        return check_key_rule(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _rate(text: str) -> RateLimit | None:
    """``--rate``'s value: a :class:`RateLimit`, or None for ``none``."""
    if text.strip().lower() == "none":
        return None
    try:
        return RateLimit.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _info_json(info: QueueInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "paused": info.paused,
        "paused_at": None if info.paused_at is None else info.paused_at.isoformat(),
        "counts": {str(state): n for state, n in sorted(info.counts.items())},
        "rate_limit": None if info.rate_limit is None else str(info.rate_limit),
        "throttled_until": (
            None if info.throttled_until is None else info.throttled_until.isoformat()
        ),
    }


def _rate_shown(info: QueueInfo) -> str:
    if info.rate_limit is None:
        return "-"
    if info.throttled_until is None:
        return str(info.rate_limit)
    return f"{info.rate_limit}, throttled until {stamp(info.throttled_until)} UTC"


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
            _rate_shown(info),
        ]
        for info in infos
    ]
    table(rows, ["queue", "status", *(str(state) for state in states), "rate"], sys.stdout)
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


def _cmd_limit(args: argparse.Namespace) -> int:
    """``limit NAME --rate N/PERIOD``: sets the rate limit (``none`` lifts it)."""
    service = service_of(args)
    settings = settings_of(args)

    async def body(queue: WorkQueue) -> tuple[bool, str]:
        if not args.force:
            (await known_queues(queue, settings, service)).refuse_unknown(args.name, "limit")
        return await set_rate_limit(queue, args.name, args.rate)

    changed, said = with_queue(args, body)
    if args.json:
        rate = None if args.rate is None else str(args.rate)
        print(json.dumps({"queue": args.name, "changed": changed, "rate": rate}))
    else:
        print(printable(said))
    return EXIT_OK


def _cmd_limit_key(args: argparse.Namespace) -> int:
    """``limit-key KEY --rate N/PERIOD``: sets the key's rate limit (``none`` lifts it)."""
    changed, said = with_queue(args, lambda queue: set_key_rate_limit(queue, args.key, args.rate))
    if args.json:
        rate = None if args.rate is None else str(args.rate)
        print(json.dumps({"key": args.key, "changed": changed, "rate": rate}))
    else:
        print(printable(said))
    return EXIT_OK


def _cmd_keys(args: argparse.Namespace) -> int:
    """``keys``: every key rate limit, and each throttled key with when it frees."""

    async def body(queue: WorkQueue) -> tuple[dict[str, RateLimit], dict[str, Any]]:
        if not isinstance(queue, KeyRateLimitStore):
            return {}, {}
        return await queue.key_rate_limits(), await queue.throttled_keys()

    rules, throttled = with_queue(args, body)
    if args.json:
        shown = {key: until.isoformat() for key, until in throttled.items()}
        print(json.dumps({"limits": {k: str(r) for k, r in rules.items()}, "throttled": shown}))
        return EXIT_OK
    rows = [[printable(key), str(rate)] for key, rate in rules.items()]
    table(rows, ["key", "rate"], sys.stdout)
    for key, until in throttled.items():
        print(f"throttled: {printable(key)} until {stamp(until)} UTC")
    return EXIT_OK


def _say(args: argparse.Namespace, name: str, changed: bool, text: str) -> None:
    if args.json:
        print(json.dumps({"queue": name, "changed": changed, "action": args.action}))
    else:
        print(text)
