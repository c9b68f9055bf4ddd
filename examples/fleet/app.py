"""The fleet's worker: a checksum driver whose results land in a directory, one file per job."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import attrs
import trio

from trio_supervise import Outcome, Service, Stop, WorkItem

SPEC_ID = "checksum"
"""The spec id of a job."""


@attrs.frozen
class ChecksumJob:
    """A job's config: what to hash, how many rounds, and how long the "I/O" takes."""

    text: str
    rounds: int = 1000
    io_seconds: float = 0.1


def checksum(text: str, rounds: int) -> str:
    """SHA-256 applied *rounds* times."""
    digest = text.encode()
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()


class Results(Protocol):
    """Where results go: ``save`` is called once per job (by whichever worker ran it)."""

    async def save(self, item_id: str, worker: str, result: str) -> None: ...


@attrs.frozen
class ResultStore:
    """Writes each job's result to ``<directory>/<item id>.json``, refusing to overwrite one: a
    job evaluated twice would be an item error, not a silent duplicate."""

    directory: Path

    async def save(self, item_id: str, worker: str, result: str) -> None:
        document = json.dumps({"item": item_id, "worker": worker, "checksum": result})
        await trio.to_thread.run_sync(self._write, item_id, document)

    def _write(self, item_id: str, document: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / f"{item_id}.json").open("x", encoding="utf-8") as file:
            file.write(document)


async def _in_a_thread(function: Callable[[str, int], str], text: str, rounds: int) -> str:
    return await trio.to_thread.run_sync(function, text, rounds)


@attrs.frozen
class ChecksumDriver:
    """Computes a job's checksum, waits out its simulated I/O, saves the result, and stops.

    :param worker: this process's name in the results.
    :param offload: runs the CPU-bound checksum (in a worker thread by default; tests under
        virtual time run it inline, since a thread's real time would let the clock jump).
    """

    worker: str = attrs.field(factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    offload: Callable[[Callable[[str, int], str], str, int], Awaitable[str]] = _in_a_thread

    name = "checksum"
    spec_ids = (SPEC_ID,)
    config_type = ChecksumJob

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: Results, item: WorkItem) -> Outcome:
        job: ChecksumJob = item.config
        result = await self.offload(checksum, job.text, job.rounds)
        await trio.sleep(job.io_seconds)
        await context.save(item.id, self.worker, result)
        return Stop()


def build_service(*, results: Path | None = None) -> Service:
    """One worker process: the checksum runner and the operations HTTP server.

    Results go to *results* (default: ``$FLEET_RESULTS``, else ``results/`` in the working
    directory). Everything else comes from settings: ``TRIO_SUPERVISE_DATABASE_URL`` (SQLite in
    ``trio_supervise.db`` by default), ``TRIO_SUPERVISE_HTTP__PORT`` and the rest.
    """
    store = ResultStore(results or Path(os.environ.get("FLEET_RESULTS", "results")))

    async def build_context() -> ResultStore:
        await trio.lowlevel.checkpoint()
        return store

    return Service(drivers=[ChecksumDriver()], build_context=build_context, name="fleet")
