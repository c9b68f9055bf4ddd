"""Example 4: user onboarding as a durable workflow (a step, a three-day sleep, an event with a
week's timeout). Run it on the SQLite default with::

    python -m examples.onboarding

enqueue a user with ``trio-supervise items enqueue onboard --config '{"email": "a@example.com"}'``
and approve them with ``trio-supervise items event ID approved '{"by": "ann"}'``.
"""

from .app import (
    SPEC_ID,
    Account,
    Approval,
    Directory,
    Onboard,
    Welcome,
    build_service,
    onboard,
)

__all__ = [
    "SPEC_ID",
    "Account",
    "Approval",
    "Directory",
    "Onboard",
    "Welcome",
    "build_service",
    "onboard",
]
