"""Contract: the commands, their options and how bad usage ends (docs/contracts.md, "Commands and
exit codes").

Pinned against fixtures/cli.json (recorded from the code before the package moves): the command
names `xl --help` lists, in order, and for each command the option strings its ``--help`` shows,
whether each takes a value, the choices it lists, and the positional arguments. Also: every
command's ``--help`` exits 0 on stdout; an unknown flag, a missing argument or an unknown command
exits 2 with exactly one line on stderr and no traceback; ``xl stop|logs|attach`` of a run that
does not exist exits 2; and the module paths that appear in the processes of a run
(``python -m xl.launcher.supervisor RUN_DIR``, ``python -m xl.launcher.entry SCRIPT``) still run
and answer bad usage with their usage line and exit 2.

Re-record the fixture on purpose (a contract change) with ``XL_CONTRACTS_RECORD=1``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from golden import FIXTURES, golden_entry

import xl

pytestmark = pytest.mark.e2e

XL = [sys.executable, "-m", "xl"]



def _env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("XL_", "COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "SLURM_"))
    }
    # A wide terminal, so argparse never wraps an option onto two lines differently.
    env.update(XL_HOME=str(home), COLUMNS="200", TERM="dumb")
    return env


def _run(argv: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def _xl(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    return _run([*XL, *args], home)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An XL_HOME with no runs."""
    return tmp_path_factory.mktemp("cli-home")


@cache
def _top_help(home: Path) -> str:
    proc = _xl(["--help"], home)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return proc.stdout


def _commands(home: Path) -> list[str]:
    text = _top_help(home)
    section = text.split("\ncommands:\n", 1)[1]
    names = []
    for line in section.splitlines():
        m = re.match(r"^  ([a-z][a-z0-9-]*)\s{2,}\S", line)
        if m:
            names.append(m.group(1))
        elif line and not line.startswith(" "):
            break
    return names


_OPTION_LINE = re.compile(r"^ {2}(-{1,2}[A-Za-z0-9].*?)(?: {2,}|$)")


def _parse_help(text: str) -> dict[str, Any]:
    """Option strings (with arity and listed choices) and positionals from argparse's --help."""
    options: dict[str, dict[str, Any]] = {}
    positionals: list[str] = []
    section = ""
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            section = line[:-1]
            continue
        if section == "positional arguments":
            m = re.match(r"^ {2}(\S+)", line)
            if m:
                positionals.append(m.group(1))
            continue
        m = _OPTION_LINE.match(line)
        if not m:
            continue
        for spec in m.group(1).split(", "):
            flag, _, value = spec.partition(" ")
            entry: dict[str, Any] = {"takes_value": bool(value)}
            choices = re.fullmatch(r"\{(.*)\}", value)
            if choices:
                entry["choices"] = choices.group(1).split(",")
            if value.startswith("["):
                entry["value_optional"] = True
            options[flag] = entry
    return {"options": options, "positionals": positionals}


def test_version_and_help(home: Path) -> None:
    proc = _xl(["--version"], home)
    assert proc.returncode == 0 and proc.stdout == f"xl {xl.__version__}\n"
    text = _top_help(home)
    assert text.startswith("usage: xl ")
    for alias in (["-h"], ["help"]):
        assert _xl(alias, home).stdout == text


def test_command_list(home: Path) -> None:
    commands = _commands(home)
    # The commands every install has (docs/contracts.md); cli.json pins the whole list.
    assert {"doctor", "gpus", "launch", "sbatch", "runs", "attach", "stop", "logs", "demo"} <= set(
        commands
    )
    golden_entry("cli.json", "commands", commands)


def test_every_command_s_options(home: Path) -> None:
    commands = _commands(home)
    with ThreadPoolExecutor(4) as pool:
        procs = dict(
            zip(commands, pool.map(lambda c: _xl([c, "--help"], home), commands), strict=True)
        )
    parsed = {}
    for command, proc in procs.items():
        assert proc.returncode == 0, (command, proc.stderr)
        assert proc.stderr == "" and proc.stdout.startswith("usage: xl"), command
        parsed[command] = _parse_help(proc.stdout)
        assert "--help" in parsed[command]["options"], command
    golden_entry("cli.json", "options", parsed)


def _one_line_usage_error(proc: subprocess.CompletedProcess[str], who: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"{who}: "), lines[0]
    assert "Traceback" not in proc.stderr


def test_unknown_flag_is_bad_usage_for_every_command(home: Path) -> None:
    commands = _commands(home)
    # Every required positional (RUN, RUN_A RUN_B) given too, so the flag is what is wrong.
    spec = json.loads((FIXTURES / "cli.json").read_text())["options"]
    argvs = {
        c: [c, "--no-such-flag", *["somerun"] * len(spec[c]["positionals"])]
        for c in commands
    }
    with ThreadPoolExecutor(4) as pool:
        procs = dict(zip(commands, pool.map(lambda c: _xl(argvs[c], home), commands), strict=True))
    for command, proc in procs.items():
        _one_line_usage_error(proc, "xl" if command == "ui" else f"xl {command}")
        assert "--no-such-flag" in proc.stderr, (command, proc.stderr)


def test_unknown_command_is_bad_usage(home: Path) -> None:
    proc = _xl(["no-such-command"], home)
    _one_line_usage_error(proc, "xl")
    assert "no-such-command" in proc.stderr


@pytest.mark.parametrize(
    "args",
    [["logs"], ["stop"], ["attach"], ["launch"], ["sbatch"], ["launch", "--dry-run"]],
    ids=lambda a: "-".join(a),
)
def test_missing_argument_is_bad_usage(home: Path, args: list[str]) -> None:
    _one_line_usage_error(_xl(args, home), f"xl {args[0]}")


@pytest.mark.parametrize("command", ["stop", "logs", "attach"])
def test_no_such_run_with_no_runs_is_bad_usage(home: Path, command: str) -> None:
    _one_line_usage_error(_xl([command, "nosuchrun"], home), f"xl {command}")
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


def test_runs_json_with_no_runs(home: Path) -> None:
    proc = _xl(["runs", "--json"], home)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


@pytest.mark.parametrize(
    ("module", "usage"),
    [
        ("xl.launcher.supervisor", "python -m xl.launcher.supervisor RUN_DIR"),
        ("xl.launcher.entry", "python -m xl.launcher.entry (SCRIPT | -m MODULE)"),
    ],
)
def test_module_paths_in_run_argv_still_run(home: Path, module: str, usage: str) -> None:
    proc = _run([sys.executable, "-m", module], home)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert usage in proc.stderr and "Traceback" not in proc.stderr
