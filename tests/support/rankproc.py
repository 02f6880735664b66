"""A real process that looks like a rank of an xl run: what `xl gpus` and the NVML sweep label
from /proc (its RANK, LOCAL_RANK and XL_RUN_ID), for tests that put it on a simulated GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import psutil


@contextmanager
def rank_like(rank: int, local_rank: int, run_id: str) -> Iterator[int]:
    """The pid of a sleeping process whose environment names this rank of this run; killed and
    reaped on the way out."""
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(local_rank), "XL_RUN_ID": run_id}
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(120)"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # Until it has exec'd, the child's /proc/PID/environ is still a copy of this process's.
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        yield child.pid
    finally:
        child.kill()
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()
    assert not psutil.pid_exists(child.pid) or psutil.Process(child.pid).status() == "zombie"
