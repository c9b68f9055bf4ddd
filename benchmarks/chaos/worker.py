"""One chaos worker process: a real :class:`~trio_supervise.Service` whose runner logs every step.

Usage: ``python worker.py URL WORKER_ID LOG_PATH SLEEP [--http PORT_FILE] [--block SECONDS]
[--poison ITEM_ID] [--max-attempts N] [--requeue-delay SECONDS]``

The service runs one driver (spec ``chaos``) that sleeps *SLEEP* seconds and returns
:class:`~trio_supervise.Stop`. Every runner event that matters for the audit is appended to
*LOG_PATH*, one line each, flushed at once (so a SIGKILL loses nothing the kernel was given):

``<kind> TAB <item id> TAB <lease version> TAB <detail>``

``outcome`` is an attempted settlement (the evaluation's result), ``settled`` one the queue
accepted, ``settle-refused`` a stale one it refused, ``settle-failed`` one whose write failed.
With ``--http`` the operations server listens on a free loopback port, written to *PORT_FILE*
once the service is up. SIGTERM drains and exits 0.

The fault options (R7, R8): ``--block`` makes the first evaluation of this process block the
thread (``time.sleep``) for that long after its sleep, so the event loop stops (and with
``--release PATH``, until that file exists too: 60 s at most); ``--poison``
makes evaluating that item raise an error whose text holds a lone surrogate (``"\\udcff"``);
``--max-attempts`` bounds the claims per item (the ``max_attempts`` setting where this build has
it, else ``max_errors``, which is said on stderr).

The timing options (R10-R12): ``--timed`` opens the queue here (not through the service) so
that every claim call is timed, and adds a fifth field to every line, the wall time
(``time.time()``, one clock for every process on the machine) at which it was written. It also
logs the lines

``start`` / ``end``: the driver's ``evaluate`` was entered / is about to return ``Stop``
(the wall time of that instant in the detail field too); ``claim-call``: an item this process
claimed (``-`` for a claim call that returned none), the detail the wall time at which the
claim call that returned it *began*;
``renewed`` and ``cancel-requested``: the runner's events of those names.

``--clock-file PATH`` gives the queue a clock that reads the machine's clock plus an offset in
seconds read from *PATH* (re-read at most every 10 ms; written by the harness to step the
clock). ``--queues NAME=N,...`` serves those named queues; ``--concurrency N`` sets the
runner's concurrency (and claim batch). ``--callers READERS,ENQUEUERS`` starts that many tasks
in this process calling ``list_items`` / ``counts`` and ``enqueue`` on the service's own queue
(so they share its connection pools) in a loop, logging ``call`` lines; while the file
``--hot-file`` names exists, the enqueuers enqueue with the idempotency key it holds.
A driver's sleep is ``config["sleep"]`` when the item has one.

``--upgrade`` (R9) serves :class:`UpgradeDriver` instead, which does what each item's
``config["kind"]`` says (complete, reschedule, fail once, fan out and in) and notes ``start``,
``end``, ``fanout`` and ``fanin`` lines (it implies ``--timed``). It uses only the API of
commit 5f6de71 (every release since has it), so the same script runs under either release.
Every worker's first line is ``library TAB - TAB - TAB <the directory it imported
trio_supervise from>``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

import trio_supervise as ts

SPEC = "chaos"
NOISE = "chaos-noise"
"""The spec (and queue) of the items ``--callers`` enqueue: no runner serves it."""
LOGGED = frozenset(
    {
        ts.RunnerEventKind.CLAIMED,
        ts.RunnerEventKind.OUTCOME,
        ts.RunnerEventKind.SETTLED,
        ts.RunnerEventKind.SETTLE_REFUSED,
        ts.RunnerEventKind.SETTLE_FAILED,
        ts.RunnerEventKind.LEASE_LOST,
        ts.RunnerEventKind.CLAIM_FAILED,
        ts.RunnerEventKind.RENEWAL_FAILED,
    }
)
TIMED = LOGGED | {ts.RunnerEventKind.RENEWED, ts.RunnerEventKind.CANCEL_REQUESTED}
CALL_BOUND = 60.0
"""A ``--callers`` call still waiting after this many seconds is abandoned and logged as such."""

Note = Callable[[str, str, object, str], None]
"""Writes one log line: kind, item id, lease version, detail."""


class SteppedClock:
    """The machine's clock plus an offset (seconds) read from a file the harness writes.

    The file is re-read at most every 10 ms, so a step reaches every process within that.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._offset = 0.0
        self._read_at = -1.0

    def now(self) -> dt.datetime:
        moment = time.monotonic()
        if moment - self._read_at > 0.01:
            self._read_at = moment
            try:
                with open(self._path, encoding="utf-8") as file:
                    self._offset = float(file.read() or 0.0)
            except (OSError, ValueError):
                pass  # being replaced right now: the last offset stands
        return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=self._offset)

    def monotonic(self) -> float:
        """A wall clock's steps are not time passing (see ``ts.WallClock``): the store holds
        a forward step until it has lasted longer than a lease."""
        return time.monotonic()


def timed_queue_class(base: type[Any], note: Note) -> type[Any]:
    """*base* with its claim calls timed: each claimed item is noted as ``claim-call`` with the
    wall time at which the call began. ``settle_and_claim`` is overridden beside ``claim_due``,
    so the runner still combines them where it would (see ``_combines`` in the runner)."""

    def claimed(items: Sequence[ts.WorkItem], began: float) -> None:
        for item in items:
            note("claim-call", item.id, item.lease_version, f"{began:.6f}")
        if not items:
            note("claim-call", "-", "-", f"{began:.6f}")

    class Timed(base):  # type: ignore[misc, valid-type]
        async def claim_due(self, *args: Any, **kwargs: Any) -> list[ts.WorkItem]:
            began = time.time()
            items: list[ts.WorkItem] = await super().claim_due(*args, **kwargs)
            claimed(items, began)
            return items

        async def settle_and_claim(self, *args: Any, **kwargs: Any) -> Any:
            began = time.time()
            applied, items = await super().settle_and_claim(*args, **kwargs)
            claimed(items, began)
            return applied, items

    return Timed


class SleepDriver:
    """Sleeps, then stops the item: the smallest driver that is still in flight for a while.

    With *block*, the first evaluation blocks the thread that long after its sleep; with
    *poison*, that item's evaluation raises an error whose text cannot be encoded as UTF-8.
    With *note*, it notes ``start`` and ``end`` of every evaluation.
    """

    name = "chaos"
    spec_ids: Sequence[str] = (SPEC,)

    def __init__(
        self,
        sleep: float,
        *,
        block: float = 0.0,
        release: str | None = None,
        poison: str | None = None,
        note: Note | None = None,
    ) -> None:
        self._sleep = sleep
        self._block = block
        self._release = release
        self._poison = poison
        self._note = note

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: ts.WorkItem) -> ts.Outcome:
        if self._note is not None:
            self._note("start", item.id, item.lease_version, f"{time.time():.6f}")
        config = item.config
        sleep = config.get("sleep", self._sleep) if isinstance(config, dict) else self._sleep
        await trio.sleep(sleep)
        if self._block:
            block, self._block = self._block, 0.0
            # The fault under test: a driver blocking the loop (for at least *block* seconds,
            # and until the release file exists, if one is named: 60 s at most).
            until = time.monotonic() + block
            bound = time.monotonic() + 60.0
            while time.monotonic() < until or (
                self._release is not None
                and not os.path.exists(self._release)
                and time.monotonic() < bound
            ):
                time.sleep(0.05)
        if item.id == self._poison:
            raise ValueError(f"poison data \udcff in {item.id}")
        if self._note is not None:
            self._note("end", item.id, item.lease_version, f"{time.time():.6f}")
        return ts.Stop()


class UpgradeDriver:
    """R9's driver: each item does what its config's ``kind`` says, after sleeping
    ``config["sleep"]`` seconds (the worker's *sleep* by default).

    ``complete`` stops; ``reschedule`` reschedules itself ``config["left"]`` more times, each
    ``config["every"]`` seconds later, then stops; ``flaky`` raises while its error count is 0,
    then stops; ``parent`` fans out ``config["fanout"]`` children (kind ``complete``) and waits
    for them when it has none yet, else fans in (noting how many of its children had finished)
    and stops. ``start`` is noted as the evaluation begins, ``end`` just before ``Stop`` (the
    completion's side effect); ``fanout`` when it creates children.
    """

    name = "chaos"
    spec_ids: Sequence[str] = (SPEC,)

    def __init__(self, queue: ts.WorkQueue, sleep: float, note: Note) -> None:
        self._queue = queue
        self._sleep = sleep
        self._note = note

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: ts.WorkItem) -> ts.Outcome:
        note = self._note
        note("start", item.id, item.lease_version, f"{time.time():.6f}")
        config = item.config
        assert isinstance(config, dict)
        kind = config.get("kind", "complete")
        await trio.sleep(config.get("sleep", self._sleep))
        if kind == "reschedule" and config["left"] > 0:
            at = self._queue.clock.now() + dt.timedelta(seconds=config.get("every", 0.5))
            return ts.Reschedule(at, {**config, "left": config["left"] - 1})
        if kind == "flaky" and item.error_count == 0:
            raise RuntimeError(f"planned failure of {item.id}")
        if kind == "parent":
            children = await self._queue.list_children(item.id)
            if not children:
                fanout = config["fanout"]
                note("fanout", item.id, item.lease_version, str(fanout))
                child = {"kind": "complete", "sleep": config.get("child_sleep", self._sleep)}
                return ts.Continue(
                    children=[ts.NewItem(spec_id=SPEC, config=child) for _ in range(fanout)],
                    wait_for_children=True,
                )
            finished = sum(1 for each in children if each.state.finished)
            note("fanin", item.id, item.lease_version, f"{finished}/{len(children)}")
        note("end", item.id, item.lease_version, f"{time.time():.6f}")
        return ts.Stop()


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="worker.py")
    parser.add_argument("url")
    parser.add_argument("worker_id")
    parser.add_argument("log_path")
    parser.add_argument("sleep", type=float)
    parser.add_argument("--http", metavar="PORT_FILE")
    parser.add_argument("--block", type=float, default=0.0)
    parser.add_argument("--release", metavar="PATH")
    parser.add_argument("--poison")
    parser.add_argument("--max-attempts", type=int)
    parser.add_argument("--requeue-delay", type=float, default=5.0)
    parser.add_argument("--timed", action="store_true")
    parser.add_argument("--clock-file", metavar="PATH")
    parser.add_argument("--queues", metavar="NAME=N,...")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--callers", metavar="READERS,ENQUEUERS")
    parser.add_argument("--hot-file", metavar="PATH")
    parser.add_argument("--upgrade", action="store_true")
    return parser.parse_args(argv)


def _bounds(max_attempts: int | None) -> dict[str, Any]:
    """The runner settings that bound claims per item on this build."""
    if max_attempts is None:
        return {}
    if "max_attempts" in attrs.fields_dict(ts.RunnerSettings):
        return {"max_attempts": max_attempts}
    print(
        "chaos worker: max_attempts not available on this build; using max_errors", file=sys.stderr
    )
    return {"max_errors": max_attempts}


def _queues(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    pairs = (part.split("=") for part in text.split(","))
    return {"queues": {name: int(limit) for name, limit in pairs}}


async def _open_queue(url: str, clock: ts.Clock | None, note: Note) -> Any:
    """The queue *url* names, opened as the service would open it, its claim calls timed."""
    backend, target = ts.queues.parse_queue_url(url)
    if backend == "sqlite":
        from trio_supervise.queues import SQLiteQueue

        return await timed_queue_class(SQLiteQueue, note).connect(target, clock=clock)
    from trio_supervise.queues import PostgresQueue

    return await timed_queue_class(PostgresQueue, note).connect(target, clock=clock)


async def _call(note: Note, kind: str, call: Callable[[], Any]) -> None:
    """One caller's call, timed: ``call TAB kind TAB - TAB seconds TAB outcome``."""
    began = time.monotonic()
    outcome = f"no answer in {CALL_BOUND:g} s"
    with trio.move_on_after(CALL_BOUND):
        try:
            await call()
            outcome = "ok"
        except Exception as error:
            outcome = f"{type(error).__name__}: {error}".replace("\t", " ")
    note("call", kind, "-", f"{time.monotonic() - began:.4f}\t{outcome}")


async def _reader(queue: ts.WorkQueue, note: Note, n: int) -> None:
    """A CLI-like reader: ``list_items`` and ``counts`` in turn, back to back."""
    while True:
        if n % 2:
            await _call(note, "counts", queue.counts)
        else:
            await _call(note, "list_items", lambda: queue.list_items(limit=20))
        n += 1
        await trio.sleep(0.01)


async def _enqueuer(queue: ts.WorkQueue, note: Note, hot_file: str | None) -> None:
    """An enqueuer of unserved items; with the key in *hot_file* while that file exists."""
    while True:
        key: str | None = None
        if hot_file is not None:
            try:
                with open(hot_file, encoding="utf-8") as file:
                    key = file.read().strip() or None
            except OSError:
                key = None
        kind = "enqueue-hot" if key else "enqueue"
        await _call(
            note,
            kind,
            lambda: queue.enqueue(NOISE, queue=NOISE, idempotency_key=key),  # noqa: B023
        )
        await trio.sleep(0.01 + random.random() * 0.01)


async def main(argv: list[str]) -> int:
    args = _arguments(argv)
    port_file = args.http
    out = open(args.log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as we do
    stamp = args.timed or args.upgrade

    def note(kind: str, item_id: object, version: object, detail: str) -> None:
        detail = detail.replace("\n", " ").encode("utf-8", "backslashreplace").decode("utf-8")
        tail = f"\t{time.time():.6f}" if stamp else ""
        out.write(f"{kind}\t{item_id}\t{version}\t{detail}{tail}\n")
        out.flush()

    note("library", "-", "-", os.path.dirname(os.path.abspath(ts.__file__)))
    logged = TIMED if stamp else LOGGED

    def record(event: ts.RunnerEvent) -> None:
        if event.kind in logged:
            note(event.kind, event.item_id, event.lease_version, event.detail.replace("\t", " "))

    settings = ts.Settings(
        database_url=args.url,
        http=ts.HttpSettings(enabled=port_file is not None, host="127.0.0.1", port=0),
        runner=ts.RunnerSettings(
            worker_id=args.worker_id,
            lease=3.0,
            concurrency=args.concurrency,
            claim_batch=args.concurrency,
            poll_interval=0.5,
            shutdown_grace=2.0,
            requeue_delay=args.requeue_delay,
            **_bounds(args.max_attempts),
            **_queues(args.queues),
        ),
    )
    queue = None
    if stamp or args.clock_file:
        clock = None if args.clock_file is None else SteppedClock(args.clock_file)
        queue = await _open_queue(args.url, clock, note)
    driver: Any = (
        UpgradeDriver(queue, args.sleep, note)
        if args.upgrade
        else SleepDriver(
            args.sleep,
            block=args.block,
            release=args.release,
            poison=args.poison,
            note=note if args.timed else None,
        )
    )
    service = ts.Service(
        drivers=[driver],
        settings=settings,
        queue=queue,
        name=f"chaos-{args.worker_id}",
        on_event=record,
    )
    code = 0

    async def run(*, task_status: trio.TaskStatus[ts.Service] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal code
        try:
            code = await service.run(task_status=task_status)
        finally:
            service.shutdown.begin("the service ended")  # the callers, if any, stop with it

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(run)
            if port_file is not None:
                tmp = f"{port_file}.tmp"
                with open(tmp, "w", encoding="utf-8") as file:
                    file.write(str(service.http_port))
                os.replace(tmp, port_file)
            if args.callers and queue is not None:
                readers, enqueuers = (int(n) for n in args.callers.split(","))
                async with trio.open_nursery() as callers:
                    for n in range(readers):
                        callers.start_soon(_reader, queue, note, n)
                    for _ in range(enqueuers):
                        callers.start_soon(_enqueuer, queue, note, args.hot_file)
                    # The callers run until the service stops (SIGTERM), then stop with it.
                    await service.shutdown.wait()
                    callers.cancel_scope.cancel()
    finally:
        if queue is not None:
            await queue.aclose()
        out.close()
    return code


if __name__ == "__main__":
    sys.exit(trio.run(main, sys.argv[1:]))
