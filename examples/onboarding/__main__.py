"""``python -m examples.onboarding``: run the onboarding service until SIGTERM or Ctrl-C."""

from .app import build_service

if __name__ == "__main__":
    build_service().main()
