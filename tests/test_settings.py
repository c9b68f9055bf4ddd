"""Settings: TOML file and environment layering, errors that name the field and the rule."""

from __future__ import annotations

import datetime as dt
import math
import types
import typing
from pathlib import Path
from typing import Any

import attrs
import hypothesis
import pytest
from hypothesis import strategies as st

from trio_supervise import JitterMode, SettingsError
from trio_supervise._settings import (
    DEFAULT_DATABASE_URL,
    HttpSettings,
    LogLevel,
    Settings,
    default_worker_id,
    load_settings,
    structure_settings,
)
from trio_supervise.console import hash_password
from trio_supervise.queues import redact_dsn


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "settings.toml"
    path.write_text(text)
    return path


def test_defaults_need_no_file_and_no_environment() -> None:
    """With nothing set, the settings are the documented defaults."""
    settings = load_settings(env={})
    assert settings == Settings()
    assert settings.database_url == DEFAULT_DATABASE_URL == "sqlite:///trio_supervise.db"
    assert settings.http == HttpSettings(host="127.0.0.1", port=8080, enabled=True)
    assert settings.log_level is LogLevel.INFO
    assert settings.jitter_seed is None


def test_file_values_are_read(tmp_path: Path) -> None:
    """A TOML file sets top-level and nested fields."""
    path = write(
        tmp_path,
        'database_url = "sqlite:///other.db"\nlog_level = "debug"\njitter_seed = 7\n'
        "[http]\nport = 9000\nenabled = false\n",
    )
    settings = load_settings(path, env={})
    assert settings.database_url == "sqlite:///other.db"
    assert settings.log_level is LogLevel.DEBUG
    assert settings.jitter_seed == 7
    assert settings.http.port == 9000
    assert settings.http.enabled is False
    assert settings.http.host == "127.0.0.1"


def test_environment_wins_over_the_file(tmp_path: Path) -> None:
    """A TRIO_SUPERVISE_* variable overrides the file; untouched file values stay."""
    path = write(tmp_path, '[http]\nport = 9000\nhost = "127.0.0.2"\n')
    env = {
        "TRIO_SUPERVISE_HTTP__PORT": "9100",
        "TRIO_SUPERVISE_DATABASE_URL": "postgresql://app@127.0.0.1/app",
        "TRIO_SUPERVISE_HTTP__ENABLED": "off",
        "TRIO_SUPERVISE_LOG_LEVEL": "WARNING",
        "UNRELATED": "ignored",
    }
    settings = load_settings(path, env=env)
    assert settings.http.port == 9100
    assert settings.http.host == "127.0.0.2"
    assert settings.http.enabled is False
    assert settings.database_url == "postgresql://app@127.0.0.1/app"
    assert settings.log_level is LogLevel.WARNING


def test_config_file_can_be_named_by_the_environment(tmp_path: Path) -> None:
    """TRIO_SUPERVISE_CONFIG names the file when no path is given."""
    path = write(tmp_path, "[http]\nport = 9001\n")
    assert load_settings(env={"TRIO_SUPERVISE_CONFIG": str(path)}).http.port == 9001


def test_empty_environment_value_means_none_for_optional_fields() -> None:
    """An empty value clears an optional field."""
    assert load_settings(env={"TRIO_SUPERVISE_JITTER_SEED": ""}).jitter_seed is None
    assert load_settings(env={"TRIO_SUPERVISE_JITTER_SEED": "42"}).jitter_seed == 42


def test_test_suite_variables_are_not_settings() -> None:
    """TRIO_SUPERVISE_TEST_*, _REQUIRE_* and _MODEL_* belong to the test suite, _BENCH_* to the
    benchmarks: each variable the project itself reads loads as no setting."""
    env = {
        "TRIO_SUPERVISE_TEST_DSN": "x",
        "TRIO_SUPERVISE_REQUIRE_POSTGRES": "1",
        "TRIO_SUPERVISE_MODEL_EXAMPLES": "300",
        "TRIO_SUPERVISE_BENCH_DSN": "postgresql:///test",
    }
    assert load_settings(env=env) == Settings()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRIO_SUPERVISE_HTTP__PORT": "abc"}, "http.port: expected int, got 'abc'"),
        ({"TRIO_SUPERVISE_HTTP__PORT": "70000"}, "http.port: must be between 0 and 65535"),
        ({"TRIO_SUPERVISE_HTTP__ENABLED": "maybe"}, "http.enabled: expected true or false"),
        ({"TRIO_SUPERVISE_HTTP__REFRESH": "0"}, "http.refresh: must be positive"),
        ({"TRIO_SUPERVISE_HTTP__HOST": " "}, "http.host: must not be empty"),
        ({"TRIO_SUPERVISE_JITTER_SEED": "x"}, "jitter_seed: expected int, got 'x'"),
        ({"TRIO_SUPERVISE_LOG_LEVEL": "loud"}, "log_level: expected one of debug, info"),
        ({"TRIO_SUPERVISE_HTTP": "x"}, "http: is a table of settings"),
        ({"TRIO_SUPERVISE_HTTP__PORT__X": "1"}, "http.port: is a value, not a table"),
        ({"TRIO_SUPERVISE_RUNNER__QUEUES": "x"}, "runner.queues: expected a table of names"),
        ({"TRIO_SUPERVISE_RUNNER__QUEUES": "3"}, "runner.queues: expected a table of names"),
    ],
)
def test_environment_errors_name_the_field_path_and_the_rule(
    env: dict[str, str], message: str
) -> None:
    """Every bad variable is reported as 'path: rule', naming the variable too."""
    with pytest.raises(SettingsError) as error:
        load_settings(env=env)
    assert str(error.value).startswith(message)
    assert next(iter(env)) in str(error.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[http]\nport = 'abc'\n", "http.port: expected int, got str"),
        ("[http]\nport = -1\n", "http.port: must be between 0 and 65535, got -1"),
        ("[http]\nrefresh = 0\n", "http.refresh: must be positive, got 0.0"),
        ("database_url = 5\n", "database_url: expected str, got int"),
        ('log_level = "loud"\n', "log_level: expected one of debug, info, warning, error"),
        ('http = "x"\n', "http: expected a table of settings"),
        ("jitter_seed = 1.5\n", "jitter_seed: expected int, got float"),
        ('[runner]\nqueues = "x"\n', "runner.queues: expected a table of names to values"),
        ("[runner]\nqueues = [1]\n", "runner.queues: expected a table of names to values"),
        (
            '[runner.rate_limits]\nmail = "fast"\n',
            "runner.rate_limits: rate must be N/PERIOD",
        ),
    ],
)
def test_file_errors_name_the_field_path_and_the_rule(
    tmp_path: Path, text: str, message: str
) -> None:
    """A wrong type or a broken rule in the file is 'path: rule'."""
    with pytest.raises(SettingsError, match="^" + message.replace(".", r"\.")):
        load_settings(write(tmp_path, text), env={})


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    """Several bad fields give one error listing each of them."""
    path = write(tmp_path, "database_url = 1\n[http]\nhost = 2\nport = 'x'\n")
    with pytest.raises(SettingsError) as error:
        load_settings(path, env={})
    message = str(error.value)
    for part in ("database_url: expected str", "http.host: expected str", "http.port: expected"):
        assert part in message


def test_unknown_keys_in_the_file_are_refused_by_name(tmp_path: Path) -> None:
    """A typo is an error that names the key and suggests the right one."""
    path = write(tmp_path, "colour = 1\n[http]\nprot = 1\n")
    with pytest.raises(SettingsError) as error:
        load_settings(path, env={})
    message = str(error.value)
    assert "colour: unknown setting" in message
    assert "http.prot: unknown setting; did you mean 'http.port'?" in message


def test_unknown_environment_variables_are_refused_by_name() -> None:
    """A misspelt TRIO_SUPERVISE_* variable is an error, not silently ignored."""
    with pytest.raises(SettingsError) as error:
        load_settings(env={"TRIO_SUPERVISE_DATABSE_URL": "sqlite:///x.db"})
    assert str(error.value) == (
        "databse_url: unknown setting (from TRIO_SUPERVISE_DATABSE_URL); "
        "did you mean 'database_url'?"
    )


def test_a_missing_file_is_one_clear_error(tmp_path: Path) -> None:
    """Naming a file that does not exist says so."""
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", env={})


def test_invalid_toml_is_one_clear_error(tmp_path: Path) -> None:
    """A file that is not TOML says so."""
    with pytest.raises(SettingsError, match="is not valid TOML"):
        load_settings(write(tmp_path, "[http\n"), env={})


def test_structure_settings_refuses_a_wrong_shape() -> None:
    """structure_settings is the same machinery for data from elsewhere."""
    assert structure_settings({"http": {"port": 1}}, Settings).http.port == 1
    with pytest.raises(SettingsError, match=r"^http\.port: expected int, got bool$"):
        structure_settings({"http": {"port": True}}, Settings)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("sqlite:///trio_supervise.db", "sqlite:///trio_supervise.db"),
        ("memory://", "memory://"),
        ("postgresql://app@db/app", "postgresql://app@db/app"),
        ("postgresql://app:s3cret@db:5432/app", "postgresql://app:***@db:5432/app"),
        (
            "postgresql://db/app?user=app&password=s3cret&sslmode=require",
            "postgresql://db/app?user=app&password=***&sslmode=require",
        ),
    ],
)
def test_redact_dsn_masks_passwords_only(url: str, shown: str) -> None:
    """Passwords in the authority or the query are masked; the rest stays readable."""
    assert redact_dsn(url) == shown


def test_redacted_view_masks_the_database_password() -> None:
    """redacted() is plain data with the DSN password masked."""
    settings = load_settings(env={"TRIO_SUPERVISE_DATABASE_URL": "postgresql://app:hunter2@db/app"})
    view = settings.redacted()
    assert view["database_url"] == "postgresql://app:***@db/app"
    assert "hunter2" not in repr(view)
    assert view["http"] == {
        "enabled": True,
        "host": "127.0.0.1",
        "port": 8080,
        "refresh": 5.0,
        "graceful_timeout": 3.0,
        "token": None,
        "password_hash": None,
        "read_only": False,
    }
    assert view["log_level"] == "info"


# -- the console's credentials --------------------------------------------------------------------

TOKEN = "s3cret-console-token"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "ops.example.com"])
def test_an_address_off_loopback_needs_console_credentials(host: str) -> None:
    """Bound off loopback without a token or password hash, the settings are refused, naming
    the host and both settings that would do."""
    with pytest.raises(SettingsError) as caught:
        load_settings(env={"TRIO_SUPERVISE_HTTP__HOST": host})
    assert str(caught.value) == (
        f"http.host: {host!r} is not a loopback address, so the console needs credentials: "
        "set http.token or http.password_hash (TRIO_SUPERVISE_HTTP__TOKEN, "
        "TRIO_SUPERVISE_HTTP__PASSWORD_HASH) (from TRIO_SUPERVISE_HTTP__HOST)"
    )
    served = load_settings(
        env={"TRIO_SUPERVISE_HTTP__HOST": host, "TRIO_SUPERVISE_HTTP__TOKEN": TOKEN}
    )
    assert served.http.authenticates
    disabled = {"TRIO_SUPERVISE_HTTP__HOST": host, "TRIO_SUPERVISE_HTTP__ENABLED": "false"}
    assert not load_settings(env=disabled).http.enabled  # nothing served, nothing to guard


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "localhost"])
def test_loopback_needs_no_credentials(host: str) -> None:
    """On loopback the console may be served without credentials."""
    assert not load_settings(env={"TRIO_SUPERVISE_HTTP__HOST": host}).http.authenticates


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("TOKEN", "short", "http.token: must be at least 16 printable ASCII characters"),
        ("TOKEN", "with spaces in it, long", "http.token: must be at least 16 printable"),
        ("PASSWORD_HASH", "hunter2", "http.password_hash: must be 'scrypt$n=N,r=R,p=P$SALT$HASH'"),
        ("PASSWORD_HASH", "md5$a$b$c", "http.password_hash: unknown scheme 'md5'"),
        ("PASSWORD_HASH", "scrypt$n=3,r=8,p=1$c2FsdHNhbHQ$" + "A" * 43, "n a power of 2"),
        ("PASSWORD_HASH", "pbkdf2_sha256$i=10$c2FsdHNhbHQ$" + "A" * 43, "i (iterations) from"),
    ],
)
def test_bad_console_credentials_are_refused_by_name(name: str, value: str, message: str) -> None:
    """A token too short or a hash not of the expected form names the field and the rule."""
    with pytest.raises(SettingsError) as caught:
        load_settings(env={f"TRIO_SUPERVISE_HTTP__{name}": value})
    assert message in str(caught.value)
    assert value not in str(caught.value)  # the secret is not repeated


def test_console_secrets_are_masked_in_the_redacted_view() -> None:
    """token and password_hash are secrets: `trio-supervise config` shows ***."""
    made = hash_password("correct horse", scheme="pbkdf2_sha256")
    env = {"TRIO_SUPERVISE_HTTP__TOKEN": TOKEN, "TRIO_SUPERVISE_HTTP__PASSWORD_HASH": made}
    view = load_settings(env=env).redacted()
    assert (view["http"]["token"], view["http"]["password_hash"]) == ("***", "***")
    assert TOKEN not in repr(view)


def test_runner_settings_are_layered_like_the_rest(tmp_path: Path) -> None:
    """runner.* comes from the file and the environment; worker_id defaults to host-pid."""
    path = write(tmp_path, "[runner]\nlease = 30\nconcurrency = 4\n")
    settings = load_settings(path, env={"TRIO_SUPERVISE_RUNNER__CONCURRENCY": "8"})
    assert settings.runner.lease == 30.0
    assert settings.runner.concurrency == 8
    assert settings.runner.worker_id == default_worker_id()


def test_rate_limits_are_read_from_a_table_of_short_forms(tmp_path: Path) -> None:
    """``[runner.rate_limits]`` maps queue names to rates written ``N/PERIOD``; shown so."""
    from trio_supervise import RateLimit

    path = write(tmp_path, '[runner.rate_limits]\nmail = "100/60s"\nsms = "5/500ms"\n')
    settings = load_settings(path, env={})
    assert settings.runner.rate_limits == {"mail": RateLimit(100, 60), "sms": RateLimit(5, 0.5)}
    assert settings.redacted()["runner"]["rate_limits"] == {"mail": "100/60s", "sms": "5/500ms"}


def test_one_field_of_a_nested_table_keeps_the_other_defaults() -> None:
    """Setting runner.claim_retry.jitter alone leaves its backoff bounds at their defaults."""
    settings = load_settings(env={"TRIO_SUPERVISE_RUNNER__CLAIM_RETRY__JITTER": "full"})
    assert settings.runner.claim_retry.jitter is JitterMode.FULL
    assert settings.runner.claim_retry.max_backoff == Settings().runner.claim_retry.max_backoff


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRIO_SUPERVISE_POSTGRES__POOL_SIZE": "0"}, "postgres.pool_size: must be at least 1"),
        (
            {"TRIO_SUPERVISE_POSTGRES__WORKER_POOL_SIZE": "-1"},
            "postgres.worker_pool_size: must be at least 1, got -1",
        ),
        (
            {"TRIO_SUPERVISE_POSTGRES__CONNECT_TIMEOUT": "0"},
            "postgres.connect_timeout: must be positive",
        ),
    ],
)
def test_postgres_pool_settings_are_checked_as_they_load(env: dict[str, str], message: str) -> None:
    """The PostgreSQL queue's pool sizes and timeout are refused by name as the settings load,
    not when the service first connects."""
    with pytest.raises(SettingsError, match=message):
        load_settings(env=env)
    worker = load_settings(env={"TRIO_SUPERVISE_POSTGRES__WORKER_POOL_SIZE": "6"}).postgres
    assert (worker.worker_pool_size, worker.pool_size) == (6, Settings().postgres.pool_size)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRIO_SUPERVISE_RUNNER__LEASE": "1"}, "runner.lease: must be >= 3 seconds, got 1.0"),
        ({"TRIO_SUPERVISE_RUNNER__CONCURRENCY": "0"}, "runner.concurrency: must be >= 1, got 0"),
        ({"TRIO_SUPERVISE_RUNNER__POLL_INTERVAL": "0"}, "runner.poll_interval: must be positive"),
        (
            {"TRIO_SUPERVISE_RUNNER__RETRY__MIN_BACKOFF": "1"},
            "runner.retry.max_backoff: required, but not given",
        ),
        (
            {"TRIO_SUPERVISE_RUNNER__CLAIM_RETRY__JITTER": "x"},
            "runner.claim_retry.jitter: expected one of equal, full, none, got 'x'",
        ),
    ],
)
def test_runner_errors_name_the_field_path_and_the_rule(env: dict[str, str], message: str) -> None:
    """The runner's own validation rules are reported under runner.*."""
    with pytest.raises(SettingsError) as error:
        load_settings(env=env)
    assert str(error.value).startswith(message)


# -- every number is range-checked when settings load ----------------------------------------------


def _numeric_fields(cls: type, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], type]]:
    """Every int or float field of *cls* and the tables it holds, by field path."""
    found = []
    attrs.resolve_types(cls)
    for field in attrs.fields(cls):
        inner = field.type
        if typing.get_origin(inner) in (typing.Union, types.UnionType):
            inner = next(arg for arg in typing.get_args(inner) if arg is not type(None))
        if attrs.has(inner):
            found.extend(_numeric_fields(inner, (*prefix, field.name)))
        elif inner in (int, float):
            found.append(((*prefix, field.name), inner))
    return found


NUMERIC_FIELDS = _numeric_fields(Settings)
NUMBERS = (
    st.floats(allow_nan=True, allow_infinity=True).map(repr)
    | st.integers().map(str)
    | st.integers(min_value=-(2**80), max_value=2**80).map(str)
    | st.sampled_from(["1e308", "-1e308", "inf", "-inf", "nan", str(2**63), str(2**63 - 1)])
)


def test_the_numeric_fields_are_found() -> None:
    """The walk below sees the runner's, the HTTP server's and the claim backoff's numbers."""
    paths = {".".join(path) for path, _ in NUMERIC_FIELDS}
    assert {"runner.lease", "runner.concurrency", "http.port", "jitter_seed"} <= paths
    assert {"runner.claim_retry.max_backoff", "runner.retry.min_backoff"} <= paths


@pytest.mark.parametrize(
    ("path", "kind"), [pytest.param(p, k, id=".".join(p)) for p, k in NUMERIC_FIELDS]
)
@hypothesis.given(text=NUMBERS)
def test_any_number_in_any_setting_loads_in_range_or_is_refused_by_name(
    path: tuple[str, ...], kind: type, text: str
) -> None:
    """A number either loads as a value every backend can use, or is one SettingsError naming
    the field; never an OverflowError later."""
    name = "TRIO_SUPERVISE_" + "__".join(path).upper()
    env = {name: text}
    if path[:2] == ("runner", "retry"):  # a table with required fields: give both bounds
        for bound in ("MIN_BACKOFF", "MAX_BACKOFF"):
            env.setdefault(f"TRIO_SUPERVISE_RUNNER__RETRY__{bound}", "1")
    refused: str | None = None
    try:
        settings = load_settings(None, env)
    except SettingsError as error:
        refused = str(error)
    if refused is not None:
        assert refused.startswith(".".join(path) + ": "), refused
        assert "\n" not in refused
        return
    value: Any = settings
    for part in path:
        value = getattr(value, part)
    if isinstance(value, float):
        assert math.isfinite(value)
        dt.datetime.now(dt.UTC) + dt.timedelta(seconds=value)  # no overflow
    else:
        assert -(2**63) <= value < 2**63  # fits the backends' 64-bit integers
