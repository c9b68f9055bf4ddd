"""A supervisor's children table: its children in start order and by name, and what is read from
it (OTP's ``which_children`` and ``count_children``, the worker metrics).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import attrs
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from ._child import ChildSpec, Slot, WorkerState, WorkerStatus
from ._group import AutoShutdown, check_significant

if TYPE_CHECKING:
    from ._supervisor import Supervisor

__all__ = ["RESTARTS_METRIC", "STATE_METRIC", "ChildCounts", "ChildTable", "WorkerMetrics"]

STATE_METRIC = "trio_supervise_worker_state"
RESTARTS_METRIC = "trio_supervise_worker_restarts"  # exposed as ..._total


@attrs.frozen
class ChildCounts:
    """What :meth:`Supervisor.count_children` reports (OTP's ``count_children``).

    :param specs: children listed, running or not.
    :param active: children with a run alive (starting, running or stopping).
    :param supervisors: listed children that are supervisors.
    :param workers: listed children that are workers (:class:`ChildSpec`).
    """

    specs: int
    active: int
    supervisors: int
    workers: int


@attrs.define(eq=False)
class ChildTable:
    """The children of the supervisor *owner*: a slot each, in start order and by name."""

    owner: str
    _slots: list[Slot] = attrs.field(init=False, factory=list, repr=False)
    _by_name: dict[str, Slot] = attrs.field(init=False, factory=dict, repr=False)

    @property
    def slots(self) -> list[Slot]:
        """The slots in start order (the list itself: the group rules index and slice it)."""
        return self._slots

    def __iter__(self) -> Iterator[Slot]:
        return iter(self._slots)

    def get(self, name: str) -> Slot | None:
        return self._by_name.get(name)

    def check_new(self, name: str, significant: bool, rule: AutoShutdown) -> None:
        """Refuse a child that may not join: its name taken, or significant where *rule* is
        ``never``."""
        if name in self._by_name:
            raise ValueError(f"supervisor {self.owner!r} already has a child named {name!r}")
        check_significant(name, significant, rule, self.owner)

    def add(self, child: ChildSpec | Supervisor) -> Slot:
        slot = Slot(child)
        self._slots.append(slot)
        self._by_name[child.name] = slot
        return slot

    def remove(self, slot: Slot) -> None:
        self._slots.remove(slot)
        del self._by_name[slot.name]

    def counts(self) -> ChildCounts:
        workers = sum(isinstance(slot.child, ChildSpec) for slot in self._slots)
        return ChildCounts(
            specs=len(self._slots),
            active=sum(slot.in_run for slot in self._slots),
            supervisors=len(self._slots) - workers,
            workers=workers,
        )


def status_of(slot: Slot, path: str) -> WorkerStatus:
    """The record a snapshot holds of *slot*, the child at *path*."""
    return WorkerStatus(
        worker=path,
        state=slot.state,
        restarts=slot.restarts,
        last_error=slot.last_error,
        since=slot.since,
    )


class WorkerMetrics:
    """A Prometheus collector reading a supervisor's snapshot at scrape time."""

    def __init__(self, snapshot: Callable[[], Iterable[WorkerStatus]]) -> None:
        self._snapshot = snapshot

    def _families(self) -> tuple[GaugeMetricFamily, CounterMetricFamily]:
        return (
            GaugeMetricFamily(
                STATE_METRIC,
                "Supervised worker state (1 for the state the worker is in).",
                labels=["worker", "state"],
            ),
            CounterMetricFamily(
                RESTARTS_METRIC, "Restarts of a supervised worker.", labels=["worker"]
            ),
        )

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        gauge, counter = self._families()
        for status in self._snapshot():
            for state in WorkerState:
                gauge.add_metric([status.worker, state.value], float(state is status.state))
            counter.add_metric([status.worker], float(status.restarts))
        return [gauge, counter]
