"""A plain DDP loop that never calls xl, under the real `xl launch` on real torchrun: every rank's
steps, its own losses, its samples and the split of its step time, checked against what the
script itself computed (tests/support/plain_ddp.py writes it)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from procs import only_run, wait_no_processes, xl, xl_env
from xltele import SUPPORT

pytestmark = pytest.mark.e2e

SPLIT = ("data_s", "compute_s", "comm_s", "other_s")


def _launch(
    tmp_path: Path, *script_args: str, instrument: bool = True, script: str = "plain_ddp.py"
) -> tuple[Path, Path]:
    home, out = tmp_path / "home", tmp_path / "truth"
    out.mkdir()
    args = ["launch", "--nproc", "2", "--no-tui"]
    if not instrument:
        args.append("--no-instrument")
    args += ["--", str(SUPPORT / script)]
    args += (
        [str(out), *script_args] if script != "plain_ddp.py" else ["--out", str(out), *script_args]
    )
    proc = xl(args, xl_env(home, OMP_NUM_THREADS="1"), cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = only_run(home)
    wait_no_processes(run_dir, timeout=30)
    return run_dir, out


def _train(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["kind"] == "train" and r["rank"] == rank]


def _truth(out: Path, rank: int) -> dict[str, Any]:
    return json.loads((out / f"rank{rank}.json").read_text())


def test_every_rank_of_a_plain_ddp_loop_reports_its_own_true_steps(tmp_path: Path) -> None:
    # Two micro-batches a step (the first under DDP's no_sync), and an eval loop under no_grad
    # every 5 steps: neither is a step, and the eval's batches are not samples.
    run_dir, out = _launch(tmp_path, "--steps", "24", "--accum", "2", "--eval-every", "5")
    for rank in (0, 1):
        truth = _truth(out, rank)
        every = _train(run_dir, rank)
        # An eval's sign of life (eval_batches, at most once a second) is no step and no loss.
        alive = [line for line in every if "eval_batches" in line]
        assert all(set(line) == {"t", "rank", "kind", "eval_batches"} for line in alive), alive
        lines = [line for line in every if "eval_batches" not in line]
        assert lines, f"rank {rank} has no train line"
        assert lines[-1]["step"] == truth["steps"] == 24
        assert sum(line.get("steps", 1) for line in lines) == 24  # every step once
        assert [line["step"] for line in lines] == sorted({line["step"] for line in lines})
        for line in lines:
            # The loss is the rank's own: the sum of the losses backward() ran on in that step.
            assert line["loss"] == pytest.approx(truth["losses"][line["step"] - 1], rel=1e-6)
            parts = sum(line[k] for k in SPLIT)
            assert parts == pytest.approx(line["step_s"], abs=1e-5)
            assert line["samples_per_s"] > 0
        assert sum(line["samples"] for line in lines) == truth["samples"] == 24 * 2 * 8
        # The rank announced its own train metrics at its first step: what rank 0 prints
        # ("step 10 loss ...") is not parsed into steps of its own.
        assert not [line for line in lines if line.get("source") == "log"]
    # The two ranks' losses differ (each sees its own data): neither is rank 0's copied.
    assert _truth(out, 0)["losses"] != _truth(out, 1)["losses"]


def test_fsdp2_steps_losses_and_a_split_that_adds_up(tmp_path: Path) -> None:
    run_dir, out = _launch(tmp_path, script="fsdp2_steps.py")
    for rank in (0, 1):
        truth, lines = _truth(out, rank), _train(run_dir, rank)
        assert lines[-1]["step"] == truth["steps"] == 8
        assert sum(line.get("steps", 1) for line in lines) == 8
        for line in lines:
            assert line["loss"] == pytest.approx(truth["losses"][line["step"] - 1], rel=1e-6)
            # FSDP2 waits on its reduce-scatter inside backward's final callbacks: counted once
            assert min(line[k] for k in SPLIT) >= 0
            assert sum(line[k] for k in SPLIT) == pytest.approx(line["step_s"], abs=1e-5)
        assert sum(line["samples"] for line in lines) == truth["samples"]


def test_no_instrument_means_no_step_records(tmp_path: Path) -> None:
    run_dir, out = _launch(tmp_path, "--steps", "6", instrument=False)
    assert _truth(out, 1)["steps"] == 6
    assert _train(run_dir, 0) == [] and _train(run_dir, 1) == []


def _medians(lines: list[dict[str, Any]]) -> dict[str, float]:
    body = lines[1:] or lines  # the first step carries the process group's warm-up
    return {k: statistics.median(line[k] for line in body) for k in SPLIT}


def test_a_rank_slow_to_load_data_shows_data_time_and_its_peer_waits_in_comm(
    tmp_path: Path,
) -> None:
    # Rank 1's Dataset sleeps 20 ms a sample: 160 ms a batch, a lower bound whatever the load.
    run_dir, _ = _launch(
        tmp_path, "--steps", "10", "--slow-data-rank", "1", "--slow-data-s", "0.02"
    )
    slow, fast = _medians(_train(run_dir, 1)), _medians(_train(run_dir, 0))
    assert slow["data_s"] >= 0.16 and slow["data_s"] == max(slow.values())
    assert fast["comm_s"] == max(fast.values())  # it waits for rank 1 in the all-reduce
    assert fast["data_s"] < slow["data_s"] / 4


def test_a_rank_slow_to_compute_shows_compute_time_and_its_peer_waits_in_comm(
    tmp_path: Path,
) -> None:
    # Rank 1's forward sleeps 150 ms: compute on rank 1; rank 0 waits at DDP's reducer.
    run_dir, _ = _launch(
        tmp_path, "--steps", "10", "--slow-compute-rank", "1", "--slow-compute-s", "0.15"
    )
    slow, fast = _medians(_train(run_dir, 1)), _medians(_train(run_dir, 0))
    assert slow["compute_s"] >= 0.15 and slow["compute_s"] == max(slow.values())
    assert fast["comm_s"] == max(fast.values())
    assert fast["compute_s"] < slow["compute_s"] / 4
