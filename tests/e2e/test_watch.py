"""The view without the TUI (`xl launch --no-tui`, `xl attach --no-tui`, launches into a pipe).

Fed the recorded run directories under tests/fixtures/runs: what a person reads in the Rich
live table on a terminal, and in the plain output of a pipe or CI log.
"""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pytest
from procs import XL, xl_env
from rich.console import Console
from where import FIXTURES

from xl.launcher.cli.console import ConsoleRun, render, render_text, watch_plain

RUNS_FIXTURES = FIXTURES / "runs"


def _watched(name: str) -> ConsoleRun:
    watched = ConsoleRun(RUNS_FIXTURES / name)
    watched.poll()
    return watched


def _rich(watched: ConsoleRun, width: int = 160) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None).print(render(watched))
    return buf.getvalue()


def _row(text: str, rank: int) -> str:
    rows = [line for line in text.splitlines() if line.strip(" │|┃").startswith(f"{rank} ")]
    assert len(rows) == 1, text
    return rows[0]


def test_live_table_names_the_straggler_with_its_figures() -> None:
    text = _rich(_watched("20260530-straggler"))
    assert "gpt2-ddp" in text and "running" in text.splitlines()[0]
    fast, slow = _row(text, 0), _row(text, 1)
    assert "running" in fast and "straggler" not in fast
    assert "straggler" in slow and "slower than the median" in slow
    # step/total, samples/s, loss and the GPU's utilization and memory for each rank
    assert "60/100" in fast and "37/100" in slow
    assert "%" in slow and "G/80.0G" in slow  # xl.units: the style the app shows too
    assert "rank 1 is 1.6x slower" in text  # the diagnosis also shows among the recent events


def test_live_table_shows_the_failed_rank_and_its_exit_code() -> None:
    text = _rich(_watched("20260530-failed"))
    assert "failed (1)" in _row(text, 1)
    assert "stopped (-15)" in _row(text, 0)
    assert "OutOfMemoryError" in _row(text, 1)


def test_64_ranks_each_get_a_row() -> None:
    text = _rich(_watched("20260530-wide"), width=200)
    for rank in (0, 31, 63):
        _row(text, rank)


def test_plain_output_of_a_failed_run_ends_with_table_traceback_and_outcome() -> None:
    out = io.StringIO()
    code = watch_plain(ConsoleRun(RUNS_FIXTURES / "20260530-failed"), out)
    text = out.getvalue()
    assert code == 1
    assert "\x1b[" not in text  # no control codes in a pipe or a log file
    assert "[rank 1] " in text  # each rank's output, prefixed
    table = render_text(_watched("20260530-failed"))
    assert table in text and "failed (1)" in table and "stopped (-15)" in table
    assert "traceback of rank 1" in text and "torch.OutOfMemoryError" in text
    assert text.rstrip().splitlines()[-1].startswith("xl: run 20260530-failed failed")


def test_plain_output_of_a_healthy_run_exits_0() -> None:
    out = io.StringIO()
    assert watch_plain(ConsoleRun(RUNS_FIXTURES / "20260530-healthy"), out) == 0
    assert "succeeded" in out.getvalue().splitlines()[-1]


@pytest.mark.e2e
def test_attach_no_tui_into_a_pipe(tmp_path: Path) -> None:
    """The real command, stdout a pipe: the plain view, the rank table, the run's exit code."""
    home = tmp_path / "home"
    shutil.copytree(RUNS_FIXTURES / "20260530-failed", home / "runs" / "20260530-failed")
    proc = subprocess.run(
        [*XL, "attach", "--no-tui", "last"],
        env=xl_env(home),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert "failed (1)" in proc.stdout and "traceback of rank 1" in proc.stdout
    assert "Traceback (most recent call last)" not in proc.stderr
