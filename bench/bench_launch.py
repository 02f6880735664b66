"""Launch overhead: `xl launch --no-tui` vs plain torchrun on a 2-rank script that exits at once.

    .venv/bin/python bench/bench_launch.py [--repeat N]

Wall time from start to exit of each command, measured alternately in the same run (so machine
load hits both alike); prints the medians and the ratio xl / torchrun (goal <= 1.15x).
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

SCRIPT = "import os\nassert os.environ['WORLD_SIZE'] == '2'\n"


def _time(argv: list[str], env: dict[str, str], cwd: str) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="xl-bench-") as tmp:
        script = Path(tmp) / "exit_now.py"
        script.write_text(SCRIPT)
        env = dict(os.environ, XL_HOME=str(Path(tmp) / "home"))
        env.pop("CUDA_VISIBLE_DEVICES", None)
        xl = [sys.executable, "-m", "xl", "launch", "--no-tui", "--nproc", "2", str(script)]
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)]
        # Warm the page cache for both before measuring.
        _time(torchrun, env, tmp)
        _time(xl, env, tmp)
        xl_times, tr_times = [], []
        for _ in range(ns.repeat):
            tr_times.append(_time(torchrun, env, tmp))
            xl_times.append(_time(xl, env, tmp))
    xl_med, tr_med = statistics.median(xl_times), statistics.median(tr_times)
    print(f"torchrun --nproc-per-node 2 : median {tr_med:.3f}s  ({', '.join(f'{t:.2f}' for t in tr_times)})")
    print(f"xl launch --no-tui --nproc 2: median {xl_med:.3f}s  ({', '.join(f'{t:.2f}' for t in xl_times)})")
    print(f"ratio xl / torchrun: {xl_med / tr_med:.3f}x (goal <= 1.15x)")
    # Each xl run follows its torchrun run at once: the ratio within a pair is the least
    # sensitive to other load on a shared machine.
    pairs = statistics.median(x / t for x, t in zip(xl_times, tr_times, strict=True))
    print(f"median of paired ratios: {pairs:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
