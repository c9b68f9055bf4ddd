"""Settings: frozen attrs classes, structured by cattrs from a TOML file and the environment.

Sources, lowest precedence first:

1. the defaults of the classes below;
2. a TOML file (``--config PATH``, or the path in ``TRIO_SUPERVISE_CONFIG``);
3. ``TRIO_SUPERVISE_*`` environment variables: the rest of the name, lower-cased, is the field
   path with ``__`` between levels (``TRIO_SUPERVISE_HTTP__PORT=9000`` sets ``http.port``).

Environment values are text and are parsed for the field's type (``"9000"`` for an int,
``true``/``false``/``1``/``0``/``yes``/``no``/``on``/``off`` for a bool, an empty value for
``None``). TOML values must already have the right type: ``port = "9000"`` is refused.

Every error names the field path and the rule (``http.port: expected int, got 'abc'``); unknown
keys are refused by name, in the file and in the environment alike.
"""

from __future__ import annotations

import collections.abc
import difflib
import enum
import ipaddress
import json
import math
import os
import re
import socket
import tomllib
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError

from ._convert import converter as _shared_converter
from ._convert import nested_too_deeply, nesting_exceeds
from ._errors import SettingsError
from ._logging import LogFormat
from .console import check_password_hash, check_token, is_loopback
from .maintenance import Period, RetentionSettings, structure_period
from .queues._factory import DEFAULT_DATABASE_URL
from .queues._sql import redact_dsn
from .queues.sql._postgres_pool import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_POOL_SIZE,
    DEFAULT_READ_POOL_SIZE,
    DEFAULT_WORKER_POOL_SIZE,
)
from .run import RunnerSettings

__all__ = [
    "DEFAULT_DATABASE_URL",
    "ENV_PREFIX",
    "HttpSettings",
    "MAX_COUNT",
    "MAX_SECONDS",
    "LogLevel",
    "LogSettings",
    "PostgresSettings",
    "Settings",
    "check_host",
    "default_worker_id",
    "load_settings",
    "structure_settings",
]

ENV_PREFIX = "TRIO_SUPERVISE_"
"""Environment variables with this prefix are settings."""

CONFIG_ENV = ENV_PREFIX + "CONFIG"
"""The environment variable naming the settings file when no path is given."""

_RESERVED_ENV_PREFIXES = (
    CONFIG_ENV,
    ENV_PREFIX + "TEST_",
    ENV_PREFIX + "REQUIRE_",
    ENV_PREFIX + "MODEL_",
    ENV_PREFIX + "BENCH_",
)
"""Variables with our prefix that are not settings: the file path, and the knobs of the test
suite and of the benchmarks (``TRIO_SUPERVISE_BENCH_DSN``), which an operator's shell may well
hold while a service starts."""


_SECRET = "secret"
"""attrs metadata key: ``"url"`` masks a URL's password, ``True`` masks the whole value."""

T = TypeVar("T")


class LogLevel(enum.StrEnum):
    """How much the service logs."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


def _port(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not 0 <= value <= 65535:
        raise ValueError(f"{attribute.name} must be between 0 and 65535, got {value!r}")


def _non_empty(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not value.strip():
        raise ValueError(f"{attribute.name} must not be empty")


_HOST_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}\Z){_HOST_LABEL}(?:\.{_HOST_LABEL})*\.?\Z")


def check_host(host: str, *, what: str = "host") -> str:
    """Refuse a *host* that is neither an IP address nor a DNS name (``ValueError`` naming it)."""
    if not host.strip():
        raise ValueError(f"{what} must not be empty")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOST_NAME.match(host):
            raise ValueError(
                f"{what} must be an IP address or a host name (letters, digits, '-', '.'), "
                f"got {host!r}"
            ) from None
    return host


def _host(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    check_host(value, what=attribute.name)


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{attribute.name} must be positive, got {value!r}")


def _token(instance: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None:
        check_token(value)


def _password_hash(
    instance: object, attribute: attrs.Attribute[str | None], value: str | None
) -> None:
    if value is not None:
        check_password_hash(value)


@attrs.frozen(kw_only=True)
class HttpSettings:
    """The operations HTTP server: ``/healthz``, ``/metrics`` and the console (status page).

    Bound to an address other than loopback, the console asks for credentials, so a ``token``
    or a ``password_hash`` (or both) is required there: the settings are refused without one.
    """

    enabled: bool = True
    """Serve HTTP at all."""
    host: str = attrs.field(default="127.0.0.1", validator=_host)
    """Interface to bind; loopback unless you mean to expose it."""
    port: int = attrs.field(default=8080, validator=_port)
    """TCP port; 0 picks a free one (tests)."""
    refresh: float = attrs.field(default=5.0, validator=_positive)
    """Seconds between status-page refreshes."""
    graceful_timeout: float = attrs.field(default=3.0, validator=_positive)
    """Seconds open requests get to finish once shutdown begins."""
    token: str | None = attrs.field(default=None, validator=_token, metadata={_SECRET: True})
    """A secret the console accepts as a bearer token or as the HTTP Basic password (any user
    name): at least 16 printable ASCII characters."""
    password_hash: str | None = attrs.field(
        default=None, validator=_password_hash, metadata={_SECRET: True}
    )
    """The console's HTTP Basic password, hashed: ``scrypt$n=...,r=...,p=...$SALT$HASH`` or
    ``pbkdf2_sha256$i=...$SALT$HASH`` (``trio-supervise hash-password`` makes one)."""
    read_only: bool = False
    """Show the console without its action forms, and refuse every action (403)."""

    def __attrs_post_init__(self) -> None:
        if self.enabled and not is_loopback(self.host) and not self.authenticates:
            raise ValueError(
                f"host {self.host!r} is not a loopback address, so the console needs "
                "credentials: set http.token or http.password_hash (TRIO_SUPERVISE_HTTP__TOKEN, "
                "TRIO_SUPERVISE_HTTP__PASSWORD_HASH)"
            )

    @property
    def authenticates(self) -> bool:
        """Whether the console asks for credentials (a token or a password hash is set)."""
        return self.token is not None or self.password_hash is not None


def _at_least_one(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be at least 1, got {value!r}")


@attrs.frozen(kw_only=True)
class PostgresSettings:
    """The PostgreSQL queue's connections, when ``database_url`` names PostgreSQL: a lane of
    connections each for callers' writes, the worker port and status reads (see
    :meth:`PostgresQueue.connect <trio_supervise.queues.PostgresQueue.connect>`)."""

    pool_size: int = attrs.field(default=DEFAULT_POOL_SIZE, validator=_at_least_one)
    """Connections for the callers' writes: enqueues, an operator's actions, upkeep."""
    worker_pool_size: int = attrs.field(default=DEFAULT_WORKER_POOL_SIZE, validator=_at_least_one)
    """Connections for the worker port alone: claims, renewals, settlements."""
    read_pool_size: int = attrs.field(default=DEFAULT_READ_POOL_SIZE, validator=_at_least_one)
    """Connections for status reads (the status page, ``/metrics``, the CLI's reads)."""
    connect_timeout: float = attrs.field(default=DEFAULT_CONNECT_TIMEOUT, validator=_positive)
    """The longest a caller waits, for a connection and then for locks, before it gets
    :class:`QueueUnavailable`."""


@attrs.frozen(kw_only=True)
class LogSettings:
    """How the service logs (the level is ``log_level``, beside this table)."""

    format: LogFormat = LogFormat.TEXT
    """``text``, or ``json`` for one JSON object a line; applies to the stderr handler the
    service installs when the application has none of its own."""


def default_worker_id() -> str:
    """``host-pid``: unique among the live workers of one machine, readable in a lease."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _default_runner() -> RunnerSettings:
    return RunnerSettings(worker_id=default_worker_id())


@attrs.frozen(kw_only=True)
class Settings:
    """Everything a :class:`Service` reads from its environment."""

    database_url: str = attrs.field(
        default=DEFAULT_DATABASE_URL, validator=_non_empty, metadata={_SECRET: "url"}
    )
    """Where the queue lives: ``sqlite:///path.db``, ``postgresql://...`` or ``memory://``."""
    log_level: LogLevel = LogLevel.INFO
    """The level of the ``trio_supervise`` loggers (and of the root logger, when the service
    installs the log handler itself)."""
    log: LogSettings = attrs.field(factory=LogSettings)
    """The log format."""
    jitter_seed: int | None = None
    """Fix the restart-jitter seed (tests); ``None`` draws one per process."""
    http: HttpSettings = attrs.field(factory=HttpSettings)
    """The operations HTTP server."""
    runner: RunnerSettings = attrs.field(factory=_default_runner)
    """How the workflow runner claims and evaluates items (``worker_id`` defaults to host-pid)."""
    retention: RetentionSettings = attrs.field(factory=RetentionSettings)
    """How long finished items are kept, and how the service's pruner deletes them."""
    postgres: PostgresSettings = attrs.field(factory=PostgresSettings)
    """The PostgreSQL queue's connections (when ``database_url`` names PostgreSQL)."""

    def redacted(self) -> dict[str, Any]:
        """The settings as plain data, with secrets masked (DSN passwords, secret fields)."""
        return _redact(self)


# -- the converter -----------------------------------------------------------------------------


def _structure_enum(value: object, cls: type[enum.Enum]) -> enum.Enum:
    try:
        return cls(value)
    except ValueError:
        raise ValueError(_enum_rule(cls, value)) from None


def _settings_converter() -> cattrs.Converter:
    """The shared converter, plus enum hooks whose errors list the choices."""
    made = _shared_converter.copy()
    for base in (enum.Enum, enum.StrEnum, enum.IntEnum):
        made.register_structure_hook(base, _structure_enum)
    made.register_structure_hook(Period, structure_period)
    return made


converter = _settings_converter()


# -- environment text into typed values ------------------------------------------------------------
#
# The shared converter is strict about scalar types (``"8080"`` is not an int), as it should be for
# TOML and JSON. Environment values are always text, so they are parsed here, guided by the type
# of the field they name, and then structured with everything else.


class _EnvProblem(ValueError):
    """An environment variable whose value does not parse for its field."""


_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(tp)
        inner = [arg for arg in args if arg is not type(None)]
        if len(inner) == 1 and len(args) == 2:
            return inner[0], True
    return tp, False


def _parse_env(text: str, tp: Any) -> Any:
    """Parse environment *text* into the JSON-ish value that structures into *tp*."""
    tp, optional = _unwrap_optional(tp)
    stripped = text.strip()
    if optional and stripped.lower() in ("", "none", "null"):
        return None
    if tp is bool:
        if stripped.lower() in _TRUE:
            return True
        if stripped.lower() in _FALSE:
            return False
        raise _EnvProblem(f"expected true or false, got {text!r}")
    if tp is int:
        try:
            return int(stripped, 10)
        except ValueError:
            raise _EnvProblem(f"expected int, got {text!r}") from None
    if tp is float:
        try:
            return float(stripped)
        except ValueError:
            raise _EnvProblem(f"expected a number, got {text!r}") from None
    if tp is str:
        return text
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for member in tp:
            if str(member.value).lower() == stripped.lower():
                return member.value
        raise _EnvProblem(_enum_rule(tp, text))
    if isinstance(tp, type) and attrs.has(tp):
        raise _EnvProblem("is a table of settings; set its fields (NAME__FIELD) instead")
    if nesting_exceeds(text):
        raise _EnvProblem(nested_too_deeply("the value"))
    try:  # lists, mappings and anything else: JSON
        return json.loads(text)
    except ValueError:
        return text


def _enum_rule(cls: type[enum.Enum], value: object) -> str:
    listed = ", ".join(str(member.value) for member in cls)
    return f"expected one of {listed}, got {value!r}"


def _field_types(cls: Any) -> dict[str, Any]:
    if not (isinstance(cls, type) and attrs.has(cls)):
        return {}
    attrs.resolve_types(cls)
    return {field.name: field.type for field in attrs.fields(cls)}


def _env_layer(
    env: Mapping[str, str], cls: type
) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """The settings named by ``TRIO_SUPERVISE_*`` variables, typed; the problems found; and
    which variable set which field path."""
    layer: dict[str, Any] = {}
    sources: dict[str, str] = {}
    problems: list[str] = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name.startswith(_RESERVED_ENV_PREFIXES):
            continue
        parts = name[len(ENV_PREFIX) :].lower().split("__")
        if not all(parts):
            problems.append(f"{name}: malformed settings variable (empty part between '__')")
            continue
        node, owner = layer, cls
        for depth, part in enumerate(parts):
            fields = _field_types(_unwrap_optional(owner)[0])
            where = ".".join(parts[: depth + 1])
            if part not in fields:
                hint = difflib.get_close_matches(part, list(fields), n=1)
                parent = ".".join(parts[:depth])
                suggestion = ".".join(p for p in (parent, hint[0]) if p) if hint else ""
                suffix = f"; did you mean {suggestion!r}?" if hint else ""
                problems.append(f"{where}: unknown setting (from {name}){suffix}")
                break
            owner = fields[part]
            if depth == len(parts) - 1:
                try:
                    node[part] = _parse_env(env[name], owner)
                    sources[where] = name
                except _EnvProblem as problem:
                    problems.append(f"{where}: {problem} (from {name})")
            else:
                inner = _unwrap_optional(owner)[0]
                if not (isinstance(inner, type) and attrs.has(inner)):
                    problems.append(f"{where}: is a value, not a table (from {name})")
                    break
                child = node.setdefault(part, {})
                node = child
    return layer, problems, sources


# -- errors --------------------------------------------------------------------------------------


def _field_names(cls: Any) -> list[str]:
    return list(_field_types(cls))


_MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def _leaf_message(error: BaseException, field_type: Any) -> str:
    inner, _ = _unwrap_optional(field_type)
    is_table = isinstance(inner, type) and attrs.has(inner)
    if is_table and isinstance(error, AttributeError | TypeError):
        return "expected a table of settings"
    # A mapping field (runner.queues) given a string or a number: cattrs' own error is about
    # the value's missing .items(), so say what the field wants instead.
    if typing.get_origin(inner) in _MAPPINGS and isinstance(error, AttributeError | TypeError):
        return 'expected a table of names to values (TOML [section] or JSON {"name": 4})'
    return str(error)


def _flatten(
    error: BaseException, path: tuple[str, ...], cls: Any, field_type: Any = None
) -> Iterator[str]:
    """One ``path: rule`` line per leaf problem in a cattrs error tree."""
    if isinstance(error, ClassValidationError):
        with_notes, others = error.group_exceptions()
        for sub, note in with_notes:
            yield from _flatten(sub, (*path, note.name), note.type, note.type)
        for other in others:
            yield from _flatten(other, path, error.cl)
        return
    if isinstance(error, BaseExceptionGroup):
        for member in error.exceptions:
            yield from _flatten(member, path, None)
        return
    if isinstance(error, ForbiddenExtraKeysError):
        known = _field_names(error.cl)
        for key in sorted(error.extra_fields):
            where = ".".join((*path, key))
            hint = difflib.get_close_matches(key, known, n=1)
            suffix = f"; did you mean {'.'.join((*path, hint[0]))!r}?" if hint else ""
            yield f"{where}: unknown setting{suffix}"
        return
    if isinstance(error, KeyError):
        yield f"{'.'.join(path) or '<settings>'}: required, but not given"
        return
    message = _leaf_message(error, field_type)
    # An attrs validator names its own field first ("lease must be positive, got 0"): that field
    # belongs to the class being built, so it extends the path.
    names = _field_names(_unwrap_optional(cls)[0])
    head, _, rest = message.partition(" ")
    if head.rstrip(":") in names and rest:
        path = (*path, head.rstrip(":"))
        message = rest
    yield f"{'.'.join(path) or '<settings>'}: {message}"


def structure_settings(
    data: Mapping[str, Any], cls: type[T], *, sources: Mapping[str, str] | None = None
) -> T:
    """Structure *data* into *cls*; a :class:`SettingsError` names every problem's field path."""
    try:
        made = converter.structure(data, cls)
    except (
        cattrs.BaseValidationError,
        ForbiddenExtraKeysError,
        ValueError,
        TypeError,
        KeyError,
        AttributeError,
    ) as error:
        problems = []
        for line in _flatten(error, (), cls):
            where = line.partition(": ")[0]
            source = (sources or {}).get(where)
            problems.append(f"{line} (from {source})" if source else line)
        raise SettingsError("; ".join(problems)) from None
    out_of_range = []
    for where, rule in _range_problems(made, ()):
        source = (sources or {}).get(where)
        line = f"{where}: {rule}"
        out_of_range.append(f"{line} (from {source})" if source else line)
    if out_of_range:
        raise SettingsError("; ".join(out_of_range))
    return made


# -- ranges --------------------------------------------------------------------------------------
#
# The classes' own validators refuse what is wrong in kind (negative, zero, NaN, infinite). The
# bounds below refuse what is absurd in size, before it becomes an OverflowError in every claim
# (a lease of 1e308 seconds overflows timedelta; a claim batch of 2**70 overflows SQLite).

MAX_SECONDS = 365 * 24 * 3600
"""The longest duration any setting of trio_supervise takes: 365 days, in seconds."""

MAX_COUNT = 1_000_000
"""The largest count (concurrency, batch sizes, bounds on errors, attempts and restarts)."""

_INT64 = 2**63
_UNBOUNDED_COUNTS = frozenset({"port"})
"""Int fields with a range of their own (checked by their validator)."""
_SEED_FIELDS = frozenset({"jitter_seed"})
"""Int fields that are identifiers, not counts: any 64-bit integer."""


_PACKAGE = __name__.split(".", 1)[0]
"""The top package: settings classes anywhere inside it are bounded, wherever they move."""


def _range_problems(instance: object, path: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """``(field path, rule)`` for every number of trio_supervise's own settings out of range.

    Only the library's classes are bounded (an application's own settings mean what they say);
    the tables inside them are walked whatever their class.
    """
    cls: Any = type(instance)
    if not attrs.has(cls):
        return
    ours = cls.__module__.split(".", 1)[0] == _PACKAGE
    for field in attrs.fields(cls):
        value = getattr(instance, field.name)
        where = (*path, field.name)
        if attrs.has(type(value)):
            yield from _range_problems(value, where)
        elif ours and not isinstance(value, bool):
            rule = _range_rule(field.name, value)
            if rule is not None:
                yield ".".join(where), rule


def _range_rule(name: str, value: object) -> str | None:
    if isinstance(value, float):
        if math.isfinite(value) and abs(value) <= MAX_SECONDS:
            return None
        return f"must be at most {MAX_SECONDS} seconds (365 days), got {value!r}"
    if not isinstance(value, int) or name in _UNBOUNDED_COUNTS:
        return None
    if name in _SEED_FIELDS:
        if -_INT64 <= value < _INT64:
            return None
        return f"must be a 64-bit integer, got {value!r}"
    if abs(value) <= MAX_COUNT:
        return None
    return f"must be at most {MAX_COUNT}, got {value!r}"


# -- sources -------------------------------------------------------------------------------------


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise SettingsError(_file_too_deep(path)) from None
    except FileNotFoundError:
        raise SettingsError(f"settings file {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as error:
        raise SettingsError(f"settings file {str(path)!r} is not valid TOML: {error}") from None
    except OSError as error:
        raise SettingsError(f"settings file {str(path)!r} cannot be read: {error}") from None
    except UnicodeDecodeError as error:
        raise SettingsError(f"settings file {str(path)!r} is not UTF-8: {error}") from None
    if nesting_exceeds(data):
        raise SettingsError(_file_too_deep(path))
    return data


def _file_too_deep(path: Path) -> str:
    return nested_too_deeply(f"settings file {str(path)!r}")


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


@typing.overload
def load_settings(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Settings: ...


@typing.overload
def load_settings(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    cls: type[T],
) -> T: ...


def load_settings(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    cls: type[Any] = Settings,
) -> Any:
    """Read settings from the TOML file at *path* and the environment (which wins).

    With no *path*, the file named by ``TRIO_SUPERVISE_CONFIG`` is read, if that is set.
    *env* defaults to ``os.environ``. Raises :class:`SettingsError` naming every bad field.

    *cls* is the attrs class to build, :class:`Settings` by default. An application's own
    settings subclass :class:`Settings` and add their fields (a table of their own, usually):
    they are read from the same file and from ``TRIO_SUPERVISE_*`` variables, with the same
    strictness and the same error messages, and a field without a default is required.
    """
    env = os.environ if env is None else env
    if path is None and env.get(CONFIG_ENV):
        path = env[CONFIG_ENV]
    data: dict[str, Any] = {} if path is None else _read_file(Path(path))
    layer, problems, sources = _env_layer(env, cls)
    if problems:
        raise SettingsError("; ".join(problems))
    # Layer over the defaults, so that setting one field of a nested table keeps the others.
    return structure_settings(_merge(_merge(_defaults(cls), data), layer), cls, sources=sources)


def _defaults(cls: type[Any]) -> dict[str, Any]:
    """The fields of *cls* that have defaults, unstructured; required fields (an application's
    section without defaults) are left out, so a missing one is reported by name."""
    defaults: dict[str, Any] = {}
    for field in attrs.fields(cls):
        default = field.default
        if default is attrs.NOTHING:
            continue
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            if default.takes_self:
                continue
            default = default.factory()
        defaults[field.alias] = converter.unstructure(default)
    return defaults


# -- redaction -----------------------------------------------------------------------------------

_MASK = "***"


def _redact(instance: Any) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for field in attrs.fields(type(instance)):
        value = getattr(instance, field.name)
        secret = field.metadata.get(_SECRET)
        if value is None:
            result[field.name] = None
        elif secret == "url":
            result[field.name] = redact_dsn(str(value))
        elif secret:
            result[field.name] = _MASK
        elif attrs.has(type(value)):
            result[field.name] = _redact(value)
        elif isinstance(value, enum.Enum):
            result[field.name] = value.value
        else:
            result[field.name] = converter.unstructure(value)
    return result
