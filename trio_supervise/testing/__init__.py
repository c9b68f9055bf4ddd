"""Helpers for testing trio_supervise applications under Trio's virtual clock."""

from .._clock import TrioClock as TrioClock
from ..queues import MemoryQueue as MemoryQueue

__all__ = ["MemoryQueue", "TrioClock"]
