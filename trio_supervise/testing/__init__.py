"""Deterministic time-travel testing: a harness, its history, and the pytest plugin's fixtures.

The plugin (``trio_supervise.testing._plugin``) is registered through the ``pytest11`` entry
point, so a project that installs trio_supervise gets the ``memory_queue``, ``jitter_seed``,
``fixed_jitter`` and ``harness`` fixtures with no conftest.
"""

from .._clock import TrioClock as TrioClock
from ..queues import MemoryQueue as MemoryQueue
from ._crash import CrashPlan as CrashPlan
from ._crash import SimulatedCrash as SimulatedCrash
from ._crash import crashing as crashing
from ._harness import DEFAULT_EPOCH as DEFAULT_EPOCH
from ._harness import DEFAULT_JITTER_SEED as DEFAULT_JITTER_SEED
from ._harness import Harness as Harness
from ._harness import harness_runner_settings as harness_runner_settings
from ._harness import open_harness as open_harness
from ._harness import run_scenario as run_scenario
from ._history import Entry as Entry
from ._history import History as History
from ._virtual import VirtualSQLiteQueue as VirtualSQLiteQueue
from ._virtual import open_virtual_sqlite as open_virtual_sqlite

__all__ = [
    "DEFAULT_EPOCH",
    "CrashPlan",
    "SimulatedCrash",
    "crashing",
    "DEFAULT_JITTER_SEED",
    "Entry",
    "Harness",
    "History",
    "MemoryQueue",
    "TrioClock",
    "VirtualSQLiteQueue",
    "harness_runner_settings",
    "open_harness",
    "open_virtual_sqlite",
    "run_scenario",
]
