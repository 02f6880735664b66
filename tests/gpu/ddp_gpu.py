"""One rank of the acceptance suite's NCCL DDP run (started by `xl launch --gpus all`).

GPU-bound steps on cuda:LOCAL_RANK under DDP with ``xl.watch``, each logging its loss as a CUDA
tensor with ``xl.log``, and while they run it records what only a rank can see:

- device synchronisations on the training thread inside ``xl.log``, counted with
  ``torch.cuda.set_sync_debug_mode("warn")`` (each sync warns in the thread that made it; a
  deliberate ``.item()`` afterwards proves the counting works);
- how long ``xl.log`` takes while a ~0.2 s kernel is still queued, and how long the GPU then
  stays busy (a synchronising ``xl.log`` would have waited for it);
- on rank 0, mid-run with every rank holding its CUDA context, ``xl gpus --json``;
- the parameters' checksum at the end (xl.watch's all-reduce hook must average like DDP's).

    ddp_gpu.py --out DIR [--seconds 8] [--width 2048] [--batch 2048]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn

import xl

PROBE_VALUE = 12345.0
SYNC_WORDS = "synchroniz"  # "called a synchronizing CUDA operation"


class SyncCounter:
    """Sync-debug warnings, by thread: only the training thread's count against xl.log."""

    def __init__(self) -> None:
        self.main = threading.get_ident()
        self.counting = False
        self.in_log = 0
        self.main_total = 0
        warnings.simplefilter("always")
        self._show = warnings.showwarning
        warnings.showwarning = self._record

    def _record(self, message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        if SYNC_WORDS in str(message) and threading.get_ident() == self.main:
            self.main_total += 1
            self.in_log += self.counting
            return
        if SYNC_WORDS not in str(message):
            self._show(message, category, filename, lineno, file, line)

    def log(self, **scalars: object) -> None:
        torch.cuda.set_sync_debug_mode("warn")
        self.counting = True
        try:
            xl.log(**scalars)
        finally:
            self.counting = False
            torch.cuda.set_sync_debug_mode("default")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=2048)
    args = ap.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same start on every rank
    w = args.width
    model = nn.Sequential(nn.Linear(w, w), nn.GELU(), nn.Linear(w, w), nn.GELU(), nn.Linear(w, 16))
    model = nn.parallel.DistributedDataParallel(model.to(device), device_ids=[local])
    xl.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(1000 + rank)
    target = torch.randn(16, w, device=device, generator=gen)
    counter = SyncCounter()
    losses: list[torch.Tensor] = []
    start, step, go = time.monotonic(), 0, True
    while go:
        step += 1
        x = torch.randn(args.batch, w, device=device, generator=gen)
        loss = nn.functional.mse_loss(model(x), x @ target.T)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        counter.log(step=step, loss=loss.detach(), samples=args.batch)
        losses.append(loss.detach())
        if step % 20 == 0:  # every rank agrees when to stop (the one sync here is ours)
            flag = torch.tensor([int(time.monotonic() - start < args.seconds)], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            go = bool(flag.item())
        if step == 40 and rank == 0:
            dist.barrier()  # every rank has a context and is training: what does `xl gpus` say?
            snap = subprocess.run(
                [sys.executable, "-m", "xl", "gpus", "--json"],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
            with open(os.path.join(args.out, "gpus.json"), "w") as fh:
                fh.write(snap.stdout or json.dumps({"error": snap.stderr}))
        elif step == 40:
            dist.barrier()
    # xl.log while the GPU is busy for a while: it must return at once, the value arrive later.
    # Each kernel below runs once first: under CUDA's lazy module loading (the default) the
    # first launch of a kernel may synchronise the whole device to load it, which here drained
    # the sleep before xl.log was called (an H200, 2026-11-26: probe_busy_s 0.0002 s).
    torch.cuda._sleep(1000)
    torch.zeros((), device=device) + PROBE_VALUE
    torch.cuda.synchronize()
    queued = time.perf_counter()
    torch.cuda._sleep(int(4e8))  # ~0.2 s of spinning at ~2 GHz
    probe = torch.zeros((), device=device) + PROBE_VALUE  # queued behind the sleep
    t0 = time.perf_counter()
    queue_s = t0 - queued  # ~0: the CPU was not held up queueing the work
    counter.log(step=step + 1, probe=probe)
    log_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    busy_s = time.perf_counter() - t0
    in_log, before = counter.in_log, counter.main_total
    torch.cuda.set_sync_debug_mode("warn")
    torch.ones((), device=device).item()  # control: a real sync on this thread is counted
    torch.cuda.set_sync_debug_mode("default")
    xl.flush(10)
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    report = {
        "rank": rank,
        "world": world,
        "pid": os.getpid(),
        "local_rank": local,
        "steps": step,
        "log_calls": step + 1,
        "syncs_in_log": in_log,
        "control_syncs": counter.main_total - before,
        "probe_log_s": log_s,
        "probe_busy_s": busy_s,
        "probe_queue_s": queue_s,
        "first_loss": float(losses[0]),
        "last_loss": float(losses[-1]),
        "param_checksum": checksum,
    }
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as fh:
        json.dump(report, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
