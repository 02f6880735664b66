"""`xl demo`: the bundled example trains for real on 2 CPU ranks and its metrics reach the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from procs import kill_run, only_run, run_json, wait_no_processes, xl, xl_env

pytestmark = pytest.mark.e2e


def test_demo_trains_on_two_cpu_ranks_and_logs_loss(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = xl(["demo", "--no-tui", "--seconds", "2"], xl_env(home), cwd=tmp_path, timeout=180)
    run_dir = only_run(home)
    try:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
        run = run_json(run_dir)
        assert run["status"] == "succeeded" and run["world_size"] == 2 and run["devices"] == []
        train = [
            m
            for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if m["kind"] == "train" and "step" in m
        ]
        # (the lines without a step are torch's hooks' time split beside the demo's own xl.log)
        for rank in (0, 1):
            mine = [m for m in train if m["rank"] == rank]
            assert mine, f"no train metrics from rank {rank}"
            last = mine[-1]
            assert (
                last["step"] == last["total_steps"]
                and last["loss"] > 0
                and last["samples_per_s"] > 0
            )
            log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
            assert "done" in log
            assert NO_NUMPY not in log and "Warning" not in log, log  # the main job starts clean
        # The loss falls: the model learns the teacher.
        first = next(m["loss"] for m in train if m["rank"] == 0)
        tail = [m["loss"] for m in train if m["rank"] == 0][-10:]
        assert sum(tail) / len(tail) < first
        wait_no_processes(run_dir, timeout=3)
    finally:
        kill_run(run_dir)


NO_NUMPY = "Failed to initialize NumPy"
ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_first_command_installs_numpy() -> None:
    # The README's main job installs xl's own requirements beside torch, whose wheel does not
    # require numpy (torch then warns in every rank's log, as the next test shows).
    readme = (ROOT / "README.md").read_text()
    assert "pip install torch==2.13.0 -e . && .venv/bin/xl demo" in readme
    # The [project] table's dependency list, one quoted requirement a line (no tomllib on 3.10).
    block = (
        (ROOT / "pyproject.toml").read_text().split("\ndependencies = [\n", 1)[1].split("\n]", 1)[0]
    )
    found = [
        line.strip().rstrip(",").strip('"')
        for line in block.splitlines()
        if line.strip().startswith('"')
    ]
    assert "numpy" in {Requirement(r).name for r in found if not Requirement(r).marker}, found


def test_without_numpy_the_demo_log_carries_torchs_warning(tmp_path: Path) -> None:
    # What the README's first command gave before numpy was among xl's requirements: the check
    # above guards against a real warning, seen here with numpy hidden from the ranks.
    hidden = tmp_path / "hide" / "numpy"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'numpy\'", name="numpy")\n'
    )
    home = tmp_path / "home"
    env = xl_env(home, PYTHONPATH=str(hidden.parent))
    proc = xl(["demo", "--no-tui", "--seconds", "1"], env, cwd=tmp_path, timeout=180)
    run_dir = only_run(home)
    try:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
        assert NO_NUMPY in (run_dir / "logs" / "rank-0.log").read_text()
        wait_no_processes(run_dir, timeout=3)
    finally:
        kill_run(run_dir)
