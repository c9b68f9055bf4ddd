"""Recent errors across items: the entries of the items' error histories, newest first, each
with the item it belongs to, and the keyset cursor a page of them continues from. Pure: the
stores' ``recent_errors`` read items and hand them here, so every backend orders, filters and
pages them alike."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

import attrs

from ._model import ErrorEntry, WorkItem

__all__ = ["ItemError", "check_errors_page", "item_errors", "newest_errors"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)

ErrorKey = tuple[int, str, int]
"""Where an error sorts: (its time in microseconds, its item's id, its place in the item's
history); newest first is the largest first."""


@attrs.frozen(kw_only=True)
class ItemError:
    """One entry of an item's error history, with the item it belongs to."""

    item_id: str
    spec_id: str
    queue: str
    position: int
    """Its place in the item's history (0: the oldest kept)."""
    entry: ErrorEntry
    """When, by which worker, on which attempt, and the error (with its traceback)."""

    @property
    def key(self) -> ErrorKey:
        return ((self.entry.at - _EPOCH) // _US, self.item_id, self.position)

    @property
    def cursor(self) -> str:
        """The ``before`` of the page that follows this error."""
        at, item_id, position = self.key
        return f"{at}:{position}:{item_id}"


def check_errors_page(limit: object, before: object) -> tuple[int, ErrorKey | None]:
    """``recent_errors``'s arguments, checked alike by every store: the limit, and the cursor
    *before* as a key (``ValueError`` naming the argument and the rule)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise ValueError(f"limit must be an integer from 1 to 1000, got {limit!r}")
    if before is None:
        return limit, None
    parts = before.split(":", 2) if isinstance(before, str) else []
    try:
        at, position, item_id = int(parts[0]), int(parts[1]), parts[2]
    except (IndexError, ValueError):
        raise ValueError(
            f"before must be the cursor of an error recent_errors returned, got {before!r}"
        ) from None
    return limit, (at, item_id, position)


def item_errors(items: Iterable[WorkItem], before: ErrorKey | None) -> list[ItemError]:
    """Every entry of *items*' error histories that sorts before *before* (all with None)."""
    found = []
    for item in items:
        for position, entry in enumerate(item.errors):
            error = ItemError(
                item_id=item.id,
                spec_id=item.spec_id,
                queue=item.queue,
                position=position,
                entry=entry,
            )
            if before is None or error.key < before:
                found.append(error)
    return found


def newest_errors(errors: Iterable[ItemError], limit: int) -> list[ItemError]:
    """The newest *limit* of *errors*."""
    return sorted(errors, key=lambda error: error.key, reverse=True)[:limit]
