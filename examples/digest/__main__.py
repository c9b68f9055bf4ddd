"""``python -m examples.digest``: run the digest service until SIGTERM or Ctrl-C."""

from .app import build_service

if __name__ == "__main__":
    build_service().main()
