"""The store the item being evaluated came from, for drivers that write beside their outcome
(durable workflows record their steps): a context variable set once in the evaluators' context
by whoever runs them (a :class:`WorkflowRunner`, ``run_due_pass``), never per evaluation."""

from __future__ import annotations

import contextvars
from typing import Any

__all__ = ["bind_store", "evaluating_store"]

_STORE: contextvars.ContextVar[Any] = contextvars.ContextVar("trio_supervise_evaluating_store")


def bind_store(context: contextvars.Context, store: Any) -> None:
    """Make *store* what :func:`evaluating_store` returns in *context* (the evaluators')."""
    context.run(_STORE.set, store)


def evaluating_store() -> Any | None:
    """The store of the item being evaluated in this task, or None outside a runner."""
    return _STORE.get(None)
