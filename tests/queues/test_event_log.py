"""``MemoryQueue.events`` behaves as a list of :class:`QueueEvent`, whatever it stores.

The log keeps each event as nine plain values in the list itself (issue 17's P4), so every list
method translates between events and values. A model, a plain list of the same events, is put
through the same random operations: after each, the two read the same, and the operations that
raise raise the same exception type.
"""

from __future__ import annotations

import copy
import datetime as dt
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_supervise.queues import QueueEvent
from trio_supervise.queues.memory._events import _NO_DETAIL, _EventLog

_T0 = dt.datetime(2031, 1, 1, tzinfo=dt.UTC)

details = st.one_of(
    st.just(_NO_DETAIL),
    st.just({}),
    st.dictionaries(st.sampled_from(["worker_id", "delay", "error"]), st.integers(), max_size=2),
    # More than two pairs, keys that are not strings, values the log must keep as they are.
    st.dictionaries(st.text(max_size=3), st.none() | st.integers(), min_size=3, max_size=4),
    st.dictionaries(st.integers() | st.none(), st.text(max_size=2), min_size=1, max_size=2),
    st.just({"counts": {"completed": 2}, "by": ["a", "test"]}),
)

events = st.builds(
    QueueEvent,
    at=st.integers(0, 10).map(lambda s: _T0 + dt.timedelta(seconds=s)),
    op=st.sampled_from(["claim", "renew", "settle:complete", "enqueue"]),
    item_id=st.sampled_from(["a", "b", "c"]),
    lease_version=st.none() | st.integers(1, 3),
    detail=details,
    applied=st.booleans(),
)
indices = st.integers(-6, 6)
slices = st.builds(
    slice, st.none() | indices, st.none() | indices, st.none() | st.sampled_from([1, 2, -1, -2])
)

Op = Callable[[Any], Any]


def _assign(index: int, event: QueueEvent) -> Op:
    def op(log: Any) -> None:
        log[index] = event

    return op


def _assign_slice(where: slice, new: list[QueueEvent]) -> Op:
    def op(log: Any) -> None:
        log[where] = new

    return op


def _delete(where: int | slice) -> Op:
    def op(log: Any) -> None:
        del log[where]

    return op


def _add(new: list[QueueEvent]) -> Op:
    def op(log: Any) -> Any:
        log += new
        return log

    return op


def _repeat(times: int) -> Op:
    def op(log: Any) -> Any:
        log *= times
        return log

    return op


operations = st.one_of(
    events.map(lambda e: lambda log: log.append(e)),
    st.lists(events, max_size=3).map(lambda es: lambda log: log.extend(es)),
    st.tuples(indices, events).map(lambda a: lambda log: log.insert(*a)),
    st.tuples(indices, events).map(lambda a: _assign(*a)),
    st.tuples(slices, st.lists(events, max_size=3)).map(lambda a: _assign_slice(*a)),
    indices.map(_delete),
    slices.map(_delete),
    indices.map(lambda i: lambda log: log.pop(i)),
    st.just(lambda log: log.pop()),
    events.map(lambda e: lambda log: log.remove(e)),
    st.just(lambda log: log.reverse()),
    st.just(lambda log: log.sort(key=lambda e: (e.item_id, e.at))),
    st.just(lambda log: log.clear()),
    st.lists(events, max_size=2).map(_add),
    st.integers(0, 2).map(_repeat),
    st.just(lambda log: log.extend(log)),
    # Reads.
    indices.map(lambda i: lambda log: log[i]),
    slices.map(lambda s: lambda log: log[s]),
    events.map(lambda e: lambda log: (e in log, log.count(e))),
    events.map(lambda e: lambda log: log.index(e)),
    st.just(lambda log: (len(log), bool(log), list(reversed(log)), log.copy())),
    st.just(lambda log: (log + [], [] + log, log * 2, repr(log))),  # noqa: RUF005
)


def _outcome(op: Op, log: Any) -> tuple[str, Any]:
    try:
        result = op(log)
    except (IndexError, ValueError, TypeError) as error:
        return ("raised", type(error))
    if result is log:
        return ("self", None)
    return ("returned", result)


@settings(max_examples=400)
@given(st.lists(events, max_size=8), st.lists(operations, min_size=1, max_size=20))
def test_the_log_behaves_as_a_list_of_events(initial: list[QueueEvent], ops: list[Op]) -> None:
    log = _EventLog()
    log.extend(initial)
    model = list(initial)
    for op in ops:
        assert _outcome(op, log) == _outcome(op, model)
        assert _read(log) == _read(model)
        assert len(log) == len(model)
        assert list.__len__(log) == 9 * len(model)  # always whole events
    assert log == model
    assert _read(reversed(log)) == _read(reversed(model))


def _read(events: Any) -> list[tuple[QueueEvent, list[tuple[Any, Any]]]]:
    """The events with their details' pairs in order (equal dicts may differ in order)."""
    return [(event, list(event.detail.items())) for event in events]


@given(st.lists(events, max_size=5))
def test_the_log_copies_and_pickles_as_a_list(initial: list[QueueEvent]) -> None:
    log = _EventLog()
    log.extend(initial)
    for other in (copy.copy(log), copy.deepcopy(log), pickle.loads(pickle.dumps(log))):
        assert type(other) is _EventLog
        assert other == initial
        assert list.__len__(other) == 9 * len(initial)


def test_the_shared_empty_detail_stays_shared() -> None:
    """An event logged with the shared empty detail (a renewal's) reads back with it; one with
    an empty dict of its own gets a fresh dict each read."""
    log = _EventLog()
    log.append(QueueEvent(_T0, "renew", "a", 1, _NO_DETAIL))
    log.append(QueueEvent(_T0, "retry", "a", None, {}))
    shared, own = log
    assert shared.detail is _NO_DETAIL
    assert own.detail == {}
    assert own.detail is not log[1].detail


def test_only_events_go_in() -> None:
    log = _EventLog()
    with pytest.raises(TypeError, match="holds QueueEvent"):
        log.append(("not", "an", "event"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="holds QueueEvent"):
        log.extend([QueueEvent(_T0, "x", "a"), "no"])  # type: ignore[list-item]
    assert log == []


_SLICES = [
    slice(start, stop, step)
    for start in (None, 0, 1, -2, 5, 9)
    for stop in (None, 0, 2, -1, 9)
    for step in (None, 1, 2, 3, -1, -2)
]


@pytest.mark.parametrize("where", _SLICES, ids=repr)
def test_every_slice_reads_writes_and_deletes_as_a_list_s(where: slice) -> None:
    """Every kind of slice over six events, extended ones included, against a plain list."""
    six = [QueueEvent(_T0, "x", item_id, None, {"n": n}) for n, item_id in enumerate("abcdef")]
    new = [QueueEvent(_T0, "new", item_id) for item_id in "uvwxyz"]
    log = _EventLog()
    log.extend(six)
    assert _read(log[where]) == _read(six[where])
    for size in (0, 1, len(range(*where.indices(6))), 3):
        log[:] = model = list(six)

        def assign(target: Any, size: int = size) -> None:
            target[where] = new[:size]

        assert _outcome(assign, log) == _outcome(assign, model)
        assert _read(log) == _read(model)
    log[:] = model = list(six)
    del log[where]
    del model[where]
    assert _read(log) == _read(model)
