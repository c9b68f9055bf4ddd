"""``python -m examples.keeper``: run the connection keeper until SIGTERM or Ctrl-C."""

import os

from .app import build_service

if __name__ == "__main__":
    build_service(
        ping_every=float(os.environ.get("KEEPER_PING_EVERY", "7")),
        fault_every=float(os.environ.get("KEEPER_FAULT_EVERY", "30")),
        outage=float(os.environ.get("KEEPER_OUTAGE", "5")),
    ).main()
