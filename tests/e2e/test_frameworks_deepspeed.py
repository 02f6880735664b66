"""DeepSpeed, unchanged, on every rank: examples/deepspeed_train.py under the real
`xl launch --nproc-per-node 2 --no-tui` on CPU ranks (gloo), checked against the loss each rank's
script recorded for itself.

A file of its own: DeepSpeed builds its CPU communication op with the C++ compiler the first
time it runs on a machine (minutes on two busy cores; cached after), so the other frameworks'
runs (test_frameworks.py) go on beside it on the other test worker.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from frameworks import every_rank_shows_its_figures, launch, same_as_recorded

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(600)  # the first DeepSpeed run on a machine builds its CPU comm op (cached)
def test_deepspeed_unchanged_every_rank(tmp_path: Path) -> None:
    record = tmp_path / "loss"
    run_dir, train, _ = launch(
        tmp_path,
        "deepspeed_train.py",
        ["--steps", "5", "--accum", "2", "--record", str(record)],
        timeout=560,
    )
    every_rank_shows_its_figures(run_dir, 5)
    same_as_recorded(train, record, 5)
    # micro batch 8 x accumulation 2
    assert {r["samples"] for r in train if "samples" in r} == {16}
