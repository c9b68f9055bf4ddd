"""Example 1: a subscription digest service.

One workflow item per subscriber. Every day, at the time of day its first digest was due, the
driver writes ("sends") a digest and reschedules the item a day later with its typed config
updated; after the subscription's last day it stops. Run it on the SQLite default with::

    python -m examples.digest

and add a subscriber with ``trio-supervise items enqueue subscription-digest '{...}'`` (see the
README's Quick start). ``/healthz`` is at http://127.0.0.1:8080/healthz.
"""

from .app import (
    SPEC_ID,
    Digest,
    DigestContext,
    DigestDriver,
    FileOutbox,
    MemoryOutbox,
    Outbox,
    Subscription,
    build_service,
)

__all__ = [
    "SPEC_ID",
    "Digest",
    "DigestContext",
    "DigestDriver",
    "FileOutbox",
    "MemoryOutbox",
    "Outbox",
    "Subscription",
    "build_service",
]
