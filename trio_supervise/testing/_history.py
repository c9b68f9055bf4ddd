"""What a harness run did, as a list of frozen records with their virtual timestamps."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator

import attrs

__all__ = ["Entry", "History"]


@attrs.frozen
class Entry:
    """One thing that happened during a harness run.

    :param at: virtual seconds since the harness opened (``trio.current_time()`` relative to it).
    :param kind: what happened. From the workflow runner: its :class:`~trio_supervise.RunnerEvent`
        kinds (``claimed``, ``renewed``, ``outcome``, ``settled``, ``lease-lost``, ...). From the
        supervisor: ``state`` (a worker entered the state in *detail*) and ``restart``. From the
        harness: ``exited`` (a supervisor or service returned) and ``note`` (see
        :meth:`Harness.note`).
    :param subject: the item id, or the worker's path (``runner``, ``pipeline/store``).
    :param detail: a short text: the outcome (``reschedule``, ``retry: ValueError: bad``), the
        state (``backing-off: ConnectionError: refused``), a lease version (``lease 3``).
    """

    at: float
    kind: str
    subject: str
    detail: str = ""

    def __str__(self) -> str:
        detail = f"  {self.detail}" if self.detail else ""
        return f"{self.at:12.3f}s  {self.kind:<14} {self.subject}{detail}"


@attrs.define(eq=False)
class History:
    """The entries of one harness run, in the order they were recorded.

    Two histories are equal when the same things happened at the same virtual times: that is what
    a deterministic scenario promises. Within one instant, the order of entries recorded by
    different tasks is Trio's scheduler's choice (it shuffles on purpose), so comparison uses
    :meth:`canonical`, which sorts each instant's entries.
    """

    _entries: list[Entry] = attrs.field(factory=list, alias="entries")

    def record(self, entry: Entry) -> None:
        """Append *entry*."""
        self._entries.append(entry)

    @property
    def entries(self) -> tuple[Entry, ...]:
        """Every entry, in recording order."""
        return tuple(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(tuple(self._entries))

    def for_item(self, item_id: str) -> list[Entry]:
        """The entries about one work item: its claims, renewals, outcomes and settlements."""
        return [entry for entry in self._entries if entry.subject == item_id]

    def for_worker(self, path: str) -> list[Entry]:
        """The entries about one supervised worker (its path), or the runner's own entries."""
        return [entry for entry in self._entries if entry.subject == path]

    def select(
        self, kind: str | None = None, subject: str | None = None, detail: str | None = None
    ) -> list[Entry]:
        """The entries matching every criterion given (``detail`` matches as a prefix)."""
        return [
            entry
            for entry in self._entries
            if (kind is None or entry.kind == kind)
            and (subject is None or entry.subject == subject)
            and (detail is None or entry.detail.startswith(detail))
        ]

    def times(
        self, kind: str | None = None, subject: str | None = None, detail: str | None = None
    ) -> list[float]:
        """When the matching entries happened: ``history.times("state", "keeper", "running")``."""
        return [entry.at for entry in self.select(kind, subject, detail)]

    def canonical(self) -> tuple[Entry, ...]:
        """The entries sorted by time, and within one instant by kind, subject and detail."""
        return tuple(sorted(self._entries, key=lambda e: (e.at, e.kind, e.subject, e.detail)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, History):
            return NotImplemented
        return self.canonical() == other.canonical()

    __hash__ = None  # type: ignore[assignment]

    def diff(self, other: History) -> str:
        """A unified diff of the two canonical histories (empty when they are equal)."""
        return "\n".join(
            difflib.unified_diff(
                [repr(entry) for entry in self.canonical()],
                [repr(entry) for entry in other.canonical()],
                "this run",
                "other run",
                lineterm="",
            )
        )

    def format(self) -> str:
        """One line per entry, in recording order: for printing and failure messages."""
        return "\n".join(_lines(self._entries))


def _lines(entries: Iterable[Entry]) -> list[str]:
    return [str(entry) for entry in entries]
