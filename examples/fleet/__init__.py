"""Example 3: a fleet of worker processes sharing one queue (PostgreSQL across machines).

Each worker process is the same small service: a runner for ``checksum`` jobs, and its
``/healthz``. Run one on the SQLite default with ``python -m examples.fleet``; run several on one
machine with ``python -m examples.fleet.launch --processes 4``; fill the queue with
``python -m examples.fleet.enqueue 100``. Point them all at one PostgreSQL database with
``TRIO_SUPERVISE_DATABASE_URL=postgresql://...`` and they share the work, on one machine or many
(``docs/howto/postgres.md``).
"""

from .app import (
    SPEC_ID,
    ChecksumDriver,
    ChecksumJob,
    Results,
    ResultStore,
    build_service,
    checksum,
)

__all__ = [
    "SPEC_ID",
    "ChecksumDriver",
    "ChecksumJob",
    "ResultStore",
    "Results",
    "build_service",
    "checksum",
]
