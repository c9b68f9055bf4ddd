"""The maintenance contract: :class:`MaintenanceTask`, a service's background upkeep of its queue
(as Oban's plugins), and the supervised children a service runs the tasks as. The rules a task
keeps are in docs/schedules.md ("Maintenance children").
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import trio

from .._policy import RestartPolicy
from ..queues import WorkQueue
from ..supervision import ChildSpec

__all__ = ["MAINTENANCE_RESTART", "MaintenanceTask", "maintenance_children"]

MAINTENANCE_RESTART = RestartPolicy(1.0, 60.0)
"""How a maintenance task that raised is restarted unless it says otherwise: from 1 s, doubling
to a minute; ten rapid failures in a row fail the service, like any other worker."""

_SHUTDOWN_GRACE = 1.0
"""Seconds a task may take to stop: its writes are atomic, so a cancel loses nothing."""


@runtime_checkable
class MaintenanceTask(Protocol):
    """Background upkeep of a queue, run by a service as the supervised child
    ``maintenance-<name>``, restarted with the task's ``restart`` policy if it has one (else
    :data:`MAINTENANCE_RESTART`).

    Any number of service processes may run a task on one database, so it keeps three rules: its
    writes are idempotent across processes (deterministic item ids or keys, fenced updates); it
    reports readiness once its first pass is done, then runs until cancelled, holding no state a
    cancel could lose; and it reads "now" from ``queue.clock`` and waits with Trio, so a month of
    upkeep passes in milliseconds under an autojump clock.
    """

    @property
    def name(self) -> str:
        """Unique among the service's maintenance tasks; the child is ``maintenance-<name>``."""
        ...

    async def run(self, queue: WorkQueue, *, task_status: trio.TaskStatus[None]) -> None:
        """Look after *queue* until cancelled; call ``task_status.started()`` once ready."""
        ...


def maintenance_children(tasks: Iterable[MaintenanceTask], queue: WorkQueue) -> list[ChildSpec]:
    """One supervised :class:`ChildSpec` per task, running it on *queue*.

    A task's ``restart`` attribute, when it has one, is its restart policy; otherwise
    :data:`MAINTENANCE_RESTART`. Two tasks with one name raise :class:`ValueError`.
    """
    children: list[ChildSpec] = []
    seen: set[str] = set()
    for task in tasks:
        if task.name in seen:
            raise ValueError(f"two maintenance tasks are named {task.name!r}")
        seen.add(task.name)
        restart = getattr(task, "restart", None) or MAINTENANCE_RESTART
        children.append(
            ChildSpec(
                f"maintenance-{task.name}",
                functools.partial(task.run, queue),
                start=True,
                restart=restart,
                shutdown_grace=_SHUTDOWN_GRACE,
            )
        )
    return children
