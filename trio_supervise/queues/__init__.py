"""Work queues: the protocol, and its backends."""

from ._memory import MemoryQueue as MemoryQueue
from ._memory import QueueEvent as QueueEvent
from ._protocol import ItemState as ItemState
from ._protocol import JSONValue as JSONValue
from ._protocol import Lease as Lease
from ._protocol import LeaseStatus as LeaseStatus
from ._protocol import SettleKind as SettleKind
from ._protocol import Settlement as Settlement
from ._protocol import WorkItem as WorkItem
from ._protocol import WorkQueue as WorkQueue

__all__ = [
    "ItemState",
    "JSONValue",
    "Lease",
    "LeaseStatus",
    "MemoryQueue",
    "QueueEvent",
    "SettleKind",
    "Settlement",
    "WorkItem",
    "WorkQueue",
]
