"""Accelerate training loop reporting through ``Accelerator(log_with=XLTracker())``.

The tracker gets ``train_loss`` and samples on the main process (``Accelerator.log`` is
main-process only); under ``xl launch`` every rank reports its own steps, loss and samples anyway.
Run under xl (``xl launch --nproc 2 examples/accelerate_train.py``) or torchrun, on CPU or GPU.

    --no-tracker    no xl code at all: the loop as Accelerate's docs write it
    --record PATH   write each rank's loss per step there (PATH.rank<r>.json)
"""

from __future__ import annotations

import argparse
import json

import torch
from accelerate import Accelerator
from torch import nn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--no-tracker", action="store_true")
    ap.add_argument("--record")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.no_tracker:
        accelerator = Accelerator(cpu=not torch.cuda.is_available())
    else:
        from xl.integrations.accelerate import XLTracker  # noqa: PLC0415 - only with the tracker

        accelerator = Accelerator(log_with=XLTracker(), cpu=not torch.cuda.is_available())
        accelerator.init_trackers("xl-example")
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = accelerator.prepare(model, opt)
    gen = torch.Generator().manual_seed(accelerator.process_index)
    recorded: dict[int, float] = {}
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, 32, generator=gen).to(accelerator.device)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        recorded[step] = float(loss.detach())
        accelerator.log(
            {"train_loss": loss.detach(), "samples": args.batch, "total_steps": args.steps},
            step=step,
        )
    if args.record:
        with open(f"{args.record}.rank{accelerator.process_index}.json", "w") as fh:
            json.dump(recorded, fh)
    # Leave together (end_training also tears the process group down): a rank that exits while
    # its peer still talks to it over gloo can be aborted.
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
