"""Every framework, unchanged, on every rank: real HF Trainer, Lightning and Accelerate scripts
(examples/, tiny models from configs, random data, nothing downloaded) under the real
`xl launch --nproc-per-node 2 --no-tui` on CPU ranks (gloo). DeepSpeed, whose first run builds
an op: test_frameworks_deepspeed.py.

Each run is checked against what the framework itself logs: the script writes its own record
(the Trainer's log_history, or each rank's loss as the script computed it) beside the run.
An HF run is the suite's slowest thing to start, so one run answers for several behaviours: the
unchanged Trainer's also for the plain view's eval column (tests/e2e/test_eval_shown.py), the
--no-instrument one also for what xl reads from the Trainer's printed output alone.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest
from frameworks import by_rank, every_rank_shows_its_figures, launch, same_as_recorded

from xl.launcher.view.reader import RunReader

pytestmark = pytest.mark.e2e

@pytest.mark.parametrize(
    "how",
    ["unchanged", "callback-without-instrumentation"],
)
def test_hf_trainer_every_rank_loss_is_the_trainers(tmp_path: Path, how: str) -> None:
    """Rank 1 has values too; the loss is the Trainer's (its mean over ranks is what the Trainer
    logs, after its scaling for average_tokens_across_devices and gradient accumulation); eval
    values are kept apart and never move the step or the progress. Unchanged (instrumented):
    the end table of `xl launch --no-tui` has each rank's eval loss as the Trainer logged it,
    with the epoch."""
    steps, history = 6, tmp_path / "history.json"
    args = [
        "--steps", str(steps), "--logging-steps", "1", "--eval", "3", "--accum", "2", "--history",
        str(history),
    ]
    if how == "unchanged":
        run_dir, train, out = launch(tmp_path, "hf_trainer.py", [*args, "--no-callback"])
    else:
        run_dir, train, out = launch(tmp_path, "hf_trainer.py", args, xl_args=("--no-instrument",))
    assert all(r.get("source") != "log" for r in train), "printed dicts must not double up"
    every_rank_shows_its_figures(run_dir, steps)
    logged = {h["step"]: h["loss"] for h in json.loads(history.read_text()) if "loss" in h}
    losses = by_rank(train, "loss")
    assert sorted(logged) == list(range(1, steps + 1))
    for step, hf_loss in logged.items():
        assert statistics.mean([losses[0][step], losses[1][step]]) == pytest.approx(
            hf_loss, rel=1e-5
        ), step
    # samples/s from the Trainer's own figure: per_device_train_batch_size 4 x accumulation 2
    assert {r["samples"] for r in train if "samples" in r} == {8}
    evals = [r for r in train if "eval_loss" in r]
    assert {(r["rank"], r["step"]) for r in evals} == {(0, 3), (1, 3), (0, 6), (1, 6)}
    assert all("loss" not in r and "samples" not in r for r in evals)
    hf_evals = {
        h["step"]: h["eval_loss"] for h in json.loads(history.read_text()) if "eval_loss" in h
    }
    assert {r["step"]: r["eval_loss"] for r in evals} == pytest.approx(hf_evals)
    assert {r["total_steps"] for r in train if "total_steps" in r} == {steps}
    if how == "unchanged":
        # the Trainer's own
        last = [h for h in json.loads(history.read_text()) if "eval_loss" in h][-1]
        shown = f"{last['eval_loss']:.4g} ep {last['epoch']:.3g}"
        header = next(ln for ln in out.splitlines() if ln.startswith("| rank"))
        assert re.search(r"\|\s+eval \|", header), out[-3000:]
        rows = [ln for ln in out.splitlines() if re.match(r"\|\s+[01] \| exited", ln)]
        assert len(rows) == 2 and all(shown in row for row in rows), (shown, out[-3000:])


@pytest.mark.parametrize("bar", ["default", "tqdm"])  # Lightning's default: Rich (xl installs rich)
def test_lightning_unchanged_every_rank_with_either_bar(tmp_path: Path, bar: str) -> None:
    """train_loss, steps across epochs, epochs; validation apart from training; no sanity check."""
    record = tmp_path / "loss"
    run_dir, train, _ = launch(
        tmp_path,
        "lightning_train.py",
        [
            "--steps",
            "6",
            "--epochs",
            "2",
            "--record",
            str(record),
            *(["--bar", bar] if bar != "default" else []),
        ],
    )
    every_rank_shows_its_figures(run_dir, 12)
    same_as_recorded([r for r in train if "eval_loss" not in r], record, 12)
    assert {r["epoch"] for r in train if "loss" in r} == {0, 1}
    assert {r["total_steps"] for r in train if "total_steps" in r} == {12}
    evals = [r for r in train if "eval_loss" in r]
    # one validation per epoch on each rank; the sanity check (before step 1) is not one
    assert sorted((r["rank"], r["step"]) for r in evals) == [(0, 6), (0, 12), (1, 6), (1, 12)]
    assert all("loss" not in r and r["val_loss"] == r["eval_loss"] for r in evals)


def test_accelerate_unchanged_every_rank(tmp_path: Path) -> None:
    record = tmp_path / "loss"
    run_dir, train, _ = launch(
        tmp_path,
        "accelerate_train.py",
        ["--steps", "6", "--batch", "16", "--no-tracker", "--record", str(record)],
    )
    every_rank_shows_its_figures(run_dir, 6)
    same_as_recorded(train, record, 6)
    assert {r["samples"] for r in train if "samples" in r} == {16}
    assert all(r["steps_per_s"] > 0 for r in train if r.get("step", 0) > 1)
    # torch's own step lines add the time split alone: Accelerate's step, loss and samples win.
    timed = [r for r in train if "step_s" in r]
    assert timed and not [r for r in timed if {"step", "loss", "samples"} & set(r)]
    assert {r["rank"] for r in timed} == {0, 1}


def test_accelerate_tracker_train_loss_is_the_loss(tmp_path: Path) -> None:
    """The script's XLTracker reports rank 0 (its train_loss as loss); rank 1 still has its own."""
    record = tmp_path / "loss"
    run_dir, train, _ = launch(
        tmp_path, "accelerate_train.py", ["--steps", "6", "--record", str(record)]
    )
    every_rank_shows_its_figures(run_dir, 6)
    same_as_recorded(train, record, 6)
    # one record per step on each rank: the tracker's on rank 0, the instrumented one on rank 1
    assert sorted(r["step"] for r in train if r["rank"] == 0 and "step" in r) == list(range(1, 7))
    assert sorted(r["step"] for r in train if r["rank"] == 1 and "step" in r) == list(range(1, 7))
    assert all(r["total_steps"] == 6 for r in train if r["rank"] == 0 and "step" in r)


def test_no_instrument_leaves_the_trainer_alone(tmp_path: Path) -> None:
    """--no-instrument: nothing is added to the Trainer; xl reads what rank 0 prints (HF prints
    on rank 0 only: its log dicts and tqdm bar become rank 0's metrics), and the evaluation bar
    drawn below the training bar is not training progress. Rank 1 prints nothing HF-shaped, yet
    its process is sampled all the same."""
    steps = 8  # logged every 2 steps (the script's default), evaluated every 2
    run_dir, train, _ = launch(
        tmp_path,
        "hf_trainer.py",
        ["--steps", str(steps), "--no-callback", "--eval", "2"],
        xl_args=("--no-instrument",),
    )
    assert train and {r["rank"] for r in train} == {0}
    assert all(r["source"] == "log" for r in train)
    assert any(isinstance(r.get("loss"), float) and "lr" in r for r in train)
    assert max(r["step"] for r in train if "step" in r) == steps
    assert {r["total_steps"] for r in train if "total_steps" in r} == {steps}
    seen = [r["step"] for r in train if "step" in r and "loss" not in r and "eval_loss" not in r]
    assert seen == sorted(seen) and max(seen) == steps
    assert any("eval_loss" in r and "loss" not in r for r in train)
    assert '"XL_INSTRUMENT": "0"' in (run_dir / "run.json").read_text()
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {r["rank"] for r in recs if r["kind"] == "sys" and r.get("rss_mib")} == {0, 1}
    view = RunReader(run_dir).poll()
    assert view.ranks[0].step == steps and view.ranks[0].progress == 1.0
    assert view.ranks[0].loss is not None
