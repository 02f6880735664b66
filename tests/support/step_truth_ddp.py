"""A plain DDP loop on gloo CPU ranks that never calls xl and keeps its own account of what each
optimizer step optimized: the ground truth for the loss and the phase xl's torch hooks report.

    step_truth_ddp.py --out DIR [--steps 60] [--accum 4]
                      [--slow-rank 1 --slow math|log --slow-s 0.2]

Each micro-batch's loss is ``loss / accum`` (as nanoGPT and HF Trainer scale it); the step's
loss is their sum, the figure nanoGPT prints. With ``--slow math``, rank --slow-rank does
``--slow-s`` seconds of tensor math a step between its forward and its backward, outside any
module (a custom loss or a metric); with ``--slow log``, it spends them after its optimizer step
(logging, a checkpoint). Every rank sleeps ``--base-s`` after its optimizer step (its own
logging). Each rank writes ``DIR/rank<R>.json``: its steps, each step's loss as it summed it,
the last micro-batch's loss (what a step's loss must not be) and its samples. Only rank 0 prints.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def burn(seconds: float) -> None:
    """Tensor math on the CPU for ``seconds``: no module, no sleep."""
    a = torch.randn(96, 96)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow", choices=("math", "log", "none"), default="none")
    ap.add_argument("--slow-s", type=float, default=0.0)
    ap.add_argument("--base-s", type=float, default=0.01)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    me = rank == args.slow_rank
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(args.steps * args.accum * args.batch, 16, generator=gen)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=args.batch)
    batches = iter(loader)
    losses: list[float] = []
    last_micro: list[float] = []
    samples = 0
    for step in range(1, args.steps + 1):
        total = 0.0
        for k in range(args.accum):
            xb, yb = next(batches)
            samples += len(xb)
            sync = k == args.accum - 1
            with contextlib.nullcontext() if sync else model.no_sync():
                loss = nn.functional.mse_loss(model(xb), yb) / args.accum
                if me and args.slow == "math":
                    burn(args.slow_s / args.accum)
                loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        losses.append(total)
        last_micro.append(loss.item())
        if rank == 0 and step % 20 == 0:
            print(f"step {step} loss {total:.4f}", flush=True)
        time.sleep(args.base_s + (args.slow_s if me and args.slow == "log" else 0.0))
    Path(args.out, f"rank{rank}.json").write_text(
        json.dumps(
            {"steps": args.steps, "losses": losses, "last_micro": last_micro, "samples": samples}
        )
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
