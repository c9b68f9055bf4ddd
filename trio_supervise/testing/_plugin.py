"""The pytest plugin, registered through the ``pytest11`` entry point."""

from __future__ import annotations

import pytest

from ..queues import MemoryQueue


@pytest.fixture
def memory_queue() -> MemoryQueue:
    """A fresh in-memory queue whose "now" follows Trio's (virtual) clock."""
    return MemoryQueue()
