"""What every verb group of the command line shares: exit codes, the parent parsers, opening the
queue, printing item data safely, and reporting an error as one line.

Item data is printed as data: terminal control characters in it (ESC, BEL, CSI, every other C0
and C1 control, bidirectional overrides, lone surrogates) are shown as visible escapes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
import unicodedata
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TextIO, TypeAlias

import trio

from .._convert import unstructure
from .._describe import children_text, item_fields, journal_fields, stamp
from .._errors import ItemNotFound, SuperviseError
from .._settings import MAX_COUNT, MAX_SECONDS, Settings, load_settings
from ..queues import Journal, WorkItem, WorkQueue
from ..queues._factory import open_queue
from ..queues._sql import scrub_dsn

PROG = "trio-supervise"

EXIT_OK = 0
EXIT_ERROR = 1
"""A runtime or user error: bad settings, a bad value, a change the item's state forbids."""
EXIT_USAGE = 2
"""A malformed command line (argparse's own usage error)."""
EXIT_NOT_FOUND = 3
"""The item (or other named thing) does not exist."""
EXIT_UNREACHABLE = 4
"""The running service (its HTTP endpoint) could not be reached or did not answer as one."""

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What ``build_parser`` hands each verb group's ``register``."""


class UserError(Exception):
    """A mistake the user can fix; reported as one line, exit code *exit_code*."""

    def __init__(self, message: str, *, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# -- parent parsers (argparse copies their arguments, so one instance serves every verb) --------

SETTINGS = argparse.ArgumentParser(add_help=False)
SETTINGS.add_argument(
    "--config", metavar="PATH", help="settings file (TOML); default: $TRIO_SUPERVISE_CONFIG"
)
DATABASE = argparse.ArgumentParser(add_help=False, parents=[SETTINGS])
DATABASE.add_argument(
    "--database-url",
    metavar="URL",
    help="queue URL; default: settings database_url ($TRIO_SUPERVISE_DATABASE_URL)",
)
AS_JSON = argparse.ArgumentParser(add_help=False)
AS_JSON.add_argument("--json", action="store_true", help="print JSON for scripts")


def limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_COUNT}, got {value}")
    return value


def timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds in (0, {MAX_SECONDS}], got {text!r}"
        )
    return value


# -- settings and the queue ---------------------------------------------------------------------


def settings_of(args: argparse.Namespace) -> Settings:
    return load_settings(args.config)


def database_url(args: argparse.Namespace) -> str:
    url: str | None = getattr(args, "database_url", None)
    args.resolved_url = url if url else settings_of(args).database_url
    return str(args.resolved_url)


def with_queue(
    args: argparse.Namespace,
    body: Callable[[WorkQueue], Awaitable[Any]],
    *,
    create: bool = False,
) -> Any:
    """Run *body* on the queue; only commands that add work (*create*) may create a database."""
    url = database_url(args)

    async def main() -> Any:
        async with open_queue(url, create=create) as queue:
            return await body(queue)

    return trio.run(main)


EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)
"""Due times the CLI accepts lie in [EARLIEST, LATEST): every backend stores them, and adding
any duration a setting allows (at most a year) cannot overflow."""

_RANGE_RULE = "a due time must fall between 1970-01-01 and 9999-01-01 UTC"


def when(text: str | None, now: dt.datetime) -> dt.datetime | None:
    """*text* (ISO 8601 with a timezone, or ``+SECONDS`` from *now*) as a due time."""
    if text is None:
        return None
    if text.startswith("+"):
        try:
            seconds = float(text[1:])
        except ValueError:
            raise UserError(f"expected +SECONDS, got {printable(text)!r}") from None
        if not math.isfinite(seconds):
            raise UserError(f"+SECONDS must be a finite number, got {text!r}")
        earliest, latest = (EARLIEST - now).total_seconds(), (LATEST - now).total_seconds()
        if not earliest <= seconds < latest:
            raise UserError(f"{text} is out of range: {_RANGE_RULE}")
        return now + dt.timedelta(seconds=seconds)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise UserError(
            f"expected an ISO 8601 datetime or +SECONDS, got {printable(text)!r}"
        ) from None
    if moment.tzinfo is None:
        raise UserError(f"the datetime {text!r} needs a timezone (e.g. {text}+00:00)")
    try:
        in_range = EARLIEST <= moment < LATEST
    except OverflowError:  # the offset takes it past datetime's own range
        in_range = False
    if not in_range:
        raise UserError(f"{text} is out of range: {_RANGE_RULE}")
    return moment


# -- printing -----------------------------------------------------------------------------------

_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e") | frozenset(
    "\u2066\u2067\u2068\u2069"
)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object) -> str:
    """*value* as text safe for a terminal: controls, bidi overrides, surrogates and the line
    and paragraph separators (U+2028, U+2029: they end a line) escaped."""
    text = "" if value is None else str(value)
    if text.isprintable():  # the common case, and a fast one
        return text
    return "".join(
        _escape(char)
        if char in _BIDI_CONTROLS or unicodedata.category(char) in _ESCAPED_CATEGORIES
        else char
        for char in text
    )


_ESCAPED_CATEGORIES = ("Cc", "Cs", "Zl", "Zp")
"""Controls, surrogates, and the line and paragraph separators."""


def short(value: object, width: int) -> str:
    text = "" if value is None else str(value)
    text = printable(text.replace("\n", " "))
    return text if len(text) <= width else text[: width - 1] + "…"


def table(rows: Sequence[Sequence[str]], headers: Sequence[str], out: TextIO) -> None:
    widths = [len(h) for h in headers]
    rows = [[printable(cell) for cell in row] for row in rows]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    print(
        "  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
        file=out,
    )
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def item_json(item: WorkItem) -> dict[str, Any]:
    document: dict[str, Any] = unstructure(item)
    return document


def print_item(
    item: WorkItem,
    as_json: bool,
    children: Sequence[WorkItem] = (),
    *,
    complete: bool = True,
    journal: Journal | None = None,
) -> None:
    if as_json:
        document = item_json(item)
        if children:
            document["children"] = [child.id for child in children]
        if journal is not None and (journal.entries or journal.events):
            document["journal"] = unstructure(journal)
        print(json.dumps(document, indent=2, sort_keys=True))
        return
    fields = item_fields(item)
    if children:
        fields.append(("children", children_text(children, complete)))
    if journal is not None:
        fields.extend(journal_fields(journal))
    # The error history, oldest first, each with its (trimmed) traceback below it.
    fields.extend(
        (
            f"error {n}",
            f"{stamp(each.at)} UTC by {each.worker or '?'} (attempt {each.attempt}): {each.error}",
        )
        for n, each in enumerate(item.errors, start=1)
    )
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        # A stored error's traceback (its lines after the first) is shown indented below it.
        first, *more = str(value).split("\n") if value else [""]
        print(f"{name.ljust(width)}  {printable(first)}")
        for line in more:
            print(f"{'':{width}}  {printable(line)}")


# -- errors -------------------------------------------------------------------------------------

USER_ERRORS = (UserError, SuperviseError, ValueError, OSError)


def one_line(value: object) -> str:
    """An error's text as one printable line (libpq's messages span several)."""
    return printable(" ".join(part.strip() for part in str(value).splitlines() if part.strip()))


def report(error: BaseException, dsn: str = "") -> None:
    """One line on stderr; the password of the DSN in use scrubbed from it, however quoted."""
    message = one_line(scrub_dsn(str(error), dsn)) or type(error).__name__
    print(f"{PROG}: error: {message}", file=sys.stderr)


def exit_code(error: BaseException) -> int:
    """The exit code an error reported by :func:`report` ends the command with."""
    if isinstance(error, UserError):
        return error.exit_code
    if isinstance(error, ItemNotFound):
        return EXIT_NOT_FOUND
    return EXIT_ERROR


def unexpected(error: BaseException) -> Exception:
    return UserError(f"unexpected {type(error).__name__}: {error}")


def leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]
