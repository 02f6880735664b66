"""The top-level `xl` command as a real process: both the installed console script and
`python -m xl` (exit 0 success, 2 bad usage; bad input gets one clear line on stderr, never a
traceback)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from xl._version import __version__
from xl.cli import COMMANDS

pytestmark = pytest.mark.e2e

SCRIPT = Path(sys.executable).parent / "xl"  # what `pip install` put next to the interpreter


def _xl(*args: str, how: str = "module", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = [str(SCRIPT)] if how == "script" else [sys.executable, "-m", "xl"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLUMNS", "FORCE_COLOR"))}
    return subprocess.run(
        [*argv, *args],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env,
    )


@pytest.fixture(params=["module", "script"])
def how(request: pytest.FixtureRequest) -> str:
    if request.param == "script" and not SCRIPT.exists():
        pytest.skip(f"no console script at {SCRIPT} (package not installed into this venv)")
    return str(request.param)


def test_the_console_script_is_installed_next_to_the_interpreter() -> None:
    assert SCRIPT.is_file() and os.access(SCRIPT, os.X_OK), SCRIPT
    assert shutil.which("xl", path=str(SCRIPT.parent)) == str(SCRIPT)
    # It is the entry point pyproject declares, and it runs this interpreter.
    eps = [ep for ep in metadata.entry_points(group="console_scripts") if ep.name == "xl"]
    assert [ep.value for ep in eps] == ["xl.cli:main"]
    first = SCRIPT.read_text(errors="replace").splitlines()[0]
    assert first.startswith("#!") and Path(first[2:].strip()).parent == SCRIPT.parent


def test_version(how: str) -> None:
    proc = _xl("--version", how=how)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == f"xl {__version__}\n"
    # The distribution's metadata says the same version (no stale install).
    dist = next(d for d in metadata.distributions() if "xl" in (d.entry_points.names or ()))
    assert dist.version == __version__
    assert _xl("-V", how=how).stdout == proc.stdout


def test_help_lists_every_command(how: str) -> None:
    proc = _xl("--help", how=how)
    assert proc.returncode == 0 and proc.stderr == ""
    out = proc.stdout
    assert out.startswith("usage: xl ")
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ")]
    assert listed == list(COMMANDS)
    for name, (_, help_) in COMMANDS.items():
        assert any(
            line.split()[0] == name and line.rstrip().endswith(help_)
            for line in out.splitlines()
            if line.startswith("  ")
        ), name
    assert _xl("-h", how=how).stdout == out and _xl("help", how=how).stdout == out


@pytest.mark.parametrize("args", [["nosuchcommand"], ["--nosuchflag"], ["nosuchcommand", "--json"]])
def test_unknown_command_is_one_line_exit_2(how: str, args: list[str]) -> None:
    proc = _xl(*args, how=how)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert args[0] in lines[0] and "xl --help" in lines[0]
    assert "Traceback" not in proc.stderr


def test_a_subcommand_runs_through_the_script(how: str, tmp_path: Path) -> None:
    """The dispatcher reaches a real command, and its exit code comes back out."""
    proc = _xl("doctor", "--json", how=how)
    report = json.loads(proc.stdout)
    assert proc.returncode == (1 if report["status"] == "fail" else 0)
    assert "Traceback" not in proc.stderr
    bad = _xl("doctor", "--frobnicate", how=how)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1
    assert "Traceback" not in bad.stderr
