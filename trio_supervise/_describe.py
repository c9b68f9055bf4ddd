"""An item described for people, field by field: what ``items show`` prints and the console's
item page shows, written once.

Values are plain text (a stored traceback keeps its newlines); the command line escapes terminal
controls in them and the console escapes HTML.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence

from .queues import WorkItem

__all__ = ["children_text", "due_text", "item_fields", "stamp"]


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
