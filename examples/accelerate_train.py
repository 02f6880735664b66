"""Accelerate training loop reporting through ``Accelerator(log_with=XLTracker())``.

Every process logs its own loss and samples (Accelerate's built-in trackers: main process only).
Run under xl (``xl launch --nproc 2 examples/accelerate_train.py``) or torchrun, on CPU or GPU.
"""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from torch import nn

from xl.integrations.accelerate import XLTracker


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(1)
    accelerator = Accelerator(log_with=XLTracker(), cpu=not torch.cuda.is_available())
    accelerator.init_trackers("xl-example")
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = accelerator.prepare(model, opt)
    gen = torch.Generator().manual_seed(accelerator.process_index)
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, 32, generator=gen).to(accelerator.device)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        accelerator.log(
            {"loss": loss.detach(), "samples": args.batch, "total_steps": args.steps}, step=step
        )
    # Leave together (end_training also tears the process group down): a rank that exits while
    # its peer still talks to it over gloo can be aborted.
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
