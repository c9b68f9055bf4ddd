"""PostgreSQL's connections in lanes, so that no caller takes what a lease renewal needs.

Three pools (``psycopg_pool``), each behind a Trio ``CapacityLimiter`` of its size, so that no
thread ever waits inside a pool: the *worker* lane (claims, renewals, settlements, the look at
what is due), which nothing else may take; the *callers'* lane (enqueues, an operator's actions,
upkeep); and the *read* lane (status reads). A caller's call waits at most ``connect_timeout``
in all: for a connection of its lane, then for any lock its statements need (its session's
``lock_timeout``); past that it gets :class:`QueueUnavailable` saying which.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import trio

from ..._errors import QueueUnavailable
from .._sql import redact_dsn
from ._base import Lane
from ._postgres_db import Row, configure, connect_kwargs, mapped_errors

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_POOL_SIZE",
    "DEFAULT_READ_POOL_SIZE",
    "DEFAULT_WORKER_POOL_SIZE",
    "Lanes",
    "check_pool_options",
]

T = TypeVar("T")

DEFAULT_POOL_SIZE = 10
"""Connections for the callers' writes: enqueues, an operator's actions, upkeep."""
DEFAULT_WORKER_POOL_SIZE = 4
"""Connections for the worker port alone: a runner's claim loop (one per queue it serves),
its settlements and its renewals each hold one at a time."""
DEFAULT_READ_POOL_SIZE = 2
"""Connections for status reads."""
DEFAULT_CONNECT_TIMEOUT = 10.0
"""Seconds a caller waits for a connection, and for locks, in all."""

_RECONNECT_WAIT = 2.0
"""Seconds a call whose connection died waits for a fresh one before reporting the outage."""
_LOCK_SLACK = 0.05
"""A caller that waited longer than this for its connection has its statements' lock waits
bounded by what is left of its time (one statement more); a shorter wait leaves the session's
``lock_timeout`` (all of ``connect_timeout``) as it is."""


def _size(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")


def check_pool_options(
    *, pool_size: int, worker_pool_size: int, read_pool_size: int, connect_timeout: float
) -> None:
    """Refuse pool sizes that are not positive ints, and a timeout that is not a positive
    number of seconds, naming the argument."""
    _size("pool_size", pool_size)
    _size("worker_pool_size", worker_pool_size)
    _size("read_pool_size", read_pool_size)
    if not connect_timeout > 0 or connect_timeout == math.inf:
        raise ValueError(f"connect_timeout must be a positive number, got {connect_timeout!r}")


def _milliseconds(seconds: float) -> str:
    """*seconds* as a ``lock_timeout`` (at least 1 ms: 0 would mean "wait for ever")."""
    return f"{max(1, math.ceil(seconds * 1000))}ms"


@attrs.frozen
class _Lane:
    """One lane: its pool, the limiter of the pool's size, and whether it is a caller's (its
    waits bounded)."""

    name: str
    pool: ConnectionPool[Any]
    limiter: trio.CapacityLimiter
    bounded: bool


@attrs.define(eq=False, kw_only=True)
class Lanes:
    """The queue's three pools, and how a blocking call reaches a connection of one."""

    dsn: str
    timeout: float
    """``connect_timeout``: the most a caller waits, for a connection and for locks."""
    worker: _Lane
    caller: _Lane
    read: _Lane
    _held: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(math.inf))
    """The threads of calls that hold their lane's limiter already: never waited for."""

    @classmethod
    def open(
        cls,
        dsn: str,
        *,
        schema: str | None,
        pool_size: int,
        worker_pool_size: int,
        read_pool_size: int,
        connect_timeout: float,
    ) -> Lanes:
        """Open the pools (blocking: call it in a thread). The worker's opens its first
        connection when a worker first needs it: a process that only enqueues has none."""
        from psycopg.rows import dict_row
        from psycopg_pool import ConnectionPool

        kwargs = {"row_factory": dict_row, **connect_kwargs(schema, connect_timeout)}
        # A caller's statement waits for a lock no longer than its call may take.
        bounded = functools.partial(configure, lock_timeout=_milliseconds(connect_timeout))
        # The worker's statements, the same few run again and again, on their generic plans.
        worker = functools.partial(configure, generic_plans=True)

        def lane(name: str, size: int, *, caller: bool, min_size: int = 1) -> _Lane:
            pool = ConnectionPool(
                dsn,
                kwargs=kwargs,
                configure=bounded if caller else worker,
                min_size=min_size,
                max_size=size,
                open=False,
                name=f"trio_supervise-{name}",
                timeout=connect_timeout,
            )
            return _Lane(name, pool, trio.CapacityLimiter(size), caller)

        lanes = cls(
            dsn=dsn,
            timeout=connect_timeout,
            worker=lane("worker", worker_pool_size, caller=False, min_size=0),
            caller=lane("caller", pool_size, caller=True),
            read=lane("read", read_pool_size, caller=True),
        )
        with contextlib.ExitStack() as on_failure:
            for each in lanes.all():
                on_failure.callback(each.pool.close)
                each.pool.open(wait=True, timeout=connect_timeout)
            on_failure.pop_all()
        return lanes

    def all(self) -> tuple[_Lane, ...]:
        return self.worker, self.caller, self.read

    def of(self, lane: Lane) -> _Lane:
        """Where calls of *lane* run (the worker's look at what is due: the worker's)."""
        if lane is Lane.CALLER:
            return self.caller
        if lane is Lane.READ:
            return self.read
        return self.worker

    async def run(self, fn: Callable[[psycopg.Connection[Row]], T], lane: Lane, retry: bool) -> T:
        """Run *fn* on a connection of *lane* in a thread.

        When the connection turns out to be dead (the server restarted, or an administrator
        terminated it while it sat in the pool), the pool's other idle connections are likely
        dead too: they are checked and replaced, and *fn* runs once more on a fresh connection,
        waited for at most ``_RECONNECT_WAIT`` seconds (a server that is down is reported as
        :class:`QueueUnavailable` soon, so the runner backs off and its health shows why).
        Only for calls that may safely run twice (*retry*): reads, and writes that are fenced or
        idempotent. A connection that dies mid-call leaves its transaction rolled back, unless
        the commit itself was lost in flight, which is why ``enqueue`` and ``mark_error`` pass
        ``retry=False``.
        """
        chosen = self.of(lane)
        if not chosen.bounded:
            call = functools.partial(self._call, chosen.pool, fn, retry, None, None)
            with mapped_errors(self.dsn):
                return await trio.to_thread.run_sync(call, limiter=chosen.limiter)
        start = trio.current_time()
        with trio.move_on_after(self.timeout) as waiting:
            await chosen.limiter.acquire()
        if waiting.cancelled_caught:
            raise QueueUnavailable(
                f"the PostgreSQL queue's {chosen.name} pool is busy: no connection came free "
                f"within {self.timeout:g} s (connect_timeout; all "
                f"{chosen.limiter.total_tokens:g} in use), at {redact_dsn(self.dsn)}"
            )
        try:
            left = self.timeout - (trio.current_time() - start)
            locks = left if left < self.timeout - _LOCK_SLACK else None
            call = functools.partial(self._call, chosen.pool, fn, retry, max(left, 0.001), locks)
            with mapped_errors(self.dsn):
                return await trio.to_thread.run_sync(call, limiter=self._held)
        finally:
            chosen.limiter.release()

    def _call(
        self,
        pool: ConnectionPool[Any],
        fn: Callable[[psycopg.Connection[Row]], T],
        retry: bool,
        wait: float | None,
        locks: float | None,
    ) -> T:
        """*fn* on a connection of *pool*, waited for at most *wait* seconds (None: the pool's
        timeout), its statements' lock waits bounded by *locks* seconds (None: the session's
        own); once more on a fresh connection if the first was dead (see :meth:`run`)."""
        import psycopg

        with pool.connection(timeout=wait) as conn:
            try:
                return self._bounded(conn, fn, locks)
            except psycopg.OperationalError:
                if not (retry and conn.broken):
                    raise
        pool.check()
        with pool.connection(timeout=_RECONNECT_WAIT) as conn:
            return self._bounded(conn, fn, locks)

    def _bounded(
        self,
        conn: psycopg.Connection[Row],
        fn: Callable[[psycopg.Connection[Row]], T],
        locks: float | None,
    ) -> T:
        """*fn* on *conn*, its lock waits bounded by *locks* seconds for this call (None: by
        the session's ``lock_timeout``, left alone)."""
        if locks is None:
            return fn(conn)
        import psycopg

        conn.execute(_SET_LOCK_TIMEOUT, [_milliseconds(locks)])
        try:
            return fn(conn)
        finally:
            try:
                conn.execute(_SET_LOCK_TIMEOUT, [_milliseconds(self.timeout)])
            except psycopg.Error:
                conn.close()  # never back in the pool with a shorter lock_timeout

    def close(self) -> None:
        """Close every pool (blocking: call it in a thread)."""
        for each in self.all():
            each.pool.close()


_SET_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %s, false)"
