"""The memory queue's log of writes: :class:`QueueEvent`, and :class:`_EventLog`, the list that
keeps events as plain values so that logging a write allocates nothing the garbage collector counts.

The queue's parts append an event's values straight to the log (``MemoryState._record``); tests
read events back from ``MemoryQueue.events``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Self, SupportsIndex, overload

import attrs

__all__ = ["QueueEvent"]


class _NoDetail(Mapping[str, Any]):
    """The type of ``_NO_DETAIL``: an empty mapping that cannot be changed, copied and pickled
    as the one shared instance (a ``MappingProxyType`` can be neither, so a log holding a
    renewal could not be)."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "{}"

    def __reduce__(self) -> str:
        return "_NO_DETAIL"


_NO_DETAIL: Mapping[str, Any] = _NoDetail()
"""The detail of an event that has none (shared: it cannot be changed)."""


@attrs.frozen
class QueueEvent:
    """One write the memory queue accepted or refused, for tests to inspect."""

    at: dt.datetime
    op: str
    item_id: str
    lease_version: int | None = None
    detail: Mapping[str, Any] = attrs.field(factory=dict)
    applied: bool = True


_RawEvent = tuple[Any, ...]
"""A logged event as :class:`_EventLog` keeps it: ``_WIDTH`` values, ``(at, op, item_id,
lease_version, applied, key1, value1, key2, value2)``. The detail is spelled out in the last
four: up to two pairs with string keys in place (``_NO_PAIR`` fills a missing one), else
``key1`` is a marker: ``_SHARED`` (the detail is the shared empty one, ``_NO_DETAIL``) or
``_PAIRS`` (``value1`` is a tuple of every key and value in turn)."""

_WIDTH = 9


class _Marker:
    """A private value in a logged event's detail slots (see ``_RawEvent``)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"

    def __reduce__(self) -> str:
        return self.name  # a module global: pickled by reference, the same object back


_SHARED = _Marker("_SHARED")
_PAIRS = _Marker("_PAIRS")
_NO_PAIR = _Marker("_NO_PAIR")

_EMPTY_DETAIL = (_NO_PAIR, None, _NO_PAIR, None)
"""The detail slots of an event with an empty detail of its own."""
_SHARED_DETAIL = (_SHARED, None, None, None)
"""The detail slots of an event whose detail is ``_NO_DETAIL``."""


def _event(
    at: Any,
    op: Any,
    item_id: Any,
    version: Any,
    applied: Any,
    key1: Any,
    value1: Any,
    key2: Any,
    value2: Any,
) -> QueueEvent:
    """The event whose ``_WIDTH`` logged values these are."""
    detail: Mapping[str, Any]
    if key1 is _SHARED:
        detail = _NO_DETAIL
    elif key1 is _NO_PAIR:
        detail = {}
    elif key1 is _PAIRS:
        pairs = iter(value1)
        detail = dict(zip(pairs, pairs, strict=True))
    elif key2 is _NO_PAIR:
        detail = {key1: value1}
    else:
        detail = {key1: value1, key2: value2}
    return QueueEvent(at, op, item_id, version, detail, applied)


def _detail_slots(detail: Mapping[Any, Any]) -> tuple[Any, ...]:
    """The four detail slots of ``_RawEvent`` for *detail*."""
    if detail is _NO_DETAIL:
        return _SHARED_DETAIL
    if not detail:
        return _EMPTY_DETAIL
    if len(detail) <= 2 and all(type(key) is str for key in detail):
        pairs = tuple(itertools.chain.from_iterable(detail.items()))
        return pairs if len(pairs) == 4 else (*pairs, _NO_PAIR, None)
    return (_PAIRS, tuple(itertools.chain.from_iterable(detail.items())), None, None)


def _raw(event: QueueEvent) -> _RawEvent:
    if not isinstance(event, QueueEvent):
        raise TypeError(f"MemoryQueue.events holds QueueEvent, not {event!r}")
    return (
        event.at,
        event.op,
        event.item_id,
        event.lease_version,
        event.applied,
        *_detail_slots(event.detail),
    )


def _raws(events: Iterable[QueueEvent]) -> list[Any]:
    """The logged values of *events*, one after the other."""
    return [value for event in list(events) for value in _raw(event)]


_list: Any = list
"""``list``, untyped: :class:`_EventLog` stores what its type says it does not."""


class _EventLog(list[QueueEvent]):
    """``MemoryQueue.events``: a list of :class:`QueueEvent` to whoever reads it, stored as
    ``_WIDTH`` plain values an event, one after the other in the list itself (see
    ``_RawEvent``).

    The queue logs every claim, settlement and renewal, and a long run under time travel logs
    millions. Kept as one object an event (a ``QueueEvent``, later a tuple), each was an
    allocation the garbage collector counts and never sees freed: young collections every few
    hundred writes, and the full ones that followed walked the whole log (issue 17's P4: a
    simulated year of 1,000 daily workflows spent 8% of its time collecting, the same steps
    without a log 0.3%). Values in a list are no allocation of the log's own: the queue appends
    an event's values with the list's own ``extend`` (``MemoryQueue._record``), and the
    datetimes, strings and numbers in it are objects the collector does not track. Every read
    builds the events (equal to the ones written, not the same objects); appending or inserting
    a :class:`QueueEvent` stores its fields. Whatever bypasses a list subclass's methods
    (``list.__len__(log)``, C code reading the list's slots) sees the values, not the events.
    """

    __slots__ = ()

    def _offset(self, index: SupportsIndex, what: str = "list index out of range") -> int:
        """Where event *index* starts among the values; IndexError (saying *what*) if none."""
        count = len(self)
        position = operator.index(index)
        if position < 0:
            position += count
        if not 0 <= position < count:
            raise IndexError(what)
        return position * _WIDTH

    def _read(self, offset: int) -> QueueEvent:
        return _event(*_list.__getitem__(self, slice(offset, offset + _WIDTH)))

    def __len__(self) -> int:
        values: int = _list.__len__(self)
        return values // _WIDTH

    def append(self, event: QueueEvent) -> None:
        _list.extend(self, _raw(event))

    def extend(self, events: Iterable[QueueEvent]) -> None:
        _list.extend(self, _raws(events))

    def insert(self, index: SupportsIndex, event: QueueEvent) -> None:
        count = len(self)
        position = operator.index(index)
        if position < 0:
            position = max(0, position + count)
        offset = min(position, count) * _WIDTH
        _list.__setitem__(self, slice(offset, offset), _raw(event))

    def __iadd__(self, events: Iterable[QueueEvent]) -> Self:  # type: ignore[override]
        self.extend(events)
        return self

    @overload
    def __setitem__(self, index: SupportsIndex, event: QueueEvent) -> None: ...
    @overload
    def __setitem__(self, index: slice, event: Iterable[QueueEvent]) -> None: ...
    def __setitem__(self, index: Any, event: Any) -> None:
        if not isinstance(index, slice):
            raw = _raw(event)
            offset = self._offset(index, "list assignment index out of range")
            _list.__setitem__(self, slice(offset, offset + _WIDTH), raw)
            return
        start, stop, step = index.indices(len(self))
        if step == 1:
            values = _raws(event)
            _list.__setitem__(self, slice(start * _WIDTH, max(start, stop) * _WIDTH), values)
            return
        events = list(event)
        targets = range(start, stop, step)
        if len(events) != len(targets):
            raise ValueError(
                f"attempt to assign sequence of size {len(events)} to extended slice of size "
                f"{len(targets)}"
            )
        raws = [_raw(each) for each in events]
        for position, raw in zip(targets, raws, strict=True):
            offset = position * _WIDTH
            _list.__setitem__(self, slice(offset, offset + _WIDTH), raw)

    def __delitem__(self, index: SupportsIndex | slice) -> None:
        if not isinstance(index, slice):
            offset = self._offset(index, "list assignment index out of range")
            _list.__delitem__(self, slice(offset, offset + _WIDTH))
            return
        start, stop, step = index.indices(len(self))
        if step == 1:
            _list.__delitem__(self, slice(start * _WIDTH, max(start, stop) * _WIDTH))
            return
        for position in sorted(range(start, stop, step), reverse=True):
            offset = position * _WIDTH
            _list.__delitem__(self, slice(offset, offset + _WIDTH))

    @overload
    def __getitem__(self, index: SupportsIndex) -> QueueEvent: ...
    @overload
    def __getitem__(self, index: slice) -> list[QueueEvent]: ...
    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            read = self._read
            return [read(position * _WIDTH) for position in range(*index.indices(len(self)))]
        return self._read(self._offset(index))

    def __iter__(self) -> Iterator[QueueEvent]:
        # The same iterator once per value: map takes an event's values in turn.
        values = _list.__iter__(self)
        return map(_event, *(values,) * _WIDTH)

    def __reversed__(self) -> Iterator[QueueEvent]:
        return map(self._read, range(_list.__len__(self) - _WIDTH, -1, -_WIDTH))

    def pop(self, index: SupportsIndex = -1) -> QueueEvent:
        if not self:
            raise IndexError("pop from empty list")
        offset = self._offset(index, "pop index out of range")
        event = self._read(offset)
        _list.__delitem__(self, slice(offset, offset + _WIDTH))
        return event

    def copy(self) -> list[QueueEvent]:
        return list(self)

    def __contains__(self, event: object) -> bool:
        return any(each == event for each in self)

    def index(self, event: QueueEvent, *args: SupportsIndex) -> int:
        return list(self).index(event, *args)

    def count(self, event: QueueEvent) -> int:
        return sum(1 for each in self if each == event)

    def remove(self, event: QueueEvent) -> None:
        del self[self.index(event)]

    def reverse(self) -> None:
        self[:] = list(reversed(self))

    def sort(self, *args: Any, **kwargs: Any) -> None:
        events = list(self)
        events.sort(*args, **kwargs)
        self[:] = events

    def __eq__(self, other: object) -> bool:
        return list(self) == other

    def __ne__(self, other: object) -> bool:
        return list(self) != other

    def __lt__(self, other: list[QueueEvent]) -> bool:
        return list(self) < other

    def __le__(self, other: list[QueueEvent]) -> bool:
        return list(self) <= other

    def __gt__(self, other: list[QueueEvent]) -> bool:
        return list(self) > other

    def __ge__(self, other: list[QueueEvent]) -> bool:
        return list(self) >= other

    __hash__ = None

    def __add__(self, other: list[QueueEvent]) -> list[QueueEvent]:  # type: ignore[override]
        return list(self) + other

    def __radd__(self, other: list[QueueEvent]) -> list[QueueEvent]:
        return other + list(self)

    def __mul__(self, times: SupportsIndex) -> list[QueueEvent]:
        return list(self) * times

    __rmul__ = __mul__

    def __imul__(self, times: SupportsIndex) -> Self:
        # Whole events repeated: the values of each stay together.
        _list.__imul__(self, times)
        return self

    def __repr__(self) -> str:
        return repr(list(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_EventLog, (), None, iter(self))


def raw_appender(log: _EventLog) -> Callable[[_RawEvent], None]:
    """*log*'s own ``list.extend``, bound: it appends one event's ``_WIDTH`` values as they are
    (every caller passes exactly that many), with no event object built."""
    extend: Callable[[_RawEvent], None] = _list.extend.__get__(log)
    return extend
