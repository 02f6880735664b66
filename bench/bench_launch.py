"""Launch overhead: `xl launch --no-tui` vs plain torchrun on 2 CPU ranks that init gloo, meet at
a barrier and leave.

    .venv/bin/python bench/bench_launch.py [--repeat N] [--before DIR] [--independent-delays]

Two CPU ranks that init gloo, meet at a barrier and leave. Wall time from start to exit of each
command, measured alternately in the same run, each command in each position of a round equally
often (bench/rounds.py), so machine load hits them alike; prints the medians and the ratio
xl / torchrun (goal <= 1.03x), the paired one with a bootstrap 95% interval over the rounds.
``--before DIR``: also time another xl (a folder holding its ``xl`` package, put first on
PYTHONPATH) in the same rounds, e.g. the last release, for a before/after measured side by side.

Where the time goes: each rank notes when its script's first line ran and when its last one
did, so every command's wall time splits into its start (the command's start to the first
rank's first line: torchrun's own start, and xl's before and around it), the script, and its end
(the last rank's last line to the command's exit). The start and end are printed too, and the
CPU time of each command's whole process tree (paired ratios too), which load disturbs far less.

torch's c10d rendezvous sleeps a random 0-0.3 s before it joins; plain torchrun here and `xl
launch` on one node run the static one, which does not (docs/launch.md, "One node's
rendezvous"), but an xl given ``--before`` may run c10d: the commands of a round draw the same
sleep where they draw one (bench/rounds.py, ``same_delays``), so that a round's ratio compares
the launchers and not two draws. ``--independent-delays``: each run draws its own.

Every command runs with bytecode caching on (``PYTHONDONTWRITEBYTECODE`` dropped; the warm-up
run writes the caches): xl is timed as an installed package runs, not compiling its own modules
from source in every process, which torch's installed modules never do.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rounds import in_round, round_env, same_delays

SCRIPT = """\
import os, time
first = time.time()
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
with open(os.environ["BENCH_STAMPS"] + "-" + os.environ["RANK"], "w") as fh:
    fh.write(f"{first} {time.time()}")
"""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _time(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float, float, float]:
    """(wall, start, end, CPU) in seconds: see the module's docstring. CPU is the whole process
    tree's (each process is waited for by its parent, so the kernel adds it to ours)."""
    stamps = Path(cwd) / "stamps" / f"{time.monotonic_ns()}"
    stamps.parent.mkdir(exist_ok=True)
    t0 = time.time()
    c0, cpu0 = time.perf_counter(), _cpu()
    proc = subprocess.run(
        argv,
        env=dict(env, BENCH_STAMPS=str(stamps)),
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=120,
    )
    elapsed, cpu = time.perf_counter() - c0, _cpu() - cpu0
    t1 = t0 + elapsed
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    marks = [
        tuple(map(float, p.read_text().split())) for p in stamps.parent.glob(stamps.name + "-*")
    ]
    if len(marks) != 2:
        raise SystemExit(f"{argv[:4]}: {len(marks)} of 2 ranks left their marks")
    return elapsed, min(m[0] for m in marks) - t0, t1 - max(m[1] for m in marks), cpu


def _bootstrap(ratios: list[float], draws: int = 4000) -> tuple[float, float]:
    """A 95% interval for the median of the rounds' ratios (rounds resampled with replacement,
    fixed seed): whether the goal is inside it says whether these rounds settle it."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def main() -> int:
    # The docstring's first paragraph, on one line.
    ap = argparse.ArgumentParser(description=" ".join((__doc__ or "").split("\n\n")[0].split()))
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument(
        "--before", metavar="DIR", help="another xl to time alongside (DIR/xl is its package)"
    )
    ap.add_argument(
        "--independent-delays", action="store_true", help="each run draws its own rendezvous delay"
    )
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="xl-bench-") as tmp:
        script = Path(tmp) / "barrier.py"
        script.write_text(SCRIPT)
        env = dict(os.environ, XL_HOME=str(Path(tmp) / "home"))
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks under both, also on a machine with GPUs
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # see the module's docstring
        xl = [sys.executable, "-m", "xl", "launch", "--no-tui", "--nproc", "2", str(script)]
        torchrun = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script),
        ]
        runs: dict[str, tuple[list[str], dict[str, str]]] = {
            "torchrun": (torchrun, env),
            "xl": (xl, env),
        }
        if ns.before:
            runs["xl (before)"] = (xl, dict(env, PYTHONPATH=os.path.abspath(ns.before)))
        if not ns.independent_delays:
            runs = {
                name: (argv, same_delays(Path(tmp) / "same-delays", run_env))
                for name, (argv, run_env) in runs.items()
            }
        for argv, run_env in runs.values():
            _time(argv, run_env, tmp)  # warm the page cache for each before measuring
        times: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in runs}
        for i in range(ns.repeat):
            # each in each position alike
            for name, (argv, run_env) in in_round(list(runs.items()), i):
                times[name].append(_time(argv, round_env(run_env, i), tmp))
    anchor = [t[0] for t in times["torchrun"]]
    load = os.getloadavg()[0]
    delays = "each run its own" if ns.independent_delays else "the same for the commands of a round"
    print(
        f"2 ranks, gloo init + barrier; {ns.repeat} rounds, each command once a round, "
        f"alternating; load {load:.1f} at the end"
    )
    print(f"torch's random rendezvous delay: {delays}")
    for name, rows in times.items():
        ts = [t[0] for t in rows]
        line = (
            f"{name:12}: median {statistics.median(ts):.3f}s  ({', '.join(f'{t:.2f}' for t in ts)})"
        )
        if name != "torchrun":
            # The ratio within a round is the least sensitive to other load on a shared machine.
            ratios = [x / t for x, t in zip(ts, anchor, strict=True)]
            low, high = _bootstrap(ratios)
            line += (
                f"  ratio {statistics.median(ts) / statistics.median(anchor):.3f}x, paired "
                f"{statistics.median(ratios):.3f}x [95% {low:.3f}-{high:.3f}]"
            )
        print(line)
    # CPU time of the process tree: what the machine's load disturbs far less than wall time.
    anchor_cpu = [t[3] for t in times["torchrun"]]
    for name, rows in times.items():
        cs = [t[3] for t in rows]
        line = f"{name:12}: CPU median {statistics.median(cs):.3f}s"
        if name != "torchrun":
            line += (
                "  paired "
                f"{statistics.median(x / t for x, t in zip(cs, anchor_cpu, strict=True)):.3f}x"
            )
        print(line)
    print(
        "start (the command's start to the first rank's first line) and end (the last rank's "
        "last line to the exit), medians:"
    )
    for name, rows in times.items():
        start, end = statistics.median(t[1] for t in rows), statistics.median(t[2] for t in rows)
        print(f"{name:12}: start {start * 1000:.0f} ms, end {end * 1000:.0f} ms")
    print("goal: xl <= 1.03x torchrun")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
