"""Which named queues the command line knows of, so that a typo is not a new queue.

A queue is *known* when something uses it: an item is in it or it is paused (the database), the
settings' runner serves it (``runner.queues``), or, with ``--service MODULE:ATTR``, the service's
runner serves it, one of its drivers declares it or one of its schedules enqueues into it.

Every command taking a queue name follows one rule: a command that acts on a queue (``queues
pause``, ``queues resume``) refuses an unknown name unless ``--force``, naming the known ones; a
command that puts work into one (``items enqueue``) warns, on stderr, when the item lands where
nothing known serves it, and without ``--queue`` uses the queue the spec's driver declares when
``--service`` says which drivers there are.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping

import attrs

from .._settings import Settings
from ..job import DEFAULT_QUEUE
from ..maintenance import declared_priority, declared_queue, resolve_schedules
from ..queues import WorkQueue
from ._common import PROG, UserError, printable, settings_of
from ._service import resolve_service

__all__ = [
    "KnownQueues",
    "ServiceView",
    "add_service_option",
    "default_priority",
    "default_queue",
    "known_queues",
    "landing_warnings",
    "service_of",
    "warn",
]


def add_service_option(parser: argparse.ArgumentParser, *, force: str | None = None) -> None:
    """``--service`` on *parser*, and ``--force`` (helped by *force*) when given."""
    parser.add_argument(
        "--service",
        metavar="MODULE:ATTR",
        help="the service (as for `run`) whose drivers, schedules and runner settings say which "
        "queues exist and where a spec's items go",
    )
    if force is not None:
        parser.add_argument("--force", action="store_true", help=force)


@attrs.frozen
class ServiceView:
    """What the CLI reads of a ``--service``: its name, which queue and priority each spec's
    driver declares, and the queues its runner serves (None: it runs no runner)."""

    name: str
    spec_queues: Mapping[str, str]
    spec_priorities: Mapping[str, int]
    served: frozenset[str] | None
    schedule_queues: Mapping[str, str]


def service_of(args: argparse.Namespace) -> ServiceView | None:
    """The ``--service`` of *args*, read (None without one)."""
    target = getattr(args, "service", None)
    if not target:
        return None
    service, _ = resolve_service(target, None)
    settings = service.settings or settings_of(args)
    schedules = resolve_schedules(service.schedules, service.drivers)
    return ServiceView(
        name=service.name,
        spec_queues={s: declared_queue(d) for d in service.drivers for s in d.spec_ids},
        spec_priorities={s: declared_priority(d) for d in service.drivers for s in d.spec_ids},
        served=frozenset(settings.runner.queue_limits) if service.drivers else None,
        schedule_queues={s.name: s.item_queue for s in schedules},
    )


@attrs.frozen
class KnownQueues:
    """Each known queue name, with what uses it (see the module doc)."""

    uses: Mapping[str, tuple[str, ...]]
    served: frozenset[str]
    """The queues a runner serves (the service's, else the settings')."""

    def names(self) -> str:
        return ", ".join(printable(name) for name in sorted(self.uses)) or "none"

    def refuse_unknown(self, name: str, verb: str) -> None:
        """Raise a :class:`UserError` unless *name* is known, naming the known queues."""
        if name not in self.uses:
            raise UserError(
                f"no queue {printable(name)!r} is known: no item is in it, it is not paused, and "
                f"no driver, schedule or runner setting names it (known: {self.names()}); "
                f"pass --force to {verb} it anyway"
            )


async def known_queues(
    queue: WorkQueue, settings: Settings, service: ServiceView | None
) -> KnownQueues:
    """The queues known of *queue*'s database, *settings* and *service*."""
    uses: dict[str, list[str]] = {}

    def use(name: str, what: str) -> None:
        uses.setdefault(name, []).append(what)

    for info in await queue.list_queues():
        if info.paused:
            use(info.name, "paused")
        if any(info.counts.values()):
            use(info.name, "holds items")
        if info.rate_limit is not None:
            use(info.name, "rate-limited")
    served = frozenset(settings.runner.queue_limits)
    if service is not None:
        for spec, name in service.spec_queues.items():
            use(name, f"spec {spec}'s driver")
        for schedule, name in service.schedule_queues.items():
            use(name, f"schedule {schedule}")
        if service.served is not None:
            served = service.served
    for name in served:
        use(name, "served by the runner")
    return KnownQueues({name: tuple(what) for name, what in uses.items()}, served)


def landing_warnings(
    spec_id: str, queue_name: str, known: KnownQueues, service: ServiceView | None
) -> list[str]:
    """Why an item of *spec_id* put in *queue_name* may never run, if it may not."""
    spec, name = printable(spec_id), printable(queue_name)
    if service is not None:
        declared = service.spec_queues.get(spec_id)
        if declared is None:
            return [f"no driver of service {service.name!r} handles spec {spec!r}"]
        if declared != queue_name:
            return [
                f"spec {spec}'s driver declares queue {printable(declared)!r}, but this item "
                f"goes to {name!r}"
            ]
    if queue_name not in known.served:
        served = ", ".join(printable(each) for each in sorted(known.served))
        where = f"service {service.name!r}" if service is not None else "these settings"
        hint = "" if service is not None else " (--service MODULE:ATTR uses its drivers' queues)"
        return [
            f"queue {name!r} is not served by the runner of {where} (it serves: {served}): "
            f"nothing here will claim this item{hint}"
        ]
    return []


def default_queue(spec_id: str, service: ServiceView | None) -> str:
    """Where an item of *spec_id* goes without ``--queue``: its driver's queue, else default."""
    if service is None:
        return DEFAULT_QUEUE
    return service.spec_queues.get(spec_id, DEFAULT_QUEUE)


def default_priority(spec_id: str, service: ServiceView | None) -> int:
    """An item's priority without ``--priority``: its driver's declared one, else 0."""
    if service is None:
        return 0
    return service.spec_priorities.get(spec_id, 0)


def warn(message: str) -> None:
    """One warning line on stderr (the command goes on)."""
    print(f"{PROG}: warning: {message}", file=sys.stderr)
