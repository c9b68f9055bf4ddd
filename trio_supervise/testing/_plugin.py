"""The pytest plugin, registered through the ``pytest11`` entry point: no conftest needed.

Fixtures:

``memory_queue``
    a fresh :class:`~trio_supervise.MemoryQueue` whose "now" follows Trio's (virtual) clock.
``jitter_seed``
    the seed for every jitter in the test (:data:`DEFAULT_JITTER_SEED`); override the fixture in
    a conftest or module to try another.
``fixed_jitter``
    a :class:`~trio_supervise.Jitter` with that seed.
``harness``
    an open :class:`Harness` on ``memory_queue`` with that seed, shut down gracefully after the
    test. The test must also request pytest-trio's ``autojump_clock``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from .._policy import Jitter
from ..queues import MemoryQueue
from ._harness import DEFAULT_JITTER_SEED, Harness, open_harness


@pytest.fixture
def memory_queue() -> MemoryQueue:
    """A fresh in-memory queue whose "now" follows Trio's (virtual) clock."""
    return MemoryQueue()


@pytest.fixture
def jitter_seed() -> int:
    """The jitter seed of the test: fixed, so backoffs are the same on every run."""
    return DEFAULT_JITTER_SEED


@pytest.fixture
def fixed_jitter(jitter_seed: int) -> Jitter:
    """A :class:`~trio_supervise.Jitter` with the test's fixed seed."""
    return Jitter(seed=jitter_seed)


@pytest.fixture
async def harness(memory_queue: MemoryQueue, jitter_seed: int) -> AsyncIterator[Harness]:
    """A time-travel harness on ``memory_queue``; the test must request ``autojump_clock``."""
    async with open_harness(queue=memory_queue, jitter_seed=jitter_seed) as opened:
        yield opened
