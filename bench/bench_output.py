"""A chatty rank's output: `xl launch --no-tui ... > file` vs `torchrun ... > file`, every line
counted.

    .venv/bin/python bench/bench_output.py [--mb 100] [--ranks 1] [--repeat 5]
        [--shape lines|bulk] [--before DIR]

Each rank prints ``--mb`` MB of 100-byte numbered lines with stdout redirected to a file, as in a
batch job: ``--shape lines`` one ``print`` a line (as a training script does), ``bulk`` 100 KB a
write (1,000 lines joined: a logger that buffers, a dump). Wall time from start to exit of each
command, pairs alternating in the same run, each command first in half the rounds (machine load
hits both alike); prints the medians, the ratio xl / torchrun (goal <= 1.05x; the paired one
with a bootstrap 95% interval) and how many of the lines reached xl's output file, in
order and prefixed (goal: all of them). ``--before DIR``: also time another xl (DIR/xl is its
package, put first on PYTHONPATH) in the same rounds.
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

from rounds import bootstrap, in_round

LINE = 100  # bytes per line, newline included
SCRIPT = f"""\
import os, sys
n = int(sys.argv[1])
rank = os.environ["RANK"]
pad = "x" * ({LINE} - 1 - len(f"r{{rank}} {{0:09d}} "))
if sys.argv[2] == "lines":
    for i in range(n):
        print(f"r{{rank}} {{i:09d}} {{pad}}")
else:  # 100 KB a write: 1,000 lines joined, as a logger or a dump that buffers writes
    for start in range(0, n, 1000):
        lines = range(start, min(n, start + 1000))
        sys.stdout.write("".join(f"r{{rank}} {{i:09d}} {{pad}}\\n" for i in lines))
        sys.stdout.flush()
"""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _time(argv: list[str], env: dict[str, str], cwd: str, out: Path) -> tuple[float, float]:
    """(wall, CPU) in seconds; CPU is the command's whole process tree's (each process is waited
    for by its parent, so the kernel adds it to ours): what other load disturbs far less."""
    with open(out, "wb") as fh:
        t0, cpu0 = time.perf_counter(), _cpu()
        proc = subprocess.run(
            argv, env=env, cwd=cwd, stdout=fh, stderr=subprocess.PIPE, timeout=900
        )
        elapsed, cpu = time.perf_counter() - t0, _cpu() - cpu0
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    return elapsed, cpu


def count_lines(path: Path, ranks: int) -> tuple[int, bool]:
    """How many of the ranks' lines the file holds, and whether each rank's came in order with
    none missing."""
    nxt = dict.fromkeys(range(ranks), 0)
    got, in_order = 0, True
    with open(path, "rb") as fh:
        for raw in fh:
            if not raw.startswith(b"[rank "):
                continue
            at = raw.find(b"] r")
            head = raw[at + 3 :].split(b" ", 2) if at > 0 else []
            if len(head) < 2 or not head[0].isdigit() or not head[1].isdigit():
                continue
            rank, i = int(head[0]), int(head[1])
            if rank in nxt:
                got += 1
                in_order = in_order and i == nxt[rank]
                nxt[rank] = i + 1
    return got, in_order


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--mb", type=int, default=100, help="MB each rank prints")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--shape",
        choices=("lines", "bulk"),
        default="lines",
        help="a print a line, or 100 KB a write",
    )
    ap.add_argument(
        "--before", metavar="DIR", help="another xl to time alongside (DIR/xl is its package)"
    )
    ns = ap.parse_args()
    n = ns.mb * 1_000_000 // LINE
    with tempfile.TemporaryDirectory(prefix="xl-bench-out-") as tmp:
        script = Path(tmp) / "chatty.py"
        script.write_text(SCRIPT)
        env = dict(os.environ, XL_HOME=str(Path(tmp) / "home"))
        env.pop("CUDA_VISIBLE_DEVICES", None)
        xl = [
            sys.executable,
            "-m",
            "xl",
            "launch",
            "--no-tui",
            "--nproc",
            str(ns.ranks),
            str(script),
            str(n),
            ns.shape,
        ]
        torchrun = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(ns.ranks),
            str(script),
            str(n),
            ns.shape,
        ]
        runs: dict[str, tuple[list[str], dict[str, str]]] = {
            "torchrun": (torchrun, env),
            "xl": (xl, env),
        }
        if ns.before:
            runs["xl (before)"] = (xl, dict(env, PYTHONPATH=os.path.abspath(ns.before)))
        out = Path(tmp) / "out.txt"
        times: dict[str, list[float]] = {name: [] for name in runs}
        loads: list[float] = []
        cpus: dict[str, list[float]] = {name: [] for name in runs}
        counts: dict[str, list[tuple[int, bool]]] = {
            name: [] for name in runs if name != "torchrun"
        }
        _time(torchrun, env, tmp, out)  # warm the page cache
        for i in range(ns.repeat):
            # each in each position alike
            for name, (argv, run_env) in in_round(list(runs.items()), i):
                loads.append(os.getloadavg()[0])  # the machine's load as each run starts
                wall, cpu = _time(argv, run_env, tmp, out)
                times[name].append(wall)
                cpus[name].append(cpu)
                if name in counts:
                    counts[name].append(count_lines(out, ns.ranks))
    anchor = times["torchrun"]
    print(
        f"{ns.ranks} rank(s) x {ns.mb} MB of {LINE}-byte lines ({ns.shape}), stdout into a file;"
        f" {ns.repeat} rounds;"
        f" load {os.getloadavg()[0]:.1f} at the end"
    )
    print(
        f"load (1-minute average) as the runs started: median {statistics.median(loads):.1f},"
        f" {min(loads):.1f} to {max(loads):.1f}"
    )
    for name, ts in times.items():
        line = (
            f"{name:12}: median {statistics.median(ts):.2f}s  ({', '.join(f'{t:.2f}' for t in ts)})"
        )
        if name != "torchrun":
            ratios = [x / t for x, t in zip(ts, anchor, strict=True)]
            low, high = bootstrap(ratios)
            line += (
                f"  ratio {statistics.median(ts) / statistics.median(anchor):.3f}x,"
                f" paired {statistics.median(ratios):.3f}x [95% {low:.3f}-{high:.3f}]"
            )
            got = ", ".join(
                f"{c}{'' if ok else ' (gaps or out of order)'}" for c, ok in counts[name]
            )
            line += f"\n{'':14}lines in its output file: {got} of {n * ns.ranks}"
        print(line)
    for name, cs in cpus.items():
        line = f"{name:12}: CPU median {statistics.median(cs):.2f}s"
        if name != "torchrun":
            ratios = [x / t for x, t in zip(cs, cpus["torchrun"], strict=True)]
            low, high = bootstrap(ratios)
            line += f"  paired {statistics.median(ratios):.3f}x [95% {low:.3f}-{high:.3f}]"
        print(line)
    print("goal: xl <= 1.05x torchrun, every line in the file, in order")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
