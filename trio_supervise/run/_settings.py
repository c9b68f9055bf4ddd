"""How a worker claims, evaluates and settles items: :class:`RunnerSettings`, checked up front."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .._convert import converter
from .._policy import RestartPolicy
from ..job import DEFAULT_QUEUE, RateLimit, check_key_rule, check_queue_name

__all__ = ["PassStats", "RunnerSettings"]


def _seconds(*, minimum: float = 0.0, positive: bool = False) -> Callable[[Any, Any, Any], None]:
    def check(instance: object, attribute: attrs.Attribute[float], value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{attribute.name} must be a number of seconds, got {value!r}")
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{attribute.name} must be a finite number, got {value!r}")
        if positive and value <= 0:
            raise ValueError(f"{attribute.name} must be positive, got {value!r}")
        if value < minimum:
            raise ValueError(f"{attribute.name} must be >= {minimum:g} seconds, got {value!r}")

    return check


def _count(
    *, minimum: int = 1, optional: bool = False
) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{attribute.name} must be an int, got {value!r}")
        if value < minimum:
            raise ValueError(f"{attribute.name} must be >= {minimum}, got {value!r}")

    return check


def _queue_limits(value: object) -> Mapping[str, int] | None:
    """``queues``: a mapping of queue names to their concurrency, each checked; a copy."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not value:
        raise ValueError(
            f"queues must be a non-empty mapping of queue names to limits, got {value!r}"
        )
    limits = {}
    for name, limit in value.items():
        try:
            check_queue_name(name)
        except ValueError as error:  # named as the field (settings: "runner.queues: ...")
            raise type(error)(f"queues: {error}") from None
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(
                f"queues: the limit of queue {name!r} must be an int >= 1, got {limit!r}"
            )
        limits[name] = limit
    return limits


def _rate_limits(value: object) -> Mapping[str, RateLimit] | None:
    """``rate_limits``: queue names to :class:`RateLimit` s (or their ``"100/60s"`` form)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(
            f"rate_limits must be a mapping of queue names to rates ('100/60s'), got {value!r}"
        )
    limits = {}
    for name, rate in value.items():
        try:
            limits[check_queue_name(name)] = RateLimit.parse(rate)
        except ValueError as error:  # named as the field (settings: "runner.rate_limits: ...")
            raise type(error)(f"rate_limits: queue {name!r}: {error}") from None
    return limits


def _key_rate_limits(value: object) -> Mapping[str, RateLimit] | None:
    """``key_rate_limits``: concurrency keys or templates to :class:`RateLimit` s."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(
            "key_rate_limits must be a mapping of concurrency keys or templates "
            f"('partner:{{tenant}}') to rates ('100/60s'), got {value!r}"
        )
    limits = {}
    for key, rate in value.items():
        try:
            limits[check_key_rule(key)] = RateLimit.parse(rate)
        except ValueError as error:  # named as the field (settings: "runner.key_rate_limits")
            raise type(error)(f"key_rate_limits: key {key!r}: {error}") from None
    return limits


# Settings files write a rate as text ("100/60s"), and read it back so.
converter.register_structure_hook(RateLimit, lambda value, _: RateLimit.parse(value))
converter.register_unstructure_hook(RateLimit, str)


def _rate(instance: object, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{attribute.name} must be a number of lines per second, got {value!r}")
    if not (value == value and 0 <= value < float("inf")):
        raise ValueError(
            f"{attribute.name} must be a finite number of lines per second >= 0, got {value!r}"
        )


def _worker_id(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"worker_id must be a non-empty string, got {value!r}")


_MIN_LEASE = 3.0

_MIN_RENEW_INTERVAL = 1.0


@attrs.frozen(kw_only=True)
class RunnerSettings:
    """How a worker claims, evaluates and settles items. Durations are seconds.

    :param worker_id: this worker's name in leases (unique among live workers).
    :param lease: how long a claim holds an item; renewed every ``lease / 3`` (at least 1 s
        apart) while the item is evaluated. At least 3 s, so two renewals can fail before expiry.
    :param requeue_delay: after :class:`Continue`, and after an error when ``retry`` is None.
    :param claim_batch: the most items one claim takes (never more than the free slots).
    :param concurrency: the most items evaluated at once. An item's slot is freed when its
        outcome is taken for a write, so the next claim runs beside that write (with a queue
        whose writes run one at a time anyway, such as SQLite's, the write itself claims the
        free slots, up to ``claim_batch``, in the same call: serving several queues, those of
        the queue with the most free slots); the
        runner then holds at most
        ``concurrency + settle_batch`` leases (the batch being written).
    :param poll_interval: the longest an idle runner waits before looking for due work again.
    :param shutdown_grace: how long in-flight items may finish after shutdown begins.
    :param retry: backoff for failed items, keyed by item id and error count; None means the fixed
        ``requeue_delay``.
    :param max_errors: an item is dead after this many consecutive errors (default 20); None
        means never.
    :param max_attempts: an item claimed more than this many times since its last successful
        evaluation is settled dead, without being evaluated, with the reason
        ``exceeded max_attempts (N)`` (default 20); None means never. Claims count whether or
        not an error was written, so this ends the loops ``max_errors`` cannot see: a worker
        killed (or a lease lost) mid-evaluation every time.
    :param claim_retry: backoff between failed claims; past ``claim_retry.max_restarts``
        consecutive failures the runner drains and raises the queue's error.
    :param settle_batch: the most outcomes written in one ``settle_many`` (or
        ``settle_and_claim``) call (one call at a time).
    :param error_history: how many recent errors a runner keeps for its status page.
    :param outcome_log_rate: the most INFO lines per second saying how an evaluation ended
        (``item 'alice' (spec 'digest'): reschedule, took 0.012 s``), one per settled outcome;
        past it the rest are counted, and the next line says how many were not logged. 0: none
        (the default is 10); a logger at WARNING shows none anyway.
    :param tracing: a span per evaluation with OpenTelemetry (the ``otel`` extra): None (the
        default) when ``opentelemetry`` is installed and the application has set a tracer
        provider by the time the runner starts, False never, True always (refused at
        :meth:`~trio_supervise.WorkflowRunner.run` without the extra).
    :param queues: the named queues this runner serves, each with its own concurrency limit,
        e.g. ``{"default": 20, "mail": 5}``: each queue is claimed on its own, so a flood in one
        never takes another's slots. None (the default) serves ``"default"`` with
        ``concurrency``.
    :param rate_limits: rate limits to set on named queues when the runner starts, fleet-wide
        (they stay in the store for every process), e.g. ``{"mail": "100/60s"}``: at most that
        many starts of the queue in any period (``docs/flow-control.md``). None (the default)
        sets none and leaves those set by others (``trio-supervise queues limit``) as they are.
    :param key_rate_limits: rate limits to set on concurrency keys when the runner starts, as
        ``rate_limits`` does on queues, e.g. ``{"partner:{tenant}": "100/60s"}``: at most that
        many starts of each key the template renders (each tenant's) in any period.
    """

    worker_id: str = attrs.field(validator=_worker_id)
    lease: float = attrs.field(default=60.0, validator=_seconds(minimum=_MIN_LEASE))
    requeue_delay: float = attrs.field(default=5.0, validator=_seconds())
    claim_batch: int = attrs.field(default=10, validator=_count())
    concurrency: int = attrs.field(default=10, validator=_count())
    poll_interval: float = attrs.field(default=1.0, validator=_seconds(positive=True))
    shutdown_grace: float = attrs.field(default=30.0, validator=_seconds())
    retry: RestartPolicy | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.instance_of(RestartPolicy)),
    )
    max_errors: int | None = attrs.field(default=20, validator=_count(optional=True))
    max_attempts: int | None = attrs.field(default=20, validator=_count(optional=True))
    claim_retry: RestartPolicy = attrs.field(
        default=RestartPolicy(1.0, 30.0, max_restarts=10),
        validator=attrs.validators.instance_of(RestartPolicy),
    )
    settle_batch: int = attrs.field(default=100, validator=_count())
    error_history: int = attrs.field(default=50, validator=_count(minimum=0))
    queues: Mapping[str, int] | None = attrs.field(default=None, converter=_queue_limits)
    rate_limits: Mapping[str, RateLimit] | None = attrs.field(default=None, converter=_rate_limits)
    key_rate_limits: Mapping[str, RateLimit] | None = attrs.field(
        default=None, converter=_key_rate_limits
    )
    outcome_log_rate: float = attrs.field(default=10.0, validator=_rate)
    tracing: bool | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(bool))
    )

    @property
    def queue_limits(self) -> dict[str, int]:
        """Each served queue's concurrency: ``queues``, or ``{"default": concurrency}``."""
        return dict(self.queues) if self.queues else {DEFAULT_QUEUE: self.concurrency}

    @property
    def renew_interval(self) -> float:
        """Seconds between lease renewals: ``lease / 3``, at least 1 s."""
        return max(self.lease / 3, _MIN_RENEW_INTERVAL)

    @property
    def claim_limit(self) -> int:
        """The most items one due pass claims: ``claim_batch`` clamped to ``[1, concurrency]``."""
        return min(max(self.claim_batch, 1), self.concurrency)


@attrs.frozen
class PassStats:
    """What one due pass did: how many items it claimed, and how many of them failed."""

    claimed: int = 0
    failed: int = 0
