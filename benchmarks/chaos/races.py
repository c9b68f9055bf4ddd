"""R10-R12: pause and cancel racing the fleet, wall-clock steps, an exhausted pool (issue 29).

Each scenario starts real worker processes (``worker.py --timed``) on a fresh queue, loopback
only, stops by itself within its bound, and returns its figures as a dict. The workers note, on
the worker side, when every claim call began, when every evaluation started and ended, and when
every lease was renewed, all in the machine's wall clock (``time.time()``), which every process
on the machine shares; the harness notes its own calls in the same clock.

- **R10**: four workers drain a named queue that the harness pauses and resumes every second
  or so, while it cancels items: some at the instant their driver should return (a race with
  the completion), some mid-evaluation, some still queued. Goal: every item ends exactly once
  (completed or cancelled; none lost, none finished twice), and no item of the paused queue
  starts from a claim call that began after ``pause_queue`` returned.
- **R11**: four workers whose queue clock is the machine's plus an offset the harness steps by
  +1 h and -1 h while they run. Goal: no lease taken from a live owner, no item run twice.
- **R12** (PostgreSQL): one worker holding 30 leases shares its queue with more concurrent
  callers (``list_items`` / ``counts`` readers, enqueuers, ``/`` and ``/metrics`` readers) than
  its pools have connections; then an application transaction holds an idempotency key that
  those enqueuers ask for. Goal: every renewal lands (0 leases lost), and every caller gets an
  answer or a clear error within the pool's timeout.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as dt
import inspect
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

import trio_supervise as ts

from .harness import LEASE, Fleet, PostgresStore, Store, item_id
from .scenarios import _Load, _wait

QUEUE = "r10"
HOUR = 3600.0
PG_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(ts.queues.PostgresQueue.connect).parameters.items()
    if name in ("pool_size", "worker_pool_size", "read_pool_size", "connect_timeout")
}
"""The pool settings a worker's PostgreSQL queue gets (the service opens it with these)."""


# -- what the timed workers wrote ------------------------------------------------------------------


Key = tuple[str, int]
"""An item id and a lease version: one claim."""


@dataclasses.dataclass
class Timeline:
    """Everything the ``--timed`` workers logged, by claim; fed line by line (see worker.py)."""

    starts: dict[Key, float] = dataclasses.field(default_factory=dict)
    start_count: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    ends: dict[Key, float] = dataclasses.field(default_factory=dict)
    claim_calls: dict[Key, tuple[float, float]] = dataclasses.field(default_factory=dict)
    """When the claim call that returned the claim began, and when it had returned."""
    owners: dict[Key, str] = dataclasses.field(default_factory=dict)
    renewals: dict[Key, list[float]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list)
    )
    completions: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    renewals_refused: int = 0
    lease_lost_events: int = 0
    settle_refused: int = 0
    renewal_failed: int = 0
    empty_claims: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    """When each claim call that returned nothing began, and when it had returned."""
    calls: list[tuple[str, float, str, float]] = dataclasses.field(default_factory=list)
    """``(kind, seconds, outcome, ended)`` per caller call."""

    def feed(self, worker: str, line: str) -> None:
        parts = line.rstrip("\n").split("\t")
        if len(parts) < 5:
            return  # a line cut short
        kind, item, version, detail, stamp = parts[0], parts[1], parts[2], parts[3], parts[-1]
        if kind == "call":
            self.calls.append((item, float(detail), "\t".join(parts[4:-1]), float(stamp)))
            return
        if kind == "claim-call" and item == "-":
            self.empty_claims.append((float(detail), float(stamp)))
            return
        if not version.isdigit():
            return
        key = (item, int(version))
        if kind == "start":
            self.starts.setdefault(key, float(detail))
            self.start_count[item] += 1
            self.owners[key] = worker
        elif kind == "end":
            self.ends[key] = float(detail)
        elif kind == "claim-call":
            self.claim_calls[key] = (float(detail), float(stamp))
            self.owners.setdefault(key, worker)
        elif kind == "renewed" or kind == "lease-lost":
            # A lost lease is a renewal's answer too (the last one): the gap to it counts.
            self.renewals[key].append(float(stamp))
            if kind == "lease-lost":
                self.lease_lost_events += 1
            if detail == "renewal refused":
                self.renewals_refused += 1
        elif kind == "settled" and detail == "complete":
            self.completions[item] += 1
        elif kind == "settle-refused":
            self.settle_refused += 1
        elif kind == "renewal-failed":
            self.renewal_failed += 1

    @property
    def leases_lost(self) -> int:
        """Leases a worker found taken over: a lost lease (a refused renewal, or a newer claim
        of the same item by the same worker) or a refused write."""
        return self.lease_lost_events + self.settle_refused

    def evaluated_twice(self) -> int:
        return sum(1 for n in self.start_count.values() if n > 1)

    def longest_renewal_gap(
        self, worker_prefix: str = "", span: tuple[float, float] = (0.0, float("inf"))
    ) -> float:
        """The longest wait between a claim (its call's return) or a renewal and the next
        renewal of the same lease (or its loss), answered within *span*, by the workers whose
        names start with *worker_prefix*."""
        longest = 0.0
        for key, stamps in self.renewals.items():
            if not self.owners.get(key, "").startswith(worker_prefix):
                continue
            previous = self.claim_calls.get(key, (0.0, stamps[0]))[1]
            for stamp in stamps:
                if span[0] <= stamp <= span[1]:
                    longest = max(longest, stamp - previous)
                previous = stamp
        return round(longest, 2)


class Tail:
    """Reads the workers' logs as they grow, whole lines only, into a :class:`Timeline`."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, str] = {}
        self.timeline = Timeline()

    def read(self) -> list[tuple[str, str]]:
        """The new whole lines since the last call, as ``(worker, line)``; fed to the timeline."""
        lines = []
        for path in sorted(self._directory.glob("*.log")):
            with path.open(encoding="utf-8", errors="replace") as file:
                file.seek(self._offsets.get(path, 0))
                text = self._partial.pop(path, "") + file.read()
                self._offsets[path] = file.tell()
            *whole, rest = text.split("\n")
            if rest:
                self._partial[path] = rest
            lines += [(path.stem, line) for line in whole]
        for worker, line in lines:
            self.timeline.feed(worker, line)
        return lines

    def read_all(self) -> Timeline:
        """The timeline with every whole line written so far."""
        self.read()
        return self.timeline


def _finish_figures(store: Store, items: int, timeline: Timeline) -> dict[str, Any]:
    """What the database and the logs say about how the items ended."""
    states = store.states()
    finishes = store.finishes()
    per_item = collections.Counter(item for (item, _), n in finishes.items() for _ in range(n))
    finished = sum(states.get(state, 0) for state in ("completed", "cancelled", "dead"))
    db_twice = sum(1 for (_, state), n in finishes.items() if state == "completed" and n > 1)
    log_twice = sum(1 for n in timeline.completions.values() if n > 1)
    return {
        "items": items,
        "states": states,
        "completed": states.get("completed", 0),
        "lost": items - finished,
        "finished_twice": sum(1 for n in per_item.values() if n > 1),
        "completed_twice": max(db_twice, log_twice),
    }


def _timed_out(started: float, limit: float) -> bool:
    return time.perf_counter() - started > limit


# -- R10 -------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Cancel:
    item: str
    role: str
    at: float
    """When it was sent (wall clock)."""
    answer: str
    """The item's state in ``request_cancel``'s answer: what the cancel found (``cancelled``:
    it was queued; ``running``: flagged for its owner; ``completed``: too late)."""


@dataclasses.dataclass
class R10Plan:
    sleeps: dict[str, float]
    """Each item's driver sleep."""
    roles: dict[str, str]
    """How each cancelled item is cancelled: ``race``, ``early`` or ``queued``."""

    def shape(self, n: int) -> dict[str, Any]:
        return {"config": {"n": n, "sleep": self.sleeps[item_id(n)]}, "queue": QUEUE}


def r10_plan(items: int, seed: str) -> R10Plan:
    """Each item's driver sleep and cancel role, drawn from *seed*.

    Seven in ten items sleep 0.1-0.5 s, the rest 1.2-2.2 s (past a renewal, so a cancel can
    reach them mid-evaluation). A quarter are cancelled when their driver should return
    (``race``), a third of the long ones a moment after they start (``early``), one in twenty
    within the first two seconds, most likely still queued (``queued``).
    """
    rng = random.Random(f"{seed}-r10")
    plan = R10Plan({}, {})
    for n in range(items):
        long = rng.random() < 0.3
        plan.sleeps[item_id(n)] = round(rng.uniform(1.2, 2.2) if long else rng.uniform(0.1, 0.5), 3)
        draw = rng.random()
        if draw < 0.25:
            plan.roles[item_id(n)] = "race"
        elif draw < 0.3:
            plan.roles[item_id(n)] = "queued"
        elif long and draw < 0.55:
            plan.roles[item_id(n)] = "early"
    return plan


def run_r10(
    store: Store,
    directory: Path,
    *,
    tag: str,
    items: int,
    plan: R10Plan,
    limit: float,
) -> dict[str, Any]:
    """Four workers on queue ``r10``, paused and resumed, items cancelled; see the module doc."""
    fleet = Fleet(store, directory, 0.3, tag=tag, args=["--timed", "--queues", f"{QUEUE}=10"])
    tail = Tail(fleet.directory_logs)
    rng = random.Random(f"{tag}-r10-harness")
    windows: list[tuple[float, float, float, float]] = []
    cancels: list[_Cancel] = []
    timed_out = False

    async def drive() -> float:
        nonlocal timed_out
        url = store.worker_url(f"chaos-{tag}-harness")
        async with ts.open_queue(url) as queue, trio.open_nursery() as nursery:

            async def cancel(item: str, role: str) -> None:
                at = time.time()
                answer = await queue.request_cancel(item)
                cancels.append(_Cancel(item, role, at, str(answer.state)))

            roles = plan.roles
            fleet.start()
            started = time.perf_counter()
            origin = time.time()
            due: list[tuple[float, str, str]] = [
                (origin + rng.uniform(0.0, 2.0), item, role)
                for item, role in roles.items()
                if role == "queued"
            ]
            scheduled = set()
            next_pause = time.time() + rng.uniform(0.7, 1.5)
            pause: tuple[float, float] | None = None
            resume_at = 0.0
            while True:
                for _, line in tail.read():
                    parts = line.split("\t")
                    if parts[0] != "start" or parts[1] in scheduled or parts[1] not in roles:
                        continue
                    item, begun = parts[1], float(parts[3])
                    role = roles[item]
                    if role == "race":
                        at = begun + plan.sleeps[item] + rng.uniform(-0.1, 0.05)
                    elif role == "early":
                        at = begun + rng.uniform(0.05, 0.5)
                    else:
                        continue
                    scheduled.add(item)
                    due.append((at, item, role))
                now = time.time()
                for entry in [d for d in due if d[0] <= now]:
                    due.remove(entry)
                    nursery.start_soon(cancel, entry[1], entry[2])
                if pause is None and now >= next_pause:
                    called = time.time()
                    await queue.pause_queue(QUEUE)
                    pause = (called, time.time())
                    resume_at = time.time() + rng.uniform(0.4, 1.0)
                elif pause is not None and now >= resume_at:
                    called = time.time()
                    await queue.resume_queue(QUEUE)
                    windows.append((*pause, called, time.time()))
                    pause = None
                    next_pause = time.time() + rng.uniform(0.7, 1.5)
                fleet.tick()
                counts = store.states()
                finished = sum(counts.get(s, 0) for s in ("completed", "cancelled", "dead"))
                if finished >= items and not due:
                    break
                if _timed_out(started, limit):
                    timed_out = True
                    break
                await trio.sleep(0.02)
            if pause is not None:
                called = time.time()
                await queue.resume_queue(QUEUE)
                windows.append((*pause, called, time.time()))
            return time.perf_counter() - started

    try:
        seconds = trio.run(drive)
    finally:
        fleet.stop()
    timeline = tail.read_all()
    result = _finish_figures(store, items, timeline)
    result.update(_pause_figures(timeline, windows))
    result.update(_cancel_figures(store, timeline, cancels))
    result.update(
        {
            "evaluations": sum(timeline.start_count.values()),
            "evaluated_twice": timeline.evaluated_twice(),
            "leases_lost": timeline.leases_lost,
            "unexpected_exits": fleet.unexpected_exits,
            "timed_out": timed_out,
            "seconds": round(seconds, 2),
        }
    )
    return result


def _pause_figures(
    timeline: Timeline, windows: list[tuple[float, float, float, float]]
) -> dict[str, Any]:
    """Starts and claims audited against the pause windows ``(pause called, pause returned,
    resume called, resume returned)``: paused is from the pause's return to the resume's call.

    A start in a paused stretch is a violation when the claim call that returned its item
    began after the pause returned; one whose claim call began before is counted apart (the
    claim was in flight as the queue was paused: allowed). A claim call that began after a
    pause returned and had returned before the resume was called is a violation too, started
    or not.
    """
    started_paused = claimed_before = unattributed = 0
    for key, start in timeline.starts.items():
        window = next((w for w in windows if w[1] < start < w[2]), None)
        if window is None:
            continue
        call = timeline.claim_calls.get(key)
        if call is None:
            unattributed += 1
        elif call[0] > window[1]:
            started_paused += 1
        else:
            claimed_before += 1

    def inside(call: tuple[float, float]) -> bool:
        return any(w[1] < call[0] and call[1] < w[2] for w in windows)

    claimed_paused = sum(1 for call in timeline.claim_calls.values() if inside(call))
    calls_paused = sum(1 for call in timeline.empty_claims if inside(call)) + claimed_paused
    return {
        "pauses": len(windows),
        "paused_seconds": round(sum(w[2] - w[1] for w in windows), 2),
        "pause_call_p_max_seconds": round(max((w[1] - w[0] for w in windows), default=0.0), 3),
        "started_while_paused": started_paused,
        "claimed_while_paused": claimed_paused,
        "claim_calls_while_paused": calls_paused,
        "started_paused_claimed_before": claimed_before,
        "started_paused_unattributed": unattributed,
    }


def _cancel_figures(store: Store, timeline: Timeline, cancels: list[_Cancel]) -> dict[str, Any]:
    """How each cancel met its item: found queued, flagged while running (then completed: it
    raced the completion and lost; or cancelled: delivered), or too late; and whether a driver
    that had returned ``Stop`` saw its item end cancelled all the same (a completion lost)."""
    final = store.item_states()
    by_answer: collections.Counter[str] = collections.Counter(c.answer for c in cancels)
    flagged = [c for c in cancels if c.answer == "running"]
    raced = sum(1 for c in flagged if final.get(c.item) == "completed")
    delivered = sum(1 for c in flagged if final.get(c.item) == "cancelled")
    ended_cancelled = {item for item, state in final.items() if state == "cancelled"}
    last: dict[str, int] = {}
    for item, version in timeline.claim_calls:
        last[item] = max(version, last.get(item, 0))
    overridden = sorted(item for item in ended_cancelled if (item, last.get(item)) in timeline.ends)
    return {
        "cancels": len(cancels),
        "cancels_by_role": dict(collections.Counter(c.role for c in cancels)),
        "cancel_found": dict(by_answer),
        "cancelled": len(ended_cancelled),
        "cancels_raced_completion": raced,
        "cancels_delivered_running": delivered,
        "completions_overridden": len(overridden),
        "completions_overridden_items": overridden[:10],
    }


# -- R11 -------------------------------------------------------------------------------------------


def r11_shape(n: int) -> dict[str, Any]:
    """Due two hours ago: claimable whatever the workers' clock offset (within an hour). The
    driver sleeps 1-2 s, spread evenly (a golden-ratio sequence), so that items finish, and
    slots are claimed again, all the time rather than in waves (a wave of claims that misses a
    step hides what the step does)."""
    return {
        "config": {"n": n, "sleep": round(1.0 + (n * 0.618034) % 1.0, 3)},
        "due_at": dt.datetime.now(dt.UTC) - dt.timedelta(hours=2),
    }


def _write_offset(path: Path, seconds: float) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{seconds}\n")
    os.replace(tmp, path)


def run_r11(
    store: Store,
    directory: Path,
    *,
    tag: str,
    items: int,
    sleep: float,
    steps: list[tuple[float, float]],
    limit: float,
) -> dict[str, Any]:
    """Four workers whose queue clock is stepped to each ``(at seconds, offset)`` of *steps*."""
    clock_file = directory / "clock-offset"
    directory.mkdir(parents=True, exist_ok=True)
    _write_offset(clock_file, 0.0)
    fleet = Fleet(
        store, directory, sleep, tag=tag, args=["--timed", "--clock-file", str(clock_file)]
    )
    tail = Tail(fleet.directory_logs)
    applied: list[dict[str, float]] = []
    busy = min(items, len(fleet.slots) * 10)  # every worker's concurrency taken
    pending = sorted(steps)
    try:
        fleet.start()
        # The steps' times count from when every slot is busy: a fleet still starting up would
        # meet a step with no lease to lose.
        _wait(fleet, lambda: len(tail.read_all().claim_calls) >= busy, 30.0)
        started, started_wall = time.perf_counter(), time.time()

        def done() -> bool:
            now = time.perf_counter() - started
            while pending and pending[0][0] <= now:
                _, offset = pending.pop(0)
                _write_offset(clock_file, offset)
                applied.append({"at_seconds": round(now, 2), "offset_seconds": offset})
            return (store.count_completed() or 0) >= items and not pending

        timed_out, seconds = _wait(fleet, done, limit)
    finally:
        fleet.stop()
    timeline = tail.read_all()
    result = _finish_figures(store, items, timeline)
    rescued = sum(
        1 for n in collections.Counter(k[0] for k in timeline.claim_calls).values() if n > 1
    )
    # Each claim of an item after its first (a rescue: nothing else claims an item twice here)
    # is put down to the last step before its claim call began.
    for step in applied:
        step["rescues_after"] = 0
    # An item's claims in order of their versions (versions only grow); all but its first are
    # rescues. (A version above 1 says nothing: versions come from one database-wide counter.)
    claims = sorted(timeline.claim_calls.items(), key=lambda claim: claim[0][1])
    seen: set[str] = set()
    for (claimed_id, _), (began, _) in claims:
        if claimed_id not in seen:
            seen.add(claimed_id)
            continue
        before = [step for step in applied if started_wall + step["at_seconds"] <= began]
        if before:
            before[-1]["rescues_after"] += 1
    result.update(
        {
            "steps": applied,
            "leases_lost": timeline.leases_lost,
            "renewals_refused": timeline.renewals_refused,
            "settle_refused": timeline.settle_refused,
            "claimed_twice": rescued,
            "evaluations": sum(timeline.start_count.values()),
            "evaluated_twice": timeline.evaluated_twice(),
            "unexpected_exits": fleet.unexpected_exits,
            "timed_out": timed_out,
            "seconds": round(seconds, 2),
        }
    )
    return result


# -- R12 -------------------------------------------------------------------------------------------


def _hold_key(url: str, key: str) -> Any:
    """An application transaction that has enqueued with *key* and stays open: returns its
    connection (roll it back to end it)."""
    import psycopg

    conn = psycopg.connect(url, autocommit=False, connect_timeout=5)

    async def enqueue() -> None:
        queue = await ts.queues.PostgresQueue.connect(url, pool_size=1, listen=False)
        async with queue:
            queue.enqueue_on(conn, "chaos-noise", queue="chaos-noise", idempotency_key=key)

    trio.run(enqueue)
    return conn


def run_r12(
    store: PostgresStore,
    directory: Path,
    *,
    tag: str,
    items: int,
    sleep: float,
    readers: int,
    enqueuers: int,
    http_clients: int,
    busy: float,
    stuck: float,
    limit: float,
) -> dict[str, Any]:
    """Worker 0 holds *items* leases beside *readers* + *enqueuers* callers on its own queue and
    *http_clients* on its HTTP server: *busy* seconds like that, then *stuck* seconds with an
    idempotency key the enqueuers ask for held by an open transaction. Worker 1 has room to
    take over any lease worker 0 lets expire."""
    hot = directory / "hot"
    directory.mkdir(parents=True, exist_ok=True)
    callers = ["--callers", f"{readers},{enqueuers}", "--hot-file", str(hot)]
    fleet = Fleet(
        store,
        directory,
        sleep,
        tag=tag,
        http=True,
        workers=2,
        args=["--timed", "--concurrency", str(items)],
        slot_args={0: callers},
    )
    tail = Tail(fleet.directory_logs)
    phases: dict[str, tuple[float, float]] = {}
    held: Any = None
    blocked = 0
    try:
        # Worker 0 claims every item first; worker 1 starts once it has, with as many free slots.
        fleet.start([0])
        _wait(fleet, lambda: len(tail.read_all().claim_calls) >= items, 30.0)
        fleet.start([1])
        fleet.wait_for_ports()
        started = time.perf_counter()
        with _Load(fleet, http_clients) as load:
            began = time.time()
            _pause(fleet, busy)
            phases["busy"] = (began, time.time())
            key = f"hot-{tag}"
            held = _hold_key(store.worker_url(f"chaos-{tag}-app"), key)
            hot.write_text(key)
            began = time.time()
            blocked = _pause(fleet, stuck, lambda: store.lock_waits(f"chaos-{tag}-w0.0"))
            hot.unlink()
            held.rollback()
            phases["stuck"] = (began, time.time())
        timed_out, _ = _wait(
            fleet, lambda: (store.count_completed() or 0) >= items, limit - busy - stuck
        )
        seconds = time.perf_counter() - started
    finally:
        if held is not None:
            with contextlib.suppress(Exception):
                held.close()
        fleet.stop()
    timeline = tail.read_all()
    result = _finish_figures(store, items, timeline)
    result.update(
        {
            "pool": PG_DEFAULTS,
            "readers": readers,
            "enqueuers": enqueuers,
            "http_clients": http_clients,
            "busy_seconds": busy,
            "stuck_seconds": stuck,
            "leases_lost": timeline.leases_lost,
            "renewals_refused": timeline.renewals_refused,
            "settle_refused": timeline.settle_refused,
            "renewal_failed": timeline.renewal_failed,
            "evaluated_twice": timeline.evaluated_twice(),
            "longest_renewal_gap_seconds": timeline.longest_renewal_gap("w0."),
            "pool_connections_waiting_on_lock": blocked,
            "calls": {
                name: {
                    **_call_figures(timeline, span),
                    # A renewal held up in a phase is answered (refused) once it ends.
                    "longest_renewal_gap_seconds": timeline.longest_renewal_gap(
                        "w0.", (span[0], span[1] + (LEASE if name == "stuck" else 0.0))
                    ),
                }
                for name, span in phases.items()
            },
            "http": load.figures(),
            "unexpected_exits": fleet.unexpected_exits,
            "timed_out": timed_out,
            "seconds": round(seconds, 2),
        }
    )
    return result


def _pause(fleet: Fleet, seconds: float, sample: Callable[[], int] | None = None) -> int:
    """Tick *fleet* for *seconds*; the largest of *sample*'s answers meanwhile (every 0.5 s)."""
    until = time.perf_counter() + seconds
    largest = 0
    while time.perf_counter() < until:
        fleet.tick()
        if sample is not None:
            largest = max(largest, sample())
        time.sleep(0.5 if sample is not None else 0.05)
    return largest


def _lock_waits(store: Store, tag: str) -> int:
    """How many of worker 0's database connections wait on a lock right now."""
    query = getattr(store, "_query", None)
    if query is None:
        return 0
    with contextlib.suppress(Exception):
        rows = query(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            f"AND application_name = 'chaos-{tag}-w0.0'"
        )
        return int(rows[0][0])
    return 0


def _call_figures(timeline: Timeline, span: tuple[float, float]) -> dict[str, Any]:
    """The callers' calls begun in *span*: how many, the longest, what went wrong, and how many
    waited past the pool's timeout without an error (a hang, as a caller sees it)."""
    bound = float(PG_DEFAULTS["connect_timeout"])
    chosen = [c for c in timeline.calls if span[0] <= c[3] - c[1] < span[1]]
    errors = collections.Counter(c[2][:160] for c in chosen if c[2] != "ok")
    return {
        "calls": len(chosen),
        "by_kind": dict(collections.Counter(c[0] for c in chosen)),
        "longest_seconds": round(max((c[1] for c in chosen), default=0.0), 2),
        "longest_kind": max(chosen, key=lambda c: c[1])[0] if chosen else None,
        "past_pool_timeout_without_error": sum(
            1 for c in chosen if c[1] > bound and (c[2] == "ok" or c[2].startswith("no answer"))
        ),
        "errors": dict(errors),
    }


# -- goals -----------------------------------------------------------------------------------------


def goals(report: dict[str, Any]) -> list[str]:
    """Every R10-R12 goal the report misses, as a sentence."""
    wanted = {
        "r10": (
            "lost",
            "finished_twice",
            "completed_twice",
            "started_while_paused",
            "claimed_while_paused",
            "completions_overridden",
        ),
        "r11": ("lost", "completed_twice", "leases_lost", "evaluated_twice"),
        "r12": ("lost", "completed_twice", "leases_lost", "evaluated_twice"),
    }
    missed = []
    for part, keys in wanted.items():
        for name, figures in report.get(part, {}).items():
            if "skipped" in figures:
                continue
            for key in keys:
                if figures[key] != 0:
                    missed.append(f"{part.upper()} {name}: {key} = {figures[key]} (goal 0)")
            if figures["timed_out"]:
                missed.append(f"{part.upper()} {name}: timed out")
            for phase, calls in figures.get("calls", {}).items():
                if calls["past_pool_timeout_without_error"]:
                    missed.append(
                        f"R12 {name}: {calls['past_pool_timeout_without_error']} calls waited "
                        f"past the pool's {PG_DEFAULTS['connect_timeout']} s timeout without an "
                        f"error in the {phase} phase (longest {calls['longest_seconds']} s; goal 0)"
                    )
    return missed


# -- one part on one backend -----------------------------------------------------------------------

PARTS = ("r10", "r11", "r12")
BACKENDS = {"r10": ("sqlite", "postgres"), "r11": ("sqlite", "postgres"), "r12": ("postgres",)}
R11_STEPS = [(1.5, HOUR), (3.5, 0.0), (5.5, -HOUR), (7.5, 0.0)]
"""Quick R11: +1 h, back, -1 h, back, two seconds apart; a full run does it twice, slower."""


def run_part(
    part: str, kind: str, quick: bool, base: Path, *, dsn: str, tag: str, log: Any
) -> dict[str, Any]:
    """One R10/R11/R12 run on a fresh *kind* store, bounded; its figures."""
    from .harness import SQLiteStore

    directory = base / f"{part}-{kind}"
    run_tag = f"{tag}{part}{kind[0]}"
    items = {"r10": (400, 2000), "r11": (240, 1200), "r12": (30, 60)}[part][0 if quick else 1]
    plan = r10_plan(items, run_tag) if part == "r10" else None
    shape = plan.shape if plan is not None else {"r11": r11_shape}.get(part)
    store = (
        SQLiteStore(directory, items, shape)
        if kind == "sqlite"
        else PostgresStore(dsn, items, run_tag, shape)
    )
    try:
        if plan is not None:
            log(f"R10 {kind}: {items} items, 4 workers, queue paused and resumed, cancels racing")
            figures = run_r10(
                store, directory, tag=run_tag, items=items, plan=plan, limit=60 if quick else 240
            )
        elif part == "r11":
            steps = (
                R11_STEPS if quick else [(at * 1.5 + d, o) for d in (0, 12) for at, o in R11_STEPS]
            )
            log(f"R11 {kind}: {items} items, 4 workers, the queue clock stepped {len(steps)} times")
            figures = run_r11(
                store,
                directory,
                tag=run_tag,
                items=items,
                sleep=1.5,
                steps=steps,
                limit=60 if quick else 240,
            )
        else:
            scale = 1 if quick else 2
            log(f"R12 {kind}: {items} leases beside callers outnumbering the pool, then a held key")
            figures = run_r12(
                store,
                directory,
                tag=run_tag,
                items=items,
                sleep=20.0 if quick else 35.0,
                readers=10 * scale,
                enqueuers=20 * scale,
                http_clients=8 * scale,
                busy=5.0 * scale,
                stuck=12.0 if quick else 15.0,
                limit=90 if quick else 180,
            )
    finally:
        store.drop()
    log(f"{part.upper()} {kind}: done in {figures['seconds']} s")
    return figures
