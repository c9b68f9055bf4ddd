"""P5: memory per idle supervised worker against a bare sleeping Trio task.

Each side runs in a subprocess of its own (``python -m benchmarks.supervision bare|supervised
N``), so neither sees the other's heap: it starts ``tracemalloc``, starts *N* idle workers (each
``await trio.sleep_forever()``), and prints the traced bytes gained per worker once all are
running. The supervised side also counts the supervisor's records for each child (its slot,
state value, cancel scope, the task that watches the child); the bare side is the task alone.
"""

from __future__ import annotations

import gc
import json
import sys
import tracemalloc

import trio

import trio_supervise as ts

from ._common import Config, Result, run_json


async def _idle() -> None:
    await trio.sleep_forever()


async def _bare(count: int) -> int:
    async with trio.open_nursery() as nursery:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(count):
            nursery.start_soon(_idle)
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - before
        nursery.cancel_scope.cancel()
    return used


async def _supervised(count: int) -> int:
    async with trio.open_nursery() as nursery:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        supervisor = ts.Supervisor(
            name="bench", children=[ts.ChildSpec(f"w{n}", _idle) for n in range(count)]
        )
        await nursery.start(supervisor.run)
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - before
        if sum(1 for s in supervisor.states.values() if s is ts.WorkerState.RUNNING) != count:
            raise RuntimeError("P5: not every supervised worker is running")
        nursery.cancel_scope.cancel()
    return used


def measure_here(kind: str, count: int) -> float:
    """Bytes per worker, measured in this process."""
    import trio.testing

    tracemalloc.start()
    used: int = trio.run(_bare if kind == "bare" else _supervised, count)
    tracemalloc.stop()
    return used / count


def measure(kind: str, count: int) -> float:
    """Bytes per worker, measured in a fresh subprocess."""
    return float(run_json("benchmarks.supervision", kind, count)["bytes_per_worker"])


def p5(config: Config) -> Result:
    count = config.size(10_000, 10_000, 100)
    bare = measure("bare", count)
    ours = measure("supervised", count)
    return Result(
        id="P5",
        title=f"memory per idle supervised worker ({count:,} workers)",
        ours=ours,
        baseline=bare,
        baseline_name="a bare Trio task sleeping forever",
        better="lower",
        goal=2.0,
        unit="bytes",
        detail={"workers": count, "method": "tracemalloc, one subprocess per side"},
    )


if __name__ == "__main__":
    kind, count = sys.argv[1], int(sys.argv[2])
    print(json.dumps({"bytes_per_worker": measure_here(kind, count)}))
