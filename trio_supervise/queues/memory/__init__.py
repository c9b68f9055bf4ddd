"""The in-memory queue, in parts: ``_events`` holds its log of writes (``memory://``; the
contract each method keeps is in ``docs/queues.md``).
"""

from ._events import QueueEvent as QueueEvent

__all__ = ["QueueEvent"]
