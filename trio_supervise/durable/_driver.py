"""A durable workflow as a driver: :func:`durable_workflow` turns ``async def fn(wf, config)``
into a :class:`DurableWorkflow`, registered like any driver (``Service(drivers=[...])``).

Each evaluation reads the item's journal, runs the function from the top with a fresh
:class:`Workflow` that replays what is recorded, and ends as a driver does: ``Stop`` with the
function's return value as the item's result, or ``Reschedule`` (same config) at a sleep's or a
wait's wake time. A replay that does not match its journal is ``Discard``-ed (dead).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

import attrs

from .._errors import DriverError, ReplayMismatch
from .._policy import Jitter
from ..job import DEFAULT_QUEUE, Discard, Outcome, Reschedule, Stop, WorkItem, validate_spec_id
from ..queues._ports import Capability, DurableJournal, capabilities_of
from ..run._current import evaluating_metrics, evaluating_store
from ._workflow import Suspended, Workflow

__all__ = ["DurableWorkflow", "durable_workflow"]

ConfigT = TypeVar("ConfigT")
ResultT = TypeVar("ResultT")

WorkflowFunction = Callable[[Workflow[Any], ConfigT], Awaitable[Any]]


@attrs.define(eq=False, kw_only=True)
class DurableWorkflow(Generic[ConfigT]):
    """The driver of one durable workflow (a :class:`TypedWorkflowDriver`): its spec id is
    its name. Made by :func:`durable_workflow`."""

    name: str
    config_type: type[ConfigT]
    function: WorkflowFunction[ConfigT]
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    timeout: float | None = None
    jitter: Jitter = attrs.field(factory=Jitter)
    """Spreads the steps' retry backoffs (keyed by item, position and step)."""
    store: DurableJournal | None = None
    """Where journals are kept; None: the store of the runner evaluating the item."""
    hook: Callable[[str, str, WorkItem], None] | None = None
    """Called as ``hook(point, step, item)`` at a step's ``before-record`` and ``after-step``
    points and at ``before-settle`` (the outcome made, not written): what
    :class:`trio_supervise.testing.CrashPlan` uses to crash a workflow where a test says."""

    @property
    def spec_ids(self) -> Sequence[str]:
        return (self.name,)

    def validate_specs(self) -> None:
        """Every spec is usable (the decorator checked them)."""

    def _counter(self) -> tuple[Callable[[str], None], Callable[[], None]]:
        """Counts this workflow's steps on the evaluating runner's metrics, if any: a tally,
        and what applies it (at the evaluation's end, as the runner observes an evaluation's
        duration when it ends: a counter's increment takes a lock, ~5 us a step)."""
        metrics = evaluating_metrics()
        if metrics is None:
            return _no_count, _no_flush
        steps = metrics.workflow_steps
        name = self.name
        tally: dict[str, int] = {}

        def count(outcome: str) -> None:
            tally[outcome] = tally.get(outcome, 0) + 1

        def flush() -> None:
            for outcome, n in tally.items():
                steps.labels(name, outcome).inc(n)
            tally.clear()

        return count, flush

    async def evaluate(self, context: Any, item: WorkItem, config: ConfigT) -> Outcome:
        store = self.store if self.store is not None else evaluating_store()
        if store is None or Capability.DURABLE_JOURNAL not in capabilities_of(store):
            raise DriverError(
                f"workflow {self.name!r} needs a store declaring the durable-journal capability "
                f"(memory, SQLite or PostgreSQL), got {type(store).__name__}"
            )
        journal = await store.read_journal(item.id)
        count, flush = self._counter()
        wf: Workflow[Any] = Workflow(
            name=self.name,
            item=item,
            context=context,
            store=store,
            clock=store.clock.now,
            entries={entry.position: entry for entry in journal.entries},
            events=journal.events,
            jitter=self.jitter,
            hook=self.hook,
            count=count,
        )
        outcome: Outcome
        try:
            outcome = Stop(result=await self.function(wf, config))
        except Suspended as suspended:
            outcome = Reschedule(suspended.at, item.config)
        except ReplayMismatch as mismatch:
            raise Discard(str(mismatch)) from None
        finally:
            flush()
        if self.hook is not None:
            self.hook("before-settle", "", item)
        return outcome


def _no_count(outcome: str) -> None:
    """Counts nothing (a workflow evaluated outside a runner)."""


def _no_flush() -> None:
    """Nothing counted, nothing to apply."""


def _check_arguments(name: object, config_type: object) -> None:
    """Refuse bad arguments of :func:`durable_workflow`, naming the argument and the rule."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    validate_spec_id(name)
    if not (isinstance(config_type, type) and attrs.has(config_type)):
        raise TypeError(f"config_type must be an attrs class, got {config_type!r}")


def durable_workflow(
    name: str,
    *,
    config_type: type[ConfigT],
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    timeout: float | None = None,
    jitter: Jitter | None = None,
) -> Callable[[WorkflowFunction[ConfigT]], DurableWorkflow[ConfigT]]:
    """Make ``async def fn(wf: Workflow, config: ConfigT)`` the durable workflow *name*.

    The decorated name is the workflow's driver: register it (``Service(drivers=[onboard])``)
    and enqueue items of spec *name* with a config of *config_type* (an attrs class). *queue*,
    *priority* and *timeout* (seconds per evaluation) are a driver's; *jitter* spreads step
    retries (default: a random seed per process).
    """
    _check_arguments(name, config_type)

    def decorate(function: WorkflowFunction[ConfigT]) -> DurableWorkflow[ConfigT]:
        return DurableWorkflow(
            name=name,
            config_type=config_type,
            function=function,
            queue=queue,
            priority=priority,
            timeout=timeout,
            jitter=Jitter() if jitter is None else jitter,
        )

    return decorate
