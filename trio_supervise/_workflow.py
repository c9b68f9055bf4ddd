"""Leased workflow execution: outcomes, drivers, the registry, settings and one due pass.

A *driver* evaluates work items of the spec ids it owns and says what happens next
(:class:`Continue`, :class:`Reschedule` or :class:`Stop`). :func:`run_due_pass` claims a batch of
due items under a lease, evaluates each in its own cancel scope while a renewal task keeps the lease
alive beside it, and writes each outcome back fenced by the lease version. The long-running
:class:`~trio_supervise.WorkflowRunner` (``_runner.py``) does the same continuously.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeAlias, TypeVar, overload

import attrs
import trio

from ._convert import structure_config
from ._errors import ConfigError, DriverError, LeaseLost, QueueError, QueueFailed
from ._policy import Jitter, RestartPolicy
from .job import (
    DEFAULT_CONCURRENCY_LIMIT,
    DEFAULT_QUEUE,
    Continue,
    Discard,
    EvaluationTimedOut,
    LeaseStatus,
    Outcome,
    Reschedule,
    SettleKind,
    Settlement,
    Stop,
    StopReason,
    WorkItem,
    application_frames,
    check_concurrency,
    check_priority,
    check_queue_name,
    check_timeout,
    dead_settlement,
    describe_error,
    describe_failure,
    first_line,
    outcome_settlement,
    settlement_after,
    settlement_before,
    unbuilt_settlement,
    validate_spec_id,
)
from .queues._ports import (
    WorkQueue,
)

__all__ = [
    "AnyWorkflowDriver",
    "ContextFactory",
    "Continue",
    "Discard",
    "DriverRegistry",
    "EvaluationTimedOut",
    "Outcome",
    "PassStats",
    "Reschedule",
    "RunnerSettings",
    "Stop",
    "TypedWorkflowDriver",
    "WorkflowDriver",
    "run_due_pass",
]

logger = logging.getLogger("trio_supervise.workflow")

ContextT = TypeVar("ContextT")
ContextT_contra = TypeVar("ContextT_contra", contravariant=True)
ConfigT = TypeVar("ConfigT")


# -- outcomes ---------------------------------------------------------------------------------


# -- drivers and the registry -----------------------------------------------------------------


class WorkflowDriver(Protocol[ContextT_contra]):
    """Evaluates the work items of the spec ids it owns.

    A driver may also declare ``config_type``, an attrs class: the runner then structures
    ``item.config`` into it with the shared cattrs converter and hands ``evaluate`` the item with
    ``config`` replaced by that instance. A config that does not fit is an item error
    (``invalid config for spec 'digest': days: expected int, got str``), never a crashed runner.
    For the type checker to see that instance too, write a :class:`TypedWorkflowDriver`.

    ``evaluate`` runs inside the item's own cancel scope: it is cancelled when the lease is lost,
    when cancellation is requested from outside, and when shutdown's grace period runs out.
    Raising an :class:`Exception` is an item error; anything else (``KeyboardInterrupt``)
    propagates.
    """

    @property
    def name(self) -> str:
        """A short name, used in errors and logs."""
        ...

    @property
    def spec_ids(self) -> Sequence[str]:
        """The spec ids this driver owns; no other driver in a registry may claim them."""
        ...

    def validate_specs(self) -> None:
        """Raise (any :class:`Exception`) if this driver's specs are not usable."""
        ...

    async def evaluate(self, context: ContextT_contra, item: WorkItem) -> Outcome:
        """Do one step of the item's work and say what happens next."""
        ...


class TypedWorkflowDriver(Protocol[ContextT_contra, ConfigT]):
    """A driver whose ``evaluate`` takes the item's config, typed, as a third argument.

    The runner structures ``item.config`` into ``config_type`` (an attrs class) and passes the
    instance as ``config``, so ``mypy --strict`` knows its type::

        class WateringDriver:
            name = "watering"
            spec_ids = ("watering",)
            config_type = Watering

            def validate_specs(self) -> None:
                pass

            async def evaluate(self, context: Garden, item: WorkItem, config: Watering) -> Outcome:
                ...

    A ``config`` annotation that is not ``config_type`` is a type error where the driver is
    registered (:meth:`DriverRegistry.register`); subclassing ``TypedWorkflowDriver[Garden,
    Watering]`` explicitly reports it at the class itself, and inherits a ``validate_specs``
    that accepts every spec. ``item.config`` holds the same instance at run time.
    """

    @property
    def name(self) -> str:
        """A short name, used in errors and logs."""
        ...

    @property
    def spec_ids(self) -> Sequence[str]:
        """The spec ids this driver owns; no other driver in a registry may claim them."""
        ...

    @property
    def config_type(self) -> type[ConfigT]:
        """The attrs class each item's config is structured into."""
        ...

    def validate_specs(self) -> None:
        """Raise (any :class:`Exception`) if this driver's specs are not usable."""
        return  # not an empty body: subclasses inherit it as the default

    async def evaluate(self, context: ContextT_contra, item: WorkItem, config: ConfigT) -> Outcome:
        """Do one step of the item's work, given its typed *config*; say what happens next."""
        ...


AnyWorkflowDriver: TypeAlias = WorkflowDriver[ContextT] | TypedWorkflowDriver[ContextT, Any]
"""Either kind of driver, for collections of them (``Service(drivers=...)``)."""


ContextFactory: TypeAlias = Callable[
    [], contextlib.AbstractAsyncContextManager[ContextT] | Awaitable[ContextT] | ContextT
]
"""What ``build_context`` may be: a zero-argument callable that returns the drivers' context, an
awaitable of it (an ``async def``), or an async context manager that yields it (a function
decorated with :func:`contextlib.asynccontextmanager`, or a class with ``__aenter__``)."""


@contextlib.asynccontextmanager
async def open_context(build_context: ContextFactory[ContextT]) -> AsyncIterator[ContextT]:
    """Build the drivers' context with *build_context*, and tear it down on the way out.

    An async context manager that *build_context* returns is entered here and exited when this
    block ends, however it ends (a stop, cancellation, a failure), so a client or pool it opened
    is closed. An awaitable is awaited; anything else is the context itself.
    """
    made = build_context()
    if isinstance(made, contextlib.AbstractAsyncContextManager):
        async with made as context:
            yield context
        return
    if inspect.isawaitable(made):
        yield await made
        return
    yield made


def driver_config_type(driver: object) -> type[Any] | None:
    """The attrs class a driver declares for its items' config, or None."""
    config_type = getattr(driver, "config_type", None)
    return config_type if isinstance(config_type, type) else None


_TAKES_CONFIG: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()
"""Per driver class: whether its ``evaluate`` takes ``config`` (a cache of the signature)."""
_LAST_TAKES_CONFIG: tuple[type | None, bool] = (None, False)
"""The class last asked about and its answer, held strongly (one class): a weak dictionary's
``get`` makes a weak reference per call, and a runner asks once per evaluation, mostly of one
driver class."""


def takes_config(driver: AnyWorkflowDriver[Any]) -> bool:
    """Whether *driver*'s ``evaluate`` requires a third (config) argument.

    Decided once per driver class from the signature: ``evaluate(context, item, config)``.
    """
    global _LAST_TAKES_CONFIG
    cls = type(driver)
    last = _LAST_TAKES_CONFIG
    if last[0] is cls:
        return last[1]
    known = _TAKES_CONFIG.get(cls)
    if known is not None:
        _LAST_TAKES_CONFIG = (cls, known)
        return known
    try:
        signature = inspect.signature(driver.evaluate)
    except (TypeError, ValueError):
        result = False
    else:
        result = _binds(signature, 3) and not _binds(signature, 2)
    _TAKES_CONFIG[cls] = result
    _LAST_TAKES_CONFIG = (cls, result)
    return result


def _binds(signature: inspect.Signature, count: int) -> bool:
    try:
        signature.bind(*([None] * count))
    except TypeError:
        return False
    return True


def _driver_concurrency(driver: object) -> tuple[str | None, int]:
    """A driver's ``concurrency_key`` template and ``concurrency_limit``, checked (ValueError)."""
    template = getattr(driver, "concurrency_key", None)
    limit = getattr(driver, "concurrency_limit", None)
    if template is not None:
        if not isinstance(template, str) or not template:
            raise ValueError(
                f"concurrency_key must be a non-empty string template, got {template!r}"
            )
        try:
            probe = template.format(tenant="t", subject="s")
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(
                f"concurrency_key {template!r} may use only {{tenant}} and {{subject}}: {error!r}"
            ) from None
        check_concurrency(probe, limit)
    elif limit is not None:
        check_concurrency("probe", limit)
    return template, DEFAULT_CONCURRENCY_LIMIT if limit is None else limit


@attrs.define(eq=False)
class DriverRegistry(Generic[ContextT]):
    """Which driver owns which spec id. Registration order never matters for dispatch."""

    _drivers: list[AnyWorkflowDriver[ContextT]] = attrs.field(init=False, factory=list)
    _by_spec: dict[str, AnyWorkflowDriver[ContextT]] = attrs.field(init=False, factory=dict)

    @overload
    def register(
        self, driver: TypedWorkflowDriver[ContextT, ConfigT]
    ) -> DriverRegistry[ContextT]: ...

    @overload
    def register(self, driver: WorkflowDriver[ContextT]) -> DriverRegistry[ContextT]: ...

    def register(self, driver: AnyWorkflowDriver[ContextT]) -> DriverRegistry[ContextT]:
        """Add *driver*; refuse (:class:`DriverError`) a spec id that another driver claims.

        Nothing is registered when the driver is refused. Returns the registry, for chaining.
        To the type checker, a :class:`TypedWorkflowDriver` whose ``config`` parameter is not
        its ``config_type`` matches neither overload.
        """
        name: object = driver.name
        if not isinstance(name, str) or not name:
            raise DriverError(f"driver name must be a non-empty string, got {name!r}")
        spec_ids = driver.spec_ids
        if isinstance(spec_ids, str):
            raise DriverError(f"driver '{name}': spec_ids must be a sequence of ids, not a string")
        seen: set[str] = set()
        for spec_id in spec_ids:
            try:
                validate_spec_id(spec_id)
            except ValueError as error:
                raise DriverError(f"driver '{name}': {error}") from None
            existing = self._by_spec.get(spec_id)
            if existing is not None:
                raise DriverError(
                    f"spec '{spec_id}' is claimed by both '{existing.name}' and '{name}'"
                )
            if spec_id in seen:
                raise DriverError(f"spec '{spec_id}' is listed twice by '{name}'")
            seen.add(spec_id)
        if not seen:
            raise DriverError(f"driver '{name}' owns no spec ids")
        if name in self.names():
            raise DriverError(f"a driver named '{name}' is registered already")
        raw_type = getattr(driver, "config_type", None)
        if raw_type is not None and not (isinstance(raw_type, type) and attrs.has(raw_type)):
            raise DriverError(
                f"driver '{name}': config_type must be an attrs class, got {raw_type!r}"
            )
        if raw_type is None and takes_config(driver):
            raise DriverError(
                f"driver '{name}': evaluate takes a config argument, but the driver declares "
                "no config_type"
            )
        try:
            check_priority(getattr(driver, "priority", 0))
            check_queue_name(getattr(driver, "queue", DEFAULT_QUEUE))
            check_timeout(getattr(driver, "timeout", None))
            _driver_concurrency(driver)
        except ValueError as error:
            raise DriverError(f"driver '{name}': {error}") from None
        for spec_id in seen:
            self._by_spec[spec_id] = driver
        self._drivers.append(driver)
        return self

    async def enqueue(
        self,
        work_queue: WorkQueue,
        spec_id: str,
        *,
        priority: int | None = None,
        queue: str | None = None,
        **fields: Any,
    ) -> WorkItem:
        """``work_queue.enqueue(spec_id, ...)`` with the owning driver's defaults.

        A driver may declare ``priority`` (an int, lower first) and ``queue`` (a queue name) as
        attributes; they apply when *priority* or *queue* is not given here (else 0 and
        ``"default"``). It may also declare ``concurrency_key``, a template formatted with the
        item's ``{tenant}`` and ``{subject}`` (``"{tenant}"``: at most ``concurrency_limit``
        items of one tenant run at once; ``"smtp"``: of the whole driver), used when no
        ``concurrency_key`` is given here; a key that formats to ``""`` (no tenant) means no
        key. Its ``concurrency_limit`` (default 1) applies to every keyed item it enqueues
        without a ``concurrency_limit``, an explicit key too. Every other keyword goes to
        :meth:`WorkQueue.enqueue` as is.
        """
        driver = self._by_spec.get(spec_id)
        if priority is None:
            priority = getattr(driver, "priority", 0)
        if queue is None:
            queue = getattr(driver, "queue", DEFAULT_QUEUE)
        if driver is not None:
            template, limit = _driver_concurrency(driver)
            if fields.get("concurrency_key") is None and template is not None:
                fields["concurrency_key"] = (
                    template.format(
                        tenant=fields.get("tenant_id", ""), subject=fields.get("subject_id", "")
                    )
                    or None
                )
            keyed = fields.get("concurrency_key") is not None
            if keyed and fields.get("concurrency_limit") is None:
                fields["concurrency_limit"] = limit
        return await work_queue.enqueue(spec_id, priority=priority, queue=queue, **fields)

    def spec_ids(self) -> list[str]:
        """Every registered spec id, sorted."""
        return sorted(self._by_spec)

    def for_spec(self, spec_id: str) -> AnyWorkflowDriver[ContextT] | None:
        """The driver that owns *spec_id*, or None."""
        return self._by_spec.get(spec_id)

    def names(self) -> list[str]:
        """The drivers' names, in registration order."""
        return [driver.name for driver in self._drivers]

    def is_empty(self) -> bool:
        """Whether no driver is registered."""
        return not self._drivers

    def validate_all(self) -> None:
        """Run every driver's ``validate_specs``; :class:`DriverError` names the first at fault."""
        for driver in self._drivers:
            try:
                driver.validate_specs()
            except Exception as error:
                raise DriverError(f"driver '{driver.name}': {describe_error(error)}") from error


# -- settings ---------------------------------------------------------------------------------


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
        whose writes run one at a time anyway, such as SQLite's, and one served queue, the
        write itself claims the free slots, up to ``claim_batch``, in the same call); the
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
    :param queues: the named queues this runner serves, each with its own concurrency limit,
        e.g. ``{"default": 20, "mail": 5}``: each queue is claimed on its own, so a flood in one
        never takes another's slots. None (the default) serves ``"default"`` with
        ``concurrency``.
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


# -- evaluation, shared by the due pass and the runner ----------------------------------------


def log_fields(worker: str, item: WorkItem | None = None, **more: object) -> dict[str, object]:
    """The ``extra`` of a runner's log record: ``worker``, the item's ``item_id``, ``spec_id``,
    ``lease_version`` and ``attempt``, then *more* (``backoff_s``, ``error``, or the item's
    fields when there is no *item*) where not None."""
    fields: dict[str, object] = {"worker": worker}
    if item is not None:
        fields.update(
            item_id=item.id,
            spec_id=item.spec_id,
            lease_version=item.lease_version,
            attempt=item.attempt,
        )
    fields.update((name, value) for name, value in more.items() if value is not None)
    return fields


def next_step(item: WorkItem, settlement: Settlement, settings: RunnerSettings) -> str:
    """What comes next for a failed *item*, in words, for the log line that reports it."""
    errors = item.error_count + 1
    of = "" if settings.max_errors is None else f" of {settings.max_errors}"
    if settlement.kind is SettleKind.DEAD:
        return f"dead after {errors} errors; `trio-supervise items retry {item.id}` requeues it"
    return f"retrying in {settlement.delay:.3g} s (error {errors}{of})"


_PERMANENT_QUEUE_ERRORS: tuple[type[Exception], ...] = (QueueFailed,)
"""Queue errors no retry fixes (``QueueFailed`` and its ``SchemaError``): a write is not retried."""

WRITE_RETRY_BOUND = 60.0
"""Seconds a failing outcome write is retried at most (one lease, if longer), renewals landing."""


def is_transient(error: Exception) -> bool:
    """Whether a failed queue write may succeed if written again: a :class:`QueueError` that is
    not permanent. :class:`QueueUnavailable` (connection lost, SQLite busy or locked, disk full)
    is the transient class; a bare :class:`QueueError` is unclassified and gets the benefit of the
    doubt, bounded by the lease. Anything else (a bug, an unencodable value, :class:`LeaseLost`)
    is not retried."""
    return isinstance(error, QueueError) and not isinstance(error, _PERMANENT_QUEUE_ERRORS)


def write_retry_delay(
    error: Exception,
    *,
    item_id: str,
    attempt: int,
    lease_left: float,
    failing_for: float,
    settings: RunnerSettings,
    jitter: Jitter,
) -> float | None:
    """How long to wait before writing an outcome again after failed *attempt*, or None.

    A transient failure (:func:`is_transient`) is retried while the lease is valid
    (*lease_left* seconds, as last renewed), and for at most ``WRITE_RETRY_BOUND`` seconds (or one
    lease, if longer) of failing writes: renewals that keep landing while writes keep failing mean
    the write itself is at fault, and an outcome is not held forever. The backoff is
    ``claim_retry``'s, keyed by item, capped at half the renewal interval and at the lease's
    expiry, so the last attempt happens as the lease runs out.
    """
    if (
        not is_transient(error)
        or lease_left <= 0
        or failing_for >= max(settings.lease, WRITE_RETRY_BOUND)
    ):
        return None
    delay = settings.claim_retry.backoff(attempt, key=f"settle:{item_id}", jitter=jitter)
    return min(delay, settings.renew_interval / 2, lease_left)


def prepare_item(driver: object, item: WorkItem) -> WorkItem:
    """The item as the driver sees it: ``config`` structured into its ``config_type`` if any."""
    config_type = driver_config_type(driver)
    if config_type is None:
        return item
    config = structure_config(
        item.config, config_type, what=f"invalid config for spec '{item.spec_id}'"
    )
    return attrs.evolve(item, config=config)


# The kinds a driver's outcome settles as, as module names: in Python 3.11 reading an enum member
# off its class costs about 45 ns (issue 17).


async def evaluate_item(
    driver: AnyWorkflowDriver[ContextT] | None,
    context: ContextT,
    item: WorkItem,
    *,
    requeue_delay: float,
) -> Settlement:
    """Run the driver on *item* and turn its outcome into a settlement; raise on any item error.

    Two failures no retry can fix settle ``dead`` at once instead: a config that does not
    structure into the driver's ``config_type``, and a driver raising :class:`Discard`.
    """
    if driver is None:
        raise DriverError(f"no driver registered for spec '{item.spec_id}'")
    prepared = item
    # prepare_item's own test first, so that a driver without a config type (most) costs no
    # call here (one evaluation is about 90 calls in all; issue 17).
    if isinstance(getattr(driver, "config_type", None), type):
        try:
            prepared = prepare_item(driver, item)
        except ConfigError as error:
            return dead_settlement(item, str(error))
    timeout = item.timeout if item.timeout is not None else getattr(driver, "timeout", None)
    # evaluate(context, item) or, for a typed driver, evaluate(context, item, config), called
    # here: a helper's call and coroutine frame would cost every evaluation (and be held by
    # every driver that awaits), and an argument tuple (evaluate(*args)) 900 instructions.
    untyped: Any = driver
    typed = takes_config(driver)
    try:
        if timeout is None:
            # No deadline, no cancel scope: most items have none, and a scope per item is a
            # measurable part of a short evaluation's cost.
            if typed:
                outcome = await untyped.evaluate(context, prepared, prepared.config)
            else:
                outcome = await untyped.evaluate(context, prepared)
        else:
            with trio.move_on_after(timeout) as deadline:
                if typed:
                    outcome = await untyped.evaluate(context, prepared, prepared.config)
                else:
                    outcome = await untyped.evaluate(context, prepared)
            if deadline.cancelled_caught:
                raise EvaluationTimedOut(f"timed out after {timeout:g} s")
    except Discard as discard:
        return dead_settlement(item, f"discarded: {discard.reason}")
    return outcome_settlement(outcome, item, driver_name=driver.name, requeue_delay=requeue_delay)


# -- the settlement rule: what an evaluation's end writes, for every executor ------------------


def raise_specific(group: BaseExceptionGroup[BaseException]) -> None:
    """Re-raise what a nursery's group is really about.

    Our tasks catch every :class:`Exception` they expect, so a group escaping a nursery carries
    ``KeyboardInterrupt``/``SystemExit``, a driver's ``BaseException``, a bug, or ``Cancelled``.
    When exactly one leaf is not ``Cancelled`` (the others being the nursery cancelling siblings
    because of it), that leaf is raised on its own so callers can ``except KeyboardInterrupt``.
    Otherwise the group is re-raised unchanged (Trio's cancel scopes handle groups of
    ``Cancelled``).
    """
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        current = pending.pop()
        if isinstance(current, BaseExceptionGroup):
            pending.extend(reversed(current.exceptions))
        else:
            leaves.append(current)
    real = [leaf for leaf in leaves if not isinstance(leaf, trio.Cancelled)]
    if len(real) == 1:
        raise real[0]
    raise group


# -- one due pass -----------------------------------------------------------------------------


def writes_batches(queue: object) -> bool:
    """Whether *queue* takes settlements whole (``settle_many``, beside ``renew_many``): every
    backend of this package does. A queue written to the seed's protocol alone (``release``,
    ``reschedule``, ``complete``, ``mark_error``) gets each settlement as those calls."""
    return callable(getattr(type(queue), "renew_many", None)) and callable(
        getattr(type(queue), "settle_many", None)
    )


async def _write(
    queue: WorkQueue,
    settlement: Settlement,
    *,
    lease_left: Callable[[], float],
    settings: RunnerSettings,
    jitter: Jitter,
) -> None:
    """Write *settlement*: whole, with ``settle_many``, to a queue that takes settlements
    (:func:`writes_batches`), else with the seed's single-item writes.

    A write that fails transiently is written again after a backoff while the lease is valid
    (:func:`write_retry_delay`; *lease_left* says how long it has); a failure given up, and a
    refusal (the lease was lost), are logged.
    """
    item_id, version = settlement.item_id, settlement.lease_version
    seed: Any = queue  # a store without the worker port has the seed's writes (SeedWrites)

    async def release() -> None:
        await seed.release(item_id, version, settlement.delay)

    async def reschedule() -> None:
        assert settlement.at is not None
        await seed.reschedule(item_id, version, settlement.at, settlement.config)

    async def complete() -> None:
        await seed.complete(item_id, version)

    async def mark_error() -> None:
        assert settlement.error is not None
        await seed.mark_error(item_id, version, settlement.error)

    async def settle() -> None:
        [applied] = await queue.settle_many([settlement])
        if not applied:
            raise LeaseLost(item_id, version, f"{settlement.kind} refused")

    steps: list[Callable[[], Awaitable[None]]]
    match settlement.kind:
        case _ if writes_batches(queue):
            steps = [settle]  # one fenced write, as the runner's (attempts counted alike)
        case _ if settlement.children or settlement.wait_for_children:
            steps = [settle]  # the children are written with the outcome, in one transaction
        case SettleKind.CONTINUE:
            steps = [release]
        case SettleKind.RESCHEDULE:
            steps = [reschedule]
        case SettleKind.COMPLETE if settlement.result is None:
            steps = [complete]
        case SettleKind.RETRY:
            steps = [mark_error, release]  # each retried alone: an error is counted once
        case SettleKind.RELEASE if settlement.error is not None:
            steps = [mark_error, release]
        case SettleKind.RELEASE:
            steps = [release]
        case _:
            steps = [settle]
    for step in steps:
        attempt = 0
        first_failure = trio.current_time()
        while True:
            try:
                await step()
                break
            except Exception as error:
                attempt += 1
                text = describe_error(error)
                delay = write_retry_delay(
                    error,
                    item_id=item_id,
                    attempt=attempt,
                    lease_left=lease_left(),
                    failing_for=trio.current_time() - first_failure,
                    settings=settings,
                    jitter=jitter,
                )
                fields = log_fields(
                    settings.worker_id,
                    item_id=item_id,
                    lease_version=version,
                    error=text,
                    backoff_s=delay,
                )
                if isinstance(error, LeaseLost):
                    logger.warning(
                        "%s of item %r refused: the lease was lost (another worker may run the "
                        "item); nothing was written",
                        settlement.kind,
                        item_id,
                        extra=fields,
                    )
                    return
                if delay is None:
                    logger.warning(
                        "writing %s for item %r failed: %s; giving up, its lease will expire "
                        "and another claim runs it again",
                        settlement.kind,
                        item_id,
                        text,
                        extra=fields,
                    )
                    return
                logger.warning(
                    "writing %s for item %r failed (attempt %d): %s; writing it again in %.3g s",
                    settlement.kind,
                    item_id,
                    attempt,
                    text,
                    delay,
                    extra=fields,
                )
                await trio.sleep(delay)


async def run_due_pass(
    queue: WorkQueue,
    registry: DriverRegistry[ContextT],
    settings: RunnerSettings,
    build_context: ContextFactory[ContextT],
    *,
    jitter: Jitter | None = None,
) -> PassStats:
    """Claim due items once, evaluate them all concurrently, write back each outcome.

    Claims at most :attr:`RunnerSettings.claim_limit` items. The context is built once, and only
    when something was claimed (an async context manager is entered, and exited once every
    outcome is written); if building it raises, every claimed item gets ``mark_error`` and
    ``release(requeue_delay)`` and the error propagates. Each item is evaluated in its own cancel
    scope beside a task renewing its lease every :attr:`RunnerSettings.renew_interval`; a failed
    renewal cancels the evaluation and counts as the error ``"lease renewal failed: ..."``.

    Outcomes: :class:`Continue` → ``release(requeue_delay)``; :class:`Reschedule` →
    ``reschedule``; :class:`Stop` → ``complete``; an error (an exception, no driver, a config that
    does not fit) → ``mark_error`` then ``release`` after ``requeue_delay`` (or the ``retry``
    backoff), or a ``dead`` settlement once ``max_errors`` is reached. An item claimed more than
    ``max_attempts`` times is settled dead without evaluation. An item claimed with
    ``cancel_requested``, or whose renewal reports it, is settled as cancelled (not an error).
    A write that fails transiently is written again while the lease holds, the lease renewed
    meanwhile (:func:`write_retry_delay`). Refused (stale) writes are logged and change nothing.
    """
    jitter = Jitter() if jitter is None else jitter
    claimed_at = trio.current_time()
    items = await queue.claim_due(
        registry.spec_ids(), settings.worker_id, settings.lease, settings.claim_limit
    )
    if not items:
        return PassStats()

    async with contextlib.AsyncExitStack() as stack:
        try:
            context = await stack.enter_async_context(open_context(build_context))
        except Exception as error:
            await _release_unbuilt(
                queue, items, describe_error(error), settings, jitter, claimed_at
            )
            raise
        return await _evaluate_claimed(
            queue, registry, settings, jitter, context, items, claimed_at=claimed_at
        )
    raise AssertionError("unreachable")  # pragma: no cover


def log_failure(
    log: logging.Logger,
    settings: RunnerSettings,
    item: WorkItem,
    settlement: Settlement,
    failure: Exception | None,
) -> None:
    """Log an item's failure once on *log*: what failed, why, what comes next, and *failure*'s
    traceback when the application's code raised it (the stored error holds it trimmed); an
    error of the library's own making (a config that does not fit) is its message alone."""
    error = first_line(str(settlement.error))
    if failure is not None and not application_frames(failure):
        failure = None
    log.warning(
        "item %r (spec %r) failed on attempt %d: %s; %s",
        item.id,
        item.spec_id,
        item.attempt,
        error,
        next_step(item, settlement, settings),
        exc_info=failure,
        stacklevel=2,
        extra=log_fields(
            settings.worker_id,
            item,
            error=error,
            backoff_s=settlement.delay if settlement.kind is SettleKind.RETRY else None,
        ),
    )


def log_dead(
    log: logging.Logger, worker: str, item: WorkItem, error: str, *, evaluated: bool = False
) -> None:
    """Log that *item* went dead: without evaluation (say, it exceeded ``max_attempts``), or,
    *evaluated*, failed for good by its evaluation (``Discard``, a config that cannot fit)."""
    log.warning(
        "item %r (spec %r) is dead%s: %s; `trio-supervise items retry %s` requeues it",
        item.id,
        item.spec_id,
        "" if evaluated else " without evaluation",
        first_line(error),
        item.id,
        stacklevel=2,
        extra=log_fields(worker, item, error=error),
    )


async def _release_unbuilt(
    queue: WorkQueue,
    items: Sequence[WorkItem],
    text: str,
    settings: RunnerSettings,
    jitter: Jitter,
    claimed_at: float,
) -> None:
    """The context failed to build: every claimed item is handed back with the error recorded
    (:func:`unbuilt_settlement`), in one ``settle_many`` when the queue takes settlements."""
    settlements = [unbuilt_settlement(item, text, settings) for item in items]

    def lease_left() -> float:
        return claimed_at + settings.lease - trio.current_time()

    if writes_batches(queue):
        try:
            await queue.settle_many(settlements)
            return
        except Exception as error:
            reason = describe_error(error)
            logger.warning(
                "the context failed to build, and handing its %d items back failed too: %s; "
                "their leases will expire and another claim runs them",
                len(items),
                reason,
                extra=log_fields(settings.worker_id, error=reason),
            )
            return
    for settlement in settlements:
        await _write(queue, settlement, lease_left=lease_left, settings=settings, jitter=jitter)


async def _evaluate_claimed(
    queue: WorkQueue,
    registry: DriverRegistry[ContextT],
    settings: RunnerSettings,
    jitter: Jitter,
    context: ContextT,
    items: Sequence[WorkItem],
    *,
    claimed_at: float,
) -> PassStats:
    """Evaluate every claimed item concurrently, each beside its lease renewal; write outcomes."""
    failed = 0

    seed_queue: Any = queue

    async def run_one(item: WorkItem) -> None:
        nonlocal failed
        renewed_at = claimed_at

        def lease_left() -> float:
            return renewed_at + settings.lease - trio.current_time()

        unevaluated = settlement_before(item, settings)
        if unevaluated is not None:
            if unevaluated.kind is SettleKind.DEAD:
                failed += 1
                log_dead(logger, settings.worker_id, item, str(unevaluated.error))
            await _write(
                queue, unevaluated, lease_left=lease_left, settings=settings, jitter=jitter
            )
            return
        scope = trio.CancelScope()
        stopped: StopReason | None = None
        detail = ""
        writing = False

        async def renew() -> None:
            # While the outcome is being written the lease is renewed on, so that a write
            # retried after a transient failure still holds it; a failed renewal then is only
            # less lease left (the write's retries watch it), a lost lease ends the renewals.
            # A failed renewal before that is the seed's "lease renewal failed" error, a
            # refused one included (the error's write is fenced: a stale one changes nothing).
            nonlocal stopped, detail, renewed_at
            while True:
                await trio.sleep(settings.renew_interval)
                try:
                    status = await seed_queue.renew(
                        item.id, settings.worker_id, item.lease_version, settings.lease
                    )
                except Exception as error:
                    if writing and not isinstance(error, LeaseLost):
                        continue
                    if not writing:
                        stopped, detail = StopReason.RENEWAL_FAILED, describe_error(error)
                        scope.cancel()
                    return
                renewed_at = trio.current_time()
                if status is LeaseStatus.CANCEL_REQUESTED and not writing:
                    stopped, detail = StopReason.CANCEL_REQUESTED, "cancel requested"
                    scope.cancel()
                    return

        outcome: Settlement | None = None
        error: str | None = None
        failure: Exception | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(renew)
            with scope:
                try:
                    outcome = await evaluate_item(
                        registry.for_spec(item.spec_id),
                        context,
                        item,
                        requeue_delay=settings.requeue_delay,
                    )
                except Exception as exc:
                    error, failure = describe_failure(exc), exc
            writing = True
            settlement = settlement_after(item, outcome, error, stopped, detail, settings, jitter)
            assert settlement is not None  # only a lost lease writes nothing: not here
            if settlement is not outcome and settlement.kind in (SettleKind.RETRY, SettleKind.DEAD):
                failed += 1
                log_failure(logger, settings, item, settlement, None if stopped else failure)
            elif settlement.kind is SettleKind.DEAD:  # Discard, an unfit config or outcome
                failed += 1
                log_dead(logger, settings.worker_id, item, str(settlement.error), evaluated=True)
            await _write(queue, settlement, lease_left=lease_left, settings=settings, jitter=jitter)
            nursery.cancel_scope.cancel()

    try:
        async with trio.open_nursery() as nursery:
            for item in items:
                nursery.start_soon(run_one, item)
    except BaseExceptionGroup as group:
        raise_specific(group)
    return PassStats(claimed=len(items), failed=failed)
