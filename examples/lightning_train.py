"""Lightning training written the way Lightning's docs write it, with no xl code: a tiny model on
random data, ``self.log("train_loss", ...)`` and a validation loop. Run it under xl
(``xl launch --nproc 2 examples/lightning_train.py``) or torchrun, on CPU or GPU.

    --bar tqdm|rich   the progress bar (default: Lightning's own choice, Rich when installed)
    --record PATH     write each rank's logged train_loss per step there (PATH.rank<r>.json)
    --package lightning | pytorch_lightning   which of the two Lightning packages to use
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12, help="optimizer steps per epoch")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--bar", choices=("tqdm", "rich"))
    ap.add_argument("--record")
    ap.add_argument("--package", default="pytorch_lightning")
    args = ap.parse_args()
    torch.set_num_threads(1)
    pl: Any = importlib.import_module(args.package)
    recorded: dict[int, float] = {}

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, prog_bar=True)
            recorded[int(self.global_step) + 1] = float(loss.detach())
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log(
                "val_loss", nn.functional.mse_loss(self.net(x), y), prog_bar=True, sync_dist=True
            )

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.steps * args.batch * 2, 16, generator=gen)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    val = TensorDataset(x[:32], x[:32].sum(dim=1, keepdim=True))
    callbacks: list[Any] = []
    if args.bar == "tqdm":
        callbacks.append(pl.callbacks.TQDMProgressBar())
    elif args.bar == "rich":
        callbacks.append(pl.callbacks.RichProgressBar())
    trainer = pl.Trainer(
        accelerator="cpu" if not torch.cuda.is_available() else "auto",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),  # what torchrun started on this node
        strategy="ddp",
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        callbacks=callbacks,
    )
    trainer.fit(
        Regressor(), DataLoader(data, batch_size=args.batch), DataLoader(val, batch_size=args.batch)
    )
    if args.record:
        with open(f"{args.record}.rank{trainer.global_rank}.json", "w") as fh:
            json.dump(recorded, fh)
    # Leave together and tear the process group down (see hf_trainer.py: a gloo thread still
    # running when the interpreter ends can abort the process after training finished).
    if torch.distributed.is_initialized():
        trainer.strategy.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
