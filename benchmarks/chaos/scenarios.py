"""R6-R8: status reads under load, poison data in a batch, a blocked event loop (issue 12).

Each scenario starts real worker processes (``worker.py``) on a fresh queue, loopback only,
stops by itself within its bound, and returns its figures as a dict (printed by ``__main__``).
Where a figure depends on a name this build may lack (a setting, a column, a helper, a metric),
it reads "not available" instead of failing the harness.

- **R6**: a large history of finished rows (300,000 in quick mode) beside two workers whose items
  outlive three lease periods, while client threads loop on ``/`` and ``/metrics`` of both.
  Goal: 0 leases lost (no renewal refused, no write refused), 0 items evaluated twice.
- **R7**: one batch of ten items, one of which fails with an error text holding a lone surrogate.
  Goal: the nine batch-mates complete, each evaluated once; the poison item is ``dead`` after
  ``max_attempts`` claims.
- **R8**: a worker whose first evaluation blocks its thread past the lease (until a second
  worker has taken its items over). Goal: nothing lost or completed twice, and every duplicate
  visible: refused writes counted by ``trio_supervise_settlements_refused_total`` as often as
  the log says, shown on the status page, and the loop-lag watchdog's warning there and in its
  metric.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .harness import LEASE, Fleet, Slot, Store, read_logs

_LIVE_ITEMS = 10


def _wait(fleet: Fleet, done: Callable[[], bool], limit: float) -> tuple[bool, float]:
    """Tick *fleet* until *done* or *limit* seconds: ``(timed_out, seconds)``."""
    started = time.perf_counter()
    while not done():
        if time.perf_counter() - started > limit:
            return True, time.perf_counter() - started
        fleet.tick()
        time.sleep(0.05)
    return False, time.perf_counter() - started


def _completed(store: Store) -> int:
    return store.states().get("completed", 0)


def _metric(text: str | None, name: str) -> float | None:
    """The sum of *name*'s samples in a Prometheus exposition, or None when it is absent."""
    if text is None:
        return None
    from prometheus_client.parser import text_string_to_metric_families

    total: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                total = (total or 0.0) + sample.value
    return total


def _text(fleet: Fleet, slot: Slot, path: str) -> str | None:
    answer = fleet.fetch(slot, path, timeout=10.0)
    if answer is None or answer[0] != 200:
        return None
    return answer[1].decode("utf-8", "replace")


def _available(value: float | None) -> float | str:
    if value is None:
        return "not available"
    return int(value) if value == int(value) else value


# -- R6 --------------------------------------------------------------------------------------------


class _Load:
    """Client threads looping on ``/`` and ``/metrics`` of every worker until stopped."""

    def __init__(self, fleet: Fleet, clients: int) -> None:
        self._fleet = fleet
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.statuses: collections.Counter[str] = collections.Counter()
        self.latencies: list[float] = []
        self._threads = [
            threading.Thread(target=self._loop, args=(n,), daemon=True) for n in range(clients)
        ]

    def _loop(self, n: int) -> None:
        slots = self._fleet.slots
        path = "/" if n % 2 == 0 else "/metrics"
        while not self._stop.is_set():
            slot = slots[(n // 2) % len(slots)]
            began = time.perf_counter()
            answer = self._fleet.fetch(slot, path, timeout=10.0)
            took = time.perf_counter() - began
            with self._lock:
                self.statuses["no answer" if answer is None else str(answer[0])] += 1
                self.latencies.append(took)
            if answer is None:
                time.sleep(0.05)

    def __enter__(self) -> _Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)

    def figures(self) -> dict[str, Any]:
        ordered = sorted(self.latencies)

        def at(q: float) -> float:
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4) if ordered else 0

        return {
            "requests": len(ordered),
            "statuses": dict(self.statuses),
            "latency_p50_seconds": at(0.5),
            "latency_p99_seconds": at(0.99),
        }


def run_r6(
    store: Store, directory: Path, *, tag: str, history: int, clients: int, limit: float
) -> dict[str, Any]:
    """Two workers with ten long items, *history* finished rows, *clients* threads reading."""
    began = time.perf_counter()
    store.add_history(history)
    history_seconds = time.perf_counter() - began
    fleet = Fleet(store, directory, 3 * LEASE, tag=tag, http=True, workers=2)
    target = history + _LIVE_ITEMS
    try:
        fleet.start()
        fleet.wait_for_ports()
        with _Load(fleet, clients) as load:
            timed_out, seconds = _wait(fleet, lambda: _completed(store) >= target, limit)
    finally:
        fleet.stop()
    logs = read_logs(fleet.directory_logs)
    completed = _completed(store) - history
    return {
        "history_rows": history,
        "history_insert_seconds": round(history_seconds, 2),
        "items": _LIVE_ITEMS,
        "completed": completed,
        "lost": _LIVE_ITEMS - completed,
        "leases_lost": logs.renewals_refused + logs.settle_refused,
        "renewals_refused": logs.renewals_refused,
        "settle_refused": logs.settle_refused,
        "renewal_failed": logs.renewal_failed,
        "evaluated_twice": max(0, logs.claimed - _LIVE_ITEMS),
        "clients": clients,
        **load.figures(),
        "unexpected_exits": fleet.unexpected_exits,
        "timed_out": timed_out,
        "seconds": round(seconds, 2),
    }


# -- R7 --------------------------------------------------------------------------------------------


def _contract(name: str) -> bool:
    """Whether this build has a name the scenario's goal relies on (from issue 12's contracts)."""
    import attrs

    import trio_supervise as ts
    import trio_supervise.queues as queues

    if name == "max_attempts":
        return "max_attempts" in attrs.fields_dict(ts.RunnerSettings)
    return hasattr(queues, name)


def run_r7(
    store: Store, directory: Path, *, tag: str, max_attempts: int, limit: float
) -> dict[str, Any]:
    """One worker, one batch of ten; ``item-00000`` raises an error holding a lone surrogate."""
    poison = "item-00000"
    args = ["--poison", poison, "--max-attempts", str(max_attempts), "--requeue-delay", "0.2"]
    fleet = Fleet(store, directory, 0.3, tag=tag, workers=1, args=args)
    mates = _LIVE_ITEMS - 1

    def settled() -> bool:
        row = store.row(poison)
        return _completed(store) >= mates and row is not None and row["state"] == "dead"

    try:
        fleet.start()
        timed_out, seconds = _wait(fleet, settled, limit)
    finally:
        fleet.stop()
    logs = read_logs(fleet.directory_logs)
    row = store.row(poison) or {}
    last_error = row.get("last_error")
    mate_claims = sum(n for item, n in logs.claims.items() if item != poison)
    return {
        "items": _LIVE_ITEMS,
        "mates_completed": _completed(store),
        "mates_evaluations": mate_claims,
        "poison_state": row.get("state"),
        "poison_claims": logs.claims.get(poison, 0),
        "poison_attempt": row.get("attempt", "not available"),
        "poison_error_count": row.get("error_count"),
        "poison_last_error": None if last_error is None else ascii(last_error)[:120],
        "max_attempts": max_attempts,
        "max_attempts_available": _contract("max_attempts"),
        "storable_text_available": _contract("storable_text"),
        "settle_failed": logs.settle_failed,
        "unexpected_exits": fleet.unexpected_exits,
        "timed_out": timed_out,
        "seconds": round(seconds, 2),
    }


# -- R8 --------------------------------------------------------------------------------------------


def _claims_in(log: Path) -> int:
    if not log.exists():
        return 0
    return sum(
        1 for line in log.read_text(errors="replace").splitlines() if line.startswith("claimed\t")
    )


def run_r8(store: Store, directory: Path, *, tag: str, items: int, limit: float) -> dict[str, Any]:
    """Worker 0 claims everything and blocks its loop past the lease; worker 1 takes over."""
    block = LEASE + 1.5
    release = directory / "release"
    blocking = ["--block", str(block), "--release", str(release)]
    fleet = Fleet(store, directory, 0.3, tag=tag, http=True, workers=2, slot_args={0: blocking})
    blocker = fleet.slots[0]
    metrics = page = None
    began = time.perf_counter()
    try:
        # Worker 0 claims everything and blocks; worker 1 starts, takes the expired leases over,
        # and only then is worker 0 released (however long worker 1 took to start).
        fleet.start([0])
        fleet.wait_for_ports()
        _wait(fleet, lambda: _claims_in(fleet.directory_logs / "w0.0.log") >= items, 20.0)
        fleet.start([1])
        fleet.wait_for_ports()
        _wait(fleet, lambda: _claims_in(fleet.directory_logs / "w1.0.log") >= items, 20.0)
        release.touch()
        timed_out, _ = _wait(fleet, lambda: _completed(store) >= items, limit)
        # The blocked worker answers again once its loop runs; its outcomes are refused when
        # its write answers, which may be after that: read what it shows once its refusals are
        # counted (or after 10 s, when the figures below say what is missing).
        _wait(fleet, lambda: fleet.fetch(blocker, "/healthz") is not None, 10.0)
        _wait(
            fleet,
            lambda: (
                (
                    _metric(
                        _text(fleet, blocker, "/metrics"),
                        "trio_supervise_settlements_refused_total",
                    )
                    or 0
                )
                >= items
            ),
            10.0,
        )
        metrics = _text(fleet, blocker, "/metrics")
        page = _text(fleet, blocker, "/")
        seconds = time.perf_counter() - began
    finally:
        fleet.stop()
    logs = read_logs(fleet.directory_logs)
    blocker_logs = read_logs(fleet.directory_logs, prefix="w0.")
    refused_metric = _metric(metrics, "trio_supervise_settlements_refused_total")
    lag_count = _metric(metrics, "trio_supervise_event_loop_lag_seconds_count")
    lag_sum = _metric(metrics, "trio_supervise_event_loop_lag_seconds_sum")
    states = store.states()
    audit = store.audit()
    completed = states.get("completed", 0)
    return {
        "items": items,
        "block_seconds": block,
        "completed": completed,
        "lost": items - completed,
        "double_finalized": sum(1 for n in audit.values() if n > 1),
        "evaluated_twice": max(0, logs.claimed - items),
        "refused_in_log": blocker_logs.settle_refused,
        "refused_metric": _available(refused_metric),
        "lease_lost_at_renewal": blocker_logs.renewals_refused,
        "refusal_on_status_page": page is not None and "refused: the lease was lost" in page,
        "lag_warning_on_status_page": page is not None and "event loop blocked for" in page,
        "lag_observations": _available(lag_count),
        "lag_seconds_total": _available(None if lag_sum is None else round(lag_sum, 2)),
        "unexpected_exits": fleet.unexpected_exits,
        "timed_out": timed_out,
        "seconds": round(seconds, 2),
    }


def goals(report: dict[str, Any]) -> list[str]:
    """Every R6-R8 goal the report misses, as a sentence."""
    missed = []
    for name, figures in report.get("r6", {}).items():
        if "skipped" in figures:
            continue
        for key in ("lost", "leases_lost", "evaluated_twice"):
            if figures[key] != 0:
                missed.append(f"R6 {name}: {key} = {figures[key]} (goal 0)")
        if figures["timed_out"]:
            missed.append(f"R6 {name}: timed out")
    for name, figures in report.get("r7", {}).items():
        if "skipped" in figures:
            continue
        mates = figures["items"] - 1
        if figures["mates_completed"] != mates or figures["mates_evaluations"] != mates:
            missed.append(
                f"R7 {name}: {figures['mates_completed']} batch-mates completed in "
                f"{figures['mates_evaluations']} evaluations (goal {mates} in {mates})"
            )
        if figures["poison_state"] != "dead":
            missed.append(f"R7 {name}: poison item {figures['poison_state']} (goal dead)")
    r8 = report.get("r8", {})
    if r8 and "skipped" not in r8:
        for key in ("lost", "double_finalized"):
            if r8[key] != 0:
                missed.append(f"R8: {key} = {r8[key]} (goal 0)")
        if r8["refused_metric"] != r8["refused_in_log"]:
            missed.append(
                f"R8: refused_metric = {r8['refused_metric']}, the log says "
                f"{r8['refused_in_log']} (goal equal)"
            )
        if r8["refused_in_log"] and not r8["refusal_on_status_page"]:
            missed.append("R8: the refusal is not on the status page")
        if not r8["lag_warning_on_status_page"]:
            missed.append("R8: the loop-lag warning is not on the status page")
    return missed
