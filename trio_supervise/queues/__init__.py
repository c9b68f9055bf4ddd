"""Work queues: the protocol, and its backends."""

from ..job import DEFAULT_CONCURRENCY_LIMIT as DEFAULT_CONCURRENCY_LIMIT
from ..job import DEFAULT_QUEUE as DEFAULT_QUEUE
from ..job import MAX_ERRORS as MAX_ERRORS
from ..job import MAX_ID_LENGTH as MAX_ID_LENGTH
from ..job import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from ..job import MAX_NAME_LENGTH as MAX_NAME_LENGTH
from ..job import MAX_PRIORITY as MAX_PRIORITY
from ..job import MIN_PRIORITY as MIN_PRIORITY
from ..job import WAITING_DUE_AT as WAITING_DUE_AT
from ..job import Enqueued as Enqueued
from ..job import EntryKind as EntryKind
from ..job import ErrorEntry as ErrorEntry
from ..job import ItemError as ItemError
from ..job import ItemEvent as ItemEvent
from ..job import ItemState as ItemState
from ..job import Journal as Journal
from ..job import JournalEntry as JournalEntry
from ..job import JSONValue as JSONValue
from ..job import Lease as Lease
from ..job import LeaseStatus as LeaseStatus
from ..job import NewItem as NewItem
from ..job import QueueInfo as QueueInfo
from ..job import RateLimit as RateLimit
from ..job import SettleKind as SettleKind
from ..job import Settlement as Settlement
from ..job import UniqueScope as UniqueScope
from ..job import WorkItem as WorkItem
from ..job import check_json as check_json
from ..job import storable_text as storable_text
from ._factory import DEFAULT_DATABASE_URL as DEFAULT_DATABASE_URL
from ._factory import migrate as migrate
from ._factory import open_queue as open_queue
from ._factory import parse_queue_url as parse_queue_url
from ._ports import AuditStore as AuditStore
from ._ports import Capability as Capability
from ._ports import DurableJournal as DurableJournal
from ._ports import ErrorHistoryStore as ErrorHistoryStore
from ._ports import KeyRateLimitStore as KeyRateLimitStore
from ._ports import MaintenanceStore as MaintenanceStore
from ._ports import OperatorStore as OperatorStore
from ._ports import ProducerStore as ProducerStore
from ._ports import RateLimitStore as RateLimitStore
from ._ports import SeedWrites as SeedWrites
from ._ports import WorkerStore as WorkerStore
from ._ports import WorkQueue as WorkQueue
from ._sql import redact_dsn as redact_dsn
from .memory import MemoryQueue as MemoryQueue
from .memory import QueueEvent as QueueEvent
from .sql._postgres import PostgresQueue as PostgresQueue
from .sql._sqlite import DEFAULT_SQLITE_PATH as DEFAULT_SQLITE_PATH
from .sql._sqlite import SQLiteQueue as SQLiteQueue

__all__ = [
    "AuditStore",
    "Capability",
    "ErrorHistoryStore",
    "DurableJournal",
    "EntryKind",
    "ItemEvent",
    "Journal",
    "JournalEntry",
    "MaintenanceStore",
    "OperatorStore",
    "ProducerStore",
    "KeyRateLimitStore",
    "RateLimitStore",
    "SeedWrites",
    "WorkerStore",
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
    "RateLimit",
    "Enqueued",
    "ErrorEntry",
    "ItemError",
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
