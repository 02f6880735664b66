"""HF Trainer on a tiny GPT-2 built from a config (random weights, synthetic data, nothing
downloaded). Run it under xl (``xl launch --nproc 2 examples/hf_trainer.py``) or torchrun.

    --no-callback   leave XLCallback out (under ``xl launch`` the rank entry adds it all the same;
                    with ``--no-instrument`` xl then reads the log dicts the Trainer prints)
    --eval N        evaluate every N steps (on a held-out set): eval_loss beside the training loss
    --history PATH  write the Trainer's own log_history there (JSON) when training ends
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Synthetic(torch.utils.data.Dataset):
    def __init__(self, n: int, seq: int, vocab: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--no-callback", action="store_true")
    ap.add_argument("--eval", type=int, default=0)
    ap.add_argument("--logging-steps", type=int, default=2)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--history")
    args = ap.parse_args()
    torch.set_num_threads(1)
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=1, n_head=2)
    model = GPT2LMHeadModel(config)
    callbacks: list[Any] = []
    if not args.no_callback:
        from xl.integrations.transformers import XLCallback  # noqa: PLC0415 - only with the callback

        callbacks.append(XLCallback())
    out = os.environ.get("XL_RUN_DIR") or tempfile.mkdtemp(prefix="xl-hf-")
    targs = TrainingArguments(
        output_dir=os.path.join(out, "hf-output"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        logging_steps=args.logging_steps,
        gradient_accumulation_steps=args.accum,
        eval_strategy="steps" if args.eval else "no",
        eval_steps=args.eval or None,
        per_device_eval_batch_size=args.batch,
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        ddp_backend=None if torch.cuda.is_available() else "gloo",
        dataloader_num_workers=0,
        learning_rate=1e-3,
    )
    trainer = Trainer(
        model=model,
        args=targs,
        train_dataset=Synthetic(args.steps * args.batch * 2, 16, config.vocab_size),
        eval_dataset=Synthetic(16, 16, config.vocab_size) if args.eval else None,
        callbacks=callbacks,
    )
    trainer.train()
    if args.history and trainer.is_world_process_zero():
        with open(args.history, "w") as fh:
            json.dump(trainer.state.log_history, fh)
    # Leave together and tear the process group down, as torch's exit warning asks: a gloo
    # thread still running when the interpreter ends can abort the process (SIGABRT, "terminate
    # called without an active exception") after training finished.
    if torch.distributed.is_initialized():
        trainer.accelerator.wait_for_everyone()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
