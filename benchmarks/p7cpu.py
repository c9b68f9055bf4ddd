"""P7's drains metered: CPU per item of one worker process and of two (issue 34).

``python -m benchmarks.p7cpu DSN [--items N] [--rounds R]`` runs P7's drain (the same worker
processes, :mod:`benchmarks._worker`) with one process and with two, in turns, and prints per
run: items per second, the machine's busy cores, and the CPU per item of the worker processes
(their own count, from "go" to "done") and of the server backends connected to the database
(``/proc``, as P8c reads it), with the claim index's heap fetches per item. On a machine that
other work keeps busy, P7's ratio (its ceiling read from the busy cores) says little; the CPU an
item costs with two processes against one says what the second process costs.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import psycopg

from ._common import machine_cpu, now
from ._cost import _BackendPoller
from .postgres import _RUN, bench_schema, completed, fill, go_and_wait, worker_processes

SCHEMA = f"bench_p7cpu_{_RUN}"

_FETCHES = """
SELECT coalesce(sum(idx_tup_fetch), 0)::bigint FROM pg_stat_user_indexes
WHERE schemaname = %s AND indexrelname = 'trio_supervise_items_claim_idx'
"""


def _fetches(conn: psycopg.Connection[Any]) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(_FETCHES, (SCHEMA,)).fetchone()
    assert row is not None
    return int(row[0])


def drain(dsn: str, count: int, processes: int) -> dict[str, float]:
    """One metered drain of *count* items by *processes* worker processes."""
    fill(dsn, SCHEMA, count)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_database(), pg_backend_pid()").fetchone()
        assert row is not None
        database, pid = row
        with worker_processes(dsn, SCHEMA, processes) as workers:
            fetches = _fetches(conn)
            poller = _BackendPoller(conn, database, pid)
            with machine_cpu() as cpu:
                start = now()
                poller.start()
                done = go_and_wait(workers)
                server_cpu = poller.finish()
        # The statistics collector reports a backend's counts when its transaction ends.
        conn.execute("SELECT pg_sleep(0.7)")
        fetches = _fetches(conn) - fetches
    if completed(dsn, SCHEMA) != count:
        raise RuntimeError("not every item completed")
    ends = [end for end, _ in done]
    worker_cpu = sum(seconds for _, seconds in done)
    return {
        "processes": processes,
        "items_per_s": round(count / (max(ends) - start)),
        "cores_busy": round(cpu.cores, 2),
        "cpu_us": round((worker_cpu + server_cpu) / count * 1e6, 1),
        "worker_us": round(worker_cpu / count * 1e6, 1),
        "server_us": round(server_cpu / count * 1e6, 1),
        "claim_fetches": round(fetches / count, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dsn")
    parser.add_argument("--items", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with bench_schema(args.dsn, SCHEMA):
        for _ in range(args.rounds):
            for processes in (1, 2):
                print(json.dumps(drain(args.dsn, args.items, processes)), flush=True)


if __name__ == "__main__":
    main()
