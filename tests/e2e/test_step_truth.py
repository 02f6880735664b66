"""What a plain DDP loop's step optimized and where its time went, under the real `xl launch` on
real torchrun with gloo CPU ranks, held to what the script itself computed
(tests/support/step_truth_ddp.py, which never calls xl).

- With 4 micro-batches a step (each ``loss / 4``), a step's loss is the sum the script prints,
  not its last micro-batch's; one backward a step is that loss as it was.
- Two ranks that step together cut their lines after the same steps, with the same rates.
- Tensor math between forward and backward outside any module, slow on one rank, makes it the
  straggler in ``compute``; slow logging after its optimizer step, in ``other``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from procs import only_run, run_json, wait_no_processes, xl, xl_env
from where import SUPPORT

pytestmark = pytest.mark.e2e

SCRIPT = SUPPORT / "step_truth_ddp.py"
SPLIT = ("data_s", "compute_s", "comm_s", "other_s")
# A short straggler window (4 s, 3 ticks) so a run of ~20 s is judged.
FAST = {"XL_STRAGGLER_WINDOW_S": "4", "XL_STRAGGLER_SUSTAIN": "3"}


def _launch(tmp_path: Path, *script_args: str, env: dict[str, str] | None = None) -> Path:
    home, out = tmp_path / "home", tmp_path / "truth"
    out.mkdir()
    args = ["launch", "--nproc", "2", "--no-tui", "--", str(SCRIPT), "--out", str(out)]
    proc = xl(
        [*args, *script_args],
        xl_env(home, OMP_NUM_THREADS="1", **(env or {})),
        cwd=tmp_path,
        timeout=300,
    )
    run_dir = only_run(home)
    wait_no_processes(run_dir, timeout=30)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert run_json(run_dir)["status"] == "succeeded"
    return run_dir


def _records(run_dir: Path, name: str) -> list[dict[str, Any]]:
    text = (run_dir / name).read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _steps(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    return [
        r
        for r in _records(run_dir, "metrics.jsonl")
        if r["kind"] == "train" and r["rank"] == rank and "step" in r
    ]


def _truth(tmp_path: Path, rank: int) -> dict[str, Any]:
    return json.loads((tmp_path / "truth" / f"rank{rank}.json").read_text())


@pytest.mark.parametrize("accum", [4, 1])
def test_a_steps_loss_is_what_the_script_optimized_and_lockstep_ranks_agree(
    tmp_path: Path, accum: int
) -> None:
    steps = 240 // accum
    run_dir = _launch(tmp_path, "--steps", str(steps), "--accum", str(accum))
    lines = {rank: _steps(run_dir, rank) for rank in (0, 1)}
    for rank, mine in lines.items():
        truth = _truth(tmp_path, rank)
        assert mine and mine[-1]["step"] == truth["steps"] == steps
        assert sum(line.get("steps", 1) for line in mine) == steps  # every step once
        for line in mine:
            want = truth["losses"][line["step"] - 1]
            assert line["loss"] == pytest.approx(want, rel=1e-5), (rank, line)
            if accum > 1:  # never the last micro-batch's loss / 4 alone
                assert line["loss"] != pytest.approx(truth["last_micro"][line["step"] - 1])
            assert sum(line[k] for k in SPLIT) == pytest.approx(line["step_s"], abs=1e-5)
        assert sum(line["samples"] for line in mine) == truth["samples"]
    # Both ranks step together (DDP's all-reduce every step): their lines are cut after the same
    # steps, so both show the same step, and each line's rate is over the same steps. (Cut where
    # each rank's sender happened to wake, the cuts drift apart over a long run as the senders'
    # wake-ups do; tests/xl/integrations/test_stepclock.py holds the grid to any wake-up phase.)
    # A step that ends right at a grid point on one rank and just after it on the other (a rank
    # descheduled on a busy machine) moves that cut by a step or two at most: neither rank can
    # end a step before the other's all-reduce of the step before. A sender starved past a grid
    # point cuts at the next one: the rank with fewer lines is held to the other's.
    cuts = [{line["step"]: line for line in lines[rank]} for rank in (0, 1)]
    shared = sorted(set(cuts[0]) & set(cuts[1]))
    fewer, more = sorted(cuts, key=len)
    apart = [min(abs(a - b) for b in more) for a in fewer]
    close = [d for d in apart if d <= 2]
    assert len(close) >= 0.9 * len(apart), (sorted(cuts[0]), sorted(cuts[1]))
    ratios = [
        cuts[1][s]["samples_per_s"] / cuts[0][s]["samples_per_s"]
        for s in shared[1:]  # the first carries each rank's own start
        if cuts[0][s].get("steps", 1) == cuts[1][s].get("steps", 1)
    ]
    assert ratios and statistics.median(ratios) == pytest.approx(1.0, abs=0.03), ratios


def _straggler(run_dir: Path) -> list[dict[str, Any]]:
    return [e for e in _records(run_dir, "events.jsonl") if e["kind"] == "straggler"]


@pytest.mark.parametrize(("slow", "phase"), [("math", "compute"), ("log", "other")])
def test_a_rank_slow_between_forward_and_backward_is_slow_in_compute_and_after_its_step_in_other(
    tmp_path: Path, slow: str, phase: str
) -> None:
    run_dir = _launch(
        tmp_path,
        *("--steps", "70", "--slow-rank", "1", "--slow", slow, "--slow-s", "0.2"),
        env=FAST,
    )
    stragglers = _straggler(run_dir)
    assert stragglers, _records(run_dir, "events.jsonl")
    assert {e["rank"] for e in stragglers} == {1}, stragglers
    assert {e["phase"] for e in stragglers} == {phase}, stragglers
    # The slow rank's own lines put the 0.2 s in that phase, the other rank's in its wait.
    body = _steps(run_dir, 1)[2:]
    key = f"{phase}_s"
    assert statistics.median(line[key] for line in body) >= 0.15
    waits = statistics.median(line["comm_s"] for line in _steps(run_dir, 0)[2:])
    assert waits >= 0.1
