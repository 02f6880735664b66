"""Stand-ins for a supervisor's parts driven directly (tests/launcher/supervisor): a run dir as
start_run leaves it, plain processes that sleep like ranks in sessions of their own, the run's
events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def unit_run_dir(tmp_path: Path, nproc: int = 2, grace: float = 0.3) -> Path:
    """A run dir as start_run leaves it, for a supervisor that is never started."""
    run_dir = tmp_path / "run"
    (run_dir / "ranks").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    record = {
        "run_id": f"unit-{os.getpid()}-{time.monotonic_ns()}",
        "name": "unit",
        "status": "running",
        "nnodes": 1,
        "node_rank": 0,
        "nproc_per_node": nproc,
        "world_size": nproc,
        "host": "here",
        "ended_at": None,
        "grace_s": grace,
        "ranks": [],
        "failure": None,
    }
    (run_dir / "run.json").write_text(json.dumps(record))
    return run_dir


def fake_rank(ignore_term: bool = False) -> subprocess.Popen[str]:
    """A process that sleeps like a rank at work, in its own session as torchrun starts ranks."""
    body = "import signal, time\n"
    if ignore_term:
        body += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    body += "print('ready', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", body], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def end_rank(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(5)
    if proc.stdout is not None:
        proc.stdout.close()


def events(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
