"""Every way to enqueue one item takes the same keywords: the fields of NewItem.

``enqueue`` on the protocol and each backend, and ``enqueue_on`` (the application's
transaction), each spell the keyword list out so that it is typed; this pins them to
:class:`NewItem`, so a field added there cannot be forgotten in one of them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from trio_supervise.queues import MemoryQueue, NewItem, PostgresQueue, SQLiteQueue, WorkQueue

FIELDS = {field.name for field in attrs.fields(NewItem)} - {"spec_id"}


def keywords(method: Callable[..., Any]) -> set[str]:
    return {
        name
        for name, parameter in inspect.signature(method).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }


@pytest.mark.parametrize(
    "method",
    [
        WorkQueue.enqueue,
        MemoryQueue.enqueue,
        SQLiteQueue.enqueue,
        PostgresQueue.enqueue,
        SQLiteQueue.enqueue_on,
        PostgresQueue.enqueue_on,
    ],
    ids=lambda method: method.__qualname__,
)
def test_enqueue_takes_every_new_item_field(method: Callable[..., Any]) -> None:
    assert keywords(method) == FIELDS
