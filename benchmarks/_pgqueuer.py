"""One P8 PgQueuer worker: drain *count* pre-enqueued no-op jobs, print the rate as JSON.

``python -m benchmarks._pgqueuer DSN COUNT BATCH [BATCH ...]``: in a database of its own (the
parent creates and drops it), installs PgQueuer's schema, then for each batch size enqueues
*count* no-op jobs (setup, in batches of 1,000 through PgQueuer's own ``Queries.enqueue``) and
times one ``QueueManager.run(mode=drain)`` from its start until it returns, with PgQueuer at its
fastest: the asyncpg driver, uvloop, no ``max_concurrent_tasks`` cap. Prints one line,
``{"rates": {"64": items/s, ...}, "cores": {"64": cores busy, ...}, "costs": {"64": {...}}}``
(the machine's busy cores during each drain, see ``machine_cpu``; each drain's CPU and WAL per
job, see ``_cost.server_cost``). A separate process because PgQueuer is asyncio.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from ._common import machine_cpu, noop_step
from ._cost import server_cost

ENQUEUE_BATCH = 1000


def asyncpg_params(dsn: str) -> dict[str, Any]:
    """asyncpg's ``connect`` keyword arguments for any libpq DSN (URL or ``key=value``)."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(dsn)
    names = {"host": "host", "port": "port", "user": "user", "password": "password"}
    kwargs: dict[str, Any] = {new: params[old] for old, new in names.items() if old in params}
    if "port" in kwargs:
        kwargs["port"] = int(str(kwargs["port"]))
    if "dbname" in params:
        kwargs["database"] = params["dbname"]
    if "sslmode" in params:
        kwargs["ssl"] = params["sslmode"]  # asyncpg takes libpq's mode names
    return kwargs


async def drain(dsn: str, count: int, batch_size: int) -> tuple[float, float, dict[str, Any]]:
    import asyncpg
    from pgqueuer import QueueManager
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    connection = await asyncpg.connect(**asyncpg_params(dsn))
    try:
        queries = Queries(AsyncpgDriver(connection))
        if not await queries.schema_is_installed():
            await queries.install()
        for start in range(0, count, ENQUEUE_BATCH):
            size = min(ENQUEUE_BATCH, count - start)
            await queries.enqueue(["noop"] * size, [None] * size, [0] * size)
        manager = QueueManager(queries)
        done = 0

        @manager.entrypoint("noop")
        async def noop(job: Job) -> None:
            nonlocal done
            await noop_step()
            done += 1

        with machine_cpu() as cpu, server_cost(dsn) as cost:
            started = time.perf_counter()
            await manager.run(batch_size=batch_size, mode=QueueExecutionMode.drain)
            seconds = time.perf_counter() - started
        left = await connection.fetchval("SELECT count(*) FROM pgqueuer")
        if done != count or left != 0:
            raise RuntimeError(f"PgQueuer: {done} of {count} jobs ran, {left} left")
        return count / seconds, cpu.cores, cost.per_item(count)
    finally:
        await connection.close()


async def main(dsn: str, count: int, batches: list[int]) -> dict[str, dict[str, Any]]:
    rates: dict[str, float] = {}
    cores: dict[str, float] = {}
    costs: dict[str, dict[str, Any]] = {}
    for batch in batches:
        rates[str(batch)], cores[str(batch)], costs[str(batch)] = await drain(dsn, count, batch)
    return {"rates": rates, "cores": cores, "costs": costs}


if __name__ == "__main__":
    import uvloop

    dsn, count = sys.argv[1], int(sys.argv[2])
    batches = [int(arg) for arg in sys.argv[3:]]
    print(json.dumps(uvloop.run(main(dsn, count, batches))), flush=True)
