"""``python -m examples.fleet``: one worker process, until SIGTERM or Ctrl-C."""

from .app import build_service

if __name__ == "__main__":
    build_service().main()
