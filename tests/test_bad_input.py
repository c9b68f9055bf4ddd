"""R4: a catalogue of bad input. Each case gets one clear error and loses nothing.

One test id per case. "One clear error": a single line that names the field or the rule (or, over
HTTP, a 4xx status). "Loses nothing": the queue's items are as before, and a running runner keeps
running and finishing other work.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import os
import socket
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import hypothesis
import pytest
import trio
from hypothesis import strategies as st

from trio_supervise import (
    ConfigError,
    DriverError,
    DriverRegistry,
    MemoryQueue,
    Outcome,
    Reschedule,
    RunnerSettings,
    RunnerState,
    SettingsError,
    Stop,
    WorkflowRunner,
)
from trio_supervise._cli import main as cli_main
from trio_supervise._service import Service
from trio_supervise._settings import HttpSettings, Settings, load_settings
from trio_supervise.console import HttpBindError
from trio_supervise.queues import ItemState, WorkItem, WorkQueue
from trio_supervise.queues._factory import parse_queue_url

from .queues.conftest import BACKENDS, open_backend

# -- settings ------------------------------------------------------------------------------------

ENV_CASES = [
    ("HTTP__PORT", "abc", "http.port: expected int, got 'abc'"),
    ("HTTP__PORT", "70000", "http.port: must be between 0 and 65535"),
    ("HTTP__PORT", "-1", "http.port: must be between 0 and 65535"),
    ("HTTP__ENABLED", "maybe", "http.enabled: expected true or false"),
    ("HTTP__HOST", "", "http.host: must not be empty"),
    ("HTTP__REFRESH", "inf", "http.refresh: must be positive"),
    ("HTTP__REFRESH", "-1", "http.refresh: must be positive"),
    ("HTTP__GRACEFUL_TIMEOUT", "nan", "http.graceful_timeout: must be positive"),
    ("RUNNER__LEASE", "-1", "runner.lease: must be >= 3 seconds"),
    ("RUNNER__LEASE", "2", "runner.lease: must be >= 3 seconds"),
    ("RUNNER__LEASE", "nan", "runner.lease: must be a finite number"),
    ("RUNNER__LEASE", "inf", "runner.lease: must be a finite number"),
    ("RUNNER__LEASE", "soon", "runner.lease: expected a number"),
    ("RUNNER__POLL_INTERVAL", "0", "runner.poll_interval: must be positive"),
    ("RUNNER__REQUEUE_DELAY", "-5", "runner.requeue_delay: must be >= 0 seconds"),
    ("RUNNER__SHUTDOWN_GRACE", "NaN", "runner.shutdown_grace: must be a finite number"),
    ("RUNNER__CONCURRENCY", "0", "runner.concurrency: must be >= 1"),
    ("RUNNER__CLAIM_BATCH", "1.5", "runner.claim_batch: expected int"),
    ("RUNNER__MAX_ERRORS", "0", "runner.max_errors: must be >= 1"),
    ("RUNNER__WORKER_ID", "", "runner.worker_id: must be a non-empty string"),
    ("RUNNER__CLAIM_RETRY", "5", "runner.claim_retry: is a table of settings"),
    ("JITTER_SEED", "x", "jitter_seed: expected int"),
    ("LOG_LEVEL", "loud", "log_level: expected one of debug, info, warning, error, critical"),
    ("LOG_LEVEL__X", "1", "log_level: is a value, not a table"),
    ("DATABASE_URL", " ", "database_url: must not be empty"),
    ("DATABSE_URL", "x", "databse_url: unknown setting"),
    ("HTTP__PROT", "1", "http.prot: unknown setting (from TRIO_SUPERVISE_HTTP__PROT); did you"),
    ("HTTP", "1", "http: is a table of settings"),
    ("HTTP____PORT", "1", "malformed settings variable"),
    # Out of range: refused when settings load, not as an OverflowError in every claim.
    ("RUNNER__LEASE", "1e308", "runner.lease: must be at most 31536000 seconds (365 days)"),
    ("RUNNER__POLL_INTERVAL", "1e12", "runner.poll_interval: must be at most 31536000 seconds"),
    ("RUNNER__REQUEUE_DELAY", "1e16", "runner.requeue_delay: must be at most 31536000 seconds"),
    ("RUNNER__SHUTDOWN_GRACE", "9e99", "runner.shutdown_grace: must be at most 31536000"),
    ("RUNNER__CLAIM_RETRY__MAX_BACKOFF", "1e300", "runner.claim_retry.max_backoff: must be at"),
    ("RUNNER__CLAIM_RETRY__MAX_RESTARTS", str(2**70), "runner.claim_retry.max_restarts: must be"),
    ("RUNNER__CLAIM_RETRY__MIN_BACKOFF", "inf", "runner.claim_retry.min_backoff: must be a finite"),
    ("RUNNER__CONCURRENCY", str(2**63), "runner.concurrency: must be at most 1000000"),
    ("RUNNER__CLAIM_BATCH", "99999999999", "runner.claim_batch: must be at most 1000000"),
    ("RUNNER__SETTLE_BATCH", "0", "runner.settle_batch: must be >= 1"),
    ("RUNNER__MAX_ERRORS", str(2**40), "runner.max_errors: must be at most 1000000"),
    ("RUNNER__ERROR_HISTORY", "-1", "runner.error_history: must be >= 0"),
    ("HTTP__REFRESH", "1e100", "http.refresh: must be at most 31536000 seconds"),
    ("HTTP__GRACEFUL_TIMEOUT", "0", "http.graceful_timeout: must be positive"),
    ("JITTER_SEED", str(2**64), "jitter_seed: must be a 64-bit integer"),
    ("HTTP__HOST", "bad host", "http.host: must be an IP address or a host name"),
    ("HTTP__HOST", "a/b", "http.host: must be an IP address or a host name"),
    ("HTTP__HOST", "x" * 300, "http.host: must be an IP address or a host name"),
]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [pytest.param(*case, id=f"env-{case[0].lower()}={case[1]!r}") for case in ENV_CASES],
)
def test_bad_environment_settings(name: str, value: str, message: str) -> None:
    """A bad TRIO_SUPERVISE_* variable is one SettingsError line naming the field and rule."""
    with pytest.raises(SettingsError) as caught:
        load_settings(None, {f"TRIO_SUPERVISE_{name}": value})
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


FILE_CASES = [
    ("port-as-text", '[http]\nport = "9000"\n', "http.port: expected int, got str"),
    ("unknown-key", "[http]\nprot = 1\n", "http.prot: unknown setting; did you mean 'http.port'?"),
    ("unknown-top", "nope = 1\n", "nope: unknown setting"),
    ("negative-lease", "[runner]\nlease = -3.0\n", "runner.lease: must be >= 3 seconds"),
    ("nan-lease", "[runner]\nlease = nan\n", "runner.lease: must be a finite number"),
    ("inf-delay", "[runner]\nrequeue_delay = inf\n", "runner.requeue_delay: must be a finite"),
    ("bool-lease", "[runner]\nlease = true\n", "runner.lease: expected float, got bool"),
    ("table-as-int", "http = 5\n", "http: expected a table of settings"),
    ("list-url", 'database_url = ["a"]\n', "database_url: expected str, got list"),
    (
        "negative-backoff",
        "[runner.claim_retry]\nmin_backoff = -1\n",
        "runner.claim_retry.min_backoff: must be a finite number >= 0",
    ),
    ("not-toml", "[http\nport=1", "is not valid TOML"),
    ("huge-lease", "[runner]\nlease = 1e308\n", "runner.lease: must be at most 31536000 seconds"),
    ("inf-poll", "[runner]\npoll_interval = inf\n", "runner.poll_interval: must be a finite"),
    ("huge-batch", "[runner]\nclaim_batch = 9223372036854775807\n", "must be at most 1000000"),
    ("deep-arrays", "x = " + "[" * 5000 + "]" * 5000, "is nested too deeply (more than 64 levels)"),
    ("deep-tables", "x = " + "{a=" * 2000 + "1" + "}" * 2000, "is nested too deeply (more than 64"),
    ("just-too-deep", "x = " + "[" * 65 + "]" * 65, "is nested too deeply (more than 64 levels)"),
    ("deep-dotted", "[" + ".".join(["a"] * 5000) + "]\n", "is nested too deeply (more than 64"),
    ("not-utf8", b"\xff\xfe = 1".decode("latin-1"), "is not"),
]


@pytest.mark.parametrize(
    ("text", "message"), [pytest.param(t, m, id=f"file-{name}") for name, t, m in FILE_CASES]
)
def test_bad_settings_files(tmp_path: Path, text: str, message: str) -> None:
    """A bad settings file is one SettingsError line naming the field and rule."""
    path = tmp_path / "settings.toml"
    path.write_bytes(text.encode("latin-1" if "\xff" in text else "utf-8"))
    with pytest.raises(SettingsError) as caught:
        load_settings(path, {})
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_missing_settings_file_is_named(tmp_path: Path) -> None:
    """A settings file that does not exist is named in the error."""
    with pytest.raises(SettingsError, match=r"nowhere\.toml' does not exist"):
        load_settings(tmp_path / "nowhere.toml", {})


URL_CASES = [
    ("mysql://x", "unknown queue URL scheme 'mysql'"),
    ("redis://u:s3cret@h/0", "unknown queue URL scheme 'redis' in 'redis://u:***@h/0'"),
    ("sqlite://", "names no SQLite file"),
    ("sqlite:///", "names no SQLite file"),
    ("sqlite:///a.db?mode=ro", "SQLite queue URLs take no query string"),
    ("memory://x", "'memory://' takes nothing after the scheme"),
    ("nonsense", "'nonsense' is not a queue URL"),
    ("", "'' is not a queue URL"),
]


@pytest.mark.parametrize(
    ("url", "message"), [pytest.param(u, m, id=f"url-{u or 'empty'}") for u, m in URL_CASES]
)
def test_bad_queue_urls(url: str, message: str) -> None:
    """A queue URL that fits no rule names the rules (and never echoes a password)."""
    with pytest.raises(ValueError, match="a queue URL is 'memory://'") as caught:
        parse_queue_url(url)
    assert message in str(caught.value)
    assert "s3cret" not in str(caught.value)


async def test_a_service_with_a_bad_url_fails_before_anything_starts() -> None:
    """Service.run refuses a bad database_url before starting any worker."""
    service = Service(settings=Settings(database_url="mysql://x"), handle_signals=False)
    with pytest.raises(ValueError, match="unknown queue URL scheme 'mysql'"):
        await service.run()
    assert service.supervisor is None


# -- item configs, spec ids and drivers ------------------------------------------------------------


@attrs.frozen
class Days:
    days: int
    label: str = ""


@attrs.define
class TypedDriver:
    """Spec 'typed' structures its config into Days; spec 'plain' reschedules with its config."""

    name: str = "typed"
    spec_ids: Sequence[str] = ("typed",)
    config_type: type = Days

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> Outcome:
        await trio.lowlevel.checkpoint()
        return Stop()


@attrs.define
class RescheduleDriver:
    """Reschedules items with whatever config the item asks for under 'next' (if any)."""

    name: str = "resched"
    spec_ids: Sequence[str] = ("resched",)
    next_config: Any = None

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> Outcome:
        await trio.lowlevel.checkpoint()
        if item.id == "good":
            return Stop()
        return Reschedule(dt.datetime(2030, 1, 1, tzinfo=dt.UTC), self.next_config)


async def _no_context() -> None:
    return None


async def _run_until_bad_errored(
    queue: MemoryQueue, registry: DriverRegistry[None], bad_id: str
) -> WorkflowRunner[None]:
    """Run a runner until *bad_id* has an error and 'good' completed; it must still be running."""
    runner: WorkflowRunner[None] = WorkflowRunner(
        queue=queue,
        registry=registry,
        settings=RunnerSettings(worker_id="w", requeue_delay=3600),
        build_context=_no_context,
    )
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            while (await queue.get(bad_id)).error_count == 0 or (  # noqa: ASYNC110
                await queue.get("good")
            ).state is not ItemState.COMPLETED:
                await trio.sleep(0.1)
            assert runner.state is RunnerState.RUNNING
            runner.shutdown.begin("test")
    return runner


CONFIG_CASES = [
    ("wrong-type", {"days": "x"}, "days: expected int, got str"),
    ("float-for-int", {"days": 1.5}, "days: expected int, got float"),
    ("bool-for-int", {"days": True}, "days: expected int, got bool"),
    ("null-for-int", {"days": None}, "days: expected int, got null"),
    ("missing-field", {}, "days: required field missing"),
    ("unknown-field", {"days": 1, "extra": 2}, "unknown field(s) extra"),
    ("list", [1, 2], "expected an object"),
    ("string", "text", "expected an object"),
    ("wrong-nested-type", {"days": 1, "label": 5}, "label: expected str, got int"),
]


@pytest.mark.parametrize(
    ("config", "message"), [pytest.param(c, m, id=f"config-{n}") for n, c, m in CONFIG_CASES]
)
async def test_a_config_that_does_not_fit_the_driver_is_an_item_error(
    autojump_clock: trio.testing.MockClock, config: Any, message: str
) -> None:
    """A typed config of the wrong shape: the item is dead at once (no retry can fix it), keeps
    its config for a fix and `items retry`; the runner goes on."""
    queue = MemoryQueue()
    await queue.enqueue("typed", item_id="bad", config=config)
    await queue.enqueue("typed", item_id="good", config={"days": 3})
    registry: DriverRegistry[None] = DriverRegistry()
    registry.register(TypedDriver())
    await _run_until_bad_errored(queue, registry, "bad")
    bad = await queue.get("bad")
    assert bad.last_error == f"invalid config for spec 'typed': {message}"
    assert (bad.state, bad.error_count) == (ItemState.DEAD, 1)
    assert bad.config == config


NON_JSON = [
    ("nan", {"x": math.nan}),
    ("inf", {"x": math.inf}),
    ("minus-inf", [-math.inf]),
    ("nested-nan", {"a": [{"b": math.nan}]}),
    ("set", {"x": {1, 2}}),
    ("bytes", {"x": b"raw"}),
    ("object", {"x": object()}),
    ("tuple-key", {(1, 2): 3}),
    ("datetime", {"at": dt.datetime(2030, 1, 1, tzinfo=dt.UTC)}),
    ("top-level-bytes", b"raw"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("config"), [pytest.param(c, id=f"enqueue-{n}") for n, c in NON_JSON])
async def test_a_non_json_config_is_refused_at_enqueue(
    backend: str, config: Any, tmp_path: Path
) -> None:
    """enqueue refuses a config JSON cannot carry, saying so, and stores nothing."""
    async with open_backend(backend, None, tmp_path) as queue:
        await queue.enqueue("job", item_id="kept", config={"n": 1})
        with pytest.raises(ConfigError, match=r"^config is not JSON-compatible: "):
            await queue.enqueue("job", item_id="new", config=config)
        assert dict(await queue.counts()) == {("job", ItemState.QUEUED): 1}
        assert (await queue.get("kept")).config == {"n": 1}


@pytest.mark.parametrize(
    ("config"), [pytest.param(c, id=f"reschedule-{n}") for n, c in NON_JSON[:6]]
)
async def test_a_driver_rescheduling_with_a_non_json_config_is_an_item_error(
    autojump_clock: trio.testing.MockClock, config: Any
) -> None:
    """Reschedule(config=NaN...) is an outcome that cannot be stored: the driver ran, so the
    item goes dead at once (issue 29), the error naming the spec; the old config is kept."""
    queue = MemoryQueue()
    await queue.enqueue("resched", item_id="bad", config={"step": 1})
    await queue.enqueue("resched", item_id="good")
    registry: DriverRegistry[None] = DriverRegistry()
    registry.register(RescheduleDriver(next_config=config))
    await _run_until_bad_errored(queue, registry, "bad")
    bad = await queue.get("bad")
    assert bad.last_error is not None
    assert bad.last_error.startswith(
        "the reschedule outcome could not be stored: rescheduled config for spec 'resched' is "
        "not JSON-compatible: "
    )
    assert bad.config == {"step": 1}
    assert bad.state is ItemState.DEAD


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "spec_id", [pytest.param(s, id=f"spec-{s!r:.10}") for s in ("", None, 5, "s" * 201)]
)
async def test_a_bad_spec_id_is_refused_at_enqueue(
    backend: str, spec_id: Any, tmp_path: Path
) -> None:
    """An empty, over-long or non-string spec id is refused, naming the rule; nothing is
    stored."""
    async with open_backend(backend, None, tmp_path) as queue:
        with pytest.raises(
            ValueError, match=r"^spec_id must be a non-empty string of at most 200 characters, got "
        ):
            await queue.enqueue(spec_id)
        assert dict(await queue.counts()) == {}


async def test_an_item_of_an_unknown_spec_waits_untouched(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A runner never claims a spec no driver owns: the item stays queued, unchanged."""
    queue = MemoryQueue()
    stranger = await queue.enqueue("nobody-owns-this", item_id="stranger", config={"k": 1})
    await queue.enqueue("typed", item_id="good", config={"days": 1})
    await queue.enqueue("typed", item_id="bad", config={})  # to have something that errors
    registry: DriverRegistry[None] = DriverRegistry()
    registry.register(TypedDriver())
    await _run_until_bad_errored(queue, registry, "bad")
    assert await queue.get("stranger") == stranger


REGISTRY_CASES = [
    ("string-spec-ids", {"spec_ids": "typed"}, "spec_ids must be a sequence of ids"),
    ("no-spec-ids", {"spec_ids": ()}, "owns no spec ids"),
    ("empty-spec-id", {"spec_ids": ("",)}, "spec_id must be a non-empty string"),
    ("spec-listed-twice", {"spec_ids": ("a", "a")}, "spec 'a' is listed twice by 'typed'"),
    ("empty-name", {"name": ""}, "driver name must be a non-empty string"),
    ("config-type-not-attrs", {"config_type": dict}, "config_type must be an attrs class"),
]


@pytest.mark.parametrize(
    ("changes", "message"),
    [pytest.param(c, m, id=f"driver-{n}") for n, c, m in REGISTRY_CASES],
)
def test_a_bad_driver_is_refused_by_the_registry(changes: dict[str, Any], message: str) -> None:
    """DriverRegistry.register refuses a malformed driver, naming it and the rule."""
    registry: DriverRegistry[None] = DriverRegistry()
    with pytest.raises(DriverError, match=message):
        registry.register(attrs.evolve(TypedDriver(), **changes))
    assert registry.is_empty()


def test_two_drivers_claiming_one_spec_are_refused() -> None:
    """A spec id two drivers claim is refused, naming both; the first stays registered."""
    registry: DriverRegistry[None] = DriverRegistry()
    registry.register(TypedDriver())
    with pytest.raises(DriverError, match="spec 'typed' is claimed by both 'typed' and 'other'"):
        registry.register(TypedDriver(name="other"))
    assert registry.names() == ["typed"]


# -- the command line ------------------------------------------------------------------------------

SERVICE_MODULE = textwrap.dedent(
    """
    from trio_supervise import Service

    svc = Service()


    def failing():
        raise RuntimeError("factory boom")
    """
)


@pytest.fixture
def cli_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A SQLite queue holding one item, as the working directory's settings see it."""
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("TRIO_SUPERVISE_") and not name.startswith("TRIO_SUPERVISE_TEST_"):
            monkeypatch.delenv(name)
    (tmp_path / "badinput_target.py").write_text(SERVICE_MODULE)
    (tmp_path / "badinput_broken.py").write_text("raise RuntimeError('import boom')\n")
    (tmp_path / "badinput_syntax.py").write_text("def (:\n")
    (tmp_path / "badinput_needs.py").write_text("import no_such_dependency_xyz\n")
    (tmp_path / "deep.toml").write_text("x = " + "[" * 3000 + "]" * 3000)
    (tmp_path / "bad_host.toml").write_text('[http]\nhost = "bad host"\n')
    (tmp_path / "huge_lease.toml").write_text("[runner]\nlease = 1e308\n")
    url = f"sqlite:///{tmp_path / 'q.db'}"
    monkeypatch.setenv("TRIO_SUPERVISE_DATABASE_URL", url)
    assert cli_main(["items", "enqueue", "job", '{"n": 1}', "--id", "kept"]) == 0
    yield url
    for name in ("badinput_target", "badinput_broken", "badinput_syntax", "badinput_needs"):
        sys.modules.pop(name, None)


CLI_USAGE = [  # argparse refuses these: exit 2, usage and one error line
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["items"], "the following arguments are required: ACTION"),
    (["items", "show"], "one of the arguments ID --key is required"),
    (["items", "frob"], "invalid choice: 'frob'"),
    (["run"], "the following arguments are required: MODULE:ATTR"),
    (["items", "list", "--limit", "0"], "argument --limit: must be >= 1, got 0"),
    (["items", "list", "--limit", "many"], "argument --limit: expected an int, got 'many'"),
    (["items", "list", "--state", "bogus"], "argument --state: invalid choice: 'bogus'"),
    (["status", "--timeout", "abc"], "argument --timeout: invalid float value: 'abc'"),
    (["items", "list", "--nope"], "unrecognized arguments: --nope"),
    (["items", "list", "--limit", str(2**63)], "argument --limit: must be at most 1000000"),
    (["items", "list", "--limit", "9" * 5000], "argument --limit: expected an int"),
    (["status", "--timeout", "inf"], "argument --timeout: must be a number of seconds in"),
    (["status", "--timeout", "nan"], "argument --timeout: must be a number of seconds in"),
    (["status", "--timeout", "-1"], "argument --timeout: must be a number of seconds in"),
    (["status", "--timeout", "1e308"], "argument --timeout: must be a number of seconds in"),
]


@pytest.mark.parametrize(
    ("argv", "message"), [pytest.param(a, m, id="cli-usage-" + "-".join(a)) for a, m in CLI_USAGE]
)
def test_cli_usage_errors(
    cli_db: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """Malformed command lines exit 2 with the usage and one error line; nothing changes."""
    with pytest.raises(SystemExit) as caught:
        cli_main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1
    assert message in errors[0]
    _assert_cli_db_unchanged(capsys)


TOO_DEEP = "config is nested too deeply (more than 64 levels)"

CLI_USER = [  # the command runs and refuses: exit 1 (not found: 3, unreachable: 4), one line
    (["run", "nocolon"], 1, "expected MODULE:ATTR, got 'nocolon'"),
    (["run", ":app"], 1, "expected MODULE:ATTR, got ':app'"),
    (["run", "no_such_module_xyz:app"], 1, "cannot import module 'no_such_module_xyz'"),
    (["run", "json:nope"], 1, "module 'json' has no attribute 'nope'"),
    (["run", "json:dumps"], 1, "json:dumps is not a Service"),
    (["run", "badinput_broken:svc"], 1, "importing 'badinput_broken' failed: RuntimeError: import"),
    (["run", "badinput_syntax:svc"], 1, "importing 'badinput_syntax' failed: SyntaxError"),
    (["run", "badinput_needs:svc"], 1, "failed: ModuleNotFoundError: No module named 'no_such_dep"),
    (
        ["run", "badinput_target:failing"],
        1,
        "badinput_target:failing() failed: RuntimeError: factory boom",
    ),
    (["run", "badinput_target:svc", "--http", "nope"], 1, "--http expects HOST:PORT"),
    (["run", "badinput_target:svc", "--http", "127.0.0.1:99999"], 1, "--http expects HOST:PORT"),
    (["run", "badinput_target:svc", "--http", ":80"], 1, "--http expects HOST:PORT"),
    (["items", "enqueue", "job", "{bad"], 1, "CONFIG_JSON is not JSON"),
    (["items", "enqueue", "job", '{"x": NaN}'], 1, "config is not JSON-compatible"),
    (["items", "enqueue", "job", "--due", "tomorrow"], 1, "expected an ISO 8601 datetime"),
    (["items", "enqueue", "job", "--due", "2030-01-01T00:00"], 1, "needs a timezone"),
    (["items", "enqueue", "job", "--due", "+soon"], 1, "expected +SECONDS, got '+soon'"),
    (["items", "enqueue", "job", "--id", "kept"], 1, "kept"),
    (["items", "show", "missing"], 3, "missing"),
    (["items", "cancel", "missing"], 3, "missing"),
    (["items", "retry", "missing"], 3, "missing"),
    (["items", "retry", "kept", "--at", "whenever"], 1, "expected an ISO 8601 datetime"),
    (["items", "list", "--database-url", "mysql://x"], 1, "unknown queue URL scheme 'mysql'"),
    (["migrate", "--database-url", "memory://x"], 1, "'memory://' takes nothing"),
    (["config", "--config", "nowhere.toml"], 1, "'nowhere.toml' does not exist"),
    (["status", "--url", "http://127.0.0.1:1/healthz"], 4, "is unreachable"),
    (["status", "--url", "not a url"], 4, "is unreachable"),
    (["status", "--url", "http://bad host/healthz"], 4, "is unreachable"),
    (["status", "--url", "http://[::1/healthz"], 4, "is unreachable"),
    (["status", "--url", "http://a..b/healthz"], 4, "is unreachable"),
    (["items", "enqueue", "job", "[" * 65 + "]" * 65], 1, TOO_DEEP),
    (["items", "enqueue", "job", "[" * 100_000 + "]" * 100_000], 1, TOO_DEEP),
    (["items", "enqueue", "job", '{"a":' * 5000 + "1" + "}" * 5000], 1, TOO_DEEP),
    (["items", "enqueue", "job", "--due", "+1e308"], 1, "+1e308 is out of range"),
    (["items", "enqueue", "job", "--due", "+-1e308"], 1, "+-1e308 is out of range"),
    (["items", "enqueue", "job", "--due", "+inf"], 1, "+SECONDS must be a finite number"),
    (["items", "enqueue", "job", "--due", "+nan"], 1, "+SECONDS must be a finite number"),
    (["items", "enqueue", "job", "--due", "0001-01-01T00:00:00+01:00"], 1, "is out of range"),
    (["items", "enqueue", "job", "--due", "9999-12-31T23:59:59+00:00"], 1, "is out of range"),
    (["items", "retry", "kept", "--at", "+1e308"], 1, "+1e308 is out of range"),
    (["run", "badinput_target:svc", "--http", "bad host:80"], 1, "--http host must be an IP"),
    (["run", "badinput_target:svc", "--http", "127.0.0.1:٨٠"], 1, "--http expects HOST:PORT"),
    (["config", "--config", "deep.toml"], 1, "'deep.toml' is nested too deeply"),
    (["status", "--config", "bad_host.toml"], 1, "http.host: must be an IP address or a host"),
    (["items", "list", "--config", "huge_lease.toml"], 1, "runner.lease: must be at most"),
]


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [pytest.param(a, c, m, id="cli-" + "-".join(a)) for a, c, m in CLI_USER],
)
def test_cli_user_errors(
    cli_db: str, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    """Each mistake is one stderr line naming the problem; the queue keeps its item as it was."""
    assert cli_main(argv) == code
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert len(lines) == 1, out.err
    assert lines[0].startswith("trio-supervise: ")
    assert message in lines[0]
    assert "Traceback" not in out.err
    _assert_cli_db_unchanged(capsys)


def test_cli_config_with_a_bad_environment_is_one_line(
    cli_db: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`config` with a bad variable prints one line naming the field and the variable."""
    monkeypatch.setenv("TRIO_SUPERVISE_HTTP__PORT", "eighty")
    assert cli_main(["config"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "trio-supervise: error: http.port: expected int, got 'eighty' "
        "(from TRIO_SUPERVISE_HTTP__PORT)"
    ]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port another socket is listening on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_cli_run_on_a_port_in_use_is_one_line_and_nothing_runs(
    cli_db: str,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    busy_port: int,
) -> None:
    """`run --http` on a port in use: exit 1, one line naming the address, no "running" log."""
    caplog.set_level(logging.DEBUG)
    assert cli_main(["run", "badinput_target:svc", "--http", f"127.0.0.1:{busy_port}"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"trio-supervise: error: cannot bind 127.0.0.1:{busy_port}: address already in use"
    ]
    assert not [record for record in caplog.records if "running" in record.getMessage()]
    _assert_cli_db_unchanged(capsys)


async def test_a_service_on_a_port_in_use_fails_before_anything_starts(busy_port: int) -> None:
    """Service.run raises HttpBindError before a supervisor (or any worker) exists."""
    service = Service(
        settings=Settings(http=HttpSettings(port=busy_port), runner=RunnerSettings(worker_id="w")),
        queue_url="memory://",
        handle_signals=False,
    )
    with pytest.raises(HttpBindError, match="address already in use"):
        await service.run()
    assert service.supervisor is None


# Every verb and flag of the CLI that takes a value, with "{}" where arbitrary text goes. Targets
# of `run` are kept away from real modules (importing one runs its code), database URLs away from
# PostgreSQL (arbitrary text must not reach a real server), and `status` at an unreachable port.
CLI_SLOTS = [
    ["items", "list", "--state", "{}"],
    ["items", "list", "--spec", "{}"],
    ["items", "list", "--limit", "{}"],
    ["items", "list", "--database-url", "sqlite:///{}"],
    ["items", "list", "--database-url", "memory://{}"],
    ["items", "list", "--database-url", "{}"],
    ["items", "list", "--config", "{}"],
    ["items", "show", "{}"],
    ["items", "show", "--json", "{}"],
    ["items", "enqueue", "{}"],
    ["items", "enqueue", "job", "{}"],
    ["items", "enqueue", "job", "--id", "{}"],
    ["items", "enqueue", "job", "--tenant", "{}"],
    ["items", "enqueue", "job", "--subject", "{}"],
    ["items", "enqueue", "job", "--due", "{}"],
    ["items", "enqueue", "job", "--due", "+{}"],
    ["items", "enqueue", "job", "--key", "{}"],
    ["items", "cancel", "{}"],
    ["items", "retry", "{}"],
    ["items", "retry", "kept", "--at", "{}"],
    ["migrate", "--database-url", "memory://{}"],
    ["status", "--url", "http://127.0.0.1:1/{}", "--timeout", "1"],
    ["status", "--url", "{}", "--timeout", "1"],
    ["status", "--url", "http://127.0.0.1:1/", "--timeout", "{}"],
    ["status", "--config", "{}"],
    ["run", "no_such_module_{}:svc"],
    ["run", "json:{}"],
    ["run", "json:dumps", "--http", "{}"],
    ["config", "--config", "{}"],
    ["{}"],
    ["items", "{}"],
]

ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=40) | st.sampled_from(
    ["", "-", "--", "-h", "+", "nan", "inf", "1e308", "-1", "0", str(2**64), "[" * 200, "\x00"]
)


@pytest.mark.parametrize("slot", [pytest.param(s, id=" ".join(s)) for s in CLI_SLOTS])
@hypothesis.settings(
    max_examples=30, suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture]
)
@hypothesis.given(text=ANY_TEXT)
def test_the_cli_never_shows_a_traceback(
    cli_db: str, capsys: pytest.CaptureFixture[str], slot: list[str], text: str
) -> None:
    """Any text in any argument: exit 0-4, no traceback; a refusal is one stderr line."""
    hypothesis.assume(not text.lower().lstrip().startswith("postgres"))
    argv = [part.replace("{}", text) for part in slot]
    try:
        code = cli_main(argv)
    except SystemExit as done:  # argparse: --help (0) or a usage error (2)
        code = done.code if isinstance(done.code, int) else 2
    out = capsys.readouterr()
    assert code in (0, 1, 2, 3, 4), (argv, out)
    assert "Traceback" not in out.out + out.err
    assert "unexpected " not in out.err, out.err  # the last-resort handler is for bugs
    if code in (1, 3, 4):
        assert len(out.err.splitlines()) == 1, out.err
        assert out.err.startswith("trio-supervise: ")


def _assert_cli_db_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["items", "list", "--json"]) == 0
    items = json.loads(capsys.readouterr().out)
    assert [(i["id"], i["state"], i["config"]) for i in items] == [("kept", "queued", {"n": 1})]


# -- HTTP junk -------------------------------------------------------------------------------------

HTTP_CASES = [
    ("post", b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", {405}),
    ("delete", b"DELETE / HTTP/1.1\r\nHost: x\r\n\r\n", {405}),
    ("put-body", b"PUT /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", {405}),
    ("trace", b"TRACE / HTTP/1.1\r\nHost: x\r\n\r\n", {405}),
    ("made-up-method", b"FROB / HTTP/1.1\r\nHost: x\r\n\r\n", {405}),
    ("options-star", b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", {404, 405}),
    ("connect", b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", {404, 405}),
    ("unknown-path", b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", {404}),
    ("trailing-slash", b"GET /healthz/ HTTP/1.1\r\nHost: x\r\n\r\n", {404}),
    ("double-slash", b"GET //healthz HTTP/1.1\r\nHost: x\r\n\r\n", {404}),
    ("bad-percent", b"GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n", {400, 404}),
    ("bad-percent-tail", b"GET /healthz%ZZ%%% HTTP/1.1\r\nHost: x\r\n\r\n", {400, 404}),
    ("traversal", b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n", {400, 404}),
    ("encoded-traversal", b"GET /..%2f..%2fetc%2fpasswd HTTP/1.1\r\nHost: x\r\n\r\n", {400, 404}),
    ("absolute-uri", b"GET http://evil.example/x HTTP/1.1\r\nHost: x\r\n\r\n", {400, 404}),
    ("nul-in-path", b"GET /\x00 HTTP/1.1\r\nHost: x\r\n\r\n", {400}),
    ("utf8-path", "GET /\u00e9 HTTP/1.1\r\nHost: x\r\n\r\n".encode(), {400, 404}),
    ("del-in-query", b"GET /healthz?a=\x7f HTTP/1.1\r\nHost: x\r\n\r\n", {400}),
    ("huge-header", b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n", {431}),
    ("long-url", b"GET /" + b"a" * 50_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", {404, 414, 431}),
    ("tls-hello", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 junk\r\n\r\n", {400}),
    ("no-host", b"GET /healthz HTTP/1.1\r\n\r\n", {400}),
    ("http-0.9", b"GET /healthz\r\n\r\n", {400}),
    ("space-in-header-name", b"GET / HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n", {400}),
    (
        "two-content-lengths",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        {400},
    ),
    (
        "bad-chunk",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        {400, 405},
    ),
    (
        "websocket",
        b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        {403},
    ),
    (
        "big-body-wrong-method",
        b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n" + b"a" * 65536,
        {405},
    ),
]


async def _exchange(port: int, data: bytes) -> int | None:
    """Send raw bytes, return the response's status code (None if the server just hung up)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    received = b""
    with trio.move_on_after(5):
        with contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(data)
        while b"\r\n" not in received:
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                break
            if not chunk:
                break
            received += chunk
    await stream.aclose()
    line = received.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) >= 2 and line[0].startswith(b"HTTP/") else None


@attrs.frozen
class Finisher:
    name: str = "finisher"
    spec_ids: Sequence[str] = ("job",)

    def validate_specs(self) -> None:
        pass

    async def evaluate(self, context: None, item: WorkItem) -> Outcome:
        await trio.lowlevel.checkpoint()
        return Stop()


@pytest.mark.parametrize(
    ("request_bytes", "statuses"), [pytest.param(d, s, id=f"http-{n}") for n, d, s in HTTP_CASES]
)
async def test_http_junk_gets_a_4xx_and_the_service_lives_on(
    request_bytes: bytes, statuses: set[int]
) -> None:
    """Junk at a real loopback server: a 4xx; then /healthz is 200 and the runner still works."""
    queue: WorkQueue = MemoryQueue()
    kept = await queue.enqueue("other", item_id="kept", config={"n": 1})
    service = Service(
        drivers=[Finisher()],
        settings=Settings(
            http=HttpSettings(port=0),
            runner=RunnerSettings(worker_id="w", shutdown_grace=1.0),
        ),
        queue=queue,
        handle_signals=False,
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            assert service.http_port is not None
            assert await _exchange(service.http_port, request_bytes) in statuses
            async with httpx.AsyncClient() as client:
                health = await client.get(f"http://127.0.0.1:{service.http_port}/healthz")
            assert health.status_code == 200
            assert service.runner is not None
            assert service.runner.state is RunnerState.RUNNING
            job = await queue.enqueue("job")
            while (await queue.get(job.id)).state is not ItemState.COMPLETED:  # noqa: ASYNC110
                await trio.sleep(0.01)
            assert await queue.get("kept") == kept
            service.stop()
