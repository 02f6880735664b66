"""Framework runs under the real `xl launch --nproc-per-node 2 --no-tui` on CPU ranks, for
tests/e2e/test_frameworks*.py: the launch, and the checks that every rank shows the figures its
script recorded for itself."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from procs import only_run, wait_no_processes, xl, xl_env
from xltele import REPO

from xl.launcher.view.reader import RunReader

EXAMPLES = REPO / "examples"


def launch(
    tmp_path: Path, script: str, args: list[str], *, xl_args: tuple[str, ...] = (),
    timeout: float = 240,
) -> tuple[Path, list[dict[str, Any]], str]:
    """The run's dir, its train records, and what `xl launch --no-tui` printed."""
    home = tmp_path / "home"
    env = xl_env(
        home,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        OMP_NUM_THREADS="1",
        HF_HOME=str(tmp_path / "hf"),
    )
    argv = [
        "launch", "--nproc-per-node", "2", "--no-tui", *xl_args, "--", str(EXAMPLES / script),
        *args,
    ]
    proc = xl(argv, env, cwd=tmp_path, timeout=timeout)
    run_dir = only_run(home)
    wait_no_processes(run_dir, timeout=30)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, [r for r in recs if r["kind"] == "train"], proc.stdout


def by_rank(train: list[dict[str, Any]], key: str) -> dict[int, dict[int, Any]]:
    """{rank: {step: value}} of the records that hold ``key`` (the last one per step)."""
    out: dict[int, dict[int, Any]] = defaultdict(dict)
    for rec in train:
        if key in rec and "step" in rec:
            out[rec["rank"]][rec["step"]] = rec[key]
    return dict(out)


def every_rank_shows_its_figures(run_dir: Path, steps: int) -> None:
    view = RunReader(run_dir).poll()
    assert set(view.ranks) == {0, 1}
    for rank in (0, 1):
        rv = view.ranks[rank]
        assert rv.step == steps, (rank, rv.step)
        assert isinstance(rv.loss, float), rank
        assert rv.samples_per_s and rv.samples_per_s > 0, rank


def same_as_recorded(train: list[dict[str, Any]], record: Path, steps: int) -> None:
    """Each rank's logged loss at each step is the loss its script computed for that step."""
    losses = by_rank(train, "loss")
    for rank in (0, 1):
        own = {
            int(k): v for k, v in json.loads(Path(f"{record}.rank{rank}.json").read_text()).items()
        }
        assert sorted(losses[rank]) == list(range(1, steps + 1)), (rank, sorted(losses[rank]))
        assert losses[rank] == pytest.approx(own, rel=1e-5), rank
    assert losses[0] != losses[1]  # each rank's own, not one value copied
