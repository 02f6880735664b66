"""What torch's step hooks cost the training thread, in its own CPU time: one process runs the
same step with the hooks in place and without, in alternating blocks, and reads
``time.thread_time()`` around each block (what other processes on a shared machine do moves it
far less than the wall clock).

    .venv/bin/python bench/bench_hook_cpu.py [--blocks 40] [--block-steps 100] [--width 16]
        [--batch 8] [--ddp] [--sender] [--before COMMIT] [--rounds 2] [--json OUT]
    .venv/bin/python bench/bench_hook_cpu.py --width 640 --batch 32 --ddp --sender  # ~10 ms

The step: a 3-layer MLP, a DataLoader batch, forward, backward, SGD (``--ddp``: a one-rank gloo
DistributedDataParallel, so backward also watches the loss's node for DDP's bucket wait).
``--sender``: while the hooks are in place a thread reads the clock as the rank's sender does
(``collect`` at each point of the lines' wall-clock grid), so what that reading costs the
training thread (the GIL, caches) is in the figure. Each block pair gives one difference
(hooks - none, microseconds per step) and one ratio; the answer is their medians with a
bootstrap 95% CI. ``--before COMMIT`` runs the same in a second process with that commit's hooks
(its tree from ``git archive``), sides alternating over ``--rounds`` processes each, and prints
the difference of the two sides' medians with its interval.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_overhead import median_ci, mlp, step_cpu_s  # bench/ is sys.path[0] when run as a script

REPO = Path(__file__).resolve().parent.parent


def child(args: argparse.Namespace) -> dict[str, list[float]]:
    """The blocks, in this process: per-step thread CPU seconds, hooks on and off."""
    import torch  # noqa: PLC0415 - only the child needs torch
    from torch.utils.data import DataLoader, TensorDataset  # noqa: PLC0415 - as above

    from xl.integrations import stepclock, torchsteps  # noqa: PLC0415 - the side's own tree

    try:  # the sender's side of the clock; a commit before the split kept it in the clock
        from xl.integrations import steplines  # noqa: PLC0415 - as above
    except ImportError:
        steplines = stepclock

    torch.set_num_threads(1)
    width = args.width
    model = mlp(width, args.ddp)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = args.batch
    x = torch.randn((max(200, args.block_steps) + 1) * batch, width)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=batch)
    every = getattr(steplines, "LINE_EVERY_S", 0.25)
    hold = getattr(steplines, "HOLD_S", 0.05)

    def reading(clock: Any) -> Any:
        make = getattr(steplines, "StepLines", None)
        return make(clock).collect if make is not None else clock.collect

    def block(n: int) -> float:
        return step_cpu_s(model, opt, loader, n)

    def reader(collect: Any, stop: threading.Event) -> None:
        # As the rank's sender: wake just after each grid point is ``hold`` old, read the steps.
        while not stop.is_set():
            now = time.time()
            stop.wait(((now - hold) // every + 1) * every + hold + 0.01 - now)
            collect(frozenset(), False)

    def hooked(n: int) -> float:
        clock = stepclock.StepClock()
        unhook = torchsteps.hook(torch, clock)
        collect = reading(clock)
        stop = threading.Event()
        thread = threading.Thread(target=reader, args=(collect, stop), daemon=True)
        if args.sender:
            thread.start()
        try:
            return block(n)
        finally:
            unhook()
            stop.set()
            if args.sender:
                thread.join(timeout=5)
            collect()

    block(200)
    out: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(args.blocks):
        if i % 2:  # which side goes first alternates: neither gets the warmer caches always
            off = block(args.block_steps)
            on = hooked(args.block_steps)
        else:
            on = hooked(args.block_steps)
            off = block(args.block_steps)
        out["on"].append(on)
        out["off"].append(off)
    return out


def diff_ci(a: list[float], b: list[float], rounds: int = 4000) -> tuple[float, float]:
    """Bootstrap 95% CI of median(a) - median(b), two independent samples."""
    rng = random.Random(0)
    got = sorted(
        statistics.median(rng.choices(a, k=len(a))) - statistics.median(rng.choices(b, k=len(b)))
        for _ in range(rounds)
    )
    return got[int(0.025 * rounds)], got[int(0.975 * rounds) - 1]


def run_side(side: str, args: argparse.Namespace, tmp: Path | None) -> dict[str, list[float]]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for key in ("XL_COLLECTOR", "XL_TOKEN", "XL_RUN_DIR", "XL_RUN_ID", "XL_INSTRUMENT"):
        env.pop(key, None)
    if side == "before" and tmp is not None:
        env["PYTHONPATH"] = str(tmp / "before")
    argv = [sys.executable, str(Path(__file__).resolve()), "--child"]
    argv += ["--blocks", str(args.blocks), "--block-steps", str(args.block_steps)]
    argv += ["--width", str(args.width), "--batch", str(args.batch)]
    argv += ["--ddp"] * args.ddp + ["--sender"] * args.sender
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"the {side} side failed: {proc.stderr[-1500:]}")
    got: dict[str, list[float]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return got


def _diffs(got: dict[str, list[float]]) -> list[float]:
    """Each block pair's hooks - none, in microseconds per step."""
    return [(a - b) * 1e6 for a, b in zip(got["on"], got["off"], strict=True)]


def summary(side: str, got: dict[str, list[float]]) -> dict[str, object]:
    diffs = _diffs(got)
    ratios = [a / b for a, b in zip(got["on"], got["off"], strict=True)]
    lo, hi = median_ci(diffs)
    rlo, rhi = median_ci(ratios)
    med, rmed = statistics.median(diffs), statistics.median(ratios)
    step = statistics.median(got["off"]) * 1e6
    print(
        f"{side}: the hooks cost {med:.1f} us a step (95% CI {lo:.1f} .. {hi:.1f}) of a "
        f"{step:.0f} us step: {(rmed - 1) * 100:+.2f}% ({(rlo - 1) * 100:+.2f} .. "
        f"{(rhi - 1) * 100:+.2f}), {len(diffs)} block pairs",
        flush=True,
    )
    return {
        "hook_us": round(med, 2),
        "hook_us_ci95": [round(lo, 2), round(hi, 2)],
        "ratio": round(rmed, 4),
        "ratio_ci95": [round(rlo, 4), round(rhi, 4)],
        "step_us": round(step, 1),
        "pairs": len(diffs),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=40, help="alternating block pairs per process")
    ap.add_argument("--block-steps", type=int, default=100, help="steps per block")
    ap.add_argument("--width", type=int, default=16, help="the MLP's width")
    ap.add_argument("--batch", type=int, default=8, help="samples per DataLoader batch")
    ap.add_argument("--ddp", action="store_true", help="a one-rank gloo DDP model")
    ap.add_argument("--sender", action="store_true", help="the sender's reads while hooked")
    ap.add_argument("--before", metavar="COMMIT", help="also that commit's hooks, side by side")
    ap.add_argument("--rounds", type=int, default=2, help="processes per side with --before")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0
    sides = ["now"] + (["before"] if args.before else [])
    got: dict[str, dict[str, list[float]]] = {side: {"on": [], "off": []} for side in sides}
    with tempfile.TemporaryDirectory(prefix="xl-bench-hook-cpu-") as name:
        tmp = Path(name)
        if args.before:
            from bench_instrument import checkout  # noqa: PLC0415 - only with --before

            checkout(args.before, tmp)
        for i in range(args.rounds if args.before else 1):
            for side in sides if i % 2 == 0 else sides[::-1]:
                one = run_side(side, args, tmp)
                got[side]["on"] += one["on"]
                got[side]["off"] += one["off"]
    figures: dict[str, object] = {
        "load_1min": round(os.getloadavg()[0], 2),
        "width": args.width,
        "batch": args.batch,
        "ddp": args.ddp,
        "sender": args.sender,
    }
    for side in sides:
        figures[side] = summary(side, got[side])
    if args.before:
        now, old = _diffs(got["now"]), _diffs(got["before"])
        lo, hi = diff_ci(now, old)
        med = statistics.median(now) - statistics.median(old)
        figures["now-before_us"] = {"median": round(med, 2), "ci95": [round(lo, 2), round(hi, 2)]}
        print(f"now - before: {med:+.1f} us a step (95% CI {lo:+.1f} .. {hi:+.1f})")
    print(json.dumps(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
