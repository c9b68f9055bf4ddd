"""What a driver's evaluation returns (:class:`Continue`, :class:`Reschedule`, :class:`Stop`),
and the settlement each one becomes, checked for storage once, before anything is written.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import attrs

from .._clock import utc
from .._convert import unstructure
from .._errors import SuperviseError
from ._checks import MAX_DELAY, check_child
from ._describe import describe_error
from ._json import check_json, flat_json_copy
from ._model import JSONValue, NewItem, WorkItem
from ._settlement import SettleKind, Settlement, UnfrozenSettlement

__all__ = [
    "Continue",
    "Discard",
    "EvaluationTimedOut",
    "Outcome",
    "Reschedule",
    "Stop",
    "dead_settlement",
    "mark_parentless",
    "outcome_settlement",
]


def _snooze(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"Continue delay must be a number of seconds, got {value!r}")
    if not 0 <= value <= MAX_DELAY:
        raise ValueError(f"Continue delay must be from 0 to {MAX_DELAY:g} seconds, got {value!r}")


_NOT_CHILDREN = (str, bytes, NewItem)


def _children(value: Sequence[NewItem]) -> tuple[NewItem, ...]:
    """An outcome's ``children``: a sequence of :class:`NewItem` (not a string), as a tuple."""
    if type(value) is tuple and not value:
        return value  # the default, once per outcome
    if isinstance(value, _NOT_CHILDREN):
        raise TypeError(f"children must be a sequence of NewItem, got {value!r}")
    children = tuple(value)
    for index, child in enumerate(children):
        if not isinstance(child, NewItem):
            raise TypeError(f"children[{index}] must be a NewItem, got {child!r}")
    return children


@attrs.frozen
class Continue:
    """Evaluated; due again after *delay* seconds (default: the runner's ``requeue_delay``).

    The config is kept, and the error count and attempts are cleared: a snooze is a successful
    evaluation, never an error.

    *children* (:class:`~trio_supervise.NewItem`) are created with this outcome, atomically and
    only if the item's lease still holds. With *wait_for_children* the item is not due again
    after a delay but when the last of those children finishes (completed, cancelled or dead),
    or at once if none was created; *delay* must then be left out. See :doc:`/howto/fan-out`.
    """

    delay: float | None = attrs.field(default=None, validator=_snooze)
    children: tuple[NewItem, ...] = attrs.field(default=(), converter=_children, kw_only=True)
    wait_for_children: bool = attrs.field(
        default=False, kw_only=True, validator=attrs.validators.instance_of(bool)
    )

    def __attrs_post_init__(self) -> None:
        if self.wait_for_children and self.delay is not None:
            raise ValueError(
                "Continue delay cannot be given with wait_for_children: the item is due when "
                "its last child finishes"
            )


class EvaluationTimedOut(SuperviseError):
    """An evaluation ran past its timeout (the item's, else its driver's): an item error,
    ``timed out after N s``, retried per the runner's policy."""


class Discard(Exception):
    """Raised by a driver to fail an item for good: it goes straight to ``dead`` with *reason*
    (``last_error`` = ``discarded: <reason>``), never retried; ``items retry`` revives it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_DATETIME = dt.datetime

_UTC = dt.UTC


@attrs.frozen(init=False)
class Reschedule:
    """Evaluated; due again at *at* with *config*, both written in one fenced write.

    *at* must be timezone-aware (a naive datetime raises :class:`ValueError`). *config* is a
    JSON-compatible value or an instance of the driver's attrs ``config_type``, which is
    unstructured back to JSON.
    """

    at: dt.datetime
    """In UTC (converted)."""
    config: Any
    children: tuple[NewItem, ...] = ()
    """Items created with this outcome, atomically (see :class:`Continue`); not waited for."""

    def __init__(self, at: dt.datetime, config: Any, *, children: Sequence[NewItem] = ()) -> None:
        # attrs' __init__ with the two converters, spelled out: one is built per evaluation of
        # a scheduled item, and both converters leave the common values (a UTC datetime, no
        # children) as they are (issue 17's P4).
        _SET_AT(self, at if type(at) is _DATETIME and at.tzinfo is _UTC else utc(at))
        _SET_RESCHEDULE_CONFIG(self, config)
        _SET_RESCHEDULE_CHILDREN(
            self, children if type(children) is tuple and not children else _children(children)
        )


@attrs.frozen(init=False)
class Stop:
    """Finished for good: the item is completed and never claimed again.

    *result*, a JSON-compatible value or an attrs instance (unstructured by the shared
    converter), is stored with the completed item (``WorkItem.result``).
    """

    result: Any = None
    children: tuple[NewItem, ...] = ()
    """Follow-up items created as this one completes, atomically (see :class:`Continue`)."""

    def __init__(self, result: Any = None, *, children: Sequence[NewItem] = ()) -> None:
        # As Reschedule's: one per completed evaluation.
        _SET_RESULT(self, result)
        _SET_STOP_CHILDREN(
            self, children if type(children) is tuple and not children else _children(children)
        )


def _slot_setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    setter: Callable[[Any, Any], None] = getattr(cls, name).__set__
    return setter


_SET_AT = _slot_setter(Reschedule, "at")

_SET_RESCHEDULE_CONFIG = _slot_setter(Reschedule, "config")

_SET_RESCHEDULE_CHILDREN = _slot_setter(Reschedule, "children")

_SET_RESULT = _slot_setter(Stop, "result")

_SET_STOP_CHILDREN = _slot_setter(Stop, "children")

Outcome: TypeAlias = Continue | Reschedule | Stop
"""What a driver's ``evaluate`` returns."""

_CONTINUE = SettleKind.CONTINUE

_RESCHEDULE = SettleKind.RESCHEDULE

_COMPLETE = SettleKind.COMPLETE


def outcome_settlement(
    outcome: object, item: WorkItem, *, driver_name: str, requeue_delay: float
) -> Settlement:
    """The write-back for a driver's *outcome*, every part of it checked for storage here, once.

    The driver has returned: its side effects have happened, so an outcome that cannot be
    written (a result or rescheduled config no backend can store, an unfit child, a child id
    past the limit, more children than an outcome may create, a value that is no outcome at
    all) must never make the item run again. It settles the item ``dead`` at once, saying which
    part could not be stored and why (``the complete outcome could not be stored: result for
    spec 'x' is not JSON-compatible: ...``); ``items retry`` revives it once fixed."""
    try:
        return _outcome_settlement(outcome, item, driver_name, requeue_delay)
    except (ValueError, TypeError, OverflowError, RecursionError) as error:
        return unstorable_settlement(item, outcome, error)


def unstorable_settlement(item: WorkItem, outcome: object, error: BaseException) -> Settlement:
    """``dead``: *outcome* (a driver's) could not be stored, for *error*."""
    if isinstance(error, _NotAnOutcome):
        return dead_settlement(item, str(error))
    kind = _OUTCOME_KINDS.get(type(outcome))
    plain = isinstance(error, ValueError | TypeError) and str(error)
    return dead_settlement(
        item,
        f"the {kind} outcome could not be stored: {error if plain else describe_error(error)}",
    )


def _outcome_settlement(
    outcome: object, item: WorkItem, driver_name: str, requeue_delay: float
) -> Settlement:
    item_id, version = item.id, item.lease_version
    # Reschedule first: a scheduled workflow's every step (issue 17's P4) is one.
    if isinstance(outcome, Reschedule):
        config = outcome.config
        if type(config) is not dict and attrs.has(type(config)):
            config = unstructure(config)
        # The common flat config without check_json's message built per evaluation (the
        # same result: flat_json_copy is check_json's own first step).
        checked = flat_json_copy(config)
        if checked is None:
            checked = check_json(config, what=f"rescheduled config for spec '{item.spec_id}'")
        config = checked
        if not outcome.children:
            # outcome.at is UTC already (Reschedule converts it).
            return _plain_settlement(item_id, version, _RESCHEDULE, at=outcome.at, config=config)
        return Settlement(
            item_id=item_id,
            lease_version=version,
            kind=SettleKind.RESCHEDULE,
            at=outcome.at,
            config=config,
            children=_checked_children(outcome.children, item),
        )
    if isinstance(outcome, Continue):
        delay = requeue_delay if outcome.delay is None else outcome.delay
        if outcome.wait_for_children:
            delay = 0.0
        if not outcome.children and not outcome.wait_for_children:
            return _plain_settlement(item_id, version, _CONTINUE, delay=delay)
        return Settlement(
            item_id=item_id,
            lease_version=version,
            kind=SettleKind.CONTINUE,
            delay=delay,
            children=_checked_children(outcome.children, item),
            wait_for_children=outcome.wait_for_children,
        )
    if isinstance(outcome, Stop):
        result = outcome.result
        if result is not None:
            if attrs.has(type(result)):
                result = unstructure(result)
            result = check_json(result, what=f"result for spec '{item.spec_id}'")
        if not outcome.children:
            return _plain_settlement(item_id, version, _COMPLETE, result=result)
        return Settlement(
            item_id=item_id,
            lease_version=version,
            kind=SettleKind.COMPLETE,
            result=result,
            children=_checked_children(outcome.children, item),
        )
    raise _NotAnOutcome(
        f"driver '{driver_name}' returned {outcome!r}, not Continue, Reschedule or Stop"
    )


class _NotAnOutcome(TypeError):
    """A driver returned something that is no outcome (said as the error, without its type)."""


_OUTCOME_KINDS: dict[type, SettleKind] = {
    Continue: SettleKind.CONTINUE,
    Reschedule: SettleKind.RESCHEDULE,
    Stop: SettleKind.COMPLETE,
}


def _plain_settlement(
    item_id: str,
    version: int,
    kind: SettleKind,
    *,
    delay: float = 0.0,
    at: dt.datetime | None = None,
    config: JSONValue = None,
    result: JSONValue = None,
) -> Settlement:
    """``Settlement(...)`` for an outcome without children or error, its values checked
    already (*at* in UTC, *config* and *result* :func:`check_json`'s own copies): the one
    built per evaluation, without the converters and checks that have nothing to do here, and
    marked so (``_checked``) that the queue does not check and copy *config* and *result*
    again. A delay out of range goes the checked way, which refuses it."""
    if not 0.0 <= delay <= MAX_DELAY:
        return Settlement(item_id=item_id, lease_version=version, kind=kind, delay=delay)
    # Built as its layout's twin without the frozen __setattr__, by plain stores (a slot's
    # setter called as a function costs five times one), then made the Settlement it is
    # (__class__ assignment between classes of one layout): 650 -> 340 ns (issue 17).
    open_: Any = _new_settlement(UnfrozenSettlement)
    open_.item_id = item_id
    open_.lease_version = version
    open_.kind = kind
    open_.delay = delay
    open_.at = at
    open_.config = config
    open_.result = result
    open_.error = None
    open_.children = ()
    open_.wait_for_children = False
    open_._checked = True
    open_._parentless = False  # the runner marks it (Settlement._parentless)
    open_.__class__ = Settlement
    settlement: Settlement = open_  # typed without a call (typing.cast is one, at run time)
    return settlement


_new_settlement = object.__new__

mark_parentless: Callable[[Settlement, bool], None] = _slot_setter(Settlement, "_parentless")
"""Marks a runner's settlement of an item without a parent (see ``Settlement._parentless``)."""


def _check_plain_settlement() -> None:
    # A field added to Settlement but not to _plain_settlement would be left unset: comparing
    # reads every field, so that fails here, at import.
    probe = Settlement(item_id="probe", lease_version=1, kind=SettleKind.COMPLETE)
    plain = _plain_settlement("probe", 1, SettleKind.COMPLETE)
    # The internal flags are not compared: each is read here, so an unset one fails too.
    flags = (plain._checked, probe._checked, plain._parentless, probe._parentless)
    if (
        type(plain) is not Settlement or plain != probe or flags != (True, False, False, False)
    ):  # pragma: no cover
        raise RuntimeError("_plain_settlement does not set every Settlement field")


_check_plain_settlement()


def _checked_children(children: Sequence[NewItem], item: WorkItem) -> tuple[NewItem, ...]:
    """An outcome's children checked as ``enqueue`` checks them (configs as JSON), so an unfit
    one is an item error of the parent (``children[2] of spec 'order': config ...``)."""
    return tuple(
        check_child(child, what=f"children[{index}] of spec '{item.spec_id}'")
        for index, child in enumerate(children)
    )


def dead_settlement(item: WorkItem, error: str) -> Settlement:
    """*item*'s ``dead`` settlement with *error* (fenced by its lease version)."""
    return Settlement(
        item_id=item.id, lease_version=item.lease_version, kind=SettleKind.DEAD, error=error
    )
