"""trio_supervise: supervised workers, leased durable workflows and time-travel testing for Trio."""

from ._audit import AuditEntry as AuditEntry
from ._audit import AuditTrail as AuditTrail
from ._audit import MemoryAuditTrail as MemoryAuditTrail
from ._clock import Clock as Clock
from ._clock import StepGuard as StepGuard
from ._clock import SystemClock as SystemClock
from ._clock import TrioClock as TrioClock
from ._clock import WallClock as WallClock
from ._errors import ChildStateError as ChildStateError
from ._errors import ConfigError as ConfigError
from ._errors import DriverError as DriverError
from ._errors import DuplicateItem as DuplicateItem
from ._errors import ItemNotFound as ItemNotFound
from ._errors import ItemStateError as ItemStateError
from ._errors import LeaseLost as LeaseLost
from ._errors import QueueError as QueueError
from ._errors import QueueFailed as QueueFailed
from ._errors import QueueUnavailable as QueueUnavailable
from ._errors import ReplayMismatch as ReplayMismatch
from ._errors import SchemaError as SchemaError
from ._errors import SettingsError as SettingsError
from ._errors import StartFailed as StartFailed
from ._errors import StepFailed as StepFailed
from ._errors import SuperviseError as SuperviseError
from ._errors import WorkerFailed as WorkerFailed
from ._lifecycle import Shutdown as Shutdown
from ._logging import JsonFormatter as JsonFormatter
from ._logging import LogFormat as LogFormat
from ._logging import configure_logging as configure_logging
from ._policy import Jitter as Jitter
from ._policy import JitterMode as JitterMode
from ._policy import RestartPolicy as RestartPolicy
from ._service import Service as Service
from ._service import ServiceHandle as ServiceHandle
from ._service import run_service as run_service
from ._settings import HttpSettings as HttpSettings
from ._settings import LogLevel as LogLevel
from ._settings import LogSettings as LogSettings
from ._settings import PostgresSettings as PostgresSettings
from ._settings import Settings as Settings
from ._settings import load_settings as load_settings
from ._version import __version__ as __version__
from .console import ErrorRecord as ErrorRecord
from .console import OperationsApp as OperationsApp
from .console import StatusSource as StatusSource
from .console import hash_password as hash_password
from .console import serve_http as serve_http
from .durable import DurableWorkflow as DurableWorkflow
from .durable import Workflow as Workflow
from .durable import durable_workflow as durable_workflow
from .job import Continue as Continue
from .job import Discard as Discard
from .job import EvaluationTimedOut as EvaluationTimedOut
from .job import Outcome as Outcome
from .job import Reschedule as Reschedule
from .job import Stop as Stop
from .maintenance import MAINTENANCE_RESTART as MAINTENANCE_RESTART
from .maintenance import MaintenanceTask as MaintenanceTask
from .maintenance import MissedFires as MissedFires
from .maintenance import Pruner as Pruner
from .maintenance import RetentionSettings as RetentionSettings
from .maintenance import Schedule as Schedule
from .maintenance import Scheduler as Scheduler
from .producer import Producer as Producer
from .queues import DEFAULT_CONCURRENCY_LIMIT as DEFAULT_CONCURRENCY_LIMIT
from .queues import DEFAULT_QUEUE as DEFAULT_QUEUE
from .queues import MAX_ERRORS as MAX_ERRORS
from .queues import MAX_PRIORITY as MAX_PRIORITY
from .queues import MIN_PRIORITY as MIN_PRIORITY
from .queues import DurableJournal as DurableJournal
from .queues import Enqueued as Enqueued
from .queues import EntryKind as EntryKind
from .queues import ErrorEntry as ErrorEntry
from .queues import ItemError as ItemError
from .queues import ItemEvent as ItemEvent
from .queues import ItemState as ItemState
from .queues import Journal as Journal
from .queues import JournalEntry as JournalEntry
from .queues import Lease as Lease
from .queues import LeaseStatus as LeaseStatus
from .queues import MemoryQueue as MemoryQueue
from .queues import NewItem as NewItem
from .queues import QueueInfo as QueueInfo
from .queues import RateLimit as RateLimit
from .queues import SettleKind as SettleKind
from .queues import Settlement as Settlement
from .queues import UniqueScope as UniqueScope
from .queues import WorkItem as WorkItem
from .queues import WorkQueue as WorkQueue
from .queues import migrate as migrate
from .queues import open_queue as open_queue
from .run import AnyWorkflowDriver as AnyWorkflowDriver
from .run import ContextFactory as ContextFactory
from .run import DriverRegistry as DriverRegistry
from .run import PassStats as PassStats
from .run import RecentError as RecentError
from .run import RunnerEvent as RunnerEvent
from .run import RunnerEventKind as RunnerEventKind
from .run import RunnerMetrics as RunnerMetrics
from .run import RunnerSettings as RunnerSettings
from .run import RunnerState as RunnerState
from .run import TypedWorkflowDriver as TypedWorkflowDriver
from .run import WorkflowDriver as WorkflowDriver
from .run import WorkflowRunner as WorkflowRunner
from .run import run_due_pass as run_due_pass
from .supervision import AutoShutdown as AutoShutdown
from .supervision import ChildCounts as ChildCounts
from .supervision import ChildSpec as ChildSpec
from .supervision import Intensity as Intensity
from .supervision import RestartType as RestartType
from .supervision import ShutdownOrder as ShutdownOrder
from .supervision import Strategy as Strategy
from .supervision import Supervisor as Supervisor
from .supervision import WorkerState as WorkerState
from .supervision import WorkerStatus as WorkerStatus

__all__ = [
    "DEFAULT_CONCURRENCY_LIMIT",
    "DEFAULT_QUEUE",
    "MAX_ERRORS",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "AnyWorkflowDriver",
    "AuditEntry",
    "AuditTrail",
    "AutoShutdown",
    "ChildCounts",
    "ChildSpec",
    "ChildStateError",
    "Clock",
    "ConfigError",
    "ContextFactory",
    "Continue",
    "Discard",
    "DriverError",
    "DriverRegistry",
    "DuplicateItem",
    "DurableJournal",
    "DurableWorkflow",
    "Enqueued",
    "EntryKind",
    "ErrorEntry",
    "ItemError",
    "EvaluationTimedOut",
    "ErrorRecord",
    "HttpSettings",
    "ItemEvent",
    "PostgresSettings",
    "Intensity",
    "ItemNotFound",
    "ItemState",
    "ItemStateError",
    "Jitter",
    "JitterMode",
    "Journal",
    "JournalEntry",
    "JsonFormatter",
    "Lease",
    "LeaseLost",
    "LeaseStatus",
    "LogFormat",
    "LogLevel",
    "LogSettings",
    "MAINTENANCE_RESTART",
    "MaintenanceTask",
    "MemoryAuditTrail",
    "MemoryQueue",
    "NewItem",
    "MissedFires",
    "OperationsApp",
    "Outcome",
    "PassStats",
    "Pruner",
    "QueueError",
    "QueueFailed",
    "QueueInfo",
    "RateLimit",
    "QueueUnavailable",
    "RecentError",
    "ReplayMismatch",
    "Reschedule",
    "RestartPolicy",
    "RestartType",
    "RetentionSettings",
    "RunnerEvent",
    "RunnerEventKind",
    "RunnerMetrics",
    "RunnerSettings",
    "RunnerState",
    "Schedule",
    "Scheduler",
    "SchemaError",
    "Producer",
    "Service",
    "ServiceHandle",
    "Settings",
    "SettingsError",
    "SettleKind",
    "Settlement",
    "UniqueScope",
    "Shutdown",
    "ShutdownOrder",
    "StartFailed",
    "StatusSource",
    "StepFailed",
    "Stop",
    "Strategy",
    "SuperviseError",
    "Supervisor",
    "StepGuard",
    "SystemClock",
    "TrioClock",
    "WallClock",
    "TypedWorkflowDriver",
    "WorkItem",
    "WorkQueue",
    "WorkerFailed",
    "WorkerState",
    "WorkerStatus",
    "Workflow",
    "WorkflowDriver",
    "WorkflowRunner",
    "__version__",
    "configure_logging",
    "durable_workflow",
    "hash_password",
    "load_settings",
    "migrate",
    "open_queue",
    "run_due_pass",
    "run_service",
    "serve_http",
]
