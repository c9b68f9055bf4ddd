"""The onboarding service: one durable workflow per new user.

Create the account (a step: run once, its result recorded), wait three days (a durable sleep:
nothing held meanwhile), then wait up to a week for an ``approved`` event sent from outside
(``trio-supervise items event ID approved '{"by": "ann"}'``); welcome the user if it comes.
"""

from __future__ import annotations

import datetime as dt

import attrs

from trio_supervise import Service, Settings, Workflow, durable_workflow

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

SPEC_ID = "onboard"


@attrs.frozen
class Onboard:
    """An item's config: who to onboard."""

    email: str


@attrs.frozen
class Account:
    """What creating the user returned (recorded in the journal)."""

    user_id: str
    email: str


@attrs.frozen
class Approval:
    """The ``approved`` event's payload."""

    by: str


@attrs.frozen
class Welcome:
    """The item's result."""

    user_id: str
    approved: bool
    approved_by: str | None = None


@attrs.define
class Directory:
    """The outside world the steps talk to: accounts, and a mailer that deduplicates by
    idempotency key (as a real e-mail or payment API would)."""

    accounts: dict[str, Account] = attrs.Factory(dict)
    welcomed: dict[str, str] = attrs.Factory(dict)
    """Idempotency key -> e-mail address: one welcome per key, however often it is asked."""
    created: int = 0
    """How many times create_user ran."""

    def create_user(self, email: str) -> Account:
        self.created += 1
        # The id follows from the address, not from the order users arrive in: workflows run
        # concurrently, so a counter would number them differently from run to run.
        account = Account(user_id=f"u-{email.partition('@')[0]}", email=email)
        self.accounts[account.user_id] = account
        return account

    def send_welcome(self, account: Account, *, idempotency_key: str) -> None:
        self.welcomed.setdefault(idempotency_key, account.email)


@durable_workflow(SPEC_ID, config_type=Onboard)
async def onboard(wf: Workflow[Directory], config: Onboard) -> Welcome:
    directory = wf.context
    account = await wf.step("create-user", directory.create_user, config.email)
    await wf.sleep(dt.timedelta(days=3))
    decision = await wf.wait_for_event(
        "approved", timeout=dt.timedelta(days=7), payload_type=Approval
    )
    if decision is None:
        return Welcome(account.user_id, approved=False)
    await wf.step(
        "send-welcome",
        directory.send_welcome,
        account,
        idempotency_key=wf.step_key("send-welcome"),
    )
    return Welcome(account.user_id, approved=True, approved_by=decision.by)


def build_service(
    *, directory: Directory | None = None, settings: Settings | None = None
) -> Service:
    """The onboarding service over *directory* (a fresh one by default). *settings* default to
    the environment's (``TRIO_SUPERVISE_*``, SQLite in ``trio_supervise.db``)."""
    context = Directory() if directory is None else directory
    return Service(
        drivers=[onboard], build_context=lambda: context, settings=settings, name="onboarding"
    )
