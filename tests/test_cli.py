"""The command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trio_supervise import __version__
from trio_supervise._cli import main


def test_version_flag_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    """--version prints the package version and exits 0."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_module_entry_point_runs() -> None:
    """python -m trio_supervise --version works as the console script does."""
    result = subprocess.run(
        [sys.executable, "-m", "trio_supervise", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert __version__ in result.stdout
