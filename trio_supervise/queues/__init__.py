"""Work queues: the protocol, and its backends."""

from ._factory import DEFAULT_DATABASE_URL as DEFAULT_DATABASE_URL
from ._factory import migrate as migrate
from ._factory import open_queue as open_queue
from ._factory import parse_queue_url as parse_queue_url
from ._memory import MemoryQueue as MemoryQueue
from ._memory import QueueEvent as QueueEvent
from ._postgres import PostgresQueue as PostgresQueue
from ._protocol import DEFAULT_CONCURRENCY_LIMIT as DEFAULT_CONCURRENCY_LIMIT
from ._protocol import DEFAULT_QUEUE as DEFAULT_QUEUE
from ._protocol import MAX_ERRORS as MAX_ERRORS
from ._protocol import MAX_ID_LENGTH as MAX_ID_LENGTH
from ._protocol import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from ._protocol import MAX_NAME_LENGTH as MAX_NAME_LENGTH
from ._protocol import MAX_PRIORITY as MAX_PRIORITY
from ._protocol import MIN_PRIORITY as MIN_PRIORITY
from ._protocol import WAITING_DUE_AT as WAITING_DUE_AT
from ._protocol import Enqueued as Enqueued
from ._protocol import ErrorEntry as ErrorEntry
from ._protocol import ItemState as ItemState
from ._protocol import JSONValue as JSONValue
from ._protocol import Lease as Lease
from ._protocol import LeaseStatus as LeaseStatus
from ._protocol import NewItem as NewItem
from ._protocol import QueueInfo as QueueInfo
from ._protocol import SettleKind as SettleKind
from ._protocol import Settlement as Settlement
from ._protocol import UniqueScope as UniqueScope
from ._protocol import WorkItem as WorkItem
from ._protocol import WorkQueue as WorkQueue
from ._protocol import check_json as check_json
from ._protocol import storable_text as storable_text
from ._sql import redact_dsn as redact_dsn
from ._sqlite import DEFAULT_SQLITE_PATH as DEFAULT_SQLITE_PATH
from ._sqlite import SQLiteQueue as SQLiteQueue

__all__ = [
    "DEFAULT_CONCURRENCY_LIMIT",
    "DEFAULT_DATABASE_URL",
    "DEFAULT_QUEUE",
    "DEFAULT_SQLITE_PATH",
    "MAX_ERRORS",
    "MAX_ID_LENGTH",
    "MAX_JSON_DEPTH",
    "MAX_NAME_LENGTH",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "QueueInfo",
    "Enqueued",
    "ErrorEntry",
    "ItemState",
    "JSONValue",
    "Lease",
    "LeaseStatus",
    "MemoryQueue",
    "NewItem",
    "PostgresQueue",
    "QueueEvent",
    "SQLiteQueue",
    "SettleKind",
    "Settlement",
    "WAITING_DUE_AT",
    "UniqueScope",
    "WorkItem",
    "WorkQueue",
    "check_json",
    "migrate",
    "open_queue",
    "parse_queue_url",
    "redact_dsn",
    "storable_text",
]
