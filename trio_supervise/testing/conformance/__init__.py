"""The store contract as a test suite, for any backend: subclass :class:`StoreConformance`.

See ``docs/queues.md``, "Checking a store of your own".
"""

from ._clock import START as START
from ._clock import ManualClock as ManualClock
from ._store import StoreConformance as StoreConformance

__all__ = ["START", "ManualClock", "StoreConformance"]
