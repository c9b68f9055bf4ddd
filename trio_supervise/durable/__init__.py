"""Durable workflows: straight-line code whose steps run once per item incarnation, with
durable sleeps, events from outside and a checked replay, over the same runner and store.
The public names are re-exported by ``trio_supervise``; see ``docs/durable.md``.
"""

from ._driver import DurableWorkflow as DurableWorkflow
from ._driver import durable_workflow as durable_workflow
from ._workflow import Suspended as Suspended
from ._workflow import Workflow as Workflow

__all__ = [
    "DurableWorkflow",
    "Suspended",
    "Workflow",
    "durable_workflow",
]
