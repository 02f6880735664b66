"""DeepSpeed ZeRO training written the way DeepSpeed's docs write it, with no xl code: a tiny
model on random data, ``engine.backward(loss)`` and ``engine.step()``. Run it under xl
(``xl launch --nproc 2 examples/deepspeed_train.py``) or torchrun; on CPU it uses gloo.

    --record PATH   write each rank's loss per step there (PATH.rank<r>.json)
"""

from __future__ import annotations

import argparse
import json

import deepspeed
import torch
from torch import nn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--record")
    args = ap.parse_args()
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": args.accum,
        "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
        "zero_optimization": {"stage": 1},
        "zero_allow_untested_optimizer": True,  # torch SGD: no compiled optimizer to build
        "steps_per_print": 10_000,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    gen = torch.Generator().manual_seed(engine.global_rank)
    recorded: dict[int, float] = {}
    losses: list[float] = []
    for _ in range(args.steps * args.accum):
        x = torch.randn(args.batch, 16, generator=gen).to(engine.device)
        loss = nn.functional.mse_loss(engine(x), x.sum(dim=1, keepdim=True))
        engine.backward(loss)
        losses.append(float(loss.detach()))
        engine.step()
        if len(losses) == args.accum:
            recorded[engine.global_steps] = sum(losses) / len(losses)
            losses = []
    if args.record:
        with open(f"{args.record}.rank{engine.global_rank}.json", "w") as fh:
            json.dump(recorded, fh)
    # Leave together: a rank whose peer tears gloo down while it still talks to it can abort
    # (SIGABRT, "terminate called ..."), under torchrun as under xl.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
