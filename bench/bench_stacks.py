"""What `xl stacks` costs: the time to get 8 ranks' stacks, and a step's cost while nobody asks.

    .venv/bin/python bench/bench_stacks.py [--ranks 8] [--asks 10] [--pairs 4] [--steps 3000]

1. Asking. A real `xl launch --detach` of tests/support/hang_ddp.py on ``--ranks`` gloo CPU ranks,
   rank 1 asleep outside the collective and the others waiting in all_reduce (the hang this is
   for). Times ``run_document`` (what `xl stacks` does after start-up) over every rank, ``--asks``
   times; the anchor is the same call for rank 0 alone in the same run, so the ratio says what
   asking N ranks in parallel costs over asking one.
2. Not asking. Two ranks under plain torchrun each run ``--steps`` tiny all_reduces, with xl's
   rank handler installed (``install``: faulthandler's signal handler, the socket thread blocked
   in accept(), the Flight Recorder's buffer) or not, in A B / B A pairs; the ratio with/without
   of the mean step, median over pairs. The handler does nothing per step, so it should sit within
   the noise, as bench_overhead's whole-run figure does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from procs import XL, kill_run, wait_ranks_running, xl, xl_env  # noqa: E402
from xltele import free_port  # noqa: E402

DRIVER = """
import os, sys, time, torch, torch.distributed as dist
if os.environ.get("BENCH_INSTALL") == "1":
    from xl.launcher.rank.stacks import install
    install(os.environ["BENCH_DIR"], int(os.environ["RANK"]))
dist.init_process_group("gloo")
t = torch.ones(16)
steps = int(sys.argv[1])
for _ in range(50):
    dist.all_reduce(t)
start = time.perf_counter()
for _ in range(steps):
    dist.all_reduce(t)
if dist.get_rank() == 0:
    print("STEP_US", (time.perf_counter() - start) / steps * 1e6, flush=True)
dist.destroy_process_group()
"""


def ask(args: argparse.Namespace, tmp: Path) -> None:
    from xl.launcher.stacks.gather import run_document  # noqa: PLC0415 - after sys.path is set

    home = tmp / "home"
    env = xl_env(home)
    os.environ["XL_HOME"] = str(home)
    cmd = [
        "launch", "--detach", "--nproc", str(args.ranks), str(ROOT / "tests/support/hang_ddp.py"),
        "--mode", "sleep",
    ]
    started = xl(cmd, env, cwd=tmp, timeout=120)
    run_dir = home / "runs" / started.stdout.strip()
    try:
        wait_ranks_running(run_dir, args.ranks, timeout=180)
        time.sleep(2)  # every rank past step 3: rank 1 asleep, the others in all_reduce
        every, one = [], []
        for _ in range(args.asks):
            t0 = time.perf_counter()
            doc = run_document(run_dir)
            every.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            run_document(run_dir, rank=0)
            one.append(time.perf_counter() - t0)
        answered = sum(1 for e in doc.ranks if e.threads is not None)
        print(f"asking: {answered}/{args.ranks} ranks answered; verdict: {doc.verdict.message}")
        print(
            f"  all {args.ranks} ranks: median {statistics.median(every) * 1000:.1f} ms (max "
            f"{max(every) * 1000:.1f})"
        )
        print(f"  rank 0 alone (anchor): median {statistics.median(one) * 1000:.1f} ms")
        print(f"  ratio all/one: {statistics.median(every) / statistics.median(one):.2f}x")
    finally:
        subprocess.run([*XL, "stop", run_dir.name], env=env, capture_output=True, timeout=60)
        kill_run(run_dir)


def step_us(script: Path, steps: int, install: bool, tmp: Path) -> float:
    env = dict(
        os.environ, BENCH_INSTALL="1" if install else "0", BENCH_DIR=str(tmp), OMP_NUM_THREADS="1"
    )
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
        "--master-addr=127.0.0.1", f"--master-port={free_port()}", str(script), str(steps),
    ]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300).stdout
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("STEP_US")))


def idle(args: argparse.Namespace, tmp: Path) -> None:
    script = tmp / "driver.py"
    script.write_text(DRIVER)
    ratios, on, off = [], [], []
    for i in range(args.pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        got = {flag: step_us(script, args.steps, flag, tmp) for flag in order}
        on.append(got[True])
        off.append(got[False])
        ratios.append(got[True] / got[False])
    print(
        f"not asking: all_reduce step {statistics.median(off):.1f} us without, "
        f"{statistics.median(on):.1f} us with the handler"
    )
    print(
        f"  ratio with/without, median of {args.pairs} pairs: {statistics.median(ratios):.3f} "
        f"(pairs: {', '.join(f'{r:.3f}' for r in ratios)})"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--asks", type=int, default=10)
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--steps", type=int, default=3000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ask(args, Path(tmp))
        idle(args, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
