"""The figures a run's end shows are the run's (real `xl launch --no-tui`, real torchrun with two
CPU gloo ranks, the real `xl runs RUN`), held against what the script measured of itself: its
samples and the wall time of its steps, its evaluation's epoch, its last line of output."""

from __future__ import annotations

import json
import re
import textwrap
import time
from pathlib import Path

import pytest
from procs import kill_run, only_run, run_json, wait_no_processes, xl, xl_env

from xl.launcher.view.reader import RunReader
from xl.tui.widgets.rank_cells import rank_values

SPS = 5  # the samples/s value in rank_values' row

pytestmark = pytest.mark.e2e

STEPS, BATCH, SLOW, FAST = 60, 32, 45, 0.002

# Slow steps, then fast ones: the last line's rate is many times the run's. Each rank writes what
# it measured of itself: the samples its steps took after the first (xl.log's first count has no
# time before it to be a rate over) and those steps' wall time, from the end of one step's
# xl.log to the end of the next. It evaluates once in epoch 1 (rank 0 names the epoch on the
# line, rank 1 leaves it to the epoch in force) and trains on into epoch 2. Rank 0 ends with a
# progress bar drawn frame by frame, rank 1 with a warning (Python echoes its source line under
# it).
SCRIPT = f"""
import json, os, sys, time, warnings
import torch
import torch.distributed as dist
from torch import nn
import xl

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
xl.log(epoch=1)
samples, seconds, mark = 0, 0.0, None
for i in range(1, {STEPS} + 1):
    x = torch.randn({BATCH}, 16)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.06 if i <= {SLOW} else {FAST})
    xl.log(step=i, loss=loss.item(), samples={BATCH})
    now = time.perf_counter()
    if mark is not None:
        samples += {BATCH}
        seconds += now - mark
    mark = now
    if i == 30:
        xl.log(**({{"eval_loss": 0.5, "epoch": 1}} if rank == 0 else {{"eval_loss": 0.25}}))
        xl.log(epoch=2)
        mark = time.perf_counter()  # the evaluation is no step: its time is not the steps'
with open(sys.argv[1] + f".{{rank}}", "w") as fh:
    json.dump({{"samples": samples, "seconds": seconds}}, fh)
print(f"rank {{rank}} trained", flush=True)
if rank == 0:
    for pct in (0, 50, 100):
        sys.stderr.write(f"\\rfinal pass {{pct:3d}}%|" + "#" * (pct // 10))
        sys.stderr.flush()
        time.sleep(0.3)
    sys.stderr.write("\\n")
else:
    warnings.warn("the schedule ended early")
sys.stderr.flush()
dist.destroy_process_group()
"""


def _row(table: str, rank: int) -> list[str]:
    line = next(ln for ln in table.splitlines() if re.match(rf"\|\s+{rank} \| ", ln))
    return [c.strip() for c in line.strip().removeprefix("| ").removesuffix(" |").split(" | ")]


def _columns(table: str) -> list[str]:
    line = next(ln for ln in table.splitlines() if ln.startswith("| rank"))
    return [c.strip() for c in line.strip().removeprefix("| ").removesuffix(" |").split(" | ")]


def test_the_end_table_and_xl_runs_run_show_the_runs_own_figures(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    truth = tmp_path / "truth"
    home = tmp_path / "home"
    env = xl_env(home, OMP_NUM_THREADS="1")
    run_dir = None
    try:
        proc = xl(
            ["launch", "--no-tui", "--nproc", "2", str(script), str(truth)],
            env,
            cwd=tmp_path,
            timeout=240,
        )
        run_dir = only_run(home)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        shown = xl(["runs", run_dir.name], env)
        assert shown.returncode == 0, shown.stderr
        rows = run_json(run_dir)["ranks"]
        for table in (proc.stdout, shown.stdout):
            heads = _columns(table)
            for rank in (0, 1):
                cells = dict(zip(heads, _row(table, rank), strict=True))
                own = json.loads(Path(f"{truth}.{rank}").read_text())
                rate = own["samples"] / own["seconds"]
                # samples / time in steps, as the script measured them; the last line's rate
                # was ~10x that
                assert float(cells["samples/s"]) == pytest.approx(rate, rel=0.1), (cells, own)
                recorded = next(r for r in rows if r["rank"] == rank)["samples_per_s"]
                assert recorded == pytest.approx(rate, rel=0.1), (recorded, own)
                # the evaluation at the epoch it was taken at, not the one training went on to
                assert cells["eval"].endswith("ep 1"), cells
                # the last line: the bar's last frame; the warning, not the source line it echoes
                last = cells["last log line"]
                if rank == 0:
                    assert last.startswith("final pass 100%|#"), cells
                else:  # (cut to the column's width)
                    said = "UserWarning: the schedule ended early (train.py:"
                    assert said.startswith(last.removesuffix("\u2026")[: len(said)]), cells
                    assert last.startswith("UserWarning: the sch"), cells
                assert "xl:" not in last and "warnings.warn" not in last, cells
        # The Monitor, opened on the ended run, shows the same figure in its samples/s column.
        view = RunReader(run_dir).poll()
        for rank in (0, 1):
            own = json.loads(Path(f"{truth}.{rank}").read_text())
            sps = rank_values(view.ranks[rank], time.time(), None)[SPS]
            assert sps == pytest.approx(own["samples"] / own["seconds"], rel=0.1), (sps, own)
        assert shown.stdout.splitlines()[1].startswith(run_dir.name)  # its line, id whole
        assert re.search(r"xl: run \S+ succeeded after", shown.stdout), shown.stdout
        wait_no_processes(run_dir, timeout=30)
    finally:
        if run_dir is not None:
            kill_run(run_dir)


def test_xl_runs_of_a_run_that_does_not_exist_says_so_in_one_line(tmp_path: Path) -> None:
    env = xl_env(tmp_path / "home")
    for token in ("nope", "last"):
        proc = xl(["runs", token], env)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
        assert proc.stdout == ""
