"""What torch's step hooks cost on a GPU: a GPU-bound DDP loop's step time under `xl launch`
with the hooks (the split on CUDA events) against `xl launch --no-instrument`.

    python bench/gpu_steps_bench.py [--pairs 4] [--steps 400] [--from 100] [--width 4096]
                                    [--json OUT.json]

Both sides run tests/gpu/steps_gpu.py, a plain script that never calls xl, on GPU 0 (NCCL, one
rank); it times its own steps from ``--from`` on (the device idle at both ends) and writes the
mean. Runs come in pairs, A B then B A, so a drift of the machine falls on both sides alike;
each pair gives one ratio hooks / no hooks, and the answer is the median ratio with a bootstrap
95% interval (bench_overhead.median_ci). bench/gpu_run.sh runs it where a GPU is at hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_overhead import median_ci, pct  # bench/ is sys.path[0] when run as a script

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "gpu" / "steps_gpu.py"
RUN_TIMEOUT_S = 300


def run_once(hooks: bool, args: argparse.Namespace, tmp: Path, n: int) -> float:
    """One launch; the script's own mean step time over its timed steps."""
    out = tmp / f"{'on' if hooks else 'off'}-{n}"
    out.mkdir()
    argv = [sys.executable, "-m", "xl", "launch", "--no-tui", "--gpus", "0"]
    if not hooks:
        argv.append("--no-instrument")
    argv += ["--", str(SCRIPT), "--out", str(out), "--steps", str(args.steps)]
    argv += ["--time-from", str(args.time_from), "--width", str(args.width)]
    env = {"XL_HOME": str(tmp / "xl-home"), "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        argv,
        env={**_base_env(), **env},
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise SystemExit(f"xl launch failed ({done.returncode}):\n{done.stderr[-2000:]}")
    step_s = json.loads((out / "rank-0.json").read_text())["step_s"]
    return float(step_s)


def _base_env() -> dict[str, str]:
    import os  # noqa: PLC0415 - only here: the launch's environment

    return {k: v for k, v in os.environ.items() if not k.startswith(("XL_", "CUDA_VISIBLE"))} | {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID"
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--from", dest="time_from", type=int, default=100)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    on: list[float] = []
    off: list[float] = []
    with tempfile.TemporaryDirectory(prefix="xl-gpu-bench-") as name:
        tmp = Path(name)
        for i in range(args.pairs):
            order = (True, False) if i % 2 == 0 else (False, True)
            got = {hooks: run_once(hooks, args, tmp, i) for hooks in order}
            on.append(got[True])
            off.append(got[False])
            print(
                f"pair {i + 1}: hooks {got[True] * 1000:.3f} ms, --no-instrument "
                f"{got[False] * 1000:.3f} ms a step ({pct(got[True] / got[False])})",
                flush=True,
            )
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    median = statistics.median(ratios)
    low, high = median_ci(ratios)
    print(
        f"hooks / --no-instrument: {pct(median)} [{pct(low)}, {pct(high)}] over {args.pairs} "
        f"pairs; a step {statistics.median(off) * 1000:.3f} ms without the hooks"
    )
    if args.json:
        doc = {"on_s": on, "off_s": off, "ratios": ratios, "median": median, "ci": [low, high]}
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
