"""A real Accelerate program for the kill tests: the loop as Accelerate's docs write it (no xl
code), every rank stepping in lockstep over gloo until it is killed; prints 'ready' once it has
stepped. ``--plain``: the same loop on torch DDP alone, for the plain-torchrun comparison."""

from __future__ import annotations

import sys
import time

import torch
from torch import nn


def main() -> None:
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    if "--plain" in sys.argv:
        import torch.distributed as dist  # noqa: PLC0415 - the plain path only

        dist.init_process_group("gloo")
        model = nn.parallel.DistributedDataParallel(model)
        backward = torch.Tensor.backward
    else:
        from accelerate import Accelerator  # noqa: PLC0415 - the Accelerate path only

        accelerator = Accelerator(cpu=True)
        model, opt = accelerator.prepare(model, opt)
        backward = accelerator.backward  # type: ignore[assignment]
    for step in range(10_000_000):
        x = torch.randn(16, 32)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        backward(loss)
        opt.step()
        opt.zero_grad()
        if step == 3:
            print("ready", flush=True)
        time.sleep(0.005)


if __name__ == "__main__":
    main()
