"""Running a coroutine in a context of its own, inside the task that awaits it.

Trio gives every task a copy of its parent's :mod:`contextvars` context, so what one task sets is
never seen by another. The runner's evaluators run many items one after the other in one task
(see :mod:`trio_supervise._runner`), so without help a context variable set by one item's driver
(a logging binding, a tracing span, a ``decimal`` context) would still be set for the next item
that evaluator takes. :func:`run_in_context` runs each evaluation's every step inside a context
of its own, as a task per item would: the driver sees the evaluator's context as it was when the
item started, and what the driver sets ends with its evaluation.
"""

from __future__ import annotations

import contextvars
import types
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["run_in_context"]


@types.coroutine
def run_in_context(
    context: contextvars.Context, coro: Coroutine[Any, Any, T]
) -> Generator[Any, Any, T]:
    """Await *coro* with each of its steps run in *context* (which no other code may have entered
    meanwhile): what it sets in :mod:`contextvars` stays in *context*, and it sees what *context*
    holds. Cancellation, errors and its result pass through as if *coro* were awaited directly.

    Use it as ``await run_in_context(context, coro)``: a generator-based coroutine, so that it
    adds one frame and no coroutine of its own to each evaluation (about 5,500 instructions an
    item in all, most of them the ``StopIteration`` that ends a stepped coroutine).
    """
    run = context.run
    send = coro.send
    value: Any = None
    thrown: Exception | None = None
    ended = False
    try:
        while True:
            try:
                if thrown is None:
                    yielded = run(send, value)
                else:
                    # Thrown into this task by Trio (a foreign await's TypeError): the
                    # coroutine's to handle, as if it were awaited directly.
                    error, thrown = thrown, None
                    yielded = run(coro.throw, error)
            except StopIteration as stop:
                ended = True
                result: T = stop.value
                return result
            value = None
            try:
                value = yield yielded
            except Exception as error:
                thrown = error
    finally:
        # Closed (or thrown out of) before the coroutine ended: end it too, in its context, so
        # its own ``finally`` blocks see what they set (a no-op if it raised).
        if not ended:
            run(coro.close)
