"""Which clock each rank's step split is on, where people read it: `xl runs --json`'s ``split``
says ``cuda`` for a rank whose steps the hooks timed with CUDA events (their train lines say
``"clock": "cuda"``), and ``host`` for a rank timed on the host, as every CPU rank is."""

from __future__ import annotations

import json
from pathlib import Path

from procs import xl, xl_env
from runfixtures import make_run

from xl.launcher.rundir import runrecord as record
from xl.launcher.view import digest, timing

T0 = 1_780_000_000.0


def _finished(root: Path, run_id: str, clocks: dict[int, str | None]) -> None:
    """runfixtures' healthy 2-rank run, finished, whose ranks timed 40 lines of 3 steps each;
    rank r's lines carry ``"clock": clocks[r]`` (none where None)."""
    run_dir = make_run(root, "healthy", t0=T0, run_id=run_id)
    with open(run_dir / "metrics.jsonl", "a") as fh:
        for i in range(40):
            for rank, clock in clocks.items():
                rec = {"t": T0 + 2 + i, "rank": rank, "kind": "train", "step": 3 * (i + 1)}
                rec |= {"steps": 3, "step_s": 0.1, "data_s": 0.01, "compute_s": 0.06}
                rec |= {"comm_s": 0.02, "other_s": 0.01}
                if clock is not None:
                    rec["clock"] = clock
                fh.write(json.dumps(rec) + "\n")
    rec = record.load(run_dir)
    assert rec is not None
    digest.close_run(run_dir, rec)
    record.save(run_dir, rec)


def test_runs_json_says_which_clock_each_ranks_split_is_on(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _finished(home / "runs", "20260530-120000-a", {0: "cuda", 1: None})
    done = xl(["runs", "--json"], xl_env(home))
    assert done.returncode == 0, done.stderr
    (run,) = json.loads(done.stdout)
    assert run["split"]["0"]["clock"] == "cuda" and run["split"]["1"]["clock"] == "host"
    assert run["split"]["0"]["steps"] == run["split"]["1"]["steps"] == 120
    ranks = json.loads((home / "runs" / "20260530-120000-a" / "digest.json").read_text())["ranks"]
    assert ranks["0"]["cuda_steps"] == 120 and "cuda_steps" not in ranks["1"]


def test_a_split_mostly_on_the_host_is_on_the_host() -> None:
    # The first step of a CUDA rank is on the host (the clock turns on at its first CUDA loss).
    assert timing.clock({"steps": 100, "cuda_steps": 99}) == "cuda"
    assert timing.clock({"steps": 100, "cuda_steps": 10}) == "host"
    assert timing.clock({"steps": 100}) == "host"
    assert timing.clock(None) == "host"
