"""The state machine run as a test: random call sequences, the store against the model.

Examples are modest by default (more under ``HYPOTHESIS_PROFILE=ci``); set
``TRIO_SUPERVISE_MODEL_EXAMPLES=<n>`` to also run a long variant with *n* examples.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager, contextmanager

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from ...job import ItemState, SettleKind
from ...queues import WorkQueue
from ._clock import ManualClock
from ._model import KEYS, SPECS
from ._portal import Portal
from ._rules import OperatorRules, ProducerRules, WorkerRules

CI = os.environ.get("HYPOTHESIS_PROFILE") == "ci"


class QueueMachine(ProducerRules, WorkerRules, OperatorRules):
    """Every rule: a producer's, a worker's and an operator's calls, in any order."""

    @rule(
        children=st.lists(
            st.tuples(
                st.sampled_from(SPECS),
                st.sampled_from(KEYS),
                st.just(None),
                st.sampled_from([False, False, False, False, True]),
            ),
            min_size=1,
            max_size=3,
        ),
        n=st.integers(0, 9),
    )
    def fan_out_from_a_new_parent(
        self, children: list[tuple[str, str | None, str | None, bool]], n: int
    ) -> None:
        """A new parent is enqueued, claimed (with whatever else is due) and fans out, waiting:
        the common shape, so that fan-in is met often."""
        self.enqueue("a", -5.0, None, None, n, -100, "default", None, None, "forever")
        self.claim_everything_due()
        parent = self.model[f"i{self.serial:03}"]
        if parent.state is ItemState.RUNNING:
            self.settle_children(parent, "fresh", SettleKind.CONTINUE, True, children, n)


class ModelContract:
    """The store and a plain-Python model, driven side by side by Hypothesis: any difference in
    a return value, an error, or the stored items after a step fails, with the shortest
    sequence of calls that shows it."""

    def open_store(self, clock: ManualClock) -> AbstractAsyncContextManager[WorkQueue]:
        raise NotImplementedError

    @contextmanager
    def _machine(self) -> Iterator[type[QueueMachine]]:
        portal = Portal()
        try:

            class Bound(QueueMachine):
                pass

            Bound.clock, Bound.portal = ManualClock(), portal
            Bound.open_store = staticmethod(self.open_store)
            yield Bound
        finally:
            portal.close()

    def _run(self, examples: int, steps: int) -> None:
        with self._machine() as machine:
            run_state_machine_as_test(  # type: ignore[no-untyped-call, unused-ignore]  # typed in newer hypothesis
                machine,
                settings=settings(
                    max_examples=examples,
                    stateful_step_count=steps,
                    deadline=None,
                    suppress_health_check=[HealthCheck.too_slow],
                ),
            )

    def test_store_matches_the_model(self) -> None:
        """The store behaves exactly like the model under random call sequences."""
        self._run(examples=100 if CI else 30, steps=40)

    @pytest.mark.skipif(
        not os.environ.get("TRIO_SUPERVISE_MODEL_EXAMPLES"),
        reason="set TRIO_SUPERVISE_MODEL_EXAMPLES=<n> for the long model run",
    )
    def test_store_matches_the_model_long(self) -> None:
        """The same, with as many examples as TRIO_SUPERVISE_MODEL_EXAMPLES says, and longer
        runs."""
        self._run(examples=int(os.environ["TRIO_SUPERVISE_MODEL_EXAMPLES"]), steps=80)
