"""The runner in parts: the producer claims, the executor evaluates, the completer writes
outcomes, the leases part renews, and one observer reports; ``run_due_pass`` is one pass over
the same executor and completer. The public names are re-exported by ``trio_supervise``.
"""

from ._completer import WRITE_RETRY_BOUND as WRITE_RETRY_BOUND
from ._completer import is_transient as is_transient
from ._completer import write_retry_delay as write_retry_delay
from ._drivers import AnyWorkflowDriver as AnyWorkflowDriver
from ._drivers import ContextFactory as ContextFactory
from ._drivers import DriverRegistry as DriverRegistry
from ._drivers import TypedWorkflowDriver as TypedWorkflowDriver
from ._drivers import WorkflowDriver as WorkflowDriver
from ._drivers import evaluate_item as evaluate_item
from ._drivers import open_context as open_context
from ._drivers import raise_specific as raise_specific
from ._leases import RENEWAL_CHUNK as RENEWAL_CHUNK
from ._leases import lease_risk as lease_risk
from ._observation import RecentError as RecentError
from ._observation import RunnerEvent as RunnerEvent
from ._observation import RunnerEventKind as RunnerEventKind
from ._observation import RunnerMetrics as RunnerMetrics
from ._observation import RunnerState as RunnerState
from ._observation import log_fields as log_fields
from ._pass import run_due_pass as run_due_pass
from ._runner import WorkflowRunner as WorkflowRunner
from ._settings import PassStats as PassStats
from ._settings import RunnerSettings as RunnerSettings
