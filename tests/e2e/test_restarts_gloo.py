"""`xl launch --max-restarts N` with real process groups: restarted gloo ranks meet again (they
used to sit in _new_process_group_helper for good in about half the runs, or fail with "Gloo
connectFullMesh failed"), and when restarts run out the run's cause is the rank's own error.
Real torchrun, CPU ranks, the real `xl` command; several runs at once to catch the flake."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from procs import kill_run, run_dirs, run_json, wait_final, wait_no_processes, xl, xl_env

pytestmark = pytest.mark.e2e

# Rank 1 fails in its first attempt (or in every attempt with --always) after the process group
# formed; rank 0 is then in an all_reduce that fails when rank 1 is gone.
SCRIPT = """
import os, sys
import torch
import torch.distributed as dist

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
dist.all_reduce(t)
print(f"rank {rank} attempt {attempt}", flush=True)
if rank == 1 and (attempt == 0 or "--always" in sys.argv):
    raise ValueError(f"bad record 17 in attempt {attempt}")
dist.all_reduce(t)
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
"""
RUNS = 3


def test_restarted_ranks_form_their_process_group_again(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (tmp_path / "flaky.py").write_text(textwrap.dedent(SCRIPT))
    env = xl_env(home, XL_STOP_GRACE="1")
    dirs: list[Path] = []
    try:
        for _ in range(RUNS):
            started = xl(
                ["launch", "--detach", "--nproc", "2", "--max-restarts", "2", "flaky.py"],
                env,
                cwd=tmp_path,
            )
            assert started.returncode == 0, started.stderr
            dirs.append(home / "runs" / started.stdout.strip())
        for run_dir in dirs:
            run = wait_final(run_dir, timeout=240)
            logs = {r: (run_dir / "logs" / f"rank-{r}.log").read_text() for r in (0, 1)}
            assert run["status"] == "succeeded", (run.get("failure"), logs)
            assert (
                "rank 1 attempt 1" in logs[1]
                and "rank 0 done" in logs[0]
                and "rank 1 done" in logs[1]
            )
            assert "connectFullMesh" not in logs[0] + logs[1]
    finally:
        for run_dir in dirs:
            kill_run(run_dir)
        for run_dir in dirs:
            wait_no_processes(run_dir, timeout=30)


def test_when_restarts_run_out_the_cause_is_the_ranks_own_error(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (tmp_path / "flaky.py").write_text(textwrap.dedent(SCRIPT))
    env = xl_env(home, XL_STOP_GRACE="1")
    proc = xl(
        ["launch", "--no-tui", "--nproc", "2", "--max-restarts", "1", "flaky.py", "--always"],
        env,
        cwd=tmp_path,
        timeout=240,
    )
    run_dir = run_dirs(home)[0]
    try:
        assert proc.returncode == 1, proc.stdout + proc.stderr
        failure = run_json(run_dir)["failure"]
        assert (
            failure["rank"] == 1 and "ValueError: bad record 17 in attempt 1" in failure["message"]
        ), failure
        assert (
            "connectFullMesh" not in failure["message"]
            and "bad record 17" in proc.stdout + proc.stderr
        )
    finally:
        kill_run(run_dir)
        wait_no_processes(run_dir, timeout=30)
