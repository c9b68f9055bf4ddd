"""What the item being evaluated came from, for drivers that write beside their outcome
(durable workflows record their steps and count them): context variables set once in the
evaluators' context by whoever runs them (a :class:`WorkflowRunner`, ``run_due_pass``), never
per evaluation."""

from __future__ import annotations

import contextvars
from typing import Any

__all__ = ["bind_store", "evaluating_metrics", "evaluating_store"]

_STORE: contextvars.ContextVar[Any] = contextvars.ContextVar("trio_supervise_evaluating_store")
_METRICS: contextvars.ContextVar[Any] = contextvars.ContextVar("trio_supervise_evaluating_metrics")


def bind_store(context: contextvars.Context, store: Any, metrics: Any = None) -> None:
    """Make *store* (and the runner's *metrics*, a ``RunnerMetrics``) what
    :func:`evaluating_store` (and :func:`evaluating_metrics`) return in *context*."""
    context.run(_STORE.set, store)
    context.run(_METRICS.set, metrics)


def evaluating_store() -> Any | None:
    """The store of the item being evaluated in this task, or None outside a runner."""
    return _STORE.get(None)


def evaluating_metrics() -> Any | None:
    """The ``RunnerMetrics`` of the runner evaluating in this task, or None."""
    return _METRICS.get(None)
