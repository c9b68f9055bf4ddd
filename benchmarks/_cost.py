"""What one completed item costs the PostgreSQL server and the worker: CPU seconds and WAL bytes.

A fleet on one PostgreSQL is bounded by the server's CPU and its WAL disk, not by its worker
processes (issue 34), so P8c and P14 measure both per item, for our runner, PgQueuer and the raw
SQL floor, each in a database of its own on the same server:

- **CPU**: the worker process's CPU time (``time.process_time()``, less the meter's own thread)
  plus that of every server backend connected to the measured database, read from
  ``/proc/<pid>/stat`` by a thread that polls ``pg_stat_activity`` (a backend that appears during
  the window counts from zero). Shared server processes (the WAL writer, the checkpointer,
  autovacuum) are not counted: they serve every database alike.
- **WAL**: the records between the window's two LSNs that touch the measured database's
  relations, and every record of the transactions that wrote them (their commit records), summed
  by ``pg_waldump`` over the server's ``pg_wal``. Other databases' work on the same server is left
  out, so the figure holds on a shared server. Where ``pg_waldump`` or ``pg_wal`` cannot be read
  (a remote server), the cluster-wide LSN difference is reported instead, and said so.

The meter needs a local server (``/proc`` of its backends): elsewhere CPU is NaN.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

POLL_SECONDS = 0.05

_RECORD = re.compile(r"len \(rec/tot\):\s*\d+/\s*(\d+), tx:\s*(\d+),")
_RELATION = re.compile(r"rel \d+/(\d+)/\d+")


@attrs.define
class Cost:
    """A window's cost, filled in when the ``with`` block ends."""

    worker_cpu: float = math.nan
    """Seconds of CPU in the worker process (this one, or the one that ran the meter)."""
    server_cpu: float = math.nan
    """Seconds of CPU in the measured database's server backends."""
    wal_bytes: float = math.nan
    """WAL bytes written for the measured database (or the whole cluster, see *wal_scope*)."""
    wal_scope: str = "database"
    """``database`` (attributed by ``pg_waldump``) or ``cluster`` (the LSN difference)."""

    def per_item(self, items: int) -> dict[str, Any]:
        """The figures per item (CPU in microseconds, WAL in bytes)."""
        return {
            "worker_cpu_us": round(self.worker_cpu / items * 1e6, 2),
            "server_cpu_us": round(self.server_cpu / items * 1e6, 2),
            "cpu_us": round((self.worker_cpu + self.server_cpu) / items * 1e6, 2),
            "wal_bytes": round(self.wal_bytes / items, 1),
            "wal_scope": self.wal_scope,
        }


def _ticks(pid: int) -> int | None:
    """User plus system CPU ticks of *pid* so far; None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)


class _BackendPoller(threading.Thread):
    """Polls the measured database's backends and keeps each one's first and last CPU ticks."""

    def __init__(self, conn: Any, database: str, exclude: int) -> None:
        super().__init__(daemon=True)
        self._conn, self._database, self._exclude = conn, database, exclude
        self._done = threading.Event()
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.own_cpu = 0.0
        self.poll(initial=True)

    def poll(self, initial: bool = False) -> None:
        rows = self._conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> %s",
            (self._database, self._exclude),
        ).fetchall()
        for (pid,) in rows:
            ticks = _ticks(pid)
            if ticks is None:
                continue
            self.first.setdefault(pid, ticks if initial else 0)
            self.last[pid] = ticks

    def run(self) -> None:
        started = time.thread_time()
        while not self._done.wait(POLL_SECONDS):
            self.poll()
        self.own_cpu = time.thread_time() - started

    def finish(self) -> float:
        """Stop polling; the backends' CPU seconds over the window."""
        self._done.set()
        self.join()
        self.poll()
        ticks = sum(self.last[pid] - self.first[pid] for pid in self.last)
        return ticks / os.sysconf("SC_CLK_TCK")


def _wal_bytes(conn: Any, start: str, end: str, database_oid: int) -> tuple[float, str]:
    """WAL bytes between *start* and *end* for *database_oid*, by ``pg_waldump``; the
    cluster-wide difference (and ``cluster``) when that cannot be read."""
    (total,) = conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", (end, start)).fetchone()
    (directory,) = conn.execute("SHOW data_directory").fetchone()
    waldump = shutil.which("pg_waldump") or _server_binary(conn, "pg_waldump")
    wal = Path(directory) / "pg_wal"
    if waldump is None or not os.access(wal, os.R_OK):
        return float(total), "cluster"
    done = subprocess.run(
        [waldump, "-p", str(wal), "-s", start, "-e", end],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0 and not done.stdout:
        return float(total), "cluster"
    return float(attributed_bytes(done.stdout.splitlines(), database_oid)), "database"


def attributed_bytes(lines: Iterable[str], database_oid: int) -> int:
    """The bytes of ``pg_waldump`` record *lines* that touch *database_oid*'s relations, and of
    every record of the transactions that wrote those (their commits)."""
    ours: set[int] = set()
    records: list[tuple[int, int, bool]] = []
    for line in lines:
        matched = _RECORD.search(line)
        if matched is None:
            continue
        size, xid = int(matched[1]), int(matched[2])
        mine = any(int(oid) == database_oid for oid in _RELATION.findall(line))
        if mine and xid:
            ours.add(xid)
        records.append((size, xid, mine))
    return sum(size for size, xid, mine in records if mine or (xid and xid in ours))


def _server_binary(conn: Any, name: str) -> str | None:
    """*name* beside the running server's binaries (Debian keeps them off PATH)."""
    (version,) = conn.execute("SHOW server_version_num").fetchone()
    candidate = Path(f"/usr/lib/postgresql/{int(version) // 10000}/bin/{name}")
    return str(candidate) if candidate.exists() else None


@contextlib.contextmanager
def server_cost(dsn: str) -> Iterator[Cost]:
    """Meter the ``with`` block: CPU of this process and of *dsn*'s database's backends, and
    the WAL written for that database. The figures land in the yielded :class:`Cost` on exit."""
    import psycopg

    cost = Cost()
    with psycopg.connect(dsn, autocommit=True) as conn:
        database, oid, pid = conn.execute(
            "SELECT current_database(), (SELECT oid FROM pg_database"
            " WHERE datname = current_database()), pg_backend_pid()"
        ).fetchone()
        poller = _BackendPoller(conn, database, pid)
        (start,) = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        cpu = time.process_time()
        poller.start()
        try:
            yield cost
        finally:
            server = poller.finish()
            cost.worker_cpu = time.process_time() - cpu - poller.own_cpu
            cost.server_cpu = server
            (end,) = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            # pg_waldump reads the segment files: wait (briefly) for the WAL writer to flush.
            for _ in range(50):
                (flushed,) = conn.execute(
                    "SELECT pg_wal_lsn_diff(pg_current_wal_flush_lsn(), %s) >= 0", (end,)
                ).fetchone()
                if flushed:
                    break
                time.sleep(0.02)
            cost.wal_bytes, cost.wal_scope = _wal_bytes(conn, start, end, oid)
