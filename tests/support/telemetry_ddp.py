"""A 2-rank CPU DDP training script for the telemetry tests (run under torchrun).

--slow-rank R --slow-s S : rank R sleeps S seconds more than the others each step (straggler)
--quiet-rank R --quiet-after K : rank R stops calling xl.log after step K (keeps training)
--hang-rank R --hang-at K : rank R hangs before step K (its peers wait in the all-reduce)
--watch : xl.watch(model)
--no-xl : never touch xl (plain baseline)
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-s", type=float, default=0.0)
    ap.add_argument("--quiet-rank", type=int, default=-1)
    ap.add_argument("--quiet-after", type=int, default=0)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--hang-rank", type=int, default=-1)
    ap.add_argument("--hang-at", type=int, default=0)
    ap.add_argument("--watch", action="store_true")
    ap.add_argument("--no-xl", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    )
    if not args.no_xl:
        import xl  # noqa: PLC0415 - --no-xl runs must never load it (the baseline)

        if args.watch:
            xl.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        x = torch.randn(args.batch, 32, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        if rank == args.hang_rank and step + 1 == args.hang_at:
            print(f"rank {rank} hangs before step {step + 1}", flush=True)
            time.sleep(3600)  # its peers block in the next all-reduce
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if rank == args.slow_rank:
            time.sleep(args.slow_s)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.no_xl:
            continue
        if rank == args.quiet_rank and step >= args.quiet_after:
            continue
        xl.log(
            step=step + 1, loss=loss.detach(), lr=0.01, samples=args.batch, total_steps=args.steps
        )
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done pid {os.getpid()}", flush=True)


if __name__ == "__main__":
    main()
