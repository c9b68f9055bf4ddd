"""Supervision: long-lived children run in a nursery, each run's end observed and acted on, by
OTP's rules (the contract is docs/supervision.md). The public names are re-exported by
``trio_supervise``.
"""

from ._child import DEFAULT_SHUTDOWN_GRACE as DEFAULT_SHUTDOWN_GRACE
from ._child import ChildSpec as ChildSpec
from ._child import RestartType as RestartType
from ._child import WorkerState as WorkerState
from ._child import WorkerStatus as WorkerStatus
from ._children import ChildCounts as ChildCounts
from ._group import AutoShutdown as AutoShutdown
from ._group import Intensity as Intensity
from ._group import ShutdownOrder as ShutdownOrder
from ._group import Strategy as Strategy
from ._group import to_auto_shutdown as to_auto_shutdown
from ._group import to_shutdown_order as to_shutdown_order
from ._supervisor import Supervisor as Supervisor
