"""The ``trio-supervise schedules`` verb group: a service's schedules and when they fire.

``schedules list MODULE:ATTR`` takes the same target as ``run`` (a :class:`Service`, or a
callable returning one, called with ``settings=`` if it takes them) and prints each schedule with
its next fire times, in its own zone and in UTC; nothing is started and no database is opened.

Exit codes (the CLI's contract): 0 ok, 1 a user or runtime error (the target cannot be imported
or is not a service, ``--at`` is not a datetime), 2 a malformed command line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys

from .._clock import SystemClock
from .._settings import load_settings
from ..maintenance import Schedule
from ._common import EXIT_OK, Subparsers, table, when
from ._service import resolve_service

__all__ = ["register"]

_MAX_FIRES = 100


def register(subparsers: Subparsers) -> None:
    """Add the ``schedules`` group (``list``) to the CLI's *subparsers*."""
    group = subparsers.add_parser("schedules", help="inspect a service's periodic schedules")
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser(
        "list", help="show each schedule of a service and its next fire times"
    )
    listing.add_argument(
        "target",
        metavar="MODULE:ATTR",
        help="the service, as for `run`: a Service, or a callable returning one",
    )
    listing.add_argument(
        "--config", metavar="PATH", help="settings file (TOML), for a factory taking settings="
    )
    listing.add_argument(
        "--count",
        type=_count,
        default=3,
        help=f"next fire times per schedule, 1..{_MAX_FIRES} (default 3)",
    )
    listing.add_argument(
        "--at", help="list the fires after this ISO 8601 datetime (default: now) or +SECONDS"
    )
    listing.add_argument("--json", action="store_true", help="print JSON for scripts")
    listing.set_defaults(handler=_cmd_list)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
    if not 1 <= value <= _MAX_FIRES:
        raise argparse.ArgumentTypeError(f"must be 1..{_MAX_FIRES}, got {value}")
    return value


def _service_schedules(target_text: str, config: str | None) -> tuple[str, list[Schedule]]:
    """The name and schedules of the service *target_text* names (resolved as ``run`` does)."""
    service, _ = resolve_service(target_text, load_settings(config) if config else None)
    return service.name, list(service.schedules)


def _local(instant: dt.datetime, schedule: Schedule) -> str:
    return instant.astimezone(schedule.zone).strftime("%Y-%m-%d %H:%M:%S %z")


def _utc(instant: dt.datetime) -> str:
    return instant.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cmd_list(args: argparse.Namespace) -> int:
    name, schedules = _service_schedules(args.target, args.config)
    now = SystemClock().now()
    after = when(args.at, now) or now
    fires = {s.name: s.next_fires(after, args.count) for s in schedules}
    if args.json:
        document = [
            {
                "name": s.name,
                "spec_id": s.spec_id,
                "cron": s.cron,
                "timezone": s.timezone,
                "missed": str(s.missed),
                "queue": s.item_queue,
                "priority": s.item_priority,
                "config": s.config,
                "next": [_utc(fire) for fire in fires[s.name]],
                "next_local": [_local(fire, s) for fire in fires[s.name]],
            }
            for s in schedules
        ]
        print(json.dumps(document, indent=2, sort_keys=True))
        return EXIT_OK
    if not schedules:
        print(f"service {name!r} has no schedules", file=sys.stdout)
        return EXIT_OK
    rows: list[list[str]] = []
    for s in schedules:
        head = [s.name, s.spec_id, s.cron, s.timezone, str(s.missed)]
        for n, fire in enumerate(fires[s.name]):
            cells = head if n == 0 else [""] * len(head)
            rows.append([*cells, _local(fire, s), _utc(fire)])
    headers = ["name", "spec", "cron", "timezone", "missed", "next (local)", "next (utc)"]
    table(rows, headers, sys.stdout)
    return EXIT_OK
