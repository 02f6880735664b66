"""A rank's memory in `sys` lines against the truth, through the real `xl launch` (torchrun, CPU).

Rank 0 holds a 300 MiB tensor (every page written) and reads batches from a DataLoader with 2
workers, forked after the tensor existed: they share its pages. Rank 1 has no workers (the
healthy-unusual shape). Each rank measures itself while it runs, with psutil, beside xl: the
PSS of its own process and of its children that are not xl's relay (the truth), and the RSS
summed over all of them with the relay (what the figure used to be).
"""

from __future__ import annotations

import json
import statistics
import textwrap
from pathlib import Path

import pytest
from procs import only_run, wait_no_processes, xl, xl_env

pytestmark = pytest.mark.e2e
MIB = 1024 * 1024

SCRIPT = r"""
import json, os, sys, time
import psutil, torch
from torch.utils.data import DataLoader, Dataset

rank = int(os.environ["RANK"])
out = sys.argv[1]
big = torch.ones(300 * (1 << 18)) if rank == 0 else None  # 300 MiB of float32, written

class Slow(Dataset):
    def __len__(self):
        return 1 << 20
    def __getitem__(self, i):
        time.sleep(0.01)
        return i

loader = iter(DataLoader(Slow(), batch_size=1, num_workers=2 if rank == 0 else 0))
me = psutil.Process()
truth = []
end = time.time() + 12
next_look = time.time() + 2  # the workers up and prefetching first
while time.time() < end:
    next(loader)
    if time.time() >= next_look:
        next_look += 0.5
        kids = me.children(recursive=True)
        relay = [k for k in kids if k.name() == "xl-relay"]
        workers = [k for k in kids if k.name() != "xl-relay"]
        truth.append({
            "t": time.time(),
            "pss_mib": sum(p.memory_full_info().pss for p in [me, *workers]) / (1 << 20),
            "rss_sum_mib": sum(p.memory_info().rss for p in [me, *kids]) / (1 << 20),
            "own_rss_mib": me.memory_info().rss / (1 << 20),
            "workers": len(workers),
            "relays": len(relay),
        })
with open(f"{out}.{rank}.json", "w") as fh:
    json.dump(truth, fh)
"""


def test_mem_mib_is_the_rank_s_footprint_with_and_without_workers(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = xl_env(home, OMP_NUM_THREADS="1")
    proc = xl(
        ["launch", "--nproc", "2", "--no-tui", "--", str(script), str(tmp_path / "truth")],
        env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = only_run(home)
    wait_no_processes(run_dir, timeout=30)
    sys_lines = [
        r
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if (r := json.loads(line))["kind"] == "sys"
    ]
    for rank, workers in ((0, 2), (1, 0)):
        truth = json.loads((tmp_path / f"truth.{rank}.json").read_text())
        assert (
            truth
            and {t["workers"] for t in truth} == {workers}
            and {t["relays"] for t in truth} == {1}
        ), truth
        start, end = truth[0]["t"], truth[-1]["t"]
        seen = [
            r
            for r in sys_lines
            if r["rank"] == rank and start <= r["t"] <= end and r["nproc"] == workers + 2
        ]
        assert len(seen) >= 3, (rank, sys_lines)
        mem = statistics.median(r["mem_mib"] for r in seen)
        pss = statistics.median(t["pss_mib"] for t in truth)
        rss_sum = statistics.median(t["rss_sum_mib"] for t in truth)
        own = statistics.median(t["own_rss_mib"] for t in truth)
        # The same processes' PSS as the rank measured it, within a few percent.
        assert abs(mem - pss) <= 0.05 * pss + 10, (rank, mem, pss)
        assert abs(statistics.median(r["rss_mib"] for r in seen) - own) <= 0.05 * own + 10, (
            rank,
            seen,
            own,
        )
        if rank == 0:
            # The 300 MiB counted once: more than the tensor, far less than RSS summed over the
            # rank, its two workers and the relay (the tensor three times over).
            assert 300 <= mem < own + 150, (mem, own)
            assert rss_sum > mem + 2 * 300 - 50, (mem, rss_sum)
        else:
            # Alone: its footprint is at most its own RSS (the relay's pages are not added; the
            # libraries it maps with other processes count a share each, hence below).
            assert 0.5 * own <= mem <= own + 5, (mem, own)
