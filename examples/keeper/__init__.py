"""Example 2: a supervised connection keeper.

A worker keeps a connection to an upstream alive, pinging it on a period. A fault injector breaks
the upstream now and then: the keeper's ping fails, it raises, and its supervisor restarts it
after a jittered backoff (``backing-off`` in ``/healthz``) until the upstream is back. Run it on
the SQLite default with::

    python -m examples.keeper

and watch http://127.0.0.1:8080/healthz. ``KEEPER_PING_EVERY``, ``KEEPER_FAULT_EVERY`` and
``KEEPER_OUTAGE`` (seconds) set how often the keeper pings, how often the upstream breaks and for
how long.
"""

from .app import KEEPER_POLICY, Connection, Upstream, build_service, inject_faults, keep_alive

__all__ = [
    "KEEPER_POLICY",
    "Connection",
    "Upstream",
    "build_service",
    "inject_faults",
    "keep_alive",
]
