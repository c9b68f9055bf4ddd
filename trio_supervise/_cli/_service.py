"""``run``, ``migrate``, ``config`` and ``status``: the service's own verbs."""

from __future__ import annotations

import argparse
import http.client
import importlib
import inspect
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._settings import HttpSettings, Settings, check_host, load_settings
from ..queues._factory import migrate
from ..queues._sql import redact_dsn

if TYPE_CHECKING:
    from .._service import Service

from ._common import (
    AS_JSON,
    DATABASE,
    EXIT_UNREACHABLE,
    PROG,
    SETTINGS,
    Subparsers,
    UserError,
    database_url,
    one_line,
    printable,
    settings_of,
    short,
    table,
    timeout,
)


def register(commands: Subparsers) -> None:
    """Add ``run``, ``migrate``, ``status`` and ``config`` to *commands*."""
    run = commands.add_parser("run", parents=[SETTINGS], help="run a service")
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

    mig = commands.add_parser("migrate", parents=[DATABASE], help="apply schema migrations")
    mig.set_defaults(handler=_cmd_migrate)


def register_inspection(commands: Subparsers) -> None:
    """Add ``status`` and ``config`` to *commands*."""
    status = commands.add_parser(
        "status", parents=[SETTINGS, AS_JSON], help="ask a running service's /healthz"
    )
    status.add_argument("--url", help="default: http://HOST:PORT/healthz from the settings")
    status.add_argument("--timeout", type=timeout, default=5.0, help="seconds (default 5)")
    status.set_defaults(handler=_cmd_status)

    config = commands.add_parser(
        "config", parents=[SETTINGS, AS_JSON], help="print the effective settings (redacted)"
    )
    config.set_defaults(handler=_cmd_config)


def _cmd_run(args: argparse.Namespace) -> int:
    from .._service import run_service

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
    loaded = (
        load_settings(args.config, cls=settings_class or Settings)
        if (settings_class is not None or args.config)
        else None
    )
    service, loaded = resolve_service(args.target, loaded)
    settings = loaded or service.settings or load_settings()
    if bind is not None:
        host, port = bind
        settings = attrs.evolve(
            settings, http=attrs.evolve(settings.http, host=host, port=port, enabled=True)
        )
    service.settings = settings
    return run_service(service)


def resolve_service(text: str, loaded: Settings | None) -> tuple[Service, Settings | None]:
    """The :class:`Service` the target *text* (``MODULE:ATTR``) names, and the settings it got.

    The target is a Service, or a callable returning one: called with ``settings=`` (the
    *loaded* settings, or the defaults from the environment) when it takes them, else with no
    arguments. Shared by ``run`` and every verb that reads a service's declarations.
    """
    from .._service import Service

    target = _import_attr(text, "the target")
    service = target if isinstance(target, Service) else None
    try:
        if service is None and callable(target) and _takes_settings(target):
            loaded = load_settings(cls=Settings) if loaded is None else loaded
            service = target(settings=loaded)
        elif service is None and callable(target) and _takes_no_arguments(target):
            service = target()
    except Exception as error:
        raise UserError(f"{text}() failed: {type(error).__name__}: {error}") from None
    if not isinstance(service, Service):
        raise UserError(
            f"{text} is not a Service, nor a callable returning one (taking no "
            "arguments, or settings=)"
        )
    return service, loaded


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
    url = database_url(args)
    version = trio.run(migrate, url)
    print(f"{printable(redact_dsn(url))}: schema at version {version}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    url = args.url
    if not url:
        served: HttpSettings = settings_of(args).http
        host = f"[{served.host}]" if ":" in served.host else served.host
        url = f"http://{host}:{served.port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:
            code, body = response.status, response.read()
    except urllib.error.HTTPError as error:
        code, body = error.code, error.read()
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        print(f"{PROG}: {printable(url)} is unreachable: {one_line(reason)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    try:
        document = json.loads(body)
        healthy = bool(document["healthy"])
        workers = [dict(worker) for worker in document["workers"]]
    except (ValueError, KeyError, TypeError, RecursionError):
        print(
            f"{PROG}: {printable(url)} answered {code} without a health document", file=sys.stderr
        )
        return EXIT_UNREACHABLE
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(f"{printable(url)}: {'healthy' if healthy else 'UNHEALTHY'} ({code})")
        rows = [
            [
                str(w.get("worker")),
                str(w.get("state")),
                str(w.get("restarts", 0)),
                short(w.get("last_error"), 60),
            ]
            for w in workers
        ]
        table(rows, ["worker", "state", "restarts", "last error"], sys.stdout)
    return 0 if healthy and code == 200 else 1


def _cmd_config(args: argparse.Namespace) -> int:
    view = settings_of(args).redacted()
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
