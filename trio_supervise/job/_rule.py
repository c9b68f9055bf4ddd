"""The settlement rule: what an evaluation's end writes, decided once for every executor.

A pure function from (the claimed item, how its evaluation ended) to the settlement to write:
:func:`settlement_before` for an item that is not evaluated at all, :func:`settlement_after`
for one that was. The runner and ``run_due_pass`` both call it, so they cannot drift; what they
log and count about it is their own (``run/_observation.py``).
"""

from __future__ import annotations

import enum
from typing import Protocol

from .._policy import Jitter, RestartPolicy
from ._model import WorkItem
from ._settlement import SettleKind, Settlement

__all__ = [
    "SettlePolicy",
    "StopReason",
    "attempts_exhausted",
    "failure_settlement",
    "settlement_after",
    "settlement_before",
    "unbuilt_settlement",
]


class SettlePolicy(Protocol):
    """What the rule reads of a runner's settings (:class:`~trio_supervise.RunnerSettings`)."""

    @property
    def requeue_delay(self) -> float: ...

    @property
    def retry(self) -> RestartPolicy | None: ...

    @property
    def max_errors(self) -> int | None: ...

    @property
    def max_attempts(self) -> int | None: ...


class StopReason(enum.IntEnum):
    """Why an evaluation was stopped from outside; a higher value overrides a lower one."""

    SHUTDOWN = 1
    """Shutdown's grace period ran out (or the service stops at once)."""
    RENEWAL_FAILED = 2
    """Renewals kept failing and the lease would run out before the next one."""
    CANCEL_REQUESTED = 3
    """Someone asked for the item to be cancelled."""
    LOST = 4
    """The queue refused the lease: another worker may hold the item now."""


def attempts_exhausted(item: WorkItem, settings: SettlePolicy) -> Settlement | None:
    """A ``dead`` settlement if *item* was claimed more than ``max_attempts`` times, else None."""
    limit = settings.max_attempts
    if limit is None or item.attempt <= limit:
        return None
    return Settlement(
        item_id=item.id,
        lease_version=item.lease_version,
        kind=SettleKind.DEAD,
        error=f"exceeded max_attempts ({limit})",
    )


def start_deadline_passed(item: WorkItem) -> Settlement | None:
    """A ``dead`` settlement if *item* was claimed after its ``start_by`` (the claim's time is
    its ``updated_at``), saying so; else None."""
    start_by = item.start_by
    if start_by is None or item.updated_at <= start_by:
        return None
    return Settlement(
        item_id=item.id,
        lease_version=item.lease_version,
        kind=SettleKind.DEAD,
        error=(
            f"{START_DEADLINE_PASSED}: start_by {start_by.isoformat()}, claimed "
            f"{item.updated_at.isoformat()}; never started"
        ),
    )


START_DEADLINE_PASSED = "start deadline passed"
"""How the error of an item settled dead for its ``start_by`` begins."""


def settlement_before(item: WorkItem, settings: SettlePolicy) -> Settlement | None:
    """What to write for a claimed *item* without evaluating it, or None to evaluate it.

    Claimed with ``cancel_requested`` set (its owner died before settling it): ``cancel``.
    Claimed after its ``start_by``: ``dead``, never started late (:func:`start_deadline_passed`).
    Claimed more than ``max_attempts`` times: ``dead`` (:func:`attempts_exhausted`).
    """
    if item.cancel_requested:
        return Settlement(item_id=item.id, lease_version=item.lease_version, kind=SettleKind.CANCEL)
    return start_deadline_passed(item) or attempts_exhausted(item, settings)


def settlement_after(
    item: WorkItem,
    outcome: Settlement | None,
    error: str | None,
    stopped: StopReason | None,
    detail: str,
    settings: SettlePolicy,
    jitter: Jitter,
) -> Settlement | None:
    """The one rule for what an evaluation's end writes; None when nothing may be written.

    *outcome* is the settlement of what the driver returned (:func:`evaluate_item`), None if
    it returned nothing; *error* the failure's text when it raised; *stopped* why it was
    stopped from outside, if it was (*detail* says more). In order:

    - the lease was lost: nothing (a write would be refused; another worker may hold it);
    - the driver returned an outcome: that outcome, whatever stopped the evaluation after it
      returned (its side effects happened: running it again would do them twice);
    - cancellation was requested: ``cancel``;
    - shutdown stopped it: ``release`` (due again at once, the attempt taken back);
    - renewals failed: the error ``lease renewal failed: <detail>``;
    - otherwise (it raised, timed out, or was cancelled): :func:`failure_settlement`, ``retry``
      after the backoff, or ``dead`` at ``max_errors``.
    """
    if stopped is None:
        if error is None and outcome is not None:
            return outcome
    elif stopped is StopReason.LOST:
        return None
    elif error is None and outcome is not None:
        return outcome
    elif stopped is StopReason.CANCEL_REQUESTED:
        return Settlement(item_id=item.id, lease_version=item.lease_version, kind=SettleKind.CANCEL)
    elif stopped is StopReason.SHUTDOWN:
        return Settlement(
            item_id=item.id, lease_version=item.lease_version, kind=SettleKind.RELEASE
        )
    else:
        error = f"lease renewal failed: {detail}"
    return failure_settlement(item, error or "evaluation was cancelled", settings, jitter)


def failure_settlement(
    item: WorkItem, error: str, settings: SettlePolicy, jitter: Jitter
) -> Settlement:
    """RETRY after the backoff for this error (or the fixed requeue delay), or DEAD at the bound."""
    attempt = item.error_count + 1
    if settings.max_errors is not None and attempt >= settings.max_errors:
        return Settlement(
            item_id=item.id, lease_version=item.lease_version, kind=SettleKind.DEAD, error=error
        )
    if settings.retry is None:
        delay = settings.requeue_delay
    else:
        delay = settings.retry.backoff(attempt, key=item.id, jitter=jitter)
    return Settlement(
        item_id=item.id,
        lease_version=item.lease_version,
        kind=SettleKind.RETRY,
        delay=delay,
        error=error,
    )


def unbuilt_settlement(item: WorkItem, error: str, settings: SettlePolicy) -> Settlement:
    """The drivers' context failed to build for a claim of *item*: not the item's fault. Its
    lease is handed back (due after ``requeue_delay``, the attempt taken back) with *error*
    recorded (the error count and history), and it never goes dead for it."""
    return Settlement(
        item_id=item.id,
        lease_version=item.lease_version,
        kind=SettleKind.RELEASE,
        delay=settings.requeue_delay,
        error=error,
    )
