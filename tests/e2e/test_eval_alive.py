"""A long eval between steps is a rank at work, not a stall; the same gap spent asleep is one.

Real 2-rank gloo runs of a plain DDP loop under the real `xl launch` (torch's hooks on), with a
4 s stall threshold: after 20 steps each rank either evaluates for ~10 s (a DataLoader under
no_grad, 0.1 s a batch) or sleeps 10 s in its own code, then trains 20 more steps. The eval run
gets no `stalled` or `hang` event and no stalled time; the sleeping run gets both ranks named.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from procs import XL, first_run, run_json, wait_no_processes, xl_env

pytestmark = pytest.mark.e2e

SCRIPT = """
import sys, time
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __init__(self, n, sleep_s):
        self.x = torch.randn(n, 8)
        self.sleep_s = sleep_s
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        time.sleep(self.sleep_s)
        return self.x[i]

dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
train = DataLoader(Slow(160, 0.0), batch_size=4)
val = DataLoader(Slow(100, 0.1), batch_size=1)
for i, x in enumerate(train):
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    if i == 19:
        if sys.argv[1] == "eval":
            with torch.no_grad():
                for vx in val:
                    model(vx)
        else:
            time.sleep(10)
        dist.barrier()
    if i == 39:
        break
dist.destroy_process_group()
"""


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run(tmp_path: Path, how: str) -> tuple[Path, str]:
    home = tmp_path / "home"
    script = tmp_path / "evaluates.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [*XL, "launch", "--no-tui", "--nproc", "2", str(script), how],
        env=xl_env(home, XL_STALL_MIN_S="4"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    run_dir = first_run(home)
    out = done.stdout + done.stderr
    assert run_dir is not None, out[-3000:]
    wait_no_processes(run_dir, timeout=30)
    assert done.returncode == 0 and run_json(run_dir)["status"] == "succeeded", out[-3000:]
    return run_dir, out


def test_a_long_eval_between_steps_is_no_stall(tmp_path: Path) -> None:
    run_dir, out = _run(tmp_path, "eval")
    events = _lines(run_dir / "events.jsonl")
    named = [e for e in events if e["kind"] in ("stalled", "hang")]
    assert named == [], (named, out[-2000:])
    train = [r for r in _lines(run_dir / "metrics.jsonl") if r.get("kind") == "train"]
    for rank in (0, 1):
        mine = [r for r in train if r["rank"] == rank]
        # the true 40 steps, and the eval said so without becoming a step
        assert max(r["step"] for r in mine if "step" in r) == 40
        alive = [r for r in mine if "eval_batches" in r]
        assert alive and all("step" not in r and "loss" not in r for r in alive), alive
        assert max(r["eval_batches"] for r in alive) <= 100
    assert run_json(run_dir)["time"]["stalled_s"] == 0, run_json(run_dir)["time"]


def test_the_same_gap_asleep_is_a_stall_of_both_ranks(tmp_path: Path) -> None:
    run_dir, out = _run(tmp_path, "sleep")
    stalled = [e for e in _lines(run_dir / "events.jsonl") if e["kind"] == "stalled"]
    assert {e["rank"] for e in stalled} == {0, 1}, out[-3000:]
    train = [r for r in _lines(run_dir / "metrics.jsonl") if r.get("kind") == "train"]
    assert not any("eval_batches" in r for r in train)
    assert run_json(run_dir)["time"]["stalled_s"] > 0
