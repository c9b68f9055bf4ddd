"""Maintenance: a service's upkeep of its queue as small services on one contract
(:class:`MaintenanceTask`), one a module: the scheduler and its schedules, the pruner. The public
names are re-exported by ``trio_supervise``.
"""

from ._pruner import DEFAULT_RETENTION as DEFAULT_RETENTION
from ._pruner import Period as Period
from ._pruner import PruneMetrics as PruneMetrics
from ._pruner import Pruner as Pruner
from ._pruner import RetentionSettings as RetentionSettings
from ._pruner import format_period as format_period
from ._pruner import parse_period as parse_period
from ._pruner import structure_period as structure_period
from ._schedule import MissedFires as MissedFires
from ._schedule import Schedule as Schedule
from ._schedule import check_schedules as check_schedules
from ._schedule import checked_schedules as checked_schedules
from ._schedule import declared_priority as declared_priority
from ._schedule import declared_queue as declared_queue
from ._schedule import resolve_schedules as resolve_schedules
from ._scheduler import Scheduler as Scheduler
from ._scheduler import fire_now as fire_now
from ._scheduler import last_fire as last_fire
from ._scheduler import missed_fires as missed_fires
from ._task import MAINTENANCE_RESTART as MAINTENANCE_RESTART
from ._task import MaintenanceTask as MaintenanceTask
from ._task import maintenance_children as maintenance_children
