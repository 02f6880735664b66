"""`xl runs` of a run being started (real `xl launch --detach`, real torchrun with CPU ranks, the
real `xl runs`). A run whose supervisor is gone: test_supervisor_dies.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import procs
import pytest
from procs import run_json, wait_for, xl, xl_env

pytestmark = pytest.mark.e2e

# Ranks wait for the test's go file, then end at once.
SCRIPT = """
import os, sys, time
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
print("done", flush=True)
"""

# A supervisor whose interpreter is slow to start (a slow disk, a loaded node): it waits until the
# test's gate file exists (bounded), so the run is starting for as long as the test looks, however
# busy the machine. Only a supervisor started in an interpreter of its own reads it: the library
# path the app uses (`xl launch` forks its supervisor, which has its interpreter already).
SLOW_SITE = """
import os, time
with open("/proc/self/cmdline", "rb") as fh:
    if b"xl.launcher.supervisor" in fh.read():
        gate, end = os.environ.get("XL_TEST_START_GATE", ""), time.monotonic() + 120
        while gate and not os.path.exists(gate) and time.monotonic() < end:
            time.sleep(0.05)
"""

GONE = "supervisor gone"


def _launch(tmp_path: Path, env: dict[str, str], name: str) -> Path:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    proc = xl(
        ["launch", "--detach", "--nproc", "2", "--name", name, str(script), str(tmp_path / "go")],
        env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = sorted((Path(env["XL_HOME"]) / "runs").glob(f"*-{name}-*"))
    assert len(runs) == 1, runs
    return runs[0]


def _listed(env: dict[str, str], run_dir: Path) -> tuple[str, dict[str, Any]]:
    """The run's row of `xl runs` and its object of `xl runs --json`."""
    table = xl(["runs"], env)
    assert table.returncode == 0, table.stderr
    row = next(ln for ln in table.stdout.splitlines() if ln.startswith(run_dir.name))
    listed = xl(["runs", "--json"], env)
    assert listed.returncode == 0, listed.stderr
    return row, next(r for r in json.loads(listed.stdout) if r["run_id"] == run_dir.name)


def test_a_run_just_launched_is_starting_never_supervisor_gone(tmp_path: Path) -> None:
    env = xl_env(tmp_path / "home", OMP_NUM_THREADS="1")
    for n in range(3):
        run_dir = _launch(tmp_path, env, f"fresh{n}")
        try:
            seen = []
            # From the launch's return until its supervisor is known, and a look after that.
            while True:
                known = run_json(run_dir).get("supervisor_pid") is not None
                row, obj = _listed(env, run_dir)
                seen.append(obj["supervisor"])
                assert GONE not in row, row
                # (the two looks are apart: the supervisor may become known between them)
                assert row.split()[2] in ("starting", "running"), row
                assert obj["status"] == "running" and obj["supervisor_alive"], obj
                assert obj["supervisor"] in ("starting", "running"), obj
                if known:
                    break
            assert seen[-1] == "running", seen
        finally:
            (tmp_path / "go").touch()
        procs.end_run(None, run_dir, timeout=60)
        (tmp_path / "go").unlink()


def test_a_run_whose_supervisor_is_slow_to_start_is_listed_starting(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_SITE)
    env = xl_env(
        tmp_path / "home",
        PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        XL_TEST_START_GATE=str(tmp_path / "gate"),
        OMP_NUM_THREADS="1",
    )
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    code = (
        "import sys; from xl.launcher.control import start_run; from xl.launcher.spec import "
        "LaunchSpec\n"
        "print(start_run(LaunchSpec(script=sys.argv[1], args=[sys.argv[2]], nproc=2)).run_id)\n"
    )
    started = subprocess.run(
        [sys.executable, "-c", code, str(script), str(tmp_path / "go")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert started.returncode == 0, started.stderr
    run_dir = tmp_path / "home" / "runs" / started.stdout.strip()
    try:
        assert run_json(run_dir)["supervisor_pid"] is None
        row, obj = _listed(env, run_dir)
        assert row.split()[2] == "starting" and GONE not in row, row
        assert obj["supervisor"] == "starting" and obj["supervisor_alive"], obj
        assert run_json(run_dir)["supervisor_pid"] is None  # it was starting all the while
        (tmp_path / "gate").touch()
        # Once it is up, the same run is running.
        wait_for(
            lambda: _listed(env, run_dir)[1]["supervisor"] == "running",
            timeout=60,
            what="the supervisor known",
        )
    finally:
        (tmp_path / "gate").touch()
        (tmp_path / "go").touch()
    procs.end_run(None, run_dir, timeout=90)


