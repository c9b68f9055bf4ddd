"""The public API's types, as ``mypy --strict`` sees them.

``tests/typing_public_api.py`` holds ``assert_type`` promises and must check clean;
``tests/typing_must_fail.py`` holds mistakes (a typed driver's config annotated with the wrong
class, among others) that must each be reported, on the marked line, with the marked error code.
One in-process mypy run checks both, with the project's configuration and its cache.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api")

REPO = Path(__file__).resolve().parents[1]
CLEAN = "tests/typing_public_api.py"
FAILING = "tests/typing_must_fail.py"
_ERROR = re.compile(
    r"^(?P<path>[^:]+):(?P<line>\d+): error: (?P<message>.*?)\s+\[(?P<code>[\w-]+)\]$"
)
_MARK = re.compile(r"#\s*E:\s*(?P<code>[\w-]+)\s*$")


def expected_errors(path: Path) -> set[tuple[int, str]]:
    """The ``(line, code)`` pairs that the ``# E: code`` comments of *path* announce."""
    marks = set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        found = _MARK.search(line)
        if found:
            marks.add((number, found["code"]))
    return marks


@pytest.fixture(scope="module")
def mypy_errors(pytestconfig: pytest.Config) -> dict[str, set[tuple[int, str]]]:
    """mypy's errors for both files, by file: ``(line, code)`` pairs."""
    stdout, stderr, _ = api.run(
        [
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--cache-dir",
            str(REPO / ".mypy_cache"),
            "--no-error-summary",
            "--no-pretty",
            "--show-error-codes",
            str(REPO / CLEAN),
            str(REPO / FAILING),
        ]
    )
    assert not stderr, stderr
    errors: dict[str, set[tuple[int, str]]] = {CLEAN: set(), FAILING: set()}
    for line in stdout.splitlines():
        matched = _ERROR.match(line)
        if matched is None:
            continue
        relative = Path(matched["path"]).resolve().relative_to(REPO).as_posix()
        errors.setdefault(relative, set()).add((int(matched["line"]), matched["code"]))
    return errors


def test_the_public_api_checks_clean(mypy_errors: dict[str, set[tuple[int, str]]]) -> None:
    """Every ``assert_type`` in the public-API file holds, with no other error."""
    assert mypy_errors[CLEAN] == set()


def test_typing_mistakes_are_reported_where_marked(
    mypy_errors: dict[str, set[tuple[int, str]]],
) -> None:
    """A typed driver whose config annotation is not its ``config_type`` (and the other marked
    mistakes) is a type error on exactly the marked lines."""
    expected = expected_errors(REPO / FAILING)
    assert len(expected) >= 5
    assert mypy_errors[FAILING] == expected


def test_no_other_file_has_errors(mypy_errors: dict[str, set[tuple[int, str]]]) -> None:
    """The library itself checks clean while the two files are checked against it."""
    assert set(mypy_errors) == {CLEAN, FAILING}


def _public_classes() -> dict[str, list[str]]:
    """Each public class a user builds (not an error, an enum or a protocol), and the names of
    its constructor's parameters."""
    import enum
    import inspect

    import trio_supervise as ts

    found = {}
    for name in ts.__all__:
        cls = getattr(ts, name)
        if not isinstance(cls, type) or issubclass(cls, BaseException | enum.Enum):
            continue
        if getattr(cls, "_is_protocol", False):
            continue
        found[name] = list(inspect.signature(cls).parameters)
    return found


def _arguments_given(path: Path) -> dict[str, set[str]]:
    """For each ``ts.Name(...)`` call in *path*, the parameters it passes (positional ones by
    their position in the constructor's signature)."""
    import ast

    signatures = _public_classes()
    given: dict[str, set[str]] = {name: set() for name in signatures}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if not (isinstance(node.func.value, ast.Name) and node.func.value.id == "ts"):
            continue
        name = node.func.attr
        if name in signatures:
            given[name].update(signatures[name][: len(node.args)])
            given[name].update(keyword.arg for keyword in node.keywords if keyword.arg)
    return given


def test_every_public_constructor_argument_is_type_checked() -> None:
    """The public-API file builds every public class with every argument its constructor
    takes, so ``mypy --strict`` checks each one as users write it (``Service(schedules=[...])``
    once failed with ``expected "_T_co"``)."""
    given = _arguments_given(REPO / CLEAN)
    missing = {
        name: sorted(set(parameters) - given[name])
        for name, parameters in _public_classes().items()
        if set(parameters) - given[name]
    }
    assert missing == {}
