"""The in-memory queue: the reference backend, and the one for tests (``memory://``).

:class:`MemoryQueue` is composed in ``_queue`` of one part per port (``_worker``, ``_producer``,
``_operator``, ``_maintenance``) over the state they share (``_state``); its log of writes is
``_events``. The contract each method keeps is in ``docs/queues.md``.
"""

from ._events import QueueEvent as QueueEvent
from ._queue import MemoryQueue as MemoryQueue

__all__ = ["MemoryQueue", "QueueEvent"]
