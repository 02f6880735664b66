"""`xl runs` of a run being started (real `xl launch --detach`, real torchrun with CPU ranks, the
real `xl runs`). A run whose supervisor is gone: test_supervisor_dies.py."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import procs
import pytest
from procs import run_json, wait_for, xl, xl_env
from slowstart import start_slow

pytestmark = pytest.mark.e2e

# Ranks wait for the test's go file, then end at once.
SCRIPT = """
import os, sys, time
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
print("done", flush=True)
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
    env = xl_env(tmp_path / "home", OMP_NUM_THREADS="1")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    run_dir, env = start_slow(tmp_path, env, script, str(tmp_path / "go"))
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


