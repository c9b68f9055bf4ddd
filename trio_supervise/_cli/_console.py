"""``hash-password``: the value of ``http.password_hash`` for the console's password."""

from __future__ import annotations

import argparse
import getpass
import sys

from ..console import hash_password
from ._common import EXIT_OK, Subparsers, UserError

__all__ = ["register"]


def register(commands: Subparsers) -> None:
    """Add ``hash-password`` to *commands*."""
    made = commands.add_parser(
        "hash-password",
        help="hash the console's password for http.password_hash",
        description="Print the hash of a password, for the setting http.password_hash "
        "(TRIO_SUPERVISE_HTTP__PASSWORD_HASH): the console then asks for it (HTTP Basic, any "
        "user name). The password is asked for twice on a terminal, else read from the first "
        "line of standard input.",
    )
    made.add_argument(
        "--scheme",
        choices=["scrypt", "pbkdf2_sha256"],
        default="scrypt",
        help="the key derivation function (default scrypt; both from the standard library)",
    )
    made.set_defaults(handler=_cmd_hash_password)


def _cmd_hash_password(args: argparse.Namespace) -> int:
    if sys.stdin.isatty():
        password = getpass.getpass("console password: ")
        if getpass.getpass("again: ") != password:
            raise UserError("the two passwords differ; nothing was hashed")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise UserError("the password is empty; nothing was hashed")
    print(hash_password(password, scheme=args.scheme))
    return EXIT_OK
