"""An item described for people, field by field: what ``items show`` prints and the console's
item page shows, written once.

Values are plain text (a stored traceback keeps its newlines); the command line escapes terminal
controls in them and the console escapes HTML.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence

from .queues import EntryKind, Journal, JournalEntry, WorkItem

__all__ = ["children_text", "due_text", "item_fields", "journal_fields", "stamp"]

SHORT_RESULT = 80
"""How many characters of a recorded step result ``items show`` and the item page show."""


def stamp(value: dt.datetime | None) -> str:
    """*value* as ``YYYY-MM-DD HH:MM:SS`` in UTC (no zone written); ``""`` for None."""
    return "" if value is None else value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def due_text(item: WorkItem) -> str:
    """When *item* is due, for people: "waiting for N children" while it waits for them (its
    stored ``due_at`` is then the never-due sentinel), else the time."""
    if item.waiting:
        n = item.waiting_children
        return f"waiting for {n} {'child' if n == 1 else 'children'}"
    return f"{stamp(item.due_at)} UTC"


def _unique_text(item: WorkItem) -> str:
    """How long the item's key holds (``forever``, ``unfinished``, ``until ... UTC``), and
    whether it was released to a newer item."""
    if item.released_key is not None:
        return f"released key {item.released_key} (a newer item holds it)"
    if item.idempotency_key is None:
        return ""
    if item.unique_scope == "period":
        return f"until {stamp(item.unique_until)} UTC"
    return item.unique_scope


def children_text(children: Sequence[WorkItem], complete: bool) -> str:
    """A parent's children in one line: how many, and how many per state."""
    states: dict[str, int] = {}
    for child in children:
        states[str(child.state)] = states.get(str(child.state), 0) + 1
    per_state = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    return f"{len(children)}{'' if complete else '+'} ({per_state})"


def item_fields(item: WorkItem) -> list[tuple[str, str]]:
    """Every field of *item* worth showing, in reading order, as ``(name, text)``; the result,
    the parent and the trace context only when it has them. The error history and children
    are not included."""
    fields = [
        ("id", item.id),
        ("spec", item.spec_id),
        ("state", str(item.state) + (" (cancel requested)" if item.cancel_requested else "")),
        ("due", due_text(item)),
        ("start by", "-" if item.start_by is None else f"{stamp(item.start_by)} UTC"),
        ("tenant", item.tenant_id),
        ("subject", item.subject_id),
        ("queue", item.queue),
        ("priority", str(item.priority)),
        ("tags", ", ".join(item.tags)),
        (
            "concurrency",
            f"{item.concurrency_key} (limit {item.concurrency_limit})"
            if item.concurrency_key is not None
            else "",
        ),
        ("errors", str(item.error_count)),
        ("last error", item.last_error or ""),
        (
            "lease",
            f"{item.lease_owner} v{item.lease_version} until {stamp(item.lease_expires_at)}"
            if item.lease_owner
            else f"none (v{item.lease_version})",
        ),
        ("idempotency", item.idempotency_key or ""),
        ("unique", _unique_text(item)),
        ("created", f"{stamp(item.created_at)} UTC"),
        ("updated", f"{stamp(item.updated_at)} UTC"),
        ("config", json.dumps(item.config, sort_keys=True)),
    ]
    if item.result is not None:
        fields.append(("result", json.dumps(item.result, sort_keys=True)))
    if item.parent_id is not None:
        fields.append(("parent", item.parent_id))
    if item.traceparent is not None:
        fields.append(("trace", item.traceparent))
    return fields


def _short(value: object) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= SHORT_RESULT else text[: SHORT_RESULT - 3] + "..."


def entry_text(entry: JournalEntry) -> str:
    """One journal entry for people: when it started, how long it took, and what it recorded
    (a step's attempts and result, a sleep's wake time, a wait's outcome or deadline)."""
    started = f"{stamp(entry.started_at)} UTC"
    if entry.kind is EntryKind.SLEEP:
        return f"{started}, until {stamp(entry.wake_at)} UTC"
    if entry.kind is EntryKind.PATCH:
        return f"{started}, version marker"
    if entry.pending:
        deadline = f"{stamp(entry.wake_at)} UTC" if entry.wake_at is not None else "no timeout"
        return f"{started}, waiting (deadline: {deadline})"
    assert entry.finished_at is not None
    took = f"{(entry.finished_at - entry.started_at).total_seconds():.3f} s"
    if entry.kind is EntryKind.WAIT:
        got = entry.result
        outcome = (
            f"event {_short(got['event'])}"
            if isinstance(got, dict) and "event" in got
            else "timed out"
        )
        return f"{started}, {took}: {outcome}"
    tries = "attempt" if entry.attempts == 1 else "attempts"
    return f"{started}, {took}, {entry.attempts} {tries}: {_short(entry.result)}"


def journal_fields(journal: Journal) -> list[tuple[str, str]]:
    """A durable workflow's journal as ``(name, text)`` lines, one per entry in order (``step
    0 create-user``), then one per event sent to the item."""
    fields = [
        (f"{entry.kind} {entry.position}", f"{entry.name}: {entry_text(entry)}")
        for entry in journal.entries
    ]
    fields.extend(
        (f"event {n}", f"{event.name} at {stamp(event.sent_at)} UTC: {_short(event.payload)}")
        for n, event in enumerate(journal.events, start=1)
    )
    return fields
