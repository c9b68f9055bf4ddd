"""The ``trio-supervise`` command line (also ``python -m trio_supervise``).

Each verb group is a module exposing ``register(commands)``; :func:`build_parser` calls them in
order, so a new group is one line in :data:`GROUPS`. Exit codes (``_common``): 0 ok, 1 a user or
runtime error (one line on stderr, never a traceback), 2 a malformed command line (argparse's
usage error), 3 not found, 4 the service is unreachable.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from .._version import __version__
from . import _items, _queues, _schedules, _service
from ._common import (
    EXIT_ERROR,
    EXIT_USAGE,
    PROG,
    USER_ERRORS,
    Subparsers,
    exit_code,
    leaves,
    report,
    unexpected,
)

__all__ = ["build_parser", "main"]

GROUPS: tuple[Callable[[Subparsers], None], ...] = (
    _service.register,
    _items.register,
    _queues.register,
    _service.register_inspection,
    _schedules.register,
)
"""The verb groups, in the order ``--help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run and inspect trio_supervise services.",
        epilog="exit codes: 0 ok, 1 a user or runtime error, 2 a malformed command line, "
        "3 not found, 4 the service is unreachable (run: 128+N after a second signal N)",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in GROUPS:
        register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE

    def dsn() -> str:  # the URL in use, once a command has read it
        return str(getattr(args, "resolved_url", ""))

    try:
        return handler(args)
    except USER_ERRORS as error:
        report(error, dsn())
        return exit_code(error)
    except BaseExceptionGroup as group:
        matched, rest = group.split(Exception)
        if rest is not None or matched is None:
            raise
        reported = [
            leaf if isinstance(leaf, USER_ERRORS) else unexpected(leaf) for leaf in leaves(matched)
        ]
        for leaf in reported:
            report(leaf, dsn())
        codes = {exit_code(leaf) for leaf in reported}
        return codes.pop() if len(codes) == 1 else EXIT_ERROR
    except Exception as error:  # a bug, or a library's error we did not foresee: still one line
        report(unexpected(error), dsn())
        return EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
