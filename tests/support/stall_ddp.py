"""A small DDP run on gloo CPU ranks in which one rank stalls for a known time (the accounting
tests).

    stall_ddp.py --steps 40 [--stall-rank 1 --stall-at 10 --stall-s 8] [--lr 0.1]

Every step: forward, backward (DDP's all-reduce, timed by xl.watch), optimizer step, then
``xl.log(step, loss, samples)``. With --stall-s, rank --stall-rank sleeps that long before step
--stall-at's forward, outside any collective: its peers wait for it in the all-reduce.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn

import xl


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-s", type=float, default=0.02)
    ap.add_argument("--stall-rank", type=int, default=1)
    ap.add_argument("--stall-at", type=int, default=10)
    ap.add_argument("--stall-s", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=0.1)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 1))
    xl.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(rank)
    for step in range(1, args.steps + 1):
        if args.stall_s and step == args.stall_at and rank == args.stall_rank:
            print(f"rank {rank} stalls for {args.stall_s} s", flush=True)
            time.sleep(args.stall_s)
        x = torch.randn(32, 16, generator=gen)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        xl.log(step=step, loss=float(loss), samples=32)
        time.sleep(args.step_s)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
