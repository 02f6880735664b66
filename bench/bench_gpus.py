"""Cost of one full GPU inventory sweep (8 simulated GPUs): xl.gpu.nvml vs nvitop's API.

Both run in their own subprocess against the same simulated libnvidia-ml (tests/support/simnvml.c,
built with gcc), loaded by the real nvidia-ml-py through LD_LIBRARY_PATH, in the same run:

    xl:     xl.gpu.nvml.inventory()                      (all fields + processes)
    nvitop: Device.all() + as_snapshot() + processes() for every device

Prints the median per sweep of each, and the ratio xl / nvitop (goal: <= 1.0). Also the cold
cost: import + NVML init + first sweep. Needs nvitop (the `bench` extra) and gcc.

    .venv/bin/python bench/bench_gpus.py [--gpus 8] [--sweeps 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))


def child(kind: str, sweeps: int) -> None:
    """Runs in the subprocess: time the sweeps, print JSON."""
    t0 = time.perf_counter()
    if kind == "xl":
        from xl.gpu import nvml  # noqa: PLC0415 - the child times its own cold import

        def sweep() -> int:
            inv = nvml.inventory()
            assert inv.driver.error is None, inv.driver.error
            return len(inv.gpus)
    else:
        from nvitop import Device  # noqa: PLC0415 - an optional anchor, only in its child

        def sweep() -> int:
            devices = Device.all()
            snaps = [d.as_snapshot() for d in devices]
            for d in devices:
                d.processes()
            return len(snaps)

    n = sweep()
    cold = time.perf_counter() - t0
    times = []
    for _ in range(sweeps):
        s = time.perf_counter()
        sweep()
        times.append(time.perf_counter() - s)
    print(json.dumps({"gpus": n, "cold": cold, "times": times}))


def run_child(kind: str, sweeps: int, env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--sweeps", str(sweeps)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise SystemExit(f"bench child {kind} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--sweeps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", choices=["xl", "nvitop"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.sweeps)
        return 0

    import simnvml  # noqa: PLC0415 - tests/support, put on sys.path above

    try:
        import nvitop  # noqa: F401, PLC0415 - an optional anchor: say so when missing
    except ImportError:
        print("bench_gpus: nvitop is not installed (pip install -e '.[bench]')", file=sys.stderr)
        return 2
    if not simnvml.have_gcc():
        print("bench_gpus: gcc not found; it builds the simulated NVML library", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix="xl-bench-gpus-") as tmp:
        lib = simnvml.build(Path(tmp) / "lib")
        gpus = [
            simnvml.SimGPU(util_gpu=10 * i % 100, memory_used_mib=1024.0 * i)
            for i in range(args.gpus)
        ]
        sim = simnvml.SimNVML(lib, Path(tmp) / "sim.conf", gpus)
        env = {**os.environ, **sim.env}
        results: dict[str, list[dict]] = {"xl": [], "nvitop": []}
        # Interleave the rounds so drift on a shared machine hits both alike.
        for _ in range(args.rounds):
            for kind in ("xl", "nvitop"):
                r = run_child(kind, args.sweeps, env)
                if r["gpus"] != args.gpus:
                    raise SystemExit(f"{kind} saw {r['gpus']} GPUs, expected {args.gpus}")
                results[kind].append(r)

    med = {k: statistics.median(t for r in v for t in r["times"]) for k, v in results.items()}
    cold = {k: statistics.median(r["cold"] for r in v) for k, v in results.items()}
    print(
        f"GPU inventory sweep, {args.gpus} simulated GPUs, "
        f"{args.rounds} rounds x {args.sweeps} sweeps each"
    )
    print(f"  {'':8}{'median sweep':>14}{'cold (import+init+1st)':>26}")
    for k in ("xl", "nvitop"):
        print(f"  {k:8}{med[k] * 1e3:>11.3f} ms{cold[k] * 1e3:>23.1f} ms")
    print(
        f"  ratio xl/nvitop: sweep {med['xl'] / med['nvitop']:.3f}, "
        f"cold {cold['xl'] / cold['nvitop']:.3f}  (goal: sweep <= 1.0)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
