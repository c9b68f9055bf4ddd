"""``python -m examples.fleet.enqueue COUNT``: add COUNT checksum jobs to the configured queue.

Jobs are named ``PREFIX-00000`` ... and carry that name as their idempotency key, so running the
script again with the same prefix adds nothing twice.
"""

from __future__ import annotations

import argparse

import trio

from trio_supervise import load_settings, open_queue

from .app import SPEC_ID


async def enqueue(url: str, count: int, prefix: str, rounds: int, io_seconds: float) -> None:
    """Enqueue *count* jobs on the queue at *url* (those enqueued before are left alone)."""
    async with open_queue(url) as queue:
        for n in range(count):
            item_id = f"{prefix}-{n:05}"
            await queue.enqueue(
                SPEC_ID,
                item_id=item_id,
                idempotency_key=item_id,
                config={"text": item_id, "rounds": rounds, "io_seconds": io_seconds},
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.fleet.enqueue")
    parser.add_argument("count", type=int, help="how many jobs")
    parser.add_argument("--prefix", default="job", help="job name prefix (default: job)")
    parser.add_argument("--rounds", type=int, default=1000, help="SHA-256 rounds per job")
    parser.add_argument("--io-seconds", type=float, default=0.1, help="simulated I/O per job")
    parser.add_argument("--database-url", help="queue URL (default: the settings' database_url)")
    args = parser.parse_args(argv)
    url = args.database_url or load_settings().database_url
    trio.run(enqueue, url, args.count, args.prefix, args.rounds, args.io_seconds)
    print(f"enqueued {args.count} {SPEC_ID} jobs ({args.prefix}-00000 ...)")


if __name__ == "__main__":
    main()
