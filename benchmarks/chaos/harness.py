"""The chaos harness: worker processes under fire, and an audit of every item afterwards.

Wall-clock time (``time.perf_counter``), ``subprocess`` and signals are the point here; the
library itself reads time through Trio alone. Every process this module starts is killed in a
``finally``, and a PostgreSQL server it stops is started again in a ``finally``.

Two independent witnesses decide whether anything was lost or finalized twice:

- the database: a trigger the harness adds to its own copy of the queue table appends a row to
  ``chaos_audit`` for every UPDATE that leaves an item ``completed`` (so a second accepted
  completion of one item, or any write to a completed item, leaves a second row);
- the workers' logs: each worker appends one line per claim, attempted settlement (``outcome``)
  and the queue's answer (``settled`` / ``settle-refused`` / ``settle-failed``), flushed at once.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import trio

import trio_supervise as ts

from .._common import with_params

WORKER = Path(__file__).with_name("worker.py")
ROOT = Path(__file__).resolve().parents[2]
"""The checkout this harness runs from: its workers import the library from here too (run as a
script, a worker would otherwise import whichever ``trio_supervise`` is installed)."""
SPEC = "chaos"
WORKERS = 4
LEASE = 3.0
R6_HISTORY = 300_000
"""Finished rows beside R6's workers, quick and full alike (the issue's figure)."""

# -- stores: a fresh queue with N items, and direct SQL views of it --------------------------------


class Store:
    """A fresh queue filled with items, read directly (not through the library) for the audit."""

    name: str

    def worker_url(self, app_name: str) -> str:
        raise NotImplementedError

    def count_completed(self) -> int | None:
        """Completed items now, or None if the database cannot be asked right now."""
        raise NotImplementedError

    def states(self) -> dict[str, int]:
        raise NotImplementedError

    def audit(self) -> collections.Counter[str]:
        """How many times the database saw each item become (or stay) completed."""
        raise NotImplementedError

    def drop(self) -> None:
        raise NotImplementedError

    def add_history(self, count: int) -> None:
        """Insert *count* completed items (``done-NNNNNN``) straight into the table: a history."""
        raise NotImplementedError

    def row(self, item_id: str) -> dict[str, Any] | None:
        """The item's row as stored, by column name, or None."""
        raise NotImplementedError

    def item_states(self) -> dict[str, str]:
        """Every item's state now, by id."""
        raise NotImplementedError

    def finishes(self) -> collections.Counter[tuple[str, str]]:
        """How many times each item moved into each finished state (``completed``,
        ``cancelled``, ``dead``), by ``(id, state)``: a move in from another state, or a write
        of a finished item with another state or lease version. Unlike :meth:`audit`, a write
        that changes neither (``request_cancel`` on a completed item) is not counted."""
        raise NotImplementedError

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        """The rows *sql* reads (plain SQL both backends understand)."""
        raise NotImplementedError

    def parents(self) -> dict[str, str]:
        """Every child item's parent, by the child's id (the ``parent_id`` column)."""
        return dict(self.query(_PARENTS))


_AUDIT_SQLITE = """
CREATE TABLE chaos_audit (id TEXT NOT NULL, version INTEGER NOT NULL);
CREATE TRIGGER chaos_audit_complete AFTER UPDATE ON trio_supervise_items
WHEN NEW.state = 'completed'
BEGIN INSERT INTO chaos_audit (id, version) VALUES (NEW.id, NEW.lease_version); END;
CREATE TABLE chaos_finish (id TEXT NOT NULL, state TEXT NOT NULL, version INTEGER NOT NULL);
CREATE TRIGGER chaos_finish_any AFTER UPDATE ON trio_supervise_items
WHEN NEW.state IN ('completed', 'cancelled', 'dead')
 AND (OLD.state IS NOT NEW.state OR OLD.lease_version IS NOT NEW.lease_version)
BEGIN INSERT INTO chaos_finish (id, state, version) VALUES (NEW.id, NEW.state, NEW.lease_version);
END;
"""

_AUDIT_POSTGRES = """
CREATE TABLE chaos_audit (id text NOT NULL, version bigint NOT NULL,
                          at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION chaos_audit_fn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO chaos_audit (id, version) VALUES (NEW.id, NEW.lease_version); RETURN NULL; END
$$;
CREATE TRIGGER chaos_audit_complete AFTER UPDATE ON trio_supervise_items
FOR EACH ROW WHEN (NEW.state = 'completed') EXECUTE FUNCTION chaos_audit_fn();
CREATE TABLE chaos_finish (id text NOT NULL, state text NOT NULL, version bigint NOT NULL);
CREATE FUNCTION chaos_finish_fn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO chaos_finish (id, state, version) VALUES (NEW.id, NEW.state, NEW.lease_version);
RETURN NULL; END
$$;
CREATE TRIGGER chaos_finish_any AFTER UPDATE ON trio_supervise_items
FOR EACH ROW WHEN (NEW.state IN ('completed', 'cancelled', 'dead')
  AND (OLD.state IS DISTINCT FROM NEW.state
       OR OLD.lease_version IS DISTINCT FROM NEW.lease_version))
EXECUTE FUNCTION chaos_finish_fn();
"""


Shape = Callable[[int], dict[str, Any]]
"""Item *n*'s ``enqueue`` arguments besides its spec and id (default: ``config={"n": n}``)."""

Build = Callable[[str, Callable[[], None]], None]
"""Creates the schema at a queue URL and fills the queue in its own way (R9: with another
release of the library), instead of this library's ``migrate`` and ``enqueue``; it calls its
second argument, which adds the audit triggers, once the schema exists and before any item is
written."""

_PARENTS = "SELECT id, parent_id FROM trio_supervise_items WHERE parent_id IS NOT NULL"


def item_id(n: int) -> str:
    return f"item-{n:05d}"


async def _fill(queue: ts.WorkQueue, items: int, parallel: int, shape: Shape | None) -> None:
    ids = iter(range(items))

    async def enqueue_some() -> None:
        for n in ids:
            fields = {"config": {"n": n}} if shape is None else shape(n)
            await queue.enqueue(SPEC, item_id=item_id(n), **fields)

    async with trio.open_nursery() as nursery:
        for _ in range(parallel):
            nursery.start_soon(enqueue_some)


class SQLiteStore(Store):
    name = "sqlite"

    def __init__(
        self,
        directory: Path,
        items: int,
        shape: Shape | None = None,
        *,
        build: Build | None = None,
    ) -> None:
        import sqlite3

        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"chaos-{uuid.uuid4().hex[:8]}.db"
        self.url = f"sqlite:///{self.path}"

        async def fill() -> None:
            async with ts.open_queue(self.url, migrate=True) as queue:
                await _fill(queue, items, 1, shape)

        if build is not None:
            build(self.url, self._add_audit)
        else:
            # The trigger first, so the audit sees every completion.
            trio.run(ts.migrate, self.url)
            self._add_audit()
            trio.run(fill)
        self._conn = sqlite3.connect(self.path, timeout=10, isolation_level=None)

    def _add_audit(self) -> None:
        import sqlite3

        with contextlib.closing(sqlite3.connect(self.path)) as conn:
            conn.executescript(_AUDIT_SQLITE)

    def worker_url(self, app_name: str) -> str:
        return self.url

    def count_completed(self) -> int | None:
        import sqlite3

        try:
            row = self._conn.execute(
                "SELECT count(*) FROM trio_supervise_items WHERE state = 'completed'"
            ).fetchone()
        except sqlite3.OperationalError:
            return None
        return int(row[0])

    def states(self) -> dict[str, int]:
        rows = self._conn.execute(
            "SELECT state, count(*) FROM trio_supervise_items GROUP BY state"
        ).fetchall()
        return dict(rows)

    def audit(self) -> collections.Counter[str]:
        rows = self._conn.execute("SELECT id FROM chaos_audit").fetchall()
        return collections.Counter(row[0] for row in rows)

    def item_states(self) -> dict[str, str]:
        return dict(self._conn.execute("SELECT id, state FROM trio_supervise_items").fetchall())

    def finishes(self) -> collections.Counter[tuple[str, str]]:
        rows = self._conn.execute("SELECT id, state FROM chaos_finish").fetchall()
        return collections.Counter((row[0], row[1]) for row in rows)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        return list(self._conn.execute(sql).fetchall())

    def add_history(self, count: int) -> None:
        now_us = int(time.time() * 1_000_000)
        self._conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) "
            "INSERT INTO trio_supervise_items "
            "(id, spec_id, state, due_at, lease_version, created_at, updated_at) "
            "SELECT printf('done-%07d', i), ?, 'completed', ?, 1, ?, ? FROM n",
            [count, SPEC, now_us, now_us, now_us],
        )
        self._conn.execute("ANALYZE")

    def row(self, item_id: str) -> dict[str, Any] | None:
        cursor = self._conn.execute("SELECT * FROM trio_supervise_items WHERE id = ?", [item_id])
        found = cursor.fetchone()
        if found is None:
            return None
        return {column[0]: value for column, value in zip(cursor.description, found, strict=True)}

    def drop(self) -> None:
        self._conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)


class PostgresStore(Store):
    name = "postgres"

    def __init__(
        self,
        dsn: str,
        items: int,
        tag: str,
        shape: Shape | None = None,
        *,
        build: Build | None = None,
    ) -> None:
        self.dsn = dsn
        self.tag = tag
        self.schema = f"chaos_{uuid.uuid4().hex[:10]}"
        self._conn: Any = None
        if build is not None:
            import psycopg
            from psycopg import sql

            with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
                conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.schema)))
            try:
                build(self.worker_url(f"chaos-{tag}-setup"), self._add_audit)
            except BaseException:
                self.drop()
                raise
            return

        async def fill() -> None:
            queue = await ts.queues.PostgresQueue.connect(
                dsn, schema=self.schema, migrate=True, pool_size=8, listen=False
            )
            async with queue:
                # The trigger first, so the audit sees every completion.
                await trio.to_thread.run_sync(self._add_audit)
                await _fill(queue, items, 8, shape)

        trio.run(fill)

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(
            with_params(self.dsn, application_name=f"chaos-{self.tag}-harness"),
            autocommit=True,
            connect_timeout=2,
            options=f"-c search_path={self.schema}",
        )

    def _add_audit(self) -> None:
        with self._connect() as conn:
            conn.execute(_AUDIT_POSTGRES.encode())

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        try:
            return list(self._conn.execute(sql.encode()).fetchall())
        except Exception:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
            raise

    def add_history(self, count: int) -> None:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        self._conn.execute(
            "INSERT INTO trio_supervise_items "
            "(id, spec_id, state, due_at, lease_version, created_at, updated_at) "
            "SELECT 'done-' || lpad(i::text, 7, '0'), %s, 'completed', now(), 1, now(), now() "
            "FROM generate_series(0, %s - 1) AS i",
            [SPEC, count],
        )
        self._conn.execute("ANALYZE trio_supervise_items")

    def row(self, item_id: str) -> dict[str, Any] | None:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        cursor = self._conn.execute("SELECT * FROM trio_supervise_items WHERE id = %s", [item_id])
        found = cursor.fetchone()
        if found is None:
            return None
        assert cursor.description is not None
        return {column.name: value for column, value in zip(cursor.description, found, strict=True)}

    def worker_url(self, app_name: str) -> str:
        return with_params(
            self.dsn, application_name=app_name, options=f"-c search_path={self.schema}"
        )

    def count_completed(self) -> int | None:
        try:
            rows = self._query(
                "SELECT count(*) FROM trio_supervise_items WHERE state = 'completed'"
            )
        except Exception:
            return None
        return int(rows[0][0])

    def states(self) -> dict[str, int]:
        rows = self._query("SELECT state, count(*) FROM trio_supervise_items GROUP BY state")
        return {state: int(n) for state, n in rows}

    def audit(self) -> collections.Counter[str]:
        return collections.Counter(row[0] for row in self._query("SELECT id FROM chaos_audit"))

    def item_states(self) -> dict[str, str]:
        return dict(self._query("SELECT id, state FROM trio_supervise_items"))

    def finishes(self) -> collections.Counter[tuple[str, str]]:
        rows = self._query("SELECT id, state FROM chaos_finish")
        return collections.Counter((row[0], row[1]) for row in rows)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        return self._query(sql)

    def terminate_workers(self) -> int:
        """``pg_terminate_backend`` on every connection of this run's workers; how many."""
        rows = self._query(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            f"WHERE application_name LIKE 'chaos-{self.tag}-w%'"
        )
        return int(rows[0][0])

    def lock_waits(self, app_name: str) -> int:
        """How many connections named *app_name* wait on a lock right now (0 if unknown)."""
        try:
            rows = self._query(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                f"AND application_name = '{app_name}'"
            )
        except Exception:
            return 0
        return int(rows[0][0])

    def drop(self) -> None:
        import psycopg
        from psycopg import sql

        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema))
            )


# -- the fleet: worker processes, killed, paused and restarted -------------------------------------


def library_env(library: Path = ROOT) -> dict[str, str]:
    """This process's environment for a script that is to import ``trio_supervise`` from the
    directory *library* (first on its ``PYTHONPATH``)."""
    path = os.pathsep.join(p for p in (str(library), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


@dataclasses.dataclass
class Slot:
    index: int
    incarnation: int = 0
    proc: subprocess.Popen[bytes] | None = None
    paused_until: float | None = None
    port_file: Path | None = None
    port: int | None = None


class Fleet:
    """``WORKERS`` worker processes; each slot is restarted with a new worker id when killed."""

    def __init__(
        self,
        store: Store,
        directory: Path,
        sleep: float,
        *,
        tag: str,
        http: bool = False,
        workers: int = WORKERS,
        args: list[str] | None = None,
        slot_args: dict[int, list[str]] | None = None,
        library: Path = ROOT,
    ) -> None:
        self.store = store
        self.dir = directory
        self.sleep = sleep
        self.tag = tag
        self.http = http
        self.args = list(args or [])
        """Extra worker options for every slot (see worker.py)."""
        self.slot_args = dict(slot_args or {})
        """Extra worker options for one slot, by index."""
        self.library = library
        """Where the workers import ``trio_supervise`` from (first on their ``PYTHONPATH``)."""
        self.slots = [Slot(index) for index in range(workers)]
        self.kills = 0
        self.pauses = 0
        self.unexpected_exits: list[str] = []
        self.directory_logs = directory / "logs"
        self.directory_logs.mkdir(parents=True, exist_ok=True)

    def _launch(self, slot: Slot) -> None:
        worker_id = f"w{slot.index}.{slot.incarnation}"
        app_name = f"chaos-{self.tag}-{worker_id}"
        log = self.directory_logs / f"{worker_id}.log"
        args = [
            sys.executable,
            str(WORKER),
            self.store.worker_url(app_name),
            f"{self.tag}-{worker_id}",
            str(log),
            str(self.sleep),
        ]
        if self.http:
            slot.port_file = self.dir / f"{worker_id}.port"
            slot.port = None
            args += ["--http", str(slot.port_file)]
        args += self.args + self.slot_args.get(slot.index, [])
        with (self.directory_logs / f"{worker_id}.stderr").open("wb") as err:
            slot.proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=library_env(self.library),
            )

    def start(self, indexes: list[int] | None = None) -> None:
        """Launch every slot (or the slots at *indexes*)."""
        for slot in self.slots:
            if indexes is None or slot.index in indexes:
                self._launch(slot)

    def wait_for_ports(self, limit: float = 30.0) -> None:
        deadline = time.perf_counter() + limit
        for slot in self.slots:
            if slot.proc is None:
                continue  # not launched (yet)
            assert slot.port_file is not None
            while not slot.port_file.exists():
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"worker {slot.index} did not report its HTTP port")
                if slot.proc is not None and slot.proc.poll() is not None:
                    raise RuntimeError(f"worker {slot.index} exited while starting")
                time.sleep(0.02)
            slot.port = int(slot.port_file.read_text())

    def live(self) -> list[Slot]:
        return [s for s in self.slots if s.paused_until is None]

    def kill(self, slot: Slot) -> None:
        """SIGKILL *slot*'s process and start a new one in its place (a new worker id)."""
        assert slot.proc is not None
        slot.proc.kill()
        slot.proc.wait()
        self.kills += 1
        slot.incarnation += 1
        self._launch(slot)

    def pause(self, slot: Slot, seconds: float) -> None:
        """SIGSTOP *slot* for *seconds*: its leases expire and it wakes up stale."""
        assert slot.proc is not None
        slot.proc.send_signal(signal.SIGSTOP)
        slot.paused_until = time.perf_counter() + seconds
        self.pauses += 1

    def tick(self) -> None:
        """Resume paused workers whose time has come; restart any that exited on their own."""
        now = time.perf_counter()
        for slot in self.slots:
            if slot.proc is None:
                continue  # not launched (yet)
            if slot.paused_until is not None and now >= slot.paused_until:
                slot.proc.send_signal(signal.SIGCONT)
                slot.paused_until = None
            code = slot.proc.poll()
            if code is not None:
                self.unexpected_exits.append(f"w{slot.index}.{slot.incarnation} exited {code}")
                slot.incarnation += 1
                self._launch(slot)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM everyone (after SIGCONT), wait *grace* seconds, SIGKILL what is left."""
        procs = [s.proc for s in self.slots if s.proc is not None]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        deadline = time.perf_counter() + grace
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for slot in self.slots:
            slot.paused_until = None

    def fetch(self, slot: Slot, path: str, timeout: float = 0.5) -> tuple[int, bytes] | None:
        """``GET path`` on *slot*'s HTTP server: ``(status, body)``, or None if no answer."""
        if slot.port is None:
            return None
        url = f"http://127.0.0.1:{slot.port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return int(response.status), response.read()
        except urllib.error.HTTPError as error:
            return int(error.code), error.read()
        except (OSError, ValueError):
            return None

    def healthz(self, slot: Slot) -> dict[str, Any] | None:
        answer = self.fetch(slot, "/healthz")
        if answer is None:
            return None
        body = answer[1]
        try:
            document: dict[str, Any] = json.loads(body)
        except ValueError:
            return None
        return document

    def stderr_excerpt(self, lines: int = 20) -> str:
        texts = []
        for path in sorted(self.directory_logs.glob("*.stderr")):
            text = path.read_text(errors="replace")
            if "Traceback" in text:
                texts.append(f"--- {path.name}\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(texts)


def runner_state(document: dict[str, Any] | None) -> str | None:
    if document is None:
        return None
    for worker in document.get("workers", []):
        if worker.get("worker") == "runner":
            return str(worker.get("state"))
    return None


# -- reading the logs ------------------------------------------------------------------------------


@dataclasses.dataclass
class LogStats:
    claimed: int = 0
    outcomes: int = 0
    settled: int = 0
    settle_refused: int = 0
    settle_failed: int = 0
    renewals_refused: int = 0
    claim_failed: int = 0
    renewal_failed: int = 0
    completions: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    claims: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


def read_logs(directory: Path, prefix: str = "") -> LogStats:
    """What the workers' logs (those whose file name starts with *prefix*) say happened."""
    stats = LogStats()
    for path in directory.glob(f"{prefix}*.log"):
        with path.open(encoding="utf-8", errors="replace") as file:
            for line in file:
                parts = line.rstrip("\n").split("\t")
                if len(parts) < 4:
                    continue  # a line cut short by SIGKILL
                kind, item_id, _, detail = parts[:4]
                if kind == "claimed":
                    stats.claimed += 1
                    stats.claims[item_id] += 1
                elif kind == "outcome":
                    stats.outcomes += 1
                elif kind == "settled":
                    stats.settled += 1
                    if detail == "complete":
                        stats.completions[item_id] += 1
                elif kind == "settle-refused":
                    stats.settle_refused += 1
                elif kind == "settle-failed":
                    stats.settle_failed += 1
                elif kind == "lease-lost" and detail == "renewal refused":
                    stats.renewals_refused += 1
                elif kind == "claim-failed":
                    stats.claim_failed += 1
                elif kind == "renewal-failed":
                    stats.renewal_failed += 1
    return stats


# -- one run ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Plan:
    items: int
    sleep: float
    fault_every: float = 2.0
    pause_every: int = 4
    """Every this many faults is a SIGSTOP past the lease instead of a SIGKILL (0: never)."""
    limit: float = 600.0


def _audit(store: Store, items: int, fleet: Fleet, seconds: float) -> dict[str, Any]:
    logs = read_logs(fleet.directory_logs)
    states = store.states()
    audit = store.audit()
    completed = states.get("completed", 0)
    db_double = sum(1 for n in audit.values() if n > 1)
    log_double = sum(1 for n in logs.completions.values() if n > 1)
    return {
        "items": items,
        "completed": completed,
        "lost": items - completed,
        "double_finalized": max(db_double, log_double),
        "double_finalized_db": db_double,
        "double_finalized_log": log_double,
        "stale_refused": logs.settle_refused + logs.renewals_refused,
        "settle_refused": logs.settle_refused,
        "renewals_refused": logs.renewals_refused,
        "evaluations": logs.claimed,
        "outcomes": logs.outcomes,
        "settle_failed": logs.settle_failed,
        "claim_failed": logs.claim_failed,
        "renewal_failed": logs.renewal_failed,
        "completed_unlogged": sum(1 for item in audit if item not in logs.completions),
        "states": states,
        "kills": fleet.kills,
        "pauses": fleet.pauses,
        "unexpected_exits": fleet.unexpected_exits,
        "seconds": round(seconds, 2),
    }


def run_r1(store: Store, plan: Plan, directory: Path, *, chaos: bool, tag: str) -> dict[str, Any]:
    """Drain *store* with the fleet; SIGKILL (or SIGSTOP) a random worker every ~2 s if *chaos*."""
    rng = random.Random(f"{tag}-{store.name}-{chaos}")
    fleet = Fleet(store, directory, plan.sleep, tag=tag)
    faults = 0
    timed_out = False
    try:
        fleet.start()
        started = time.perf_counter()
        next_fault = started + plan.fault_every * rng.uniform(0.5, 1.5)
        while True:
            done = store.count_completed()
            now = time.perf_counter()
            if done is not None and done >= plan.items:
                break
            if now - started > plan.limit:
                timed_out = True
                break
            fleet.tick()
            if chaos and now >= next_fault:
                candidates = fleet.live()
                if candidates:
                    victim = rng.choice(candidates)
                    faults += 1
                    if plan.pause_every and faults % plan.pause_every == 0:
                        fleet.pause(victim, LEASE + 1.5)
                    else:
                        fleet.kill(victim)
                next_fault = now + plan.fault_every * rng.uniform(0.5, 1.5)
            time.sleep(0.05)
        seconds = time.perf_counter() - started
    finally:
        fleet.stop()
    result = _audit(store, plan.items, fleet, seconds)
    result["timed_out"] = timed_out
    excerpt = fleet.stderr_excerpt()
    if excerpt:
        result["worker_tracebacks"] = excerpt[-4000:]
    return result


# -- R2: PostgreSQL faults -------------------------------------------------------------------------


def _cluster_for(dsn: str) -> tuple[str, str] | None:
    """The local ``(version, name)`` cluster serving *dsn*, if this machine can stop it."""
    if shutil.which("pg_ctlcluster") is None or shutil.which("pg_lsclusters") is None:
        return None
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(dsn)
    host = str(info.get("host", "localhost"))
    if host not in ("127.0.0.1", "localhost", "::1") and not host.startswith("/"):
        return None
    port = str(info.get("port", "5432"))
    listing = subprocess.run(
        ["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=False
    ).stdout
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == port:
            return fields[0], fields[1]
    return None


def _pg_ctl(cluster: tuple[str, str], action: str) -> None:
    subprocess.run(
        [
            "pg_ctlcluster",
            "--skip-systemctl-redirect",
            *cluster,
            action,
            *(["-m", "fast"] if action == "stop" else []),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )


@contextlib.contextmanager
def server_stopped(cluster: tuple[str, str]) -> Iterator[None]:
    """The PostgreSQL cluster stopped for the body; always started again, however it ends."""
    _pg_ctl(cluster, "stop")
    try:
        yield
    finally:
        for attempt in range(5):
            try:
                _pg_ctl(cluster, "start")
                break
            except subprocess.SubprocessError as error:
                print(f"chaos: starting PostgreSQL failed ({error}); retrying", file=sys.stderr)
                time.sleep(1 + attempt)
        else:  # pragma: no cover - loud, and the caller's error says the rest
            print("chaos: !!! COULD NOT START POSTGRESQL AGAIN !!!", file=sys.stderr)


def run_r2(
    dsn: str,
    plan: Plan,
    directory: Path,
    *,
    tag: str,
    stop_window: float | None,
    terminate_every: float = 1.0,
) -> dict[str, Any]:
    """Workers' connections terminated repeatedly; with *stop_window*, the server stopped too."""
    rng = random.Random(f"{tag}-r2")
    cluster = _cluster_for(dsn) if stop_window else None
    store = PostgresStore(dsn, plan.items, tag)
    fleet = Fleet(store, directory, plan.sleep, tag=tag, http=True)
    terminated = 0
    terminations = 0
    seen: dict[int, list[tuple[float, str | None]]] = {s.index: [] for s in fleet.slots}
    outage: tuple[float, float] | None = None
    timed_out = False
    final_states: dict[int, str | None] = {}
    try:
        fleet.start()
        fleet.wait_for_ports()
        started = time.perf_counter()
        next_terminate = started + terminate_every
        while True:
            now = time.perf_counter()
            done = store.count_completed()
            if done is not None and done >= plan.items:
                break
            if now - started > plan.limit:
                timed_out = True
                break
            for slot in fleet.slots:
                seen[slot.index].append((now - started, runner_state(fleet.healthz(slot))))
            for slot in fleet.slots:
                assert slot.proc is not None
                if slot.proc.poll() is not None:
                    fleet.unexpected_exits.append(f"w{slot.index} exited {slot.proc.returncode}")
            if fleet.unexpected_exits:
                break  # R2 asks for recovery without a restart: a dead worker ends the run
            if now >= next_terminate:
                with contextlib.suppress(Exception):
                    terminated += store.terminate_workers()
                    terminations += 1
                next_terminate = now + terminate_every * rng.uniform(0.5, 1.5)
            if (
                cluster is not None
                and stop_window is not None
                and outage is None
                and done is not None
                and done >= plan.items * 0.3
            ):
                down = time.perf_counter()
                with server_stopped(cluster):
                    while time.perf_counter() - down < stop_window:
                        for slot in fleet.slots:
                            seen[slot.index].append(
                                (time.perf_counter() - started, runner_state(fleet.healthz(slot)))
                            )
                        time.sleep(0.1)
                    up = time.perf_counter()
                outage = (down - started, up - started)
            time.sleep(0.1)
        seconds = time.perf_counter() - started
        for slot in fleet.slots:
            final_states[slot.index] = runner_state(fleet.healthz(slot))
    finally:
        fleet.stop()
    try:
        result = _audit(store, plan.items, fleet, seconds)
    finally:
        store.drop()

    # degraded_seen: while the server was down (and until 5 s after it was back, the time a
    # worker needs to notice), every worker's /healthz showed its runner backing-off.
    degraded: dict[int, bool] = {}
    if outage is not None:
        start, end = outage
        for index, polls in seen.items():
            degraded[index] = any(
                start <= at <= end + 5.0 and state == "backing-off" for at, state in polls
            )
    restarted = [s.index for s in fleet.slots if s.incarnation != 0] + fleet.unexpected_exits
    result.update(
        {
            "terminations": terminations,
            "backends_terminated": terminated,
            "server_stop": None
            if outage is None
            else {"window_seconds": round(outage[1] - outage[0], 2), "at_seconds": outage[0]},
            "server_stop_skipped": None
            if outage is not None
            else ("disabled" if not stop_window else "no local cluster to stop"),
            "degraded_seen": bool(degraded) and all(degraded.values()),
            "degraded_definition": (
                "every worker's /healthz listed its runner as backing-off at least once between "
                "the server stop and 5 s after it was started again"
            ),
            "degraded_per_worker": degraded,
            "recovered": (
                not timed_out
                and result["lost"] == 0
                and not restarted
                and all(state == "running" for state in final_states.values())
            ),
            "final_runner_states": final_states,
            "timed_out": timed_out,
        }
    )
    excerpt = fleet.stderr_excerpt()
    if excerpt:
        result["worker_tracebacks"] = excerpt[-4000:]
    return result


# -- everything ------------------------------------------------------------------------------------


def postgres_problem(dsn: str) -> str | None:
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=3):
            pass
    except Exception as error:
        return f"PostgreSQL at {ts.queues._sql.redact_dsn(dsn)} is unreachable: {error}"
    return None


def r1_backend(
    kind: str, plan: Plan, base: Path, *, dsn: str | None, tag: str, log: Any
) -> dict[str, Any]:
    """A calm run and a chaos run of the same size on a fresh queue each; their figures."""
    results: dict[str, dict[str, Any]] = {}
    for chaos in (False, True):
        label = "chaos" if chaos else "calm"
        directory = base / f"r1-{kind}-{label}"
        run_tag = f"{tag}{kind[0]}{label[0]}"
        store: Store = (
            SQLiteStore(directory, plan.items)
            if kind == "sqlite"
            else PostgresStore(dsn or "", plan.items, run_tag)
        )
        try:
            log(f"R1 {kind} {label}: {plan.items} items, {WORKERS} workers ...")
            results[label] = run_r1(store, plan, directory, chaos=chaos, tag=run_tag)
            log(
                f"R1 {kind} {label}: {results[label]['completed']} completed in "
                f"{results[label]['seconds']} s"
            )
        finally:
            store.drop()
    calm, chaos_run = results["calm"], results["chaos"]
    figures = dict(chaos_run)
    figures["calm_seconds"] = calm["seconds"]
    figures["chaos_seconds"] = chaos_run["seconds"]
    figures["calm_lost"] = calm["lost"]
    figures["calm_double_finalized"] = calm["double_finalized"]
    figures["throughput_ratio"] = (
        round(calm["seconds"] / chaos_run["seconds"], 3) if chaos_run["seconds"] else 0.0
    )
    figures.pop("seconds", None)
    return figures


def run_scenario(
    part: str, kind: str, quick: bool, base: Path, *, dsn: str, tag: str, log: Any
) -> dict[str, Any]:
    """One R6/R7/R8 run on a fresh *kind* store, bounded; its figures."""
    from . import scenarios  # it builds on this module

    items = {"r6": 10, "r7": 10, "r8": 6}[part]
    directory = base / f"{part}-{kind}"
    run_tag = f"{tag}{part}{kind[0]}"
    store: Store = (
        SQLiteStore(directory, items) if kind == "sqlite" else PostgresStore(dsn, items, run_tag)
    )
    try:
        if part == "r6":
            history = R6_HISTORY
            clients = 40 if quick else 100
            log(f"R6 {kind}: {history} finished rows, 2 workers, {clients} clients reading")
            figures = scenarios.run_r6(
                store, directory, tag=run_tag, history=history, clients=clients, limit=120
            )
        elif part == "r7":
            log(f"R7 {kind}: a batch of {items}, one item's error text holds a lone surrogate")
            figures = scenarios.run_r7(
                store, directory, tag=run_tag, max_attempts=3, limit=30 if quick else 60
            )
        else:
            log(f"R8 {kind}: a worker blocks its event loop past the lease, another takes over")
            figures = scenarios.run_r8(store, directory, tag=run_tag, items=items, limit=60)
    finally:
        store.drop()
    log(f"{part.upper()} {kind}: done in {figures['seconds']} s")
    return figures


def goals(report: dict[str, Any]) -> list[str]:
    """Every goal the report misses, as a sentence."""
    from . import races, scenarios, upgrade  # they build on this module

    missed = []
    for name, figures in report.get("r1", {}).items():
        if "skipped" in figures:
            continue
        for key in ("lost", "double_finalized", "calm_lost", "calm_double_finalized"):
            if figures[key] != 0:
                missed.append(f"R1 {name}: {key} = {figures[key]} (goal 0)")
        if figures["throughput_ratio"] < 0.5:
            missed.append(
                f"R1 {name}: throughput_ratio = {figures['throughput_ratio']} (goal >= 0.5)"
            )
        if figures.get("timed_out"):
            missed.append(f"R1 {name}: timed out")
    missed += scenarios.goals(report) + upgrade.goals(report) + races.goals(report)
    r2 = report.get("r2", {})
    if r2 and "skipped" not in r2:
        for key in ("lost", "double_finalized"):
            if r2[key] != 0:
                missed.append(f"R2: {key} = {r2[key]} (goal 0)")
        if r2["server_stop"] is not None and not r2["degraded_seen"]:
            missed.append("R2: degraded_seen = false (goal true)")
        if not r2["recovered"]:
            missed.append("R2: recovered = false (goal true)")
    return missed


def run_all(
    *,
    quick: bool,
    dsn: str,
    only: set[str],
    stop_window: float | None,
    items: int | None,
    log: Any,
) -> dict[str, Any]:
    from . import races, upgrade  # they build on this module

    tag = uuid.uuid4().hex[:6]
    n = items if items is not None else (1000 if quick else 10_000)
    plan = Plan(items=n, sleep=0.4 if quick else 0.1, limit=300 if quick else 1200)
    began = time.perf_counter()
    report: dict[str, Any] = {
        "mode": "quick" if quick else "full",
        "workers": WORKERS,
        "lease_seconds": LEASE,
        "driver_sleep_seconds": plan.sleep,
        "fault_every_seconds": plan.fault_every,
        "r1": {},
    }
    base = Path(tempfile.mkdtemp(prefix="trio-supervise-chaos-"))
    try:
        pg_parts = {"r1-postgres", "r2", "r6", "r7", "r9", *races.PARTS}
        pg_problem = postgres_problem(dsn) if pg_parts & only else None
        if "r1-sqlite" in only:
            report["r1"]["sqlite"] = r1_backend("sqlite", plan, base, dsn=None, tag=tag, log=log)
        if "r1-postgres" in only:
            if pg_problem:
                report["r1"]["postgres"] = {"skipped": pg_problem}
            else:
                report["r1"]["postgres"] = r1_backend(
                    "postgres", plan, base, dsn=dsn, tag=tag, log=log
                )
        both = ("sqlite", "postgres")
        runs = {"r6": run_scenario, "r7": run_scenario, "r9": upgrade.run_part}
        for part, backends in (("r6", both), ("r7", both), ("r9", both), *races.BACKENDS.items()):
            if part in only:
                run = runs.get(part, races.run_part)
                report[part] = {
                    kind: run(part, kind, quick, base, dsn=dsn, tag=tag, log=log)
                    if kind == "sqlite" or not pg_problem
                    else {"skipped": pg_problem}
                    for kind in backends
                }
        if "r8" in only:
            report["r8"] = run_scenario("r8", "sqlite", quick, base, dsn=dsn, tag=tag, log=log)
        if "r2" in only:
            if pg_problem:
                report["r2"] = {"skipped": pg_problem}
            else:
                log(f"R2 postgres: {n} items, connections terminated, server stop {stop_window} s")
                report["r2"] = run_r2(
                    dsn, plan, base / "r2", tag=f"{tag}x", stop_window=stop_window
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report["wall_seconds"] = round(time.perf_counter() - began, 1)
    report["missed"] = goals(report)
    report["goals_met"] = not report["missed"]
    return report
