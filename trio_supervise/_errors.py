"""One exception family for everything trio_supervise raises on purpose."""

from __future__ import annotations

__all__ = [
    "ChildStateError",
    "ConfigError",
    "DriverError",
    "DuplicateItem",
    "ItemNotFound",
    "ItemStateError",
    "LeaseLost",
    "QueueError",
    "QueueFailed",
    "QueueUnavailable",
    "ReplayMismatch",
    "SchemaError",
    "SettingsError",
    "StartFailed",
    "StepFailed",
    "SuperviseError",
    "WorkerFailed",
]


class SuperviseError(Exception):
    """Base class of every error trio_supervise raises on purpose."""


class LeaseLost(SuperviseError):
    """A write named a lease that is no longer current: its version or owner is stale.

    The queue changed nothing. Another worker may own the item now.
    """

    def __init__(self, item_id: str, lease_version: int, detail: str = "") -> None:
        self.item_id = item_id
        self.lease_version = lease_version
        self.detail = detail
        message = f"lease lost on item {item_id!r} (version {lease_version})"
        if detail:
            message = f"{message}: {detail}"
        super().__init__(message)

    def __reduce__(self) -> tuple[type[LeaseLost], tuple[str, int, str]]:
        return (type(self), (self.item_id, self.lease_version, self.detail))


class ItemNotFound(SuperviseError, LookupError):
    """No item has that id."""

    def __init__(self, item_id: str, by: str = "id") -> None:
        self.item_id = item_id
        self.by = by
        """What was looked for: ``"id"``, or ``"idempotency key"`` (then *item_id* is the key)."""
        super().__init__(f"no item with {by} {item_id!r}")

    def __reduce__(self) -> tuple[type[ItemNotFound], tuple[str, str]]:
        return (type(self), (self.item_id, self.by))


class DuplicateItem(SuperviseError):
    """An item with that id already exists (and no idempotency key made the enqueue a no-op)."""

    def __init__(self, item_id: str) -> None:
        self.item_id = item_id
        super().__init__(f"an item with id {item_id!r} already exists")

    def __reduce__(self) -> tuple[type[DuplicateItem], tuple[str]]:
        return (type(self), (self.item_id,))


class ItemStateError(SuperviseError):
    """The item is in a state that does not allow the operation (retrying a running item)."""


class ConfigError(SuperviseError, ValueError):
    """An item's config does not fit the shape its driver declares."""


class DriverError(SuperviseError, ValueError):
    """A driver registry refused a driver: a spec id claimed twice, or specs failing validation."""


class QueueError(SuperviseError):
    """The queue backend failed; the driver's own exception is chained as the cause."""


class QueueUnavailable(QueueError):
    """The queue backend failed in a way that may pass: retry later.

    Connection refused or lost, server down, SQLite busy or locked, disk full.
    """


class QueueFailed(QueueError):
    """The queue backend failed in a way no retry fixes: fail fast, loudly.

    Read-only database, permission denied, authentication failed, schema missing, database file
    gone (deleted or replaced under a running worker, or never created).
    """


class SchemaError(QueueFailed):
    """The database schema is missing, or newer than this version knows."""


class SettingsError(SuperviseError, ValueError):
    """Settings failed validation; the message names the field path and the rule."""


class WorkerFailed(SuperviseError):
    """A supervised worker failed terminally (no restarts left, or none allowed)."""


class StartFailed(WorkerFailed):
    """A child ended before it was ready: a supervisor's start, ``start_child`` or
    ``restart_child`` failed. The message names the child and its cause (chained as
    ``__cause__`` when it raised)."""

    def __init__(self, worker: str, reason: str) -> None:
        self.worker = worker
        self.reason = reason
        super().__init__(f"worker {worker!r} failed to start: {reason}")

    def __reduce__(self) -> tuple[type[StartFailed], tuple[str, str]]:
        return (type(self), (self.worker, self.reason))


class ChildStateError(SuperviseError, RuntimeError):
    """A child management call does not fit the child's state (restarting a running child,
    deleting one that is not terminated)."""


class StepFailed(SuperviseError):
    """A durable workflow's step raised on every attempt its retry policy allows: an item error
    naming the step (the item is retried, or goes dead, as any item error)."""

    def __init__(self, workflow: str, step: str, attempts: int, error: str) -> None:
        self.workflow = workflow
        self.step = step
        self.attempts = attempts
        self.error = error
        tries = "attempt" if attempts == 1 else "attempts"
        super().__init__(
            f"workflow {workflow!r}: step {step!r} failed after {attempts} {tries}: {error}"
        )

    def __reduce__(self) -> tuple[type[StepFailed], tuple[str, str, int, str]]:
        return (type(self), (self.workflow, self.step, self.attempts, self.error))


class ReplayMismatch(SuperviseError):
    """A durable workflow asked for something other than what its journal recorded at that
    position: its code changed under an item in flight without a version marker (the item goes
    ``dead``: running on could repeat or skip work)."""
