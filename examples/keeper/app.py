"""The connection keeper: an upstream that can break, the keeper worker, and the fault injector."""

from __future__ import annotations

import functools
import logging
import math

import attrs
import trio

from trio_supervise import ChildSpec, RestartPolicy, Service

logger = logging.getLogger("examples.keeper")

KEEPER_POLICY = RestartPolicy(1, 30)
"""Restart after 0.5-1 s, then 1-2 s, 2-4 s, ... up to 15-30 s; ten rapid restarts at most."""


@attrs.define(eq=False)
class Upstream:
    """A connection-like resource: connections work until it breaks, and while it is down no
    new connection is accepted. Time is Trio's, so outages follow virtual time in tests."""

    _down_until: float = -math.inf
    _generation: int = 0
    connects: int = 0
    """Successful connections so far."""

    def break_for(self, seconds: float) -> None:
        """Reset every open connection and refuse new ones for *seconds*."""
        self._generation += 1
        self._down_until = trio.current_time() + seconds

    async def connect(self) -> Connection:
        await trio.lowlevel.checkpoint()
        if trio.current_time() < self._down_until:
            raise ConnectionRefusedError("upstream is down")
        self.connects += 1
        return Connection(self, self._generation)

    def alive(self, connection: Connection) -> bool:
        return connection.generation == self._generation


@attrs.frozen(eq=False)
class Connection:
    """One connection to an :class:`Upstream`."""

    upstream: Upstream
    generation: int

    async def ping(self) -> None:
        await trio.lowlevel.checkpoint()
        if not self.upstream.alive(self):
            raise ConnectionResetError("connection reset by upstream")


async def keep_alive(upstream: Upstream, *, ping_every: float) -> None:
    """Connect, then ping every *ping_every* seconds; raise when the connection fails.

    A worker runs for the life of the process: this one never returns. Recovering is its
    supervisor's job, not a retry loop's here.
    """
    connection = await upstream.connect()
    logger.info("connected (connection %d)", upstream.connects)
    while True:
        await trio.sleep(ping_every)
        await connection.ping()


async def inject_faults(upstream: Upstream, *, every: float, outage: float) -> None:
    """Break *upstream* for *outage* seconds every *every* seconds."""
    while True:
        await trio.sleep(every)
        logger.warning("injecting a fault: upstream down for %g s", outage)
        upstream.break_for(outage)


def build_service(
    *,
    upstream: Upstream | None = None,
    ping_every: float = 7.0,
    fault_every: float | None = 30.0,
    outage: float = 5.0,
) -> Service:
    """The keeper under a restart policy, and (unless *fault_every* is None) the fault
    injector beside it."""
    upstream = Upstream() if upstream is None else upstream
    workers = [
        ChildSpec(
            "keeper",
            functools.partial(keep_alive, upstream, ping_every=ping_every),
            restart=KEEPER_POLICY,
            shutdown_grace=0,  # nothing to finish: cancel it at once on shutdown
        )
    ]
    if fault_every is not None:
        workers.append(
            ChildSpec(
                "faults",
                functools.partial(inject_faults, upstream, every=fault_every, outage=outage),
                shutdown_grace=0,
            )
        )
    return Service(workers=workers, name="keeper")
