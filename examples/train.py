"""xl's demo job: a small DDP model on synthetic data, 2,500 steps by default.

    xl demo                                   # one rank per GPU, or 2 CPU ranks
    xl launch --nproc 2 examples/train.py --steps 500
    xl launch --nproc 2 examples/train.py --seconds 30   # as many steps as fit in ~30 s here
    python examples/train.py                  # one process, no torchrun

The step count is fixed (the same total on every run and machine: about 90 s on 2 CPU ranks of a
laptop, less on GPUs); only ``--seconds`` sizes it from this machine's speed instead.

CUDA + NCCL where there are GPUs, CPU + gloo otherwise. The target is a fixed random "teacher"
network, so the loss really falls. Each step logs loss and throughput with ``xl.log`` (a no-op
outside an xl run) and every 20th step prints a line for the logs.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn

import xl

STEPS = 2500  # the demo's total: the same on every run


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--steps",
        type=int,
        default=0,
        help=f"exact number of steps (default {STEPS}, unless --seconds is given)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=0.0,
        help="instead of a fixed count, about how long to train (sized from this machine's steps)",
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()
    if not args.steps and not args.seconds:
        args.steps = STEPS
    return args


def model_for(width: int, n_in: int = 128, n_out: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Linear(n_in, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
        nn.Linear(width, n_out),
    )


def agree(total: int, device: torch.device, distributed: bool) -> int:
    """Rank 0's step count, on every rank."""
    if not distributed:
        return total
    agreed = torch.tensor([total], device=device)
    dist.broadcast(agreed, src=0)
    return int(agreed.item())


def main() -> None:
    args = parse_args()
    distributed = "RANK" in os.environ
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    rank = int(os.environ.get("RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if distributed:
        dist.init_process_group(backend)
    world = dist.get_world_size() if distributed else 1

    torch.manual_seed(0)  # the same teacher and starting weights on every rank
    teacher = model_for(64).to(device).eval()
    model = model_for(args.width).to(device)
    if distributed:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[local_rank] if device.type == "cuda" else None
        )
        xl.watch(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    gen = torch.Generator(device=device).manual_seed(1000 + rank)  # each rank its own data
    print(
        f"rank {rank}/{world} on {device} ({backend}), "
        f"{sum(p.numel() for p in model.parameters()):,} parameters",
        flush=True,
    )

    def step() -> float:
        x = torch.randn(args.batch_size, 128, device=device, generator=gen)
        with torch.no_grad():
            y = teacher(x).argmax(dim=1)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss.detach())

    # A few warm-up steps, timed. With --seconds, rank 0 sizes the run from them (every rank
    # then runs its count) and again every 20 steps from the time left and the recent steps
    # (warm-up steps on a busy machine can be many times slower than the rest).
    warmup = 5
    started = t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    per_step = (time.perf_counter() - t0) / warmup
    total = agree(
        args.steps or max(warmup + 20, int(args.seconds / max(per_step, 1e-4))), device, distributed
    )
    print(f"rank {rank}: {total} steps (~{per_step * 1000:.1f} ms each)", flush=True)

    i = mark_i = warmup
    last = mark_t = time.perf_counter()
    while i < total:
        i += 1
        loss = step()
        now = time.perf_counter()
        xl.log(step=i, loss=loss, samples=args.batch_size, total_steps=total)
        if i % 20 == 0 or i == total:
            print(
                f"rank {rank} step {i}/{total} loss {loss:.4f} "
                f"{args.batch_size / (now - last):.0f} samples/s",
                flush=True,
            )
        if i % 20 == 0 and not args.steps and i < total:
            left = args.seconds - (now - started)
            recent = (now - mark_t) / (i - mark_i)
            total = agree(max(i + 1, i + int(left / max(recent, 1e-4))), device, distributed)
            mark_i, mark_t = i, time.perf_counter()
        last = now
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
