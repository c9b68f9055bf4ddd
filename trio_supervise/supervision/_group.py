"""The group rules of a supervisor: which siblings restart together, how many restarts a
supervisor takes before it gives up, in which order children are stopped, and when the end of
significant children ends the supervisor. Each rule is a small value or function over the
supervisor's slots; the restarter (``_restarts.py``) and the stopper (``_stopping.py``) apply them.
"""

from __future__ import annotations

import collections
import enum
import math

import attrs

from ._child import TIME_EPSILON, RestartType, Slot, WorkerState, choice

__all__ = ["AutoShutdown", "Intensity", "ShutdownOrder", "Strategy"]


class Strategy(enum.StrEnum):
    """Which siblings are restarted with a child that is restarted (OTP's strategies)."""

    ONE_FOR_ONE = "one_for_one"
    """Only the child that ended (the default; the seed's)."""
    ONE_FOR_ALL = "one_for_all"
    """Every live child is stopped and all are restarted together: for children that only make
    sense as a set."""
    REST_FOR_ONE = "rest_for_one"
    """The child and every live child added after it: for a pipeline where later children depend on
    earlier ones."""


class ShutdownOrder(enum.StrEnum):
    """How a supervisor stops its children when shutdown begins."""

    REVERSE = "reverse"
    """One at a time, the last started first, each within its own grace (OTP's order; the
    default): a child can rely on the ones started before it outliving it."""
    PARALLEL = "parallel"
    """All at once, each within its own grace: the quickest drain."""


class AutoShutdown(enum.StrEnum):
    """When the normal end of *significant* children shuts their supervisor down (OTP 24+)."""

    NEVER = "never"
    """Never (the default); a significant child is refused."""
    ANY_SIGNIFICANT = "any_significant"
    """When any significant child ends normally (a transient one returned, a temporary one
    ended)."""
    ALL_SIGNIFICANT = "all_significant"
    """When the last significant child still alive ends normally."""


def to_strategy(value: object) -> Strategy:
    return choice(Strategy, "strategy", value)


def to_shutdown_order(value: object) -> ShutdownOrder:
    return choice(ShutdownOrder, "shutdown_order", value)


def to_auto_shutdown(value: object) -> AutoShutdown:
    return choice(AutoShutdown, "auto_shutdown", value)


def _positive_int(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name} must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


def _positive_seconds(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{attribute.name} must be a number of seconds, got {value!r}")
    if math.isnan(value) or math.isinf(value) or value <= 0:
        raise ValueError(f"{attribute.name} must be a finite number > 0, got {value!r}")


@attrs.frozen
class Intensity:
    """A supervisor's restart intensity (OTP's ``intensity`` and ``period``).

    More than *max_restarts* restarts, counted over all the supervisor's children, within any
    *period* seconds, and the supervisor gives up: it stops its children (in its shutdown order)
    and fails upward. It bounds restarts that per-child policies allow; it never causes one.

    :param max_restarts: restarts allowed within *period* (``0``: the first restart gives up).
    :param period: the sliding window, in seconds.
    """

    max_restarts: int = attrs.field(validator=_positive_int)
    period: float = attrs.field(validator=_positive_seconds)


@attrs.define
class RestartWindow:
    """The restarts a supervisor made within its intensity's period."""

    intensity: Intensity
    _times: collections.deque[float] = attrs.field(init=False, factory=collections.deque)

    def admit(self, now: float) -> bool:
        """Count a restart at *now*; False when it is one too many for the intensity.

        The window includes its far end, as OTP's does (it keeps every restart at or after
        ``now - period``): a restart exactly *period* seconds ago is still within it, so a child
        failing every *period* seconds exceeds ``max_restarts=1``. Virtual time is a sum of float
        deltas, so a restart within a nanosecond of the far end counts as on it.
        """
        oldest = now - self.intensity.period - TIME_EPSILON
        while self._times and self._times[0] < oldest:
            self._times.popleft()
        self._times.append(now)
        return len(self._times) <= self.intensity.max_restarts

    @property
    def count(self) -> int:
        return len(self._times)

    def reset(self) -> None:
        self._times.clear()


def restart_group(slots: list[Slot], slot: Slot, strategy: Strategy) -> list[Slot]:
    """The siblings *strategy* restarts with *slot* (itself included), in start order."""
    index = slots.index(slot)
    if strategy is Strategy.ONE_FOR_ALL:
        return list(slots)
    if strategy is Strategy.REST_FOR_ONE:
        return slots[index:]
    return [slot]


def ended_for_good(slot: Slot) -> bool:
    return slot.state in (WorkerState.FAILED, WorkerState.STOPPED)


def auto_shutdown_due(slots: list[Slot], ended: Slot, rule: AutoShutdown) -> bool:
    """Whether the normal end of the significant child *ended* shuts its supervisor down."""
    if rule is AutoShutdown.NEVER or not ended.significant:
        return False
    if rule is AutoShutdown.ANY_SIGNIFICANT:
        return True
    # The slot that just ended is still finishing its run: it counts as ended.
    return all(s is ended or (ended_for_good(s) and s.idle) for s in slots if s.significant)


def check_significant(slot_name: str, significant: bool, rule: AutoShutdown, owner: str) -> None:
    """OTP refuses a significant child under a supervisor that never shuts down automatically."""
    if significant and rule is AutoShutdown.NEVER:
        raise ValueError(
            f"supervisor {owner!r} has auto_shutdown='never', so its child {slot_name!r} "
            f"cannot be significant"
        )


def stop_order(slots: list[Slot], order: ShutdownOrder) -> list[Slot]:
    """The children to stop, in the order they are stopped."""
    return list(reversed(slots)) if order is ShutdownOrder.REVERSE else list(slots)


def never_restarted_with_group(slot: Slot) -> bool:
    """OTP: a temporary sibling is stopped with its group and never restarted."""
    return slot.restart_type is RestartType.TEMPORARY
