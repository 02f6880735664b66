"""A data-parallel loop on gloo CPU ranks that logs each step's time split, as xl's torch
instrumentation does, with one rank slow in a phase of its choice (the straggler and hang tests).

    phases_ddp.py --steps 80 --truth DIR [--slow-rank 1 --slow data|compute|other --slow-s 0.2]
                  (--slow-rank -1: every rank is slow alike)
                  [--hang-at N] [--bars]

Every rank: a DataLoader over a Dataset (rank --slow-rank's sleeps --slow-s per item with
``--slow data``), forward (sleeps with ``--slow compute``), backward, the gradients' all_reduce
(blocking: the wait for the slowest rank), the optimizer's step, and its own code (sleeps with
``--slow other``). Its train lines carry step, loss, samples, steps and the step's time split
(step_s = data_s + compute_s + comm_s + other_s), at most ten a second, each the per-step means
of the steps since the previous one (docs/contracts.md, "metrics.jsonl"). With --truth, each
rank writes the split it measured, summed over its steps, to DIR/rank-R.json at the end: the
ground truth the tests hold xl's figures to. With --hang-at N, rank --slow-rank sleeps for an
hour before step N's optimizer step (outside any collective: its peers wait in the all_reduce).
With --bars, each rank first prints tqdm-like bars that are not training (datasets' map,
transformers' weights), as real scripts do before their first step. With --plain, it logs nothing
itself (a plain PyTorch loop: its steps are whatever xl's torch instrumentation reports).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

import xl


class Items(Dataset):
    def __init__(self, n: int, slow_s: float) -> None:
        self.n, self.slow_s = n, slow_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.slow_s:
            time.sleep(self.slow_s)
        g = torch.Generator().manual_seed(i)
        x = torch.randn(16, generator=g)
        return x, x.sum(0, keepdim=True)


class Model(nn.Module):
    def __init__(self, slow_s: float) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 1)
        self.slow_s = slow_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.slow_s:
            time.sleep(self.slow_s)
        return self.lin(x)


def bars() -> None:
    for n in (100, 320):
        sys.stdout.write(
            f"\rMap: {n * 100 // 320:3d}%|#####     | {n}/320 [00:00<00:00, 5000.00 examples/s]"
        )
        sys.stdout.flush()
        time.sleep(0.05)
    sys.stdout.write("\n")
    for n in (20, 41):
        sys.stdout.write(
            f"\rLoading weights: {n * 100 // 41:3d}%|####      | {n}/41 [00:00<00:00, 400.00it/s]"
        )
        sys.stdout.flush()
        time.sleep(0.05)
    sys.stdout.write("\n")
    print({"eos_token_id": 0, "bos_token_id": 0}, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--slow", choices=("data", "compute", "other", "none"), default="none")
    ap.add_argument("--slow-s", type=float, default=0.2)
    ap.add_argument("--base-s", type=float, default=0.02, help="every rank's own code per step")
    ap.add_argument("--hang-at", type=int, default=0)
    ap.add_argument("--truth", type=Path)
    ap.add_argument("--bars", action="store_true")
    ap.add_argument(
        "--plain", action="store_true", help="no xl.log: the instrumentation's steps only"
    )
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    me = rank == args.slow_rank or args.slow_rank < 0  # -1: every rank
    if args.bars:
        bars()
    torch.manual_seed(0)
    per_item = args.slow_s / args.batch if me and args.slow == "data" else 0.0
    loader = DataLoader(Items(args.steps * args.batch, per_item), batch_size=args.batch)
    model = Model(args.slow_s if me and args.slow == "compute" else 0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    t = torch.ones(1)
    dist.all_reduce(t)
    print("ready", flush=True)
    totals = {"steps": 0, "data_s": 0.0, "compute_s": 0.0, "comm_s": 0.0, "other_s": 0.0}
    pending: list[dict[str, float]] = []
    last_line = time.perf_counter()
    end = time.perf_counter()
    it = iter(loader)
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        x, y = next(it)
        t1 = time.perf_counter()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        t2 = time.perf_counter()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        t3 = time.perf_counter()
        if me and step == args.hang_at:
            print(f"rank {rank} hangs at step {step}", flush=True)
            time.sleep(3600)
        opt.step()
        t4 = time.perf_counter()
        time.sleep(args.base_s + (args.slow_s if me and args.slow == "other" else 0.0))
        now = time.perf_counter()
        # This step: from the previous step's end (its own code included) to this one's.
        split = {"data_s": t1 - t0, "compute_s": (t2 - t1) + (t4 - t3), "comm_s": t3 - t2}
        split["other_s"] = (now - end) - sum(split.values())
        end = now
        pending.append(split)
        totals["steps"] += 1
        for k, v in split.items():
            totals[k] += v
        # The first step's line at once: xl's hooks hold a step's line 50 ms for the script's own
        # keys, and a script that times its steps itself must say so before they send its split.
        if not args.plain and (now - last_line >= 0.1 or step in (1, args.steps)):
            n = len(pending)
            means = {k: sum(p[k] for p in pending) / n for k in split}
            xl.log(
                step=step,
                loss=loss.item(),
                samples=n * args.batch,
                steps=n,
                step_s=sum(means.values()),
                **means,
            )
            pending.clear()
            last_line = now
    if not args.plain:
        xl.flush()
    if args.truth is not None:
        args.truth.mkdir(parents=True, exist_ok=True)
        (args.truth / f"rank-{rank}.json").write_text(json.dumps(totals))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
