"""Settlements: what is written back when an evaluation ends, fenced by the lease version.

Which settlement an evaluation's end writes is decided in one place (:mod:`._rule`); how a
backend applies one is its own (``docs/queues.md``, "The guarantees").
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Sequence

import attrs

from .._clock import utc
from ._checks import MAX_CHILDREN, MAX_DELAY
from ._json import storable_text
from ._model import JSONValue, NewItem

__all__ = [
    "SettleKind",
    "Settlement",
    "UnfrozenSettlement",
    "child_item_id",
    "unstorable_outcome",
]


def child_item_id(parent_id: str, lease_version: int, index: int) -> str:
    """The id of the *index*-th child (from 0) created by *parent_id*'s outcome under
    *lease_version*, when the child names none: ``"<parent>.<version>.<index, 4 digits>"``.

    Deterministic, so a settlement written twice cannot create a child twice, and readable
    (``items show order-1.7.0002``); the children of one outcome sort in their order.
    """
    return f"{parent_id}.{lease_version}.{index:04d}"


def _item_tuple(children: Sequence[NewItem]) -> tuple[NewItem, ...]:
    return tuple(children)


class SettleKind(enum.StrEnum):
    """How an evaluation ended, as written back to the queue."""

    CONTINUE = "continue"
    """Evaluated fine; due again after ``delay`` seconds. Clears the error count."""
    RESCHEDULE = "reschedule"
    """Evaluated fine; due at ``at`` with the new ``config`` in one write. Clears the errors."""
    COMPLETE = "complete"
    """Finished for good, with the JSON ``result`` if any."""
    CANCEL = "cancel"
    """Finished because cancellation was requested."""
    RETRY = "retry"
    """Failed with ``error``; due again after ``delay`` seconds. Adds one to the error count."""
    DEAD = "dead"
    """Failed with ``error`` for the last time: never claimed again until retried by hand."""
    RELEASE = "release"
    """Lease handed back without an outcome (shutdown); due again after ``delay``, the claim's
    attempt taken back. Errors kept; with an ``error`` (a failure that is not the item's own,
    such as a drivers' context that failed to build) it is recorded too (the error count, the
    history), and the item never goes dead for it."""


@attrs.frozen(kw_only=True)
class Settlement:
    """One write-back of an evaluation's outcome, fenced by ``(item_id, lease_version)``."""

    item_id: str
    lease_version: int
    kind: SettleKind
    delay: float = 0.0
    at: dt.datetime | None = attrs.field(default=None, converter=attrs.converters.optional(utc))
    config: JSONValue = None
    result: JSONValue = None
    """A ``complete`` settlement's JSON result (checked like a config before it is written)."""
    error: str | None = attrs.field(
        default=None, converter=attrs.converters.optional(storable_text)
    )
    """Made storable on the way in (:func:`storable_text`): escaped, never dropped."""
    children: tuple[NewItem, ...] = attrs.field(default=(), converter=_item_tuple)
    """Items to create with this settlement, atomically and only if it applies (``continue``,
    ``reschedule`` and ``complete`` only); a child without an ``item_id`` is given
    :func:`child_item_id` here. Checked by the backend as ``enqueue`` checks (an unstorable
    child makes the whole entry :func:`unstorable_outcome`)."""
    wait_for_children: bool = False
    """``continue`` only: the parent waits, not due, until every child created has finished."""
    _checked: bool = attrs.field(init=False, default=False, eq=False, repr=False)
    """Internal, never set by ``__init__`` nor kept by ``attrs.evolve``: ``config`` and
    ``result`` are :func:`check_json`'s copies made for this settlement alone (the runner's
    settlement of a driver's outcome), so a backend may store them without checking and
    copying them again. Not compared: equal settlements are equal however they were built."""
    _parentless: bool = attrs.field(init=False, default=False, eq=False, repr=False)
    """Internal, set by the runner alone (never by ``__init__`` nor kept by ``attrs.evolve``):
    the settled item has no parent, as the runner read from the item it claimed (an item's
    parent never changes), so no parent's fan-in follows from it. PostgreSQL writes a batch of
    such settlements without children or waits as one statement in autocommit; any other batch
    goes the general way, in one transaction with the fan-in."""

    def __attrs_post_init__(self) -> None:
        if self.children or self.wait_for_children:
            self._check_children()
        if self.kind is SettleKind.RESCHEDULE and self.at is None:
            raise ValueError("a reschedule settlement needs 'at'")
        if self.kind in (SettleKind.RETRY, SettleKind.DEAD) and self.error is None:
            raise ValueError(f"a {self.kind} settlement needs 'error'")
        if not (0.0 <= self.delay <= MAX_DELAY):
            raise ValueError(
                f"delay must be a number of seconds from 0 to {MAX_DELAY:g}, got {self.delay!r}"
            )

    def _check_children(self) -> None:
        if self.wait_for_children and self.kind is not SettleKind.CONTINUE:
            raise ValueError(f"a {self.kind} settlement cannot wait for children")
        if not self.children:
            return
        if self.kind not in (SettleKind.CONTINUE, SettleKind.RESCHEDULE, SettleKind.COMPLETE):
            raise ValueError(f"a {self.kind} settlement cannot create children")
        if len(self.children) > MAX_CHILDREN:
            raise ValueError(
                f"children: at most {MAX_CHILDREN} per outcome, got {len(self.children)}"
            )
        named = []
        for index, child in enumerate(self.children):
            if not isinstance(child, NewItem):
                raise TypeError(f"children[{index}] must be a NewItem, got {child!r}")
            if child.item_id is None:
                child = attrs.evolve(
                    child, item_id=child_item_id(self.item_id, self.lease_version, index)
                )
            named.append(child)
        object.__setattr__(self, "children", tuple(named))


class UnfrozenSettlement(Settlement):
    """:class:`Settlement`'s layout without the frozen ``__setattr__``, as
    :class:`UnfrozenItem` is :class:`WorkItem`'s: the settlement built per evaluation is filled
    by plain stores on one, which then becomes the ``Settlement`` it is."""

    __slots__ = ()
    __setattr__ = object.__setattr__
    __delattr__ = object.__delattr__


def unstorable_outcome(settlement: Settlement, error: Exception) -> Settlement:
    """What a settlement the backend cannot store becomes: ``dead``, with the reason.

    One entry of a ``settle_many`` batch that cannot be written (a rescheduled config no backend
    can store, a value out of the database's range) must not take its batch-mates down, nor be
    re-run for ever: it is settled ``dead`` (fenced as usual) with ``last_error`` saying why, and
    ``trio-supervise items retry`` revives it once fixed.
    """
    return Settlement(
        item_id=settlement.item_id,
        lease_version=settlement.lease_version,
        kind=SettleKind.DEAD,
        error=f"the {settlement.kind} outcome could not be stored: {error}",
    )
