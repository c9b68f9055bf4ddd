"""``items list|show|enqueue|cancel|retry``: inspect and change work items.

``items prune|delete|edit`` live in ``_items_edit``, registered here.

``items enqueue --from-file items.jsonl`` reads one JSON object a line (the fields of
:class:`NewItem`), checks every line before it writes any, and enqueues them all in one
``enqueue_many`` (one transaction): a bad line is reported with its number and field (exit 2)
and nothing is written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from .._convert import nested_too_deeply, nesting_exceeds
from .._describe import due_text, stamp
from .._errors import ConfigError, DuplicateItem
from .._operations import cancel_item, read_journal, retry_item
from .._settings import MAX_COUNT
from ..job import (
    DEFAULT_QUEUE,
    MAX_CONCURRENCY_LIMIT,
    MAX_DELAY,
    MAX_PRIORITY,
    MIN_PRIORITY,
    check_concurrency,
    check_entries,
    check_priority,
    first_line,
)
from ..queues import Enqueued, ItemState, Journal, NewItem, WorkItem, WorkQueue
from . import _items_edit, _items_event
from ._common import (
    AS_JSON,
    DATABASE,
    EXIT_OK,
    EXIT_USAGE,
    Subparsers,
    UserError,
    item_json,
    limit,
    one_line,
    print_item,
    printable,
    settings_of,
    short,
    table,
    when,
    with_queue,
)
from ._known import (
    add_service_option,
    default_priority,
    default_queue,
    known_queues,
    landing_warnings,
    service_of,
    warn,
)


def register(commands: Subparsers) -> None:
    """Add the ``items`` group and its actions to *commands*."""
    items = commands.add_parser("items", help="inspect and change work items")
    actions = items.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", parents=[DATABASE, AS_JSON], help="list items")
    listing.add_argument(
        "--state",
        action="append",
        choices=[state.value for state in ItemState],
        help="only items in this state (repeatable)",
    )
    listing.add_argument("--spec", action="append", help="only items of this spec (repeatable)")
    listing.add_argument(
        "--tag",
        action="append",
        dest="tags",
        metavar="TAG",
        help="only items carrying this tag (repeatable: every one of them)",
    )
    listing.add_argument(
        "--limit", type=limit, default=50, help=f"at most N, 1..{MAX_COUNT} (default 50)"
    )
    listing.add_argument(
        "--after", metavar="ID", help="the page after this item (the last id of the previous page)"
    )
    listing.add_argument(
        "--parent",
        metavar="ID",
        help="only the children of this item, in the order they were created",
    )
    listing.set_defaults(handler=_cmd_list)

    show = actions.add_parser(
        "show",
        parents=[DATABASE, AS_JSON],
        help="show one item",
        description="Show the item with id ID, or with --key the item holding that idempotency "
        "key (else the newest one that held it).",
    )
    which = show.add_mutually_exclusive_group(required=True)
    which.add_argument("item_id", metavar="ID", nargs="?")
    which.add_argument("--key", help="the item by its idempotency key instead of its id")
    show.set_defaults(handler=_cmd_show)

    enqueue = actions.add_parser(
        "enqueue",
        parents=[DATABASE, AS_JSON],
        help="add an item, or many from a file",
        description="Add an item. With an idempotency key another item holds, nothing is written "
        "and that item is reported ('exists: ...'; exit 0). --from-file PATH (or - for stdin) "
        "adds one item per line, each a JSON object with enqueue's fields (spec_id, config, "
        "tenant_id, subject_id, due_at, item_id, idempotency_key, priority, queue, "
        "evaluation_timeout, unique, concurrency_key, concurrency_limit, tags, start_by, "
        "debounce), in one "
        "transaction: a bad line is reported with its line "
        "number and field (exit 2) and nothing is written. Without --queue, --service "
        "MODULE:ATTR puts the item in the queue the spec's driver declares (else 'default'); "
        "an item that lands in a queue nothing known serves is warned about on stderr.",
    )
    enqueue.add_argument("spec_id", metavar="SPEC", nargs="?")
    enqueue.add_argument("item_config", metavar="CONFIG_JSON", nargs="?", default=None)
    enqueue.add_argument(
        "--from-file", metavar="PATH", help="JSON lines, one item each ('-': standard input)"
    )
    enqueue.add_argument(
        "--unique",
        type=_unique,
        default="forever",
        metavar="SCOPE",
        help="how long --key holds: 'forever' (default), 'unfinished' (until the item is "
        "completed, cancelled or dead) or a period from creation (SECONDS, or 30m, 12h, 7d)",
    )
    enqueue.add_argument("--id", dest="item_id", help="the item's id (default: generated)")
    enqueue.add_argument("--tenant", default="", help="tenant id")
    enqueue.add_argument("--subject", default="", help="subject id")
    enqueue.add_argument("--due", help="ISO 8601 datetime with a timezone, or +SECONDS")
    enqueue.add_argument(
        "--start-by",
        metavar="WHEN",
        help="a start deadline (as --due): claimed after it, the item goes dead unstarted",
    )
    enqueue.add_argument(
        "--debounce",
        action="store_true",
        help="with --key: a queued item holding it takes this config and due time instead",
    )
    enqueue.add_argument("--key", help="idempotency key")
    enqueue.add_argument(
        "--tag",
        action="append",
        dest="tags",
        metavar="TAG",
        help="a label to find the item by (repeatable)",
    )
    enqueue.add_argument(
        "--priority",
        type=_priority,
        help=f"{MIN_PRIORITY}..{MAX_PRIORITY}, lower is claimed first (default: the driver's "
        "declared priority with --service, else 0)",
    )
    enqueue.add_argument(
        "--queue",
        help="the named queue (default: the driver's declared queue with --service, else "
        f"{DEFAULT_QUEUE!r})",
    )
    add_service_option(enqueue)
    enqueue.add_argument(
        "--concurrency-key",
        metavar="KEY",
        help="at most --concurrency-limit items of this key run at once, fleet-wide",
    )
    enqueue.add_argument(
        "--concurrency-limit",
        metavar="N",
        type=_concurrency_limit,
        help="how many items of --concurrency-key may run at once (default 1)",
    )
    enqueue.set_defaults(handler=_cmd_enqueue)

    cancel = actions.add_parser(
        "cancel",
        parents=[DATABASE, AS_JSON],
        help="cancel an item",
        description="Cancel a queued item at once, or ask a running item's worker to stop it. "
        "A completed or dead item has nothing to cancel (exit 1); an already cancelled one "
        "is left as it is (exit 0).",
    )
    cancel.add_argument("item_id", metavar="ID")
    cancel.set_defaults(handler=_cmd_cancel)

    retry = actions.add_parser(
        "retry",
        parents=[DATABASE, AS_JSON],
        help="requeue an item",
        description="Requeue a failed, dead, cancelled or completed item, due now (or --at), "
        "its error count and attempts reset. A queued item already has a due time: moving it "
        "needs --now or --at. A running item must be cancelled first.",
    )
    retry.add_argument("item_id", metavar="ID")
    moment = retry.add_mutually_exclusive_group()
    moment.add_argument(
        "--at", metavar="WHEN", help="ISO 8601 datetime with a timezone, or +SECONDS"
    )
    moment.add_argument("--now", action="store_true", help="a queued item too: make it due now")
    retry.set_defaults(handler=_cmd_retry)
    _items_edit.register(actions)
    _items_event.register(actions)


def _cmd_list(args: argparse.Namespace) -> int:
    states = [ItemState(s) for s in args.state] if args.state else None

    if args.parent is not None and args.after is not None:
        raise UserError("--after pages the whole queue; with --parent, use --limit")

    async def body(queue: WorkQueue) -> tuple[list[WorkItem], int | None]:
        if args.parent is not None:
            await queue.get(args.parent)  # an unknown parent is an error, not "no items"
            children = [
                child
                for child in await queue.list_children(args.parent, limit=MAX_COUNT)
                if (states is None or child.state in states)
                and (args.spec is None or child.spec_id in args.spec)
                and all(tag in child.tags for tag in args.tags or ())
            ]
            return children[: args.limit], len(children)
        items = await queue.list_items(
            states=states, spec_ids=args.spec, limit=args.limit, after=args.after, tags=args.tags
        )
        if args.tags:
            return items, None  # counts are kept per spec and state, not per tag
        counts = await queue.counts()
        total = sum(
            n
            for (spec_id, state), n in counts.items()
            if (states is None or state in states) and (args.spec is None or spec_id in args.spec)
        )
        return items, total

    items, total = with_queue(args, body)
    if args.json:
        print(json.dumps([item_json(item) for item in items], indent=2, sort_keys=True))
        return 0
    in_all = "" if total is None else f" ({total:,} in all)"
    if not items:
        print("no items" if args.after is None else f"no items after {args.after}{in_all}")
        return 0
    rows = [
        [
            item.id,
            item.spec_id,
            str(item.state) + ("*" if item.cancel_requested else ""),
            due_text(item).removesuffix(" UTC"),
            short(item.queue, 20),
            str(item.priority),
            str(item.error_count),
            short(item.tenant_id, 16),
            short(item.subject_id, 16),
            short(", ".join(item.tags), 24),
            short(first_line(item.last_error), 40),  # its summary, not its traceback
        ]
        for item in items
    ]
    table(
        rows,
        [
            "id",
            "spec",
            "state",
            "due (utc)",
            "queue",
            "priority",
            "errors",
            "tenant",
            "subject",
            "tags",
            "last error",
        ],
        sys.stdout,
    )
    if any(item.cancel_requested for item in items):
        print("* cancel requested")
    more = (
        f"; next page: --after {items[-1].id}"
        if len(items) == args.limit and args.parent is None
        else ""
    )
    of = "" if total is None else f" of {total:,}"
    print(f"{len(items):,}{of}{' after ' + args.after if args.after else ''}{more}")
    return 0


_SHOWN_CHILDREN = 10_000
"""The most children ``items show`` reads to summarise them ("10000+" past that)."""


def _cmd_show(args: argparse.Namespace) -> int:
    async def body(queue: WorkQueue) -> tuple[WorkItem, list[WorkItem], Journal | None]:
        if args.key is not None:
            item = await queue.get_by_key(args.key)
        else:
            item = await queue.get(args.item_id)
        children = await queue.list_children(item.id, limit=_SHOWN_CHILDREN)
        return item, children, await read_journal(queue, item.id)

    item, children, journal = with_queue(args, body)
    complete = len(children) < _SHOWN_CHILDREN
    print_item(item, args.json, children, complete=complete, journal=journal)
    return 0


_PERIOD = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)([smhd]?)$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _unique(text: str) -> str | float:
    """--unique: 'forever', 'unfinished', or a period (SECONDS, or with an s/m/h/d unit)."""
    if text in ("forever", "unfinished"):
        return text
    match = _PERIOD.match(text.strip())
    seconds = float(match[1]) * _UNIT[match[2]] if match else math.nan
    if not 0 < seconds <= MAX_DELAY:
        raise argparse.ArgumentTypeError(
            "must be 'forever', 'unfinished' or a positive period (SECONDS, or 30m, 12h, 7d), "
            f"got {printable(text)!r}"
        )
    return seconds


def _priority(text: str) -> int:
    try:
        return check_priority(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an integer from {MIN_PRIORITY} (claimed first) to {MAX_PRIORITY}, "
            f"got {printable(text)!r}"
        ) from None


def _concurrency_limit(text: str) -> int:
    try:
        return check_concurrency("key", int(text))[1] or 1
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an integer from 1 to {MAX_CONCURRENCY_LIMIT}, got {printable(text)!r}"
        ) from None


def _cmd_enqueue(args: argparse.Namespace) -> int:
    if args.from_file is not None:
        return _enqueue_from_file(args)
    if args.spec_id is None:
        raise UserError("give a SPEC to enqueue, or --from-file PATH", exit_code=EXIT_USAGE)
    config: Any = None
    if args.item_config is not None:
        if nesting_exceeds(args.item_config):
            raise ConfigError(nested_too_deeply("config"))
        try:
            config = json.loads(args.item_config)
        except ValueError as error:
            raise UserError(f"CONFIG_JSON is not JSON: {error}") from None

    service = service_of(args)
    settings = settings_of(args)

    async def body(queue: WorkQueue) -> Enqueued:
        entry = NewItem(
            spec_id=args.spec_id,
            config=config,
            tenant_id=args.tenant,
            subject_id=args.subject,
            due_at=when(args.due, queue.clock.now()),
            item_id=args.item_id,
            idempotency_key=args.key,
            priority=(
                default_priority(args.spec_id, service) if args.priority is None else args.priority
            ),
            queue=default_queue(args.spec_id, service) if args.queue is None else args.queue,
            concurrency_key=args.concurrency_key,
            concurrency_limit=args.concurrency_limit,
            unique=args.unique,
            tags=args.tags or (),
            start_by=when(args.start_by, queue.clock.now()),
            debounce=args.debounce,
        )
        known = await known_queues(queue, settings, service)
        [done] = await queue.enqueue_many([entry])
        for problem in landing_warnings(entry.spec_id, entry.queue, known, service):
            warn(problem)
        return done

    done: Enqueued = with_queue(args, body, create=True)
    if args.json:
        print_item(done.item, True)
    else:
        print(_outcome_line(done))
    return 0


def _outcome_line(done: Enqueued) -> str:
    """``enqueued ID (SPEC), due ...`` or ``exists: ID (key K, state S); config unchanged``."""
    item = done.item
    if done.replaced:
        return (
            f"replaced: {printable(item.id)} (key {printable(item.idempotency_key)}) takes this "
            f"config, due {stamp(item.due_at)} UTC"
        )
    if not done.created:
        key = item.idempotency_key or item.released_key
        return (
            f"exists: {printable(item.id)} (key {printable(key)}, state {item.state}); "
            "config unchanged"
        )
    spec = printable(item.spec_id)
    return f"enqueued {printable(item.id)} ({spec}), due {stamp(item.due_at)} UTC"


_FILE_FIELDS = {
    "spec_id": str,
    "config": object,
    "tenant_id": str,
    "subject_id": str,
    "due_at": str,
    "item_id": str,
    "idempotency_key": str,
    "priority": int,
    "queue": str,
    "evaluation_timeout": float,
    "unique": object,
    "concurrency_key": str,
    "concurrency_limit": int,
    "tags": list,
    "traceparent": str,
    "start_by": str,
    "debounce": bool,
}
"""The fields a line of --from-file may hold, and the JSON type each must have."""


def _enqueue_from_file(args: argparse.Namespace) -> int:
    per_item = {
        "SPEC": args.spec_id,
        "CONFIG_JSON": args.item_config,
        "--id": args.item_id,
        "--tenant": args.tenant or None,
        "--subject": args.subject or None,
        "--due": args.due,
        "--key": args.key,
        "--priority": args.priority,
        "--queue": args.queue,
        "--service": args.service,
        "--unique": None if args.unique == "forever" else args.unique,
        "--concurrency-key": args.concurrency_key,
        "--concurrency-limit": args.concurrency_limit,
        "--tag": args.tags,
        "--start-by": args.start_by,
        "--debounce": args.debounce or None,
    }
    given = [name for name, value in per_item.items() if value is not None]
    if given:
        raise UserError(
            f"--from-file takes every field from the file; drop {', '.join(given)}",
            exit_code=EXIT_USAGE,
        )
    if args.from_file == "-":
        lines = _read_lines(sys.stdin)
    else:
        try:
            with open(args.from_file, encoding="utf-8") as stream:
                lines = _read_lines(stream)
        except UnicodeDecodeError as error:
            raise UserError(f"{printable(args.from_file)} is not UTF-8 text: {error}") from None

    settings = settings_of(args)

    async def body(queue: WorkQueue) -> list[tuple[int, Enqueued]]:
        numbered = _parse_lines(lines, queue.clock.now())
        known = await known_queues(queue, settings, None)
        try:
            done = await queue.enqueue_many([entry for _, entry in numbered])
        except DuplicateItem as error:
            clashing = [n for n, entry in numbered if entry.item_id == error.item_id]
            where = f"line {clashing[-1]}: " if clashing else ""
            raise UserError(f"{where}{error}; nothing was written") from None
        warned = set()
        for _, entry in numbered:
            for problem in landing_warnings(entry.spec_id, entry.queue, known, None):
                if problem not in warned:
                    warned.add(problem)
                    warn(problem)
        return [(n, each) for (n, _), each in zip(numbered, done, strict=True)]

    results: list[tuple[int, Enqueued]] = with_queue(args, body, create=True)
    created = sum(each.created for _, each in results)
    if args.json:
        document = [
            {"line": n, "created": each.created, "item": item_json(each.item)}
            for n, each in results
        ]
        print(json.dumps(document, indent=2, sort_keys=True))
        return 0
    for _, each in results:
        print(_outcome_line(each))
    print(f"{created:,} enqueued, {len(results) - created:,} existed already")
    return 0


def _read_lines(stream: TextIO) -> list[tuple[int, str]]:
    """The non-blank lines of *stream*, numbered from 1."""
    return [(n, line) for n, line in enumerate(stream, start=1) if line.strip()]


def _parse_lines(lines: Iterable[tuple[int, str]], now: dt.datetime) -> list[tuple[int, NewItem]]:
    """Every line as a checked entry; the first bad one raises a UserError (exit 2) naming its
    line number and field, before anything is written."""
    entries = []
    for number, line in lines:
        try:
            entry = _entry_of(line, now)
            check_entries([entry])
        except (UserError, ValueError) as error:
            raise UserError(
                f"line {number}: {one_line(error)}; nothing was written", exit_code=EXIT_USAGE
            ) from None
        entries.append((number, entry))
    return entries


def _entry_of(line: str, now: dt.datetime) -> NewItem:
    if nesting_exceeds(line):
        raise ConfigError(nested_too_deeply("config"))
    try:
        document = json.loads(line)
    except ValueError as error:
        raise UserError(f"not JSON: {error}") from None
    if not isinstance(document, dict):
        raise UserError(f"expected a JSON object, got {type(document).__name__}")
    unknown = sorted(set(document) - set(_FILE_FIELDS))
    if unknown:
        raise UserError(
            f"unknown field {printable(unknown[0])!r} (known: {', '.join(_FILE_FIELDS)})"
        )
    if "spec_id" not in document:
        raise UserError("spec_id is missing")
    fields: dict[str, Any] = {}
    for name, value in document.items():
        wanted = _FILE_FIELDS[name]
        if value is None or wanted is object:
            fields[name] = value
        elif wanted is float and isinstance(value, int | float) and not isinstance(value, bool):
            fields[name] = float(value)
        elif isinstance(value, wanted) and (wanted is bool or not isinstance(value, bool)):
            fields[name] = value
        else:
            raise UserError(f"{name} must be {_TYPE_NAMES[wanted]}, got {json.dumps(value)}")
    for name in ("due_at", "start_by"):
        if name in fields:
            fields[name] = when(fields[name], now)
    for name in ("tenant_id", "subject_id", "queue", "priority", "unique"):
        if fields.get(name, 0) is None:
            del fields[name]  # null: the default
    if isinstance(fields.get("unique"), str):
        try:
            fields["unique"] = _unique(fields["unique"])
        except argparse.ArgumentTypeError as error:
            raise UserError(f"unique {error}") from None
    return NewItem(**fields)


_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    list: "a list",
    bool: "true or false",
}


def _cmd_cancel(args: argparse.Namespace) -> int:
    item, said = with_queue(args, lambda queue: cancel_item(queue, args.item_id))
    if args.json:
        print_item(item, True)
    else:
        print(printable(said))
    return EXIT_OK


def _cmd_retry(args: argparse.Namespace) -> int:
    async def body(queue: WorkQueue) -> tuple[WorkItem, str]:
        return await retry_item(
            queue,
            args.item_id,
            at=when(args.at, queue.clock.now()),
            move_queued=args.now or args.at is not None,
            queued_hint="pass --now to run it now, or --at to move it",
        )

    item, said = with_queue(args, body)
    if args.json:
        print_item(item, True)
    else:
        print(printable(said))
    return EXIT_OK
