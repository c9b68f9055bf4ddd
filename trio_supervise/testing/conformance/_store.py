""":class:`StoreConformance`: the store contract as one pytest class to subclass."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager

import pytest
import trio

from ...queues import WorkQueue
from ._audit import AuditContract
from ._bulk import BulkEnqueueContract
from ._children import ChildrenContract
from ._claiming import ClaimingContract
from ._clock import ManualClock
from ._concurrency import ConcurrencyKeysContract
from ._debounce import DebounceContract
from ._durable import DurableJournalContract
from ._error_history import ErrorHistoryContract
from ._evaluation_ends import EvaluationEndsContract
from ._identity import IdentityContract
from ._key_rate_limits import KeyRateLimitContract
from ._producing import ProducingContract
from ._rate_limits import RateLimitContract
from ._retention import RetentionContract
from ._settle_and_claim import SettleAndClaimContract
from ._settling import CancellationContract, SettlingContract
from ._snapshots import SnapshotReadsContract
from ._start_by import StartByContract
from ._stateful import ModelContract
from ._support import Need, has, needed_by
from ._tags import TagsContract
from ._trace_context import TraceContextContract
from ._uniqueness import UniquenessContract

_PARTS: dict[type, frozenset[Need]] = {}
"""What each subclass's store has, asked once."""


class StoreConformance(
    ProducingContract,
    BulkEnqueueContract,
    ClaimingContract,
    SettlingContract,
    CancellationContract,
    SettleAndClaimContract,
    EvaluationEndsContract,
    IdentityContract,
    ChildrenContract,
    ConcurrencyKeysContract,
    UniquenessContract,
    RetentionContract,
    SnapshotReadsContract,
    TagsContract,
    TraceContextContract,
    AuditContract,
    ErrorHistoryContract,
    RateLimitContract,
    KeyRateLimitContract,
    StartByContract,
    DebounceContract,
    DurableJournalContract,
    ModelContract,
):
    """Every behaviour of the store contract (``docs/queues.md``) as tests, for any backend.

    Subclass it in a test module, name the subclass ``Test...`` and say how to open a fresh,
    empty store whose "now" is *clock*::

        class TestMyStore(StoreConformance):
            def open_store(self, clock: ManualClock) -> AbstractAsyncContextManager[WorkQueue]:
                return MyStore.open(":memory:", clock=clock)

    pytest then runs the whole contract against it; the test ids name the behaviour that
    differs. Tests of an optional :class:`~trio_supervise.queues.Capability` the store does not
    declare are skipped. The tests are async and marked for pytest-trio; the state machine
    (:class:`ModelContract`) needs Hypothesis (the ``conformance`` extra installs both).
    """

    def open_store(self, clock: ManualClock) -> AbstractAsyncContextManager[WorkQueue]:
        """A fresh, empty store reading "now" from *clock*, closed when the context exits.

        Called once per test, and once per example of the state machine (then in a Trio loop
        of its own, on another thread): each call must give a store sharing nothing with the
        ones before (a new file, database schema or in-memory state).
        """
        raise NotImplementedError(f"{type(self).__name__} must define open_store(clock)")

    @pytest.fixture(autouse=True)
    def _skip_what_the_store_lacks(self, request: pytest.FixtureRequest) -> None:
        """Skips, before it starts, a test needing an optional part the store has not."""
        callspec = getattr(request.node, "callspec", None)
        wanted = needed_by(request.function, callspec.params if callspec else {})
        if not wanted:
            return
        missing = sorted(wanted - self._store_has())
        if missing:
            pytest.skip(f"the store lacks {', '.join(missing)}")

    def _store_has(self) -> frozenset[Need]:
        """The optional parts of the store under test: one store opened (in a Trio run of its
        own, before any test's) and asked, once per class."""
        cls = type(self)
        if cls not in _PARTS:

            async def ask() -> frozenset[Need]:
                async with self.open_store(ManualClock()) as store:
                    return has(store)

            _PARTS[cls] = trio.run(ask)
        return _PARTS[cls]

    @pytest.fixture
    def clock(self) -> ManualClock:
        """The test's clock, injected into its store; the test moves it by hand."""
        return ManualClock()

    @pytest.fixture
    async def queue(self, clock: ManualClock) -> AsyncIterator[WorkQueue]:
        """A fresh store of the backend under test, its "now" read from :meth:`clock`."""
        async with self.open_store(clock) as store:
            yield store


def _mark_async_tests_for_trio(cls: type) -> None:
    """pytest-trio runs a test marked ``trio`` (with or without ``trio_mode``); only the async
    ones may carry the mark."""
    for name, member in inspect.getmembers(cls, inspect.iscoroutinefunction):
        if name.startswith("test_"):
            pytest.mark.trio(member)


_mark_async_tests_for_trio(StoreConformance)
