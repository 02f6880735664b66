"""Each framework's wall time under `xl launch --no-tui` vs plain torchrun (goal <= 1.03x).

    .venv/bin/python bench/bench_frameworks.py [--repeat N] [--only hf,lightning,accelerate,deepspeed]
        [--no-instrument]

The bundled examples (examples/), unchanged, on two CPU ranks: HF Trainer (tiny GPT-2 with an
evaluation), Lightning (a validation each epoch), Accelerate (no tracker), DeepSpeed ZeRO-1. The
commands run alternately in the same rounds, so machine load hits both alike; the ratio is the
median of each round's xl / torchrun. Under xl every rank is instrumented (docs/frameworks.md);
``--no-instrument`` times xl without it, to tell the hooks' cost from the launcher's.
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

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FRAMEWORKS = {
    "hf": ["hf_trainer.py", "--no-callback", "--steps", "40", "--eval", "20"],
    "lightning": ["lightning_train.py", "--steps", "20", "--epochs", "2", "--bar", "tqdm"],
    "accelerate": ["accelerate_train.py", "--no-tracker", "--steps", "200"],
    "deepspeed": ["deepspeed_train.py", "--steps", "200"],
}


def _time(argv: list[str], env: dict[str, str], cwd: str) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", default=",".join(FRAMEWORKS), help="comma-separated: " + ", ".join(FRAMEWORKS))
    ap.add_argument("--no-instrument", action="store_true", help="time xl with --no-instrument")
    ns = ap.parse_args()
    chosen = [name.strip() for name in ns.only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in FRAMEWORKS]
    if unknown:
        print(f"bench_frameworks: unknown framework {unknown[0]!r}; choose from {', '.join(FRAMEWORKS)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="xl-bench-fw-") as tmp:
        env = dict(os.environ, XL_HOME=str(Path(tmp) / "home"), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", HF_HOME=str(Path(tmp) / "hf"))
        env.pop("CUDA_VISIBLE_DEVICES", None)
        xl_opts = ["--no-instrument"] if ns.no_instrument else []
        for name in chosen:
            script, *args = FRAMEWORKS[name]
            path = str(EXAMPLES / script)
            runs = {
                "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", path, *args],
                "xl": [sys.executable, "-m", "xl", "launch", "--no-tui", "--nproc-per-node", "2", *xl_opts, path, *args],
            }
            for argv in runs.values():
                _time(argv, env, tmp)  # warm the page cache (and DeepSpeed's op cache) first
            times: dict[str, list[float]] = {k: [] for k in runs}
            for _ in range(ns.repeat):
                for key, argv in runs.items():
                    times[key].append(_time(argv, env, tmp))
            anchor, ours = times["torchrun"], times["xl"]
            paired = statistics.median(x / t for x, t in zip(ours, anchor, strict=True))
            print(
                f"{name:11} torchrun {statistics.median(anchor):6.2f}s  xl {statistics.median(ours):6.2f}s  "
                f"xl/torchrun {paired:.3f}x (paired median of {ns.repeat})  "
                f"[torchrun {', '.join(f'{t:.2f}' for t in anchor)}] [xl {', '.join(f'{t:.2f}' for t in ours)}]",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
