"""`xl demo`: the bundled example trains for real on 2 CPU ranks and its metrics reach the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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
        train = [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if m["kind"] == "train"]
        for rank in (0, 1):
            mine = [m for m in train if m["rank"] == rank]
            assert mine, f"no train metrics from rank {rank}"
            last = mine[-1]
            assert last["step"] == last["total_steps"] and last["loss"] > 0 and last["samples_per_s"] > 0
            assert "done" in (run_dir / "logs" / f"rank-{rank}.log").read_text()
        # The loss falls: the model learns the teacher.
        first = next(m["loss"] for m in train if m["rank"] == 0)
        tail = [m["loss"] for m in train if m["rank"] == 0][-10:]
        assert sum(tail) / len(tail) < first
        wait_no_processes(run_dir, timeout=3)
    finally:
        kill_run(run_dir)
