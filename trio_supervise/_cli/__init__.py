"""The ``trio-supervise`` command line (also ``python -m trio_supervise``).

Each verb group is a module exposing ``register(commands)``; :func:`build_parser` calls them in
order, so a new group is one line in :data:`GROUPS`. Exit codes (``_common``): 0 ok, 1 a user or
runtime error (one line on stderr, never a traceback), 2 a malformed command line (argparse's
usage error), 3 not found, 4 the service is unreachable.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from .._version import __version__
from . import _console, _items, _queues, _schedules, _service
from ._common import (
    EXIT_ERROR,
    EXIT_OK,
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
    _console.register,
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
        code = handler(args)
        sys.stdout.flush()  # inside the try: a reader that went away is met here, not at exit
        return code
    except BrokenPipeError:
        return _reader_gone()
    except USER_ERRORS as error:
        report(error, dsn())
        return exit_code(error)
    except BaseExceptionGroup as group:
        matched, rest = group.split(Exception)
        if rest is not None or matched is None:
            raise
        if all(isinstance(leaf, BrokenPipeError) for leaf in leaves(matched)):
            return _reader_gone()
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


def _reader_gone() -> int:
    """Standard output's reader closed the pipe (``... | head``): stop quietly, status 0.

    What is still buffered can never be written; pointing standard output at ``/dev/null``
    keeps the interpreter's own flush at exit from failing on it again (Python's documented
    recipe for SIGPIPE, which it ignores).
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
