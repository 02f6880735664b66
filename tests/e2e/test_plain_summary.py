"""`xl attach --no-tui` (the plain view, as `xl launch --no-tui` draws it) of a big run that
ended: the summary of nodes and outliers, the run's outcome and exit code; a 64-rank run keeps
its row per rank (docs/launch.md, "Big runs in the plain view")."""

from __future__ import annotations

import re
import time
from pathlib import Path

from bigrun import make_big_run
from procs import xl, xl_env


def test_xl_attach_of_a_4096_rank_run_prints_the_summary(tmp_path: Path) -> None:
    home = tmp_path / "home"
    runs = home / "runs"
    runs.mkdir(parents=True)
    run = make_big_run(
        runs, 4096, t0=time.time() - 60, seconds=3, failed=[2049], slow=[3001], status="failed"
    )
    done = xl(["attach", run.name, "--no-tui"], xl_env(home), timeout=120)
    assert done.returncode == 1, done.stderr  # the run failed
    out = done.stdout
    assert "4096 ranks on 512 nodes" in out and not re.search(r"^\| +\d+ \|", out, flags=re.M)
    assert "slow: rank 3001 2.000 s" in out
    assert "  failed (1): rank 2049 (exit 1)" in out
    assert "xl: ranks 0-4095 started (4096)" in out
    assert f"xl: run {run.name} failed" in out
    assert len(out.splitlines()) < 100
    assert not done.stderr.strip(), done.stderr


def test_xl_attach_of_a_64_rank_run_keeps_a_row_a_rank(tmp_path: Path) -> None:
    home = tmp_path / "home"
    runs = home / "runs"
    runs.mkdir(parents=True)
    run = make_big_run(runs, 64, t0=time.time() - 60, seconds=2, status="succeeded")
    done = xl(["attach", run.name, "--no-tui"], xl_env(home), timeout=120)
    assert done.returncode == 0, done.stderr
    rows = re.findall(r"^\| +(\d+) \| exited", done.stdout, flags=re.M)
    assert rows == [str(r) for r in range(64)]
    assert "ranks on" not in done.stdout and "slowest steps" not in done.stdout
