"""A plain DDP training loop that never touches xl (run under torchrun): the ground truth for
the steps torch's own hooks report.

Each rank writes ``<out>/rank<R>.json``: each optimizer step's loss (the sum of the losses it
passed to backward() before that step), its step count and the samples its DataLoader handed
it. Only rank 0 prints.

--accum K : K micro-batches per optimizer step (DDP's no_sync() on all but the last)
--eval-every N : an eval loop under no_grad every N steps (not steps, no samples)
--slow-data-rank R --slow-data-s S : rank R's Dataset sleeps S seconds per sample
--slow-compute-rank R --slow-compute-s S : rank R's forward sleeps S seconds
--no-loader : batches made in the loop (no DataLoader)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Points(Dataset):
    def __init__(self, n: int, seed: int, sleep_s: float) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 16, generator=gen)
        self.y = self.x.sum(dim=1, keepdim=True)
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


class Net(nn.Module):
    def __init__(self, sleep_s: float) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.sleep_s = sleep_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sleep_s and torch.is_grad_enabled():
            time.sleep(self.sleep_s)
        return self.body(x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--slow-data-rank", type=int, default=-1)
    ap.add_argument("--slow-data-s", type=float, default=0.0)
    ap.add_argument("--slow-compute-rank", type=int, default=-1)
    ap.add_argument("--slow-compute-s", type=float, default=0.0)
    ap.add_argument("--no-loader", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    slow_compute = args.slow_compute_s if rank == args.slow_compute_rank else 0.0
    model = nn.parallel.DistributedDataParallel(Net(slow_compute))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    micro = args.steps * args.accum
    slow_data = args.slow_data_s if rank == args.slow_data_rank else 0.0
    data = Points(micro * args.batch, seed=rank, sleep_s=slow_data)
    loader = DataLoader(data, batch_size=args.batch, shuffle=False)
    batches = iter(loader)
    val = DataLoader(Points(4 * args.batch, seed=100 + rank, sleep_s=0.0), batch_size=args.batch)
    gen = torch.Generator().manual_seed(rank)
    losses: list[float] = []
    samples = 0
    for step in range(args.steps):
        total = 0.0  # what the step optimized: the sum of its micro-batches' losses
        for k in range(args.accum):
            if args.no_loader:
                x = torch.randn(args.batch, 16, generator=gen)
                y = x.sum(dim=1, keepdim=True)
            else:
                x, y = next(batches)
            samples += len(x)
            sync = k == args.accum - 1
            with contextlib.nullcontext() if sync else model.no_sync():
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
            total += loss.item()
        losses.append(total)
        opt.step()
        opt.zero_grad()
        if rank == 0 and (step + 1) % 10 == 0:
            print(f"step {step + 1} loss {losses[-1]:.4f}", flush=True)
        if args.eval_every and (step + 1) % args.eval_every == 0:
            model.eval()
            with torch.no_grad():
                total = sum(float(nn.functional.mse_loss(model(vx), vy)) for vx, vy in val)
            model.train()
            if rank == 0:
                print(f"eval {total:.4f}", flush=True)
    Path(args.out, f"rank{rank}.json").write_text(
        json.dumps({"steps": args.steps, "losses": losses, "samples": samples, "pid": os.getpid()})
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
