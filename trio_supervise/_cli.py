"""The ``trio-supervise`` command line (also ``python -m trio_supervise``).

User errors (bad settings, a bad URL, an unknown item, an unreachable database) are one line on
stderr and exit code 1, never a traceback; a malformed command line is exit code 2 (argparse's
usage error). ``status`` exits 0 healthy, 1 unhealthy, 2 unreachable.

Item data is printed as data: terminal control characters in it (ESC, BEL, CSI, every other C0
and C1 control, bidirectional overrides, lone surrogates) are shown as visible escapes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import importlib
import inspect
import json
import math
import os
import sys
import unicodedata
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TextIO

import attrs
import trio

from . import _cli_queues
from ._convert import nested_too_deeply, nesting_exceeds, unstructure
from ._errors import ConfigError, SuperviseError
from ._settings import MAX_COUNT, MAX_SECONDS, HttpSettings, Settings, check_host, load_settings
from ._version import __version__
from .queues import ItemState, WorkItem, WorkQueue
from .queues._factory import migrate, open_queue
from .queues._protocol import DEFAULT_QUEUE, MAX_PRIORITY, MIN_PRIORITY, check_priority
from .queues._sql import redact_dsn, scrub_dsn

__all__ = ["main"]

PROG = "trio-supervise"
EXIT_USAGE = 2
STATUS_UNREACHABLE = 2


class UserError(Exception):
    """A mistake the user can fix; reported as one line."""


# -- parser -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Run and inspect trio_supervise services."
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    settings = argparse.ArgumentParser(add_help=False)
    settings.add_argument(
        "--config", metavar="PATH", help="settings file (TOML); default: $TRIO_SUPERVISE_CONFIG"
    )
    database = argparse.ArgumentParser(add_help=False, parents=[settings])
    database.add_argument(
        "--database-url",
        metavar="URL",
        help="queue URL; default: settings database_url ($TRIO_SUPERVISE_DATABASE_URL)",
    )
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON for scripts")

    run = commands.add_parser("run", parents=[settings], help="run a service")
    run.add_argument(
        "target",
        metavar="MODULE:ATTR",
        help="a Service, or a callable returning one (called with settings= if it takes them)",
    )
    run.add_argument("--http", metavar="HOST:PORT", help="serve the operations HTTP here")
    run.add_argument(
        "--settings-class",
        metavar="MODULE:CLASS",
        help="the application's settings: a subclass of trio_supervise.Settings, read from the "
        "same file and environment",
    )
    run.set_defaults(handler=_cmd_run)

    mig = commands.add_parser("migrate", parents=[database], help="apply schema migrations")
    mig.set_defaults(handler=_cmd_migrate)

    items = commands.add_parser("items", help="inspect and change work items")
    actions = items.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", parents=[database, as_json], help="list items")
    listing.add_argument(
        "--state",
        action="append",
        choices=[state.value for state in ItemState],
        help="only items in this state (repeatable)",
    )
    listing.add_argument("--spec", action="append", help="only items of this spec (repeatable)")
    listing.add_argument(
        "--limit", type=_limit, default=50, help=f"at most N, 1..{MAX_COUNT} (default 50)"
    )
    listing.add_argument(
        "--after", metavar="ID", help="the page after this item (the last id of the previous page)"
    )
    listing.set_defaults(handler=_cmd_list)

    show = actions.add_parser("show", parents=[database, as_json], help="show one item")
    show.add_argument("item_id", metavar="ID")
    show.set_defaults(handler=_cmd_show)

    enqueue = actions.add_parser("enqueue", parents=[database, as_json], help="add an item")
    enqueue.add_argument("spec_id", metavar="SPEC")
    enqueue.add_argument("item_config", metavar="CONFIG_JSON", nargs="?", default=None)
    enqueue.add_argument("--id", dest="item_id", help="the item's id (default: generated)")
    enqueue.add_argument("--tenant", default="", help="tenant id")
    enqueue.add_argument("--subject", default="", help="subject id")
    enqueue.add_argument("--due", help="ISO 8601 datetime with a timezone, or +SECONDS")
    enqueue.add_argument("--key", help="idempotency key")
    enqueue.add_argument(
        "--priority",
        type=_priority,
        default=0,
        help=f"{MIN_PRIORITY}..{MAX_PRIORITY}, lower is claimed first (default 0)",
    )
    enqueue.add_argument(
        "--queue", default=DEFAULT_QUEUE, help=f"the named queue (default {DEFAULT_QUEUE!r})"
    )
    enqueue.set_defaults(handler=_cmd_enqueue)

    cancel = actions.add_parser("cancel", parents=[database, as_json], help="cancel an item")
    cancel.add_argument("item_id", metavar="ID")
    cancel.set_defaults(handler=_cmd_cancel)

    retry = actions.add_parser("retry", parents=[database, as_json], help="requeue an item")
    retry.add_argument("item_id", metavar="ID")
    retry.add_argument("--at", help="ISO 8601 datetime with a timezone, or +SECONDS")
    retry.set_defaults(handler=_cmd_retry)

    _cli_queues.register(commands)

    status = commands.add_parser(
        "status", parents=[settings, as_json], help="ask a running service's /healthz"
    )
    status.add_argument("--url", help="default: http://HOST:PORT/healthz from the settings")
    status.add_argument("--timeout", type=_timeout, default=5.0, help="seconds (default 5)")
    status.set_defaults(handler=_cmd_status)

    config = commands.add_parser(
        "config", parents=[settings, as_json], help="print the effective settings (redacted)"
    )
    config.set_defaults(handler=_cmd_config)
    return parser


def _priority(text: str) -> int:
    try:
        return check_priority(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an integer from {MIN_PRIORITY} (claimed first) to {MAX_PRIORITY}, "
            f"got {_printable(text)!r}"
        ) from None


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_COUNT}, got {value}")
    return value


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds in (0, {MAX_SECONDS}], got {text!r}"
        )
    return value


# -- helpers ------------------------------------------------------------------------------------


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(args.config)


def _database_url(args: argparse.Namespace) -> str:
    url: str | None = getattr(args, "database_url", None)
    args.resolved_url = url if url else _settings(args).database_url
    return str(args.resolved_url)


def _with_queue(
    args: argparse.Namespace,
    body: Callable[[WorkQueue], Awaitable[Any]],
    *,
    create: bool = False,
) -> Any:
    """Run *body* on the queue; only commands that add work (*create*) may create a database."""
    url = _database_url(args)

    async def main() -> Any:
        async with open_queue(url, create=create) as queue:
            return await body(queue)

    return trio.run(main)


_EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_LATEST = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)
"""Due times the CLI accepts lie in [_EARLIEST, _LATEST): every backend stores them, and adding
any duration a setting allows (at most a year) cannot overflow."""


def _when(text: str | None, now: dt.datetime) -> dt.datetime | None:
    if text is None:
        return None
    if text.startswith("+"):
        try:
            seconds = float(text[1:])
        except ValueError:
            raise UserError(f"expected +SECONDS, got {_printable(text)!r}") from None
        if not math.isfinite(seconds):
            raise UserError(f"+SECONDS must be a finite number, got {text!r}")
        earliest, latest = (_EARLIEST - now).total_seconds(), (_LATEST - now).total_seconds()
        if not earliest <= seconds < latest:
            raise UserError(f"{text} is out of range: {_RANGE_RULE}")
        return now + dt.timedelta(seconds=seconds)
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise UserError(
            f"expected an ISO 8601 datetime or +SECONDS, got {_printable(text)!r}"
        ) from None
    if when.tzinfo is None:
        raise UserError(f"the datetime {text!r} needs a timezone (e.g. {text}+00:00)")
    try:
        in_range = _EARLIEST <= when < _LATEST
    except OverflowError:  # the offset takes it past datetime's own range
        in_range = False
    if not in_range:
        raise UserError(f"{text} is out of range: {_RANGE_RULE}")
    return when


_RANGE_RULE = "a due time must fall between 1970-01-01 and 9999-01-01 UTC"


def _item_json(item: WorkItem) -> dict[str, Any]:
    document: dict[str, Any] = unstructure(item)
    return document


_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e") | frozenset(
    "\u2066\u2067\u2068\u2069"
)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _printable(value: object) -> str:
    """*value* as text safe for a terminal: controls, bidi overrides and surrogates escaped."""
    text = "" if value is None else str(value)
    if text.isprintable():  # the common case, and a fast one
        return text
    return "".join(
        _escape(char)
        if char in _BIDI_CONTROLS or unicodedata.category(char) in ("Cc", "Cs")
        else char
        for char in text
    )


def _short(value: object, width: int) -> str:
    text = "" if value is None else str(value)
    text = _printable(text.replace("\n", " "))
    return text if len(text) <= width else text[: width - 1] + "…"


def _stamp(value: dt.datetime | None) -> str:
    return "" if value is None else value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _table(rows: Sequence[Sequence[str]], headers: Sequence[str], out: TextIO) -> None:
    widths = [len(h) for h in headers]
    rows = [[_printable(cell) for cell in row] for row in rows]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    print(
        "  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
        file=out,
    )
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def _print_item(item: WorkItem, as_json: bool) -> None:
    if as_json:
        print(json.dumps(_item_json(item), indent=2, sort_keys=True))
        return
    fields = [
        ("id", item.id),
        ("spec", item.spec_id),
        ("state", str(item.state) + (" (cancel requested)" if item.cancel_requested else "")),
        ("due", f"{_stamp(item.due_at)} UTC"),
        ("tenant", item.tenant_id),
        ("subject", item.subject_id),
        ("queue", item.queue),
        ("priority", str(item.priority)),
        ("errors", str(item.error_count)),
        ("last error", item.last_error or ""),
        (
            "lease",
            f"{item.lease_owner} v{item.lease_version} until {_stamp(item.lease_expires_at)}"
            if item.lease_owner
            else f"none (v{item.lease_version})",
        ),
        ("idempotency", item.idempotency_key or ""),
        ("created", f"{_stamp(item.created_at)} UTC"),
        ("updated", f"{_stamp(item.updated_at)} UTC"),
        ("config", json.dumps(item.config, sort_keys=True)),
    ]
    if item.result is not None:
        fields.append(("result", json.dumps(item.result, sort_keys=True)))
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        print(f"{name.ljust(width)}  {_printable(value)}")


# -- commands -----------------------------------------------------------------------------------


def _cmd_run(args: argparse.Namespace) -> int:
    from ._service import Service, run_service

    bind = _host_port(args.http) if args.http else None  # checked before importing anything
    settings_class: type[Settings] | None = None
    if args.settings_class:
        found = _import_attr(args.settings_class, "--settings-class")
        if not (isinstance(found, type) and attrs.has(found) and issubclass(found, Settings)):
            raise UserError(
                f"--settings-class {args.settings_class} is not an attrs subclass of "
                "trio_supervise.Settings"
            )
        settings_class = found
    target = _import_attr(args.target, "the target")
    loaded: Settings | None = None
    if settings_class is not None or args.config:
        loaded = load_settings(args.config, cls=settings_class or Settings)
    service = target if isinstance(target, Service) else None
    try:
        if service is None and callable(target) and _takes_settings(target):
            loaded = load_settings(cls=Settings) if loaded is None else loaded
            service = target(settings=loaded)
        elif service is None and callable(target) and _takes_no_arguments(target):
            service = target()
    except Exception as error:
        raise UserError(f"{args.target}() failed: {type(error).__name__}: {error}") from None
    if not isinstance(service, Service):
        raise UserError(
            f"{args.target} is not a Service, nor a callable returning one (taking no "
            "arguments, or settings=)"
        )
    settings = loaded or service.settings or load_settings()
    if bind is not None:
        host, port = bind
        settings = attrs.evolve(
            settings, http=attrs.evolve(settings.http, host=host, port=port, enabled=True)
        )
    service.settings = settings
    return run_service(service)


def _import_attr(text: str, what: str) -> Any:
    """The object *text* (``MODULE:ATTR``, ATTR dotted) names; the working directory is on the
    module path, as for ``python -m``."""
    module_name, sep, attr_path = text.partition(":")
    if not sep or not module_name or not attr_path:
        raise UserError(f"{what}: expected MODULE:ATTR, got {text!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # a mistyped name, or the module's own code failed
        missing = isinstance(error, ModuleNotFoundError) and error.name
        if missing and module_name.startswith(missing):
            raise UserError(f"cannot import module {module_name!r}: {error}") from None
        raise UserError(
            f"importing {module_name!r} failed: {type(error).__name__}: {error}"
        ) from None
    found: Any = module
    for part in attr_path.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise UserError(f"module {module_name!r} has no attribute {attr_path!r}") from None
    return found


def _takes_settings(function: Callable[..., Any]) -> bool:
    """Whether *function* can be called as ``function(settings=...)``."""
    try:
        signature = inspect.signature(function)
        signature.bind(settings=None)
    except (TypeError, ValueError):
        return False
    return "settings" in signature.parameters


def _takes_no_arguments(function: Callable[..., Any]) -> bool:
    try:
        inspect.signature(function).bind()
    except TypeError:
        return False
    except ValueError:  # no signature (some builtins): let the call decide
        return True
    return True


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    valid_port = port.isascii() and port.isdigit() and len(port) <= 5 and int(port) <= 65535
    if not sep or not host or not valid_port:
        raise UserError(f"--http expects HOST:PORT (port 0..65535), got {text!r}")
    try:
        check_host(host, what="--http host")
    except ValueError as error:
        raise UserError(str(error)) from None
    return host, int(port)


def _cmd_migrate(args: argparse.Namespace) -> int:
    url = _database_url(args)
    version = trio.run(migrate, url)
    print(f"{_printable(redact_dsn(url))}: schema at version {version}")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    states = [ItemState(s) for s in args.state] if args.state else None

    async def body(queue: WorkQueue) -> tuple[list[WorkItem], int]:
        items = await queue.list_items(
            states=states, spec_ids=args.spec, limit=args.limit, after=args.after
        )
        counts = await queue.counts()
        total = sum(
            n
            for (spec_id, state), n in counts.items()
            if (states is None or state in states) and (args.spec is None or spec_id in args.spec)
        )
        return items, total

    items, total = _with_queue(args, body)
    if args.json:
        print(json.dumps([_item_json(item) for item in items], indent=2, sort_keys=True))
        return 0
    if not items:
        print(
            "no items" if args.after is None else f"no items after {args.after} ({total:,} in all)"
        )
        return 0
    rows = [
        [
            item.id,
            item.spec_id,
            str(item.state) + ("*" if item.cancel_requested else ""),
            _stamp(item.due_at),
            str(item.error_count),
            _short(item.tenant_id, 16),
            _short(item.subject_id, 16),
            _short(item.last_error, 40),
        ]
        for item in items
    ]
    _table(
        rows,
        ["id", "spec", "state", "due (utc)", "errors", "tenant", "subject", "last error"],
        sys.stdout,
    )
    if any(item.cancel_requested for item in items):
        print("* cancel requested")
    more = f"; next page: --after {items[-1].id}" if len(items) == args.limit else ""
    print(f"{len(items):,} of {total:,}{' after ' + args.after if args.after else ''}{more}")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    item: WorkItem = _with_queue(args, lambda queue: queue.get(args.item_id))
    _print_item(item, args.json)
    return 0


def _cmd_enqueue(args: argparse.Namespace) -> int:
    config: Any = None
    if args.item_config is not None:
        if nesting_exceeds(args.item_config):
            raise ConfigError(nested_too_deeply("config"))
        try:
            config = json.loads(args.item_config)
        except ValueError as error:
            raise UserError(f"CONFIG_JSON is not JSON: {error}") from None

    async def body(queue: WorkQueue) -> WorkItem:
        return await queue.enqueue(
            args.spec_id,
            config=config,
            tenant_id=args.tenant,
            subject_id=args.subject,
            due_at=_when(args.due, queue.clock.now()),
            item_id=args.item_id,
            idempotency_key=args.key,
            priority=args.priority,
            queue=args.queue,
        )

    item: WorkItem = _with_queue(args, body, create=True)
    if args.json:
        _print_item(item, True)
    else:
        spec = _printable(item.spec_id)
        print(f"enqueued {_printable(item.id)} ({spec}), due {_stamp(item.due_at)} UTC")
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    item: WorkItem = _with_queue(args, lambda queue: queue.request_cancel(args.item_id))
    if args.json:
        _print_item(item, True)
    elif item.state is ItemState.CANCELLED:
        print(f"cancelled {_printable(item.id)}")
    else:
        print(
            f"cancellation requested for {_printable(item.id)} ({item.state}); "
            "its worker will stop it"
        )
    return 0


def _cmd_retry(args: argparse.Namespace) -> int:
    async def body(queue: WorkQueue) -> WorkItem:
        return await queue.retry(args.item_id, at=_when(args.at, queue.clock.now()))

    item: WorkItem = _with_queue(args, body)
    if args.json:
        _print_item(item, True)
    else:
        print(f"requeued {_printable(item.id)}, due {_stamp(item.due_at)} UTC")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    url = args.url
    if not url:
        served: HttpSettings = _settings(args).http
        host = f"[{served.host}]" if ":" in served.host else served.host
        url = f"http://{host}:{served.port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:
            code, body = response.status, response.read()
    except urllib.error.HTTPError as error:
        code, body = error.code, error.read()
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        print(f"{PROG}: {_printable(url)} is unreachable: {_one_line(reason)}", file=sys.stderr)
        return STATUS_UNREACHABLE
    try:
        document = json.loads(body)
        healthy = bool(document["healthy"])
        workers = [dict(worker) for worker in document["workers"]]
    except (ValueError, KeyError, TypeError, RecursionError):
        print(
            f"{PROG}: {_printable(url)} answered {code} without a health document", file=sys.stderr
        )
        return STATUS_UNREACHABLE
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(f"{_printable(url)}: {'healthy' if healthy else 'UNHEALTHY'} ({code})")
        rows = [
            [
                str(w.get("worker")),
                str(w.get("state")),
                str(w.get("restarts", 0)),
                _short(w.get("last_error"), 60),
            ]
            for w in workers
        ]
        _table(rows, ["worker", "state", "restarts", "last error"], sys.stdout)
    return 0 if healthy and code == 200 else 1


def _cmd_config(args: argparse.Namespace) -> int:
    view = _settings(args).redacted()
    if args.json:
        print(json.dumps(view, indent=2))
        return 0
    for key, value in _flatten(view):
        print(f"{key} = {json.dumps(value)}")
    return 0


def _flatten(view: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    lines: list[tuple[str, Any]] = []
    for key, value in view.items():
        if isinstance(value, dict):
            lines.extend(_flatten(value, f"{prefix}{key}."))
        else:
            lines.append((f"{prefix}{key}", value))
    return lines


# -- entry point --------------------------------------------------------------------------------

_USER_ERRORS = (UserError, SuperviseError, ValueError, OSError)


def _one_line(value: object) -> str:
    """An error's text as one printable line (libpq's messages span several)."""
    return _printable(" ".join(part.strip() for part in str(value).splitlines() if part.strip()))


def _report(error: BaseException, dsn: str = "") -> None:
    """One line on stderr; the password of the DSN in use scrubbed from it, however quoted."""
    message = _one_line(scrub_dsn(str(error), dsn)) or type(error).__name__
    print(f"{PROG}: error: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return handler(args)
    except _USER_ERRORS as error:
        _report(error, getattr(args, "resolved_url", ""))
        return 1
    except BaseExceptionGroup as group:
        matched, rest = group.split(Exception)
        if rest is not None or matched is None:
            raise
        for leaf in _leaves(matched):
            leaf = leaf if isinstance(leaf, _USER_ERRORS) else _unexpected(leaf)
            _report(leaf, getattr(args, "resolved_url", ""))
        return 1
    except Exception as error:  # a bug, or a library's error we did not foresee: still one line
        _report(_unexpected(error), getattr(args, "resolved_url", ""))
        return 1


def _unexpected(error: BaseException) -> Exception:
    return UserError(f"unexpected {type(error).__name__}: {error}")


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
