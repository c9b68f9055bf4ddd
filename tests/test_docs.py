"""The code in the docs runs.

One rule for every page under ``docs/``:

- each ```` ```python ```` block is executed, in page order, in one namespace per page (top-level
  ``await`` allowed, on Trio's real clock, in a scratch working directory). Functions named
  ``test_*`` that a page defines are then run like pytest would, with the fixtures they name
  (``autojump_clock``, ``harness``, ``memory_queue``, ``jitter_seed``, ``fixed_jitter``,
  ``tmp_path``). What a block needs but does not show (a worker it refers to) is set up here, in
  ``PAGE_SETUP`` or ``BLOCK_SETUP``, never in the page. On the tutorial and the how-to pages
  (``SELF_CONTAINED``) nothing is set up: each block imports every name it uses that the page
  has not defined above it, so a reader can copy any snippet;
- each shell block (```` ```bash ````, ``sh``, ``shell``, ``console``) runs, in page order, in a
  scratch directory of its own per page, where the SQLite default ``trio_supervise.db`` lives,
  with ``trio-supervise`` and ``python`` meaning this checkout's and the operations HTTP on a free
  port (``TRIO_SUPERVISE_HTTP__PORT``). A ``bash`` block runs under ``set -e`` and must exit 0.
  In a ``console`` block, ``$ `` starts a command (a trailing backslash continues it); the lines up
  to the next command are its expected output (stdout and stderr), and a command showing none
  must exit 0;
- a block that starts a service that runs until stopped is preceded by
  ``% long-running: <what>``: it runs until ``/healthz`` answers, then gets SIGINT and must drain
  and exit 0;
- a python block preceded by ``% file: PATH`` is also written to PATH in the shell blocks'
  directory (the tutorial's test file, which a shell block then runs with pytest);
- a block that cannot run here (it needs a PostgreSQL server, it installs packages, it is a file
  of an imaginary package, it runs for minutes) is preceded by a MyST comment line
  ``% illustration: <why>``; a python one is only compiled, a shell one is not run (the extras a
  ``pip install`` names must still exist);
- a ``{literalinclude}`` shows a file under ``examples/`` that a test under ``tests/`` imports
  or runs.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import tomllib
import types
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from trio_supervise.testing import DEFAULT_JITTER_SEED, open_harness

DOCS = Path(__file__).resolve().parents[1] / "docs"
REPO = DOCS.parent
PAGES = sorted(p for p in DOCS.rglob("*.md") if p.name != "README.md")

PRELUDE = """
import datetime as dt
import attrs
import pytest
import trio
import trio.testing
from trio_supervise import *
from trio_supervise.testing import *
"""

PAGE_SETUP: dict[str, str] = {
    "supervision.md": """
        _failed_once = False

        async def poller():
            global _failed_once
            if not _failed_once:
                _failed_once = True
                raise ConnectionError("upstream refused")
            await trio.sleep_forever()
    """,
    "workflows.md": """
        @attrs.frozen
        class Digest:
            recipient: str
            sent: int = 0

        class Outbox:
            pass
    """,
}
"""Names a page uses without defining them, keyed by the page's path under ``docs/``."""

BLOCK_SETUP: dict[tuple[str, str], str] = {
    ("queues.md", "await queue.wait_for_work(spec_ids)"): """
        queue = MemoryQueue()
        poll_interval = 1.0
        spec_ids = ["daily-report"]
    """,
}
"""Setup run just before the block of a page that contains the given text."""

SELF_CONTAINED = ("tutorial.md", "howto/")
"""Pages (or directories) whose python blocks get no prelude: each block imports what it uses."""

_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_ILLUSTRATION = re.compile(r"^%\s*illustration:\s*\S")
_LONG_RUNNING = re.compile(r"^%\s*long-running:\s*\S")
_FILE = re.compile(r"^%\s*file:\s*(?P<path>\S+)\s*$")
_SHELLS = ("bash", "sh", "shell", "console")
_VIRTUAL_TIMEOUT = 10 * 365 * 86_400.0
_REAL_TIMEOUT = 60.0
_COMMAND_TIMEOUT = 120.0


@attrs.frozen
class Block:
    page: str
    line: int
    info: str
    code: str
    marker: str
    """The line just before the fence (a ``% ...:`` MyST comment, or anything else)."""

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info.strip() else ""

    @property
    def is_python(self) -> bool:
        return self.language in ("python", "py")

    @property
    def is_shell(self) -> bool:
        return self.language in _SHELLS

    @property
    def illustration(self) -> bool:
        return bool(_ILLUSTRATION.match(self.marker))

    @property
    def long_running(self) -> bool:
        return bool(_LONG_RUNNING.match(self.marker))

    @property
    def file(self) -> str | None:
        found = _FILE.match(self.marker)
        return found["path"] if found else None


def blocks(page: Path) -> Iterator[Block]:
    """Every fenced block of *page*, with the line that precedes it (its marker, if any)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    name = page.relative_to(DOCS).as_posix()
    index = 0
    while index < len(lines):
        opened = _FENCE.match(lines[index])
        if not opened:
            index += 1
            continue
        fence, info = opened["fence"], opened["info"].strip()
        previous = lines[index - 1] if index else ""
        body: list[str] = []
        index += 1
        while index < len(lines) and not lines[index].startswith(fence):
            body.append(lines[index])
            index += 1
        yield Block(name, index - len(body), info, "\n".join(body) + "\n", previous)
        index += 1


def page_id(page: Path) -> str:
    return page.relative_to(DOCS).as_posix()


def test_every_page_is_checked() -> None:
    """The pages this file checks include the user guide's; none is skipped by accident."""
    names = {page_id(page) for page in PAGES}
    assert {"tutorial.md", "howto/testing.md", "discussion/jitter.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_python_hides_in_other_directives(page: Path) -> None:
    """Python is only in ```` ```python ```` fences (which run) or literalincludes (tested)."""
    for block in blocks(page):
        assert not re.match(r"\{(code-block|code|sourcecode)\}\s+py", block.info), (
            f"{block.page}:{block.line}: use a ```python fence, so tests/test_docs.py runs it"
        )


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_literalincludes_show_tested_examples(page: Path) -> None:
    """Each ``{literalinclude}`` shows a file under ``examples/`` that a test refers to."""
    tests = "\n".join(path.read_text() for path in (REPO / "tests").rglob("test_*.py"))
    for block in blocks(page):
        if not block.info.startswith("{literalinclude}"):
            continue
        target = (page.parent / block.info.split(maxsplit=1)[1].strip()).resolve()
        assert target.is_file(), f"{block.page}:{block.line}: {target} does not exist"
        relative = target.relative_to(REPO)
        assert relative.parts[0] == "examples", f"{block.page}:{block.line}: not an example"
        module = ".".join(relative.with_suffix("").parts)
        names = {module, module.rpartition(".")[0], relative.stem, str(relative)}
        assert any(name and name in tests for name in names - {"examples"}), (
            f"{block.page}:{block.line}: no test imports or runs {relative}"
        )


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ```` ```python ```` block of the page runs, and the tests it defines pass."""
    name = page_id(page)
    python = [block for block in blocks(page) if block.is_python]
    if not python:
        pytest.skip("no python blocks")
    monkeypatch.chdir(tmp_path)
    # A real module, so that annotations resolve (cattrs looks names up in the class's module).
    module = types.ModuleType(f"docs_{name.replace('/', '_')[:-3]}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace: dict[str, Any] = module.__dict__
    if not self_contained(name):
        exec(PRELUDE, namespace)
        exec(textwrap.dedent(PAGE_SETUP.get(name, "")), namespace)
    runnable = []
    for block in python:
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        code = compile(block.code, f"{name}:{block.line}", "exec", flags=flags)
        if block.illustration:
            continue
        setups = [
            textwrap.dedent(setup)
            for (where, text), setup in BLOCK_SETUP.items()
            if where == name and text in block.code
        ]
        runnable.append((setups, code))

    async def run_blocks() -> None:
        with trio.fail_after(_REAL_TIMEOUT):
            for setups, code in runnable:
                for setup in setups:
                    exec(setup, namespace)
                result = eval(code, namespace)
                if inspect.iscoroutine(result):
                    await result

    trio.run(run_blocks)
    for test_name, function in list(namespace.items()):
        if test_name.startswith("test_") and callable(function):
            _run_test(function, tmp_path / test_name)


def self_contained(name: str) -> bool:
    return any(name == entry or name.startswith(entry) for entry in SELF_CONTAINED if entry)


def _bound(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The names *tree* binds: (defined: assigned, def, class, argument...; imported)."""
    defined: set[str] = set()
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            defined.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            defined.add(node.name)
        elif isinstance(node, ast.alias):
            imported.add((node.asname or node.name).partition(".")[0])
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            defined.add(node.name)
        elif isinstance(node, ast.Nonlocal | ast.Global):
            defined.update(node.names)
    return defined, imported


@pytest.mark.parametrize(
    "page", [page for page in PAGES if self_contained(page_id(page))], ids=page_id
)
def test_snippets_include_their_imports(page: Path) -> None:
    """On the tutorial and the how-to pages, each python block imports every module or name it
    uses, except what the page itself defined in a block above it."""
    defined_above: set[str] = set()
    problems = []
    for block in blocks(page):
        if not block.is_python:
            continue
        tree = ast.parse(block.code)
        defined, imported = _bound(tree)
        used = {
            node.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
        }
        missing = used - defined - imported - defined_above - set(dir(builtins))
        if missing:
            problems.append(f"{block.page}:{block.line}: uses {sorted(missing)} without importing")
        defined_above |= defined
    assert not problems, "\n".join(problems)


def _run_test(function: Callable[..., Any], tmp_path: Path) -> None:
    """Call a test a page defines, with the fixtures it names, as pytest-trio would."""
    tmp_path.mkdir()
    parameters = list(inspect.signature(function).parameters)
    if not inspect.iscoroutinefunction(function):
        function(**{name: tmp_path for name in parameters if name == "tmp_path"})
        return
    clock = trio.testing.MockClock(autojump_threshold=0)
    simple: dict[str, Any] = {
        "autojump_clock": clock,
        "jitter_seed": DEFAULT_JITTER_SEED,
        "fixed_jitter": _jitter(),
        "memory_queue": _memory_queue(),
        "tmp_path": tmp_path,
    }
    unknown = set(parameters) - set(simple) - {"harness"}
    assert not unknown, f"{function.__name__} needs fixtures test_docs.py lacks: {unknown}"

    async def run() -> None:
        with trio.fail_after(_VIRTUAL_TIMEOUT):
            kwargs = {name: simple[name] for name in parameters if name in simple}
            if "harness" not in parameters:
                await function(**kwargs)
                return
            async with open_harness(queue=simple["memory_queue"]) as harness:
                await function(**kwargs, harness=harness)

    trio.run(run, clock=clock)


def _jitter() -> Any:
    from trio_supervise import Jitter

    return Jitter(seed=DEFAULT_JITTER_SEED)


def _memory_queue() -> Any:
    from trio_supervise import MemoryQueue

    return MemoryQueue()


# -- shell blocks --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _shell_env(directory: Path, port: int) -> dict[str, str]:
    """The environment of a page's shell blocks: no settings of the developer's, this checkout's
    ``trio-supervise`` and ``python`` first on the PATH, HTTP on *port*."""
    shims = directory / ".shims"
    shims.mkdir()
    for name, command in (("trio-supervise", "-m trio_supervise"), ("python", "")):
        shim = shims / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" {command} "$@"\n')
        shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIO_SUPERVISE_")}
    env["PATH"] = os.pathsep.join([str(shims), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["TRIO_SUPERVISE_HTTP__PORT"] = str(port)
    return env


def console_commands(code: str) -> Iterator[tuple[str, str | None]]:
    """A console block's ``(command, expected output or None)`` pairs."""
    command: list[str] = []
    output: list[str] | None = None
    pairs: list[tuple[list[str], list[str]]] = []
    for line in code.splitlines():
        if line.startswith("$ ") and not (command and command[-1].endswith("\\")):
            command, output = [line[2:]], []
            pairs.append((command, output))
        elif command and command[-1].endswith("\\") and output == []:
            command.append(line)
        elif output is not None:
            output.append(line.rstrip())
    for lines, shown in pairs:
        text = "\n".join(shown).strip("\n")
        yield "\n".join(lines), text or None


def _wait_healthy(process: subprocess.Popen[str], port: int, where: str) -> None:
    url = f"http://127.0.0.1:{port}/healthz"
    waited = 0.0
    while waited < _REAL_TIMEOUT:
        assert process.poll() is None, f"{where}: the service exited {process.returncode} early"
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        threading.Event().wait(0.2)
        waited += 0.2
    raise AssertionError(f"{where}: {url} never answered 200")


def _run_shell(block: Block, directory: Path, env: dict[str, str], port: int) -> None:
    where = f"{block.page}:{block.line}"
    if block.language == "console":
        for command, expected in console_commands(block.code):
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=directory,
                env=env,
                capture_output=True,
                text=True,
                timeout=_COMMAND_TIMEOUT,
            )
            printed = (done.stdout + done.stderr).strip("\n")
            if expected is None:
                assert done.returncode == 0, (
                    f"{where}: `{command}` exited {done.returncode}:\n{printed}"
                )
            else:
                lines = [line.rstrip() for line in printed.splitlines()]
                assert lines == expected.splitlines(), f"{where}: `{command}` printed:\n{printed}"
        return
    process = subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "-c", block.code],
        cwd=directory,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        if block.long_running:
            _wait_healthy(process, port, where)
            os.killpg(process.pid, signal.SIGINT)
        printed, _ = process.communicate(timeout=_COMMAND_TIMEOUT)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 0, f"{where}: exited {process.returncode}:\n{printed}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "page",
    [page for page in PAGES if any(b.is_shell and not b.illustration for b in blocks(page))],
    ids=page_id,
)
def test_shell_blocks_run(page: Path, tmp_path: Path) -> None:
    """Every shell block not marked as an illustration runs as shown, in page order, with
    SQLite in a scratch directory; a long-running one serves ``/healthz`` and drains on SIGINT."""
    port = _free_port()
    env = _shell_env(tmp_path, port)
    for block in blocks(page):
        if block.is_python and block.file is not None:
            target = tmp_path / block.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code, encoding="utf-8")
    for block in blocks(page):
        if block.is_shell and not block.illustration:
            _run_shell(block, tmp_path, env, port)


_MARKER = re.compile(r"^%\s*(?P<name>[\w-]+):")


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_block_markers_are_known(page: Path) -> None:
    """A ``% name:`` comment before a block is a marker this file knows, on a block it applies
    to, so a misspelt one cannot silently change what runs."""
    for block in blocks(page):
        found = _MARKER.match(block.marker)
        if found is None:
            continue
        where = f"{block.page}:{block.line}"
        assert found["name"] in ("illustration", "long-running", "file"), f"{where}: {found[0]}"
        assert block.illustration or block.long_running or block.file, f"{where}: no reason given"
        if block.long_running:
            assert block.is_shell, f"{where}: long-running applies to shell blocks"
        if block.file:
            assert block.is_python, f"{where}: file applies to python blocks"


_EXTRAS = re.compile(r"pip install[^\n]*?\.\[(?P<extras>[\w,-]+)\]")


def test_pip_installs_name_extras_that_exist() -> None:
    """Every ``pip install '.[extra]'`` in the docs (illustrations included) names extras that
    ``pyproject.toml`` declares."""
    declared = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    named = set()
    for page in PAGES:
        for block in blocks(page):
            for found in _EXTRAS.finditer(block.code):
                extras = set(found["extras"].split(","))
                assert extras <= declared, f"{block.page}:{block.line}: {extras - declared}"
                named |= extras
    assert "test" in named


def _commands(parser: Any, prefix: tuple[str, ...] = ()) -> set[str]:
    """Every command of an argparse parser: the paths to its leaf sub-parsers."""
    import argparse

    found: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= _commands(sub, (*prefix, name)) or {" ".join((*prefix, name))}
    return found


def test_the_command_table_lists_every_command() -> None:
    """docs/operations.md's table of commands names every command the CLI has, and only those:
    a command added without its row (as `queues` and `schedules` once were) fails here."""
    from trio_supervise._cli import build_parser

    text = (DOCS / "operations.md").read_text(encoding="utf-8")
    section = text.split("## Command line", 1)[1].split("\n\n| exit code", 1)[0]
    listed = set()
    for line in section.splitlines():
        cell = line.split("|")[1].strip().strip("`") if line.startswith("| `") else ""
        words = [w for w in re.split(r"[\s`]+", cell) if w]
        command = " ".join(
            itertools.takewhile(lambda word: re.fullmatch(r"[a-z][a-z-]*", word) is not None, words)
        )
        if command:
            listed.add(command)
    assert listed == _commands(build_parser())
