"""Training overhead of full monitoring: the example's step time under `xl launch` vs torchrun.

    .venv/bin/python bench/bench_overhead.py [--steps 800] [--pairs 4]

Both sides run examples/train.py (2 CPU ranks, DDP) through a tiny driver that timestamps each
``xl.log`` call (one per step) and reports each rank's median step time. Under plain torchrun
``xl.log``/``xl.watch`` are no-ops; under ``xl launch --no-tui`` everything is on: the client
and its sender thread, xl.watch's comm hook, the collector, the 1 Hz sampler, log parsing.
Runs alternate (A B A B ...) so machine load hits both alike. Goal: <= 1% slower.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

DRIVER = r"""
import json, os, runpy, sys, time
import xl
stamps = []
cpu = []
real_log = xl.log
def timed_log(**kw):
    stamps.append(time.perf_counter())
    cpu.append(time.process_time())  # every thread of the rank: training, sender, hooks
    real_log(**kw)
xl.log = timed_log
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    steps = [b - a for a, b in zip(stamps, stamps[1:])]
    cpus = [b - a for a, b in zip(cpu, cpu[1:])]
    out = os.environ["BENCH_OUT"]
    with open(os.path.join(out, f"rank-{os.environ.get('RANK', '0')}-{os.getpid()}.json"), "w") as fh:
        json.dump({"median_step_s": statistics.median(steps) if steps else None,
                   "cpu_per_step_s": (cpu[-1] - cpu[0]) / len(cpus) if cpus else None,
                   "steps": len(steps)}, fh)
""".replace("import json, os", "import json, os, statistics")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(mode: str, driver: Path, steps: int, tmp: Path, n: int) -> tuple[float, float]:
    out = tmp / f"{mode}-{n}"
    out.mkdir()
    env = dict(os.environ, BENCH_OUT=str(out), XL_HOME=str(tmp / "home"), OMP_NUM_THREADS="1")
    for key in ("XL_COLLECTOR", "XL_TOKEN", "XL_RUN_DIR", "XL_RUN_ID", "CUDA_VISIBLE_DEVICES"):
        env.pop(key, None)
    script = [
        str(driver),
        str(REPO / "examples" / "train.py"),
        "--steps",
        str(steps),
        "--width",
        "256",
    ]
    if mode == "torchrun":
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            *script,
        ]
    else:
        argv = [sys.executable, "-m", "xl", "launch", "--nproc", "2", "--no-tui", "--", *script]
    proc = subprocess.run(
        argv, env=env, cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=900
    )
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    reports = [json.loads(p.read_text()) for p in out.glob("rank-*.json")]
    if len(reports) != 2:
        raise SystemExit(f"{mode}: expected 2 rank reports, got {len(reports)}")
    return (
        statistics.mean(r["median_step_s"] for r in reports),
        statistics.mean(r["cpu_per_step_s"] for r in reports),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--pairs", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="xl-bench-overhead-") as tmp_s:
        tmp = Path(tmp_s)
        driver = tmp / "driver.py"
        driver.write_text(DRIVER)
        results: dict[str, list[float]] = {"torchrun": [], "xl": []}
        cpu: dict[str, list[float]] = {"torchrun": [], "xl": []}
        for n in range(args.pairs):
            # A B B A ...: a load trend on the machine favours neither side.
            order = ("torchrun", "xl") if n % 2 == 0 else ("xl", "torchrun")
            for mode in order:
                wall, cpu_s = run_once(mode, driver, args.steps, tmp, n)
                results[mode].append(wall)
                cpu[mode].append(cpu_s)
                print(
                    f"  {mode:8} run {n + 1}: {wall * 1000:.3f} ms/step, "
                    f"rank CPU {cpu_s * 1000:.3f} ms/step",
                    flush=True,
                )
        base = statistics.median(results["torchrun"])
        xl_s = statistics.median(results["xl"])
        overhead = (xl_s / base - 1) * 100
        print(
            f"plain torchrun : {base * 1000:.3f} ms/step (median of {args.pairs} runs; "
            f"best {min(results['torchrun']) * 1000:.3f})"
        )
        print(f"xl, monitored  : {xl_s * 1000:.3f} ms/step (best {min(results['xl']) * 1000:.3f})")
        best = (min(results["xl"]) / min(results["torchrun"]) - 1) * 100
        print(f"best vs best   : {best:+.2f}%  (load from other processes only adds time)")
        print(
            f"overhead       : {overhead:+.2f}%  (goal <= 1%: {'met' if overhead <= 1 else 'MISSED'})"
        )
        cpu_base, cpu_xl = statistics.median(cpu["torchrun"]), statistics.median(cpu["xl"])
        print(
            f"rank CPU/step  : torchrun {cpu_base * 1000:.3f} ms, xl {cpu_xl * 1000:.3f} ms "
            f"({(cpu_xl / cpu_base - 1) * 100:+.2f}%; all threads of a rank: training, "
            "xl.log's sender, xl.watch's hook)"
        )
        print(
            "note: on a shared 2-core machine run-to-run noise is several %; compare the"
            " per-run lines, and treat a single ratio with care"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
