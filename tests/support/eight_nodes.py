"""The training script of tests/e2e/test_multinode_eight.py: a gloo CPU rank that trains
E8_STEPS steps and writes the losses it computed to E8_OUT/rank-<r>.json (the test's ground
truth); the rank of local rank E8_ASTRAY_LOCAL on the node launched with HANG_HERE=1 goes
astray at step E8_HANG_AT (after printing ~180 KB, some of it not UTF-8), outside any
collective, until the file E8_RELEASE exists.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import xl


def astray(release: Path) -> None:
    """Outside every collective: its peers wait in all_reduce for it."""
    while not release.exists():
        time.sleep(0.2)


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    steps, hang_at = int(os.environ["E8_STEPS"]), int(os.environ.get("E8_HANG_AT", "-1"))
    strays = os.environ.get("HANG_HERE") == "1" and os.environ.get("LOCAL_RANK") == os.environ.get(
        "E8_ASTRAY_LOCAL"
    )
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"rank {rank} of {world} ready", flush=True)
    losses: dict[int, float] = {}
    for step in range(steps):
        if step == hang_at and strays:
            print(f"rank {rank} goes astray", flush=True)
            # more output than node 0 takes in one piece, with bytes that are not UTF-8
            for i in range(2000):
                sys.stdout.buffer.write(b"line %d of its dump \xff " % i + b"x" * 60 + b"\n")
            sys.stdout.buffer.flush()
            astray(Path(os.environ["E8_RELEASE"]))
        total = torch.tensor([float(rank + 1)])
        dist.all_reduce(total)
        # every rank its own loss, from what the all_reduce gave
        loss = float(total.item()) / world / (rank + 1) / (step + 1)
        xl.log(step=step, loss=loss, samples=2)
        losses[step] = loss
        time.sleep(0.05)
    dist.barrier()
    dist.destroy_process_group()
    out = Path(os.environ["E8_OUT"])
    tmp = out / f".rank-{rank}.json.tmp"
    tmp.write_text(json.dumps({"rank": rank, "losses": losses}))
    tmp.replace(out / f"rank-{rank}.json")
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
