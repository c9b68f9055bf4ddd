"""trio_supervise: supervised workers, leased durable workflows and time-travel testing for Trio."""

from ._clock import Clock as Clock
from ._clock import SystemClock as SystemClock
from ._clock import TrioClock as TrioClock
from ._errors import ConfigError as ConfigError
from ._errors import DuplicateItem as DuplicateItem
from ._errors import ItemNotFound as ItemNotFound
from ._errors import ItemStateError as ItemStateError
from ._errors import LeaseLost as LeaseLost
from ._errors import QueueError as QueueError
from ._errors import QueueUnavailable as QueueUnavailable
from ._errors import SchemaError as SchemaError
from ._errors import SettingsError as SettingsError
from ._errors import SuperviseError as SuperviseError
from ._errors import WorkerFailed as WorkerFailed
from ._lifecycle import Shutdown as Shutdown
from ._policy import Jitter as Jitter
from ._policy import JitterMode as JitterMode
from ._policy import RestartPolicy as RestartPolicy
from ._version import __version__ as __version__
from .queues import ItemState as ItemState
from .queues import Lease as Lease
from .queues import LeaseStatus as LeaseStatus
from .queues import MemoryQueue as MemoryQueue
from .queues import SettleKind as SettleKind
from .queues import Settlement as Settlement
from .queues import WorkItem as WorkItem
from .queues import WorkQueue as WorkQueue

__all__ = [
    "Clock",
    "ConfigError",
    "DuplicateItem",
    "ItemNotFound",
    "ItemState",
    "ItemStateError",
    "Jitter",
    "JitterMode",
    "Lease",
    "LeaseLost",
    "LeaseStatus",
    "MemoryQueue",
    "QueueError",
    "QueueUnavailable",
    "RestartPolicy",
    "SchemaError",
    "SettingsError",
    "SettleKind",
    "Settlement",
    "Shutdown",
    "SuperviseError",
    "SystemClock",
    "TrioClock",
    "WorkItem",
    "WorkQueue",
    "WorkerFailed",
    "__version__",
]
