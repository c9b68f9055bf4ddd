"""Drivers and the registry: which driver evaluates which spec id, and how one is called.

A driver evaluates the items of the spec ids it owns and returns an outcome
(:class:`~trio_supervise.Continue`, :class:`~trio_supervise.Reschedule`,
:class:`~trio_supervise.Stop`); :func:`evaluate_item` calls it (its typed config structured, its
timeout applied) and turns the outcome into the settlement to write. See ``docs/workflows.md``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import inspect
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Generic, Protocol, TypeAlias, TypeVar, overload

import attrs
import trio

from .._clock import SystemClock
from .._convert import structure_config
from .._errors import ConfigError, DriverError
from ..job import (
    DEFAULT_CONCURRENCY_LIMIT,
    DEFAULT_QUEUE,
    Discard,
    EvaluationTimedOut,
    Outcome,
    Settlement,
    WorkItem,
    check_concurrency,
    check_priority,
    check_queue_name,
    check_timeout,
    dead_settlement,
    describe_error,
    outcome_settlement,
    validate_spec_id,
)
from ..queues._ports import ProducerStore, WorkerStore

__all__ = [
    "AnyWorkflowDriver",
    "ContextFactory",
    "ContextT",
    "DriverRegistry",
    "TypedWorkflowDriver",
    "WorkflowDriver",
    "driver_config_type",
    "evaluate_item",
    "open_context",
    "prepare_item",
    "raise_specific",
    "takes_config",
]

ContextT = TypeVar("ContextT")

ContextT_contra = TypeVar("ContextT_contra", contravariant=True)

ConfigT = TypeVar("ConfigT")


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


def _start_by(work_queue: ProducerStore, due_at: object, within: float) -> object:
    """A driver's default start deadline: *within* seconds after *due_at*, else after now by
    the store's clock (the system's for a store that has none). A bad *due_at* is left for
    the store to refuse, naming it."""
    if due_at is None:
        clock = work_queue.clock if isinstance(work_queue, WorkerStore) else SystemClock()
        due_at = clock.now()
    if not isinstance(due_at, dt.datetime):
        return None
    return due_at + dt.timedelta(seconds=within)


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
            check_timeout(getattr(driver, "start_within", None), what="start_within")
            _driver_concurrency(driver)
        except ValueError as error:
            raise DriverError(f"driver '{name}': {error}") from None
        for spec_id in seen:
            self._by_spec[spec_id] = driver
        self._drivers.append(driver)
        return self

    async def enqueue(
        self,
        work_queue: ProducerStore,
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
        without a ``concurrency_limit``, an explicit key too. Its ``start_within`` (seconds)
        sets the ``start_by`` of an item enqueued without one: that long after its due time
        (now, by the store's clock, without one). Every other keyword goes to the store's
        ``enqueue`` as is.
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
            within = getattr(driver, "start_within", None)
            if within is not None and fields.get("start_by") is None:
                fields["start_by"] = _start_by(work_queue, fields.get("due_at"), within)
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


def prepare_item(driver: object, item: WorkItem) -> WorkItem:
    """The item as the driver sees it: ``config`` structured into its ``config_type`` if any."""
    config_type = driver_config_type(driver)
    if config_type is None:
        return item
    config = structure_config(
        item.config, config_type, what=f"invalid config for spec '{item.spec_id}'"
    )
    return attrs.evolve(item, config=config)


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
