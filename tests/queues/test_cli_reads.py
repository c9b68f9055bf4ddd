"""The CLI's queue reads: ``items list`` pages with ``--after``, reads never create a database."""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_supervise._cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "command", [["items", "list"], ["items", "show", "x"], ["items", "cancel", "x"]]
)
def test_reads_of_a_mistyped_path_create_nothing(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A read of a file that does not exist says how to create it, exits 1, and creates nothing."""
    path = tmp_path / "typo.db"
    code, _, err = run(capsys, *command, "--database-url", f"sqlite:///{path}")
    assert code == 1
    assert f"no database at {path}; run `trio-supervise migrate` to create it" in err
    assert "Traceback" not in err
    assert not path.exists()


def test_items_list_pages_with_after_and_says_how_many(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`items list` shows "N of TOTAL" and the next page's --after; pages cover every item once."""
    url = f"sqlite:///{tmp_path}/q.db"
    for n in range(5):
        assert (
            run(
                capsys,
                "items",
                "enqueue",
                "spec",
                "--id",
                f"i{n}",
                "--due",
                f"+{n}",
                "--database-url",
                url,
            )[0]
            == 0
        )
    code, out, _ = run(capsys, "items", "list", "--limit", "2", "--database-url", url)
    assert code == 0
    assert "2 of 5; next page: --after i1" in out
    assert [line.split()[0] for line in out.splitlines()[1:3]] == ["i0", "i1"]
    code, out, _ = run(
        capsys, "items", "list", "--limit", "2", "--after", "i3", "--database-url", url
    )
    assert [line.split()[0] for line in out.splitlines()[1:2]] == ["i4"]
    assert "1 of 5 after i3" in out
    code, out, _ = run(capsys, "items", "list", "--after", "i4", "--database-url", url)
    assert (code, out.strip()) == (0, "no items after i4 (5 in all)")
    code, _, err = run(capsys, "items", "list", "--after", "nope", "--database-url", url)
    assert code == 3  # not found
    assert "no item with id 'nope'" in err
