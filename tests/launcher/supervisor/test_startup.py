"""How the supervisor starts a run: torchrun first, then what its loop needs (the collector on the
port the ranks were given), and its ``Phase`` from start to end (launcher/supervisor/loop.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from xl.launcher.supervisor.loop import Phase, Supervisor

# Stands in for torchrun: notes which collector its ranks would dial, and leaves.
FAKE_TORCHRUN = "import os; open('collector', 'w').write(os.environ['XL_COLLECTOR'])"


def _run_dir(tmp_path: Path) -> Path:
    """A run dir as `xl launch` leaves it for its supervisor."""
    run_dir = tmp_path / "run"
    (run_dir / "ranks").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    record = {
        "run_id": f"unit-{os.getpid()}-{time.monotonic_ns()}",
        "name": "unit",
        "status": "starting",
        "nnodes": 1,
        "node_rank": 0,
        "nproc_per_node": 1,
        "world_size": 1,
        "host": "here",
        "argv": [sys.executable, "-c", FAKE_TORCHRUN],
        "cwd": str(run_dir),
        "rank_env": {},
        "spec": {},
        "ended_at": None,
        "grace_s": 0.3,
        "ranks": [],
        "failure": None,
    }
    (run_dir / "run.json").write_text(json.dumps(record))
    return run_dir


def test_torchrun_starts_before_telemetry_and_its_ranks_are_given_the_port_the_collector_then_listens_on(  # noqa: E501 - a test's name is its id
    tmp_path: Path,
) -> None:
    run_dir = _run_dir(tmp_path)
    env = dict(os.environ, XL_DEBUG_TIMING="1")
    done = subprocess.run(
        [sys.executable, "-m", "xl.launcher.supervisor", str(run_dir)],
        env=env,
        cwd=run_dir,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    stamps = [line.split(" ", 1)[1] for line in done.stderr.splitlines() if line[:1].isdigit()]
    assert (
        stamps.index("torchrun started")
        < stamps.index("telemetry started")
        < stamps.index("loop ready")
    ), done.stderr
    port = json.loads((run_dir / "collector.json").read_text())["port"]
    assert (run_dir / "collector").read_text() == f"127.0.0.1:{port}"
    run = json.loads((run_dir / "run.json").read_text())
    assert run["torchrun_pid"] and run["versions"] is not None and run["ended_at"] is not None


def test_the_phase_of_a_supervisor_that_is_never_started_and_then_ends(tmp_path: Path) -> None:
    sup = Supervisor(_run_dir(tmp_path))
    assert sup.phase is Phase.STARTING
    sup.torchrun.code = 2  # as when torchrun exits before any rank starts
    sup.finish()
    assert sup.phase is Phase.ENDED
