"""Telemetry through the real `xl launch`: the supervisor's collector, sampler and diagnoses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from procs import only_run, run_json, wait_no_processes, xl, xl_env
from xltele import SUPPORT

from xl.launcher.view.reader import RunReader

pytestmark = pytest.mark.e2e


def test_xl_launch_stores_every_rank_and_names_the_straggler(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = xl_env(
        home,
        XL_STRAGGLER_WINDOW_S="3",
        XL_STRAGGLER_SUSTAIN="2",
        OMP_NUM_THREADS="1",
    )
    args = [
        "launch",
        "--nproc",
        "2",
        "--no-tui",
        "--",
        str(SUPPORT / "telemetry_ddp.py"),
        "--steps",
        "40",
        "--watch",
        "--slow-rank",
        "0",
        "--slow-s",
        "0.1",
    ]
    proc = xl(args, env, cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = only_run(home)
    wait_no_processes(run_dir, timeout=30)
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for rank in (0, 1):
        train = [r for r in recs if r["kind"] == "train" and r["rank"] == rank]
        steps = [r["step"] for r in train if "step" in r]
        assert steps == list(range(1, 41))
        # The script logs step, loss and samples itself: torch's own step lines add only the
        # split of the step time, each step once.
        timed = [r for r in train if "step_s" in r]
        assert all("step" not in r and "loss" not in r and "samples" not in r for r in timed)
        assert sum(r.get("steps", 1) for r in timed) == 40
        assert any(r["kind"] == "sys" and r["rank"] == rank and r.get("rss_mib") for r in recs)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    stragglers = [e for e in events if e["kind"] == "straggler"]
    assert stragglers and {e["rank"] for e in stragglers} == {0}
    assert not [e for e in events if e["kind"] in ("stalled", "nan_loss", "dropped")]
    # The view a person gets afterwards (xl attach / the TUI read the same way).
    view = RunReader(run_dir).poll()
    assert run_json(run_dir)["status"] == "succeeded"
    assert {r: v.state for r, v in view.ranks.items()} == {0: "exited", 1: "exited"}
    assert all(v.step == 40 and v.total_steps == 40 for v in view.ranks.values())
    assert all(v.samples_per_s and v.rss_mib for v in view.ranks.values())
    status = json.loads((run_dir / "collector.json").read_text())
    assert status["records"] >= 80 and status["rejects"] == {}
