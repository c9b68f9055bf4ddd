"""Maintenance children: the small contract of a service's background upkeep (as Oban's plugins).

A maintenance task is something a :class:`~trio_supervise.Service` runs beside its workers to look
after the queue: the :class:`~trio_supervise.Scheduler` that enqueues periodic schedules, and the
:class:`~trio_supervise.Pruner` that deletes old finished items (retention). Each is one object
with a ``name`` and an ``async def run(queue, *, task_status)``; the service runs each as a
supervised child named ``maintenance-<name>`` on the service's queue, restarted with the task's
``restart`` policy (or :data:`MAINTENANCE_RESTART`).

Rules a task keeps, so that any number of service processes may run it on one database:

- its writes are idempotent across processes (deterministic item ids or keys, fenced updates);
  running it twice at once, or restarting it, never does a piece of upkeep twice;
- it reports readiness with ``task_status.started()`` once its first pass is done, and then runs
  until cancelled (it holds no state that a cancel could lose);
- it reads "now" from the queue's clock (``queue.clock``) and waits with ``trio.sleep_until``, so
  under an autojump clock a month of upkeep passes in milliseconds.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import trio

from ._policy import RestartPolicy
from .queues import WorkQueue
from .supervision import ChildSpec

__all__ = ["MAINTENANCE_RESTART", "MaintenanceTask", "maintenance_children"]

MAINTENANCE_RESTART = RestartPolicy(1.0, 60.0)
"""How a maintenance task that raised is restarted unless it says otherwise: from 1 s, doubling
to a minute; ten rapid failures in a row fail the service, like any other worker."""

_SHUTDOWN_GRACE = 1.0
"""Seconds a task may take to stop: its writes are atomic, so a cancel loses nothing."""


@runtime_checkable
class MaintenanceTask(Protocol):
    """Background upkeep of a queue, run by a service as a supervised child (see module doc)."""

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
