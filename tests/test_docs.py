"""The code in the docs runs.

One rule for every page under ``docs/``:

- each ```` ```python ```` block is executed, in page order, in one namespace per page (top-level
  ``await`` allowed, on Trio's real clock, in a scratch working directory). Functions named
  ``test_*`` that a page defines are then run like pytest would, with the fixtures they name
  (``autojump_clock``, ``harness``, ``memory_queue``, ``jitter_seed``, ``fixed_jitter``,
  ``tmp_path``). What a block needs but does not show (a worker it refers to) is set up here, in
  ``PAGE_SETUP`` or ``BLOCK_SETUP``, never in the page;
- a block that cannot run here (it needs a PostgreSQL server, or it is a file of an imaginary
  package) is preceded by a MyST comment line ``% illustration: <why>``, and is only compiled;
- a ``{literalinclude}`` shows a file under ``examples/`` that a test under ``tests/`` imports
  or runs.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
import types
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

_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_ILLUSTRATION = re.compile(r"^%\s*illustration:\s*\S")
_VIRTUAL_TIMEOUT = 10 * 365 * 86_400.0
_REAL_TIMEOUT = 60.0


@attrs.frozen
class Block:
    page: str
    line: int
    info: str
    code: str
    illustration: bool

    @property
    def is_python(self) -> bool:
        return self.info.split()[0] in ("python", "py") if self.info.strip() else False


def blocks(page: Path) -> Iterator[Block]:
    """Every fenced block of *page*, with whether a ``% illustration:`` line precedes it."""
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
        yield Block(
            name,
            index - len(body),
            info,
            "\n".join(body) + "\n",
            bool(_ILLUSTRATION.match(previous)),
        )
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
