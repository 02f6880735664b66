"""What a rank started outlives the rank in the kernel's eyes, never the run's: a `setsid sleep &`
from a shell (its own session, reparented once the shell exits) and a double-forked daemon that
also cleared its environment (no XL_RUN_ID to find it by) end with the run, whether it succeeds,
fails or is stopped with `xl stop` (real `xl launch`, real torchrun, CPU ranks)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import textwrap
from pathlib import Path

import psutil
import pytest
from procs import (
    XL,
    kill_run,
    wait_final,
    wait_for,
    wait_no_processes,
    wait_ranks_running,
    wait_run,
    xl,
    xl_env,
)

pytestmark = pytest.mark.e2e

# argv: GO_FILE, HOW (succeed | fail | wait). Rank 0 leaves two processes behind and writes their
# pids, then every rank waits for the go file and ends as told.
SCRIPT = r"""
import os, subprocess, sys, time
rank = int(os.environ["RANK"])
go, how = sys.argv[1], sys.argv[2]
if rank == 0:
    # A shell's background job in a session of its own; the shell exits at once.
    subprocess.run(
        ["sh", "-c", f'setsid sh -c "echo \\$\\$ > {go}.setsid.tmp; exec sleep 1000" &'], check=True
    )
    # The classic daemon: fork, setsid, fork again, the middle process exits; the grandchild
    # clears its environment (nothing says which run it came from) and sleeps.
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execve(
                "/bin/sh",
                ["sh", "-c", f"echo $$ > {go}.daemon.tmp; exec sleep 1000"],
                {"PATH": "/usr/bin:/bin"},
            )
        os._exit(0)
    for name in ("setsid", "daemon"):
        while not os.path.exists(f"{go}.{name}.tmp") or not open(f"{go}.{name}.tmp").read().strip():
            time.sleep(0.02)
        os.rename(f"{go}.{name}.tmp", f"{go}.{name}")
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.02)
if how == "fail" and rank == 1:
    raise SystemExit("rank 1 fails on purpose")
if how == "wait":
    time.sleep(1000)
"""


def _leftovers(tmp_path: Path) -> list[psutil.Process]:
    procs = []
    for name in ("setsid", "daemon"):
        path = tmp_path / f"go.{name}"
        pid = int(
            wait_for(
                lambda p=path: p.exists() and p.read_text().strip(),
                timeout=60,
                what=f"the {name} pid",
            )
        )
        procs.append(psutil.Process(pid))
    return procs


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.parametrize(
    ("how", "status"), [("succeed", "succeeded"), ("fail", "failed"), ("wait", "stopped")]
)
def test_what_a_rank_left_behind_ends_with_the_run(tmp_path: Path, how: str, status: str) -> None:
    env = xl_env(tmp_path / "home")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run(
        [*XL, "launch", "--detach", "--nproc", "2", str(script), str(tmp_path / "go"), how],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = wait_run(Path(env["XL_HOME"]))
    left: list[psutil.Process] = []
    try:
        wait_ranks_running(run_dir, 2, timeout=120)
        left = _leftovers(tmp_path)
        setsid, daemon = left
        # They are what the test means: out of the rank's session, and (the daemon) no longer
        # the rank's child nor carrying the run's id.
        rank0 = next(r["pid"] for r in wait_ranks_running(run_dir, 2)["ranks"] if r["rank"] == 0)
        assert os.getsid(setsid.pid) == setsid.pid and os.getsid(daemon.pid) != os.getsid(rank0)
        assert daemon.ppid() != rank0 and "XL_RUN_ID" not in daemon.environ()
        assert all(_alive(p) for p in left)
        (tmp_path / "go").touch()
        if how == "wait":
            stop = xl(["stop", run_dir.name], env, timeout=60)
            assert stop.returncode == 0, stop.stdout + stop.stderr
        assert wait_final(run_dir, timeout=120)["status"] == status
        # Ended by the run's end, not found later: once run.json is final they are gone (a few
        # seconds for a zombie's reaping on a busy machine).
        wait_for(
            lambda: not any(_alive(p) for p in left),
            timeout=10,
            what="the rank's leftovers to end",
            explain=lambda: str([(p.pid, _alive(p)) for p in left]),
        )
        wait_no_processes(run_dir, timeout=30)
    finally:
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        kill_run(run_dir)
