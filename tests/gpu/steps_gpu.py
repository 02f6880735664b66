"""One rank of the GPU step-split acceptance runs (started by `xl launch`): a plain DDP loop on
CUDA that never calls xl, with what only the rank can measure written beside it as ground truth.

    steps_gpu.py --out DIR [--backend nccl|gloo] [--steps 300] [--width 4096] [--batch 512]
                 [--one-gpu] [--delay-rank R --delay-ms M] [--profile FROM:TO] [--own-peak]

Every rank: a batch made on the host and copied to its GPU (``non_blocking``), a forward and
backward of an MLP (GPU-bound at the default width), DDP's all-reduce, AdamW's step. With
``--one-gpu`` every rank uses GPU 0 (two ranks on one GPU over gloo with CUDA tensors; launch
them as CPU ranks, ``CUDA_VISIBLE_DEVICES=``: xl runs one rank per GPU).
``--delay-rank R --delay-ms M``: rank R's forward also spins the GPU for M ms
(``torch.cuda._sleep``): a rank slow on the device, while its host is as fast as the others'.
``--profile A:B``: rank 0 runs ``torch.profiler`` over steps A..B-1 and writes the device time
its kernels took per step, copies left out (``profile.json``). ``--own-peak`` (under
``--no-instrument`` only: xl's hooks reset the same counter): the allocator's peak per step,
reset at each step's start. ``--count-syncs``: the device synchronisations the training thread
made from step 20 to the last 5 (the same loop with and without xl's hooks must make as many).
``--time-from K``: the mean wall time of steps K.. to the end, device idle at both ends
(``step_s``: bench/gpu_steps_bench.py's figure).
Each rank writes ``DIR/rank-R.json``: steps, the device, its own per-step peaks.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

MIB = 1024.0 * 1024.0


class Syncs:
    """Device synchronisations on the training thread from step 20 on, counted through
    ``torch.cuda.set_sync_debug_mode("warn")`` (each sync warns in the thread that made it)."""

    def __init__(self) -> None:
        self.main = threading.get_ident()
        self.count = 0
        self._show = warnings.showwarning
        warnings.simplefilter("always")
        warnings.showwarning = self._record
        torch.cuda.set_sync_debug_mode("warn")

    def _record(self, message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        if "synchroniz" in str(message):
            self.count += threading.get_ident() == self.main
            return
        self._show(message, category, filename, lineno, file, line)

    def stop(self) -> int:
        torch.cuda.set_sync_debug_mode("default")
        return self.count


def spin_cycles(ms: float) -> int:
    """GPU clock cycles that ``torch.cuda._sleep`` spins for ``ms`` milliseconds, measured once
    before training (a sync here is the script's setup, not a step)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return int(ms * 10_000_000 / max(start.elapsed_time(end), 1e-3))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", default="nccl")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--one-gpu", action="store_true")
    ap.add_argument("--delay-rank", type=int, default=-1)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--profile", default="")
    ap.add_argument("--own-peak", action="store_true")
    ap.add_argument("--count-syncs", action="store_true")
    ap.add_argument("--time-from", type=int, default=0, help="time the steps from this one on")
    args = ap.parse_args()
    if args.one_gpu:
        # xl runs one rank per GPU: launched as CPU ranks (CUDA_VISIBLE_DEVICES empty), each
        # rank takes GPU 0 itself, before CUDA starts in this process.
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    local = 0 if args.one_gpu else int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    torch.manual_seed(rank)
    w = args.width
    body = nn.Sequential(nn.Linear(w, w), nn.GELU(), nn.Linear(w, w), nn.GELU(), nn.Linear(w, 1))
    model = nn.parallel.DistributedDataParallel(body.to(dev), device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    cycles = spin_cycles(args.delay_ms) if rank == args.delay_rank else 0
    start, stop = (int(x) for x in args.profile.split(":")) if args.profile else (-1, -1)
    prof = None
    peaks: list[float] = []
    syncs: Syncs | None = None
    synced = -1
    host = torch.randn(args.batch, w).pin_memory()
    began = 0.0
    for step in range(1, args.steps + 1):
        if step == args.time_from:
            torch.cuda.synchronize()  # outside the steps timed: they start on an idle device
            began = time.perf_counter()
        if args.count_syncs and step == 20:
            syncs = Syncs()
        if syncs is not None and step == args.steps - 5:
            synced, syncs = syncs.stop(), None
        if rank == 0 and step == start:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        if args.own_peak:
            torch.cuda.reset_peak_memory_stats()
        x = host.to(dev, non_blocking=True)
        out = model(x)
        if cycles:
            torch.cuda._sleep(cycles)  # the device is slow for this rank: not its host
        loss = out.float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if args.own_peak:
            peaks.append(torch.cuda.max_memory_allocated() / MIB)
        if prof is not None and step == stop - 1:
            torch.cuda.synchronize()
            prof.__exit__(None, None, None)
            # The kernels' own time (copies are the batch's data time, not compute), in us.
            kernels = [
                e
                for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA
                and not e.name.startswith(("Memcpy", "Memset"))
            ]
            device_us = sum(e.time_range.elapsed_us() for e in kernels)
            per_step = device_us / 1e6 / (stop - start)
            Path(args.out, "profile.json").write_text(
                json.dumps({"from": start, "to": stop, "device_s": per_step})
            )
            prof = None
    torch.cuda.synchronize()
    timed = args.steps - args.time_from + 1
    step_s = (time.perf_counter() - began) / timed if args.time_from > 0 else None
    Path(args.out, f"rank-{rank}.json").write_text(
        json.dumps(
            {
                "rank": rank,
                "steps": args.steps,
                "device": str(dev),
                "peaks_mib": peaks,
                "syncs": synced,
                "step_s": step_s,
            }
        )
    )
    dist.barrier()
    time.sleep(0.5)  # the last lines out before the process group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
