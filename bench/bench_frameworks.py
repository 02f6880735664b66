"""Each framework's wall time under `xl launch --no-tui` vs plain torchrun (goal <= 1.03x).

    .venv/bin/python bench/bench_frameworks.py [--repeat N]
        [--only hf,lightning,accelerate,deepspeed]
        [--no-instrument | --hooks] [--independent-delays]

The bundled examples (examples/), unchanged, on two CPU ranks: HF Trainer (tiny GPT-2 with an
evaluation), Lightning (a validation each epoch), Accelerate (no tracker), DeepSpeed ZeRO-1. The
commands run alternately in the same rounds, so machine load hits them alike; a ratio is the
median of each round's ratio, printed with its spread (min-max over the rounds). Under xl every
rank is instrumented (docs/frameworks.md); ``--no-instrument`` times xl without it instead, and
``--hooks`` times both in the same rounds and also prints xl / xl --no-instrument: the hooks'
own cost, apart from the launcher's. torch's rendezvous sleeps a random 0-0.3 s under either
launcher: the commands of a round draw the same sleep (bench/rounds.py, ``same_delays``);
``--independent-delays`` lets each run draw its own. Bytecode caching is on for every command
(``PYTHONDONTWRITEBYTECODE`` dropped; the warm-up runs write the caches): with it off, every xl
process compiled xl's modules from source (~100-150 ms of CPU a run), which an installed xl never
does and torch's installed modules never did.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rounds import in_round, round_env, same_delays

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FRAMEWORKS = {
    "hf": ["hf_trainer.py", "--no-callback", "--steps", "40", "--eval", "20"],
    "lightning": ["lightning_train.py", "--steps", "20", "--epochs", "2", "--bar", "tqdm"],
    "accelerate": ["accelerate_train.py", "--no-tracker", "--steps", "200"],
    "deepspeed": ["deepspeed_train.py", "--steps", "200"],
}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _time(argv: list[str], env: dict[str, str], cwd: str, tries: int = 3) -> tuple[float, float]:
    """One run's wall time and the CPU time of its whole process tree (every process in it is
    waited for by its parent, so the kernel adds it to ours). A run that fails is run again (at
    most ``tries`` in all) and said on stderr: the examples' gloo teardown aborts a rank now and
    then, under torchrun as under xl."""
    for attempt in range(1, tries + 1):
        t0, cpu0 = time.perf_counter(), _cpu()
        proc = subprocess.run(
            argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600
        )
        elapsed, cpu = time.perf_counter() - t0, _cpu() - cpu0
        if proc.returncode == 0:
            return elapsed, cpu
        what = f"{' '.join(argv[2:5])} failed ({proc.returncode})"
        if attempt == tries:
            raise SystemExit(f"{what}: {proc.stderr.decode()[-2000:]}")
        print(
            f"bench_frameworks: {what}, run again: "
            f"{proc.stderr.decode().strip().splitlines()[-1:]}",
            file=sys.stderr,
            flush=True,
        )
    raise AssertionError("unreachable")


def _ratio(label: str, ours: list[float], anchor: list[float]) -> str:
    """The median of the rounds' ratios, with their spread."""
    per_round = [x / t for x, t in zip(ours, anchor, strict=True)]
    return (
        f"{label} {statistics.median(per_round):.3f}x ({min(per_round):.3f}-{max(per_round):.3f})"
    )


def _report(
    name: str, times: dict[str, list[float]], cpus: dict[str, list[float]], rounds: int
) -> None:
    """Wall time (the goal's figure) and the process tree's CPU time (what load disturbs least)."""
    anchors = [("torchrun", "xl/torchrun")] + (
        [("xl-off", "xl/xl-off")] if "xl-off" in times else []
    )
    for figure, data in (("wall", times), ("cpu", cpus)):
        medians = "  ".join(f"{k} {statistics.median(v):6.2f}s" for k, v in data.items())
        ratios = "  ".join(_ratio(label, data["xl"], data[anchor]) for anchor, label in anchors)
        singles = " ".join(f"[{k} {', '.join(f'{t:.2f}' for t in v)}]" for k, v in data.items())
        print(
            f"{name:11} {figure:4} {medians}  {ratios} (paired medians of {rounds})  {singles}",
            flush=True,
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--only", default=",".join(FRAMEWORKS), help="comma-separated: " + ", ".join(FRAMEWORKS)
    )
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--no-instrument", action="store_true", help="time xl with --no-instrument")
    mode.add_argument(
        "--hooks", action="store_true", help="also time xl --no-instrument, the hooks' anchor"
    )
    ap.add_argument(
        "--independent-delays", action="store_true", help="each run draws its own rendezvous delay"
    )
    ns = ap.parse_args()
    chosen = [name.strip() for name in ns.only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in FRAMEWORKS]
    if unknown:
        print(
            f"bench_frameworks: unknown framework {unknown[0]!r}; choose from "
            f"{', '.join(FRAMEWORKS)}",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="xl-bench-fw-") as tmp:
        env = dict(
            os.environ,
            XL_HOME=str(Path(tmp) / "home"),
            OMP_NUM_THREADS="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            HF_HOME=str(Path(tmp) / "hf"),
        )
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # see the module's docstring
        if not ns.independent_delays:
            env = same_delays(Path(tmp) / "same-delays", env)
        xl_opts = ["--no-instrument"] if ns.no_instrument else []
        for name in chosen:
            script, *args = FRAMEWORKS[name]
            path = str(EXAMPLES / script)
            xl = [sys.executable, "-m", "xl", "launch", "--no-tui", "--nproc-per-node", "2"]
            runs = {
                "torchrun": [
                    sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", "2", path, *args,
                ]
            }
            if ns.hooks:
                runs["xl-off"] = [*xl, "--no-instrument", path, *args]
            runs["xl"] = [*xl, *xl_opts, path, *args]
            for argv in runs.values():
                _time(argv, env, tmp)  # warm the page cache (and DeepSpeed's op cache) first
            times: dict[str, list[float]] = {k: [] for k in runs}
            cpus: dict[str, list[float]] = {k: [] for k in runs}
            for i in range(ns.repeat):
                # each in each position alike (bench/rounds.py)
                for key, argv in in_round(list(runs.items()), i):
                    wall, cpu = _time(argv, round_env(env, i), tmp)
                    times[key].append(wall)
                    cpus[key].append(cpu)
            _report(name, times, cpus, ns.repeat)
            print(f"{'':11} load {os.getloadavg()[0]:.1f} at the end", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
