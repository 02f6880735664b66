"""A run's end: from the last rank's exit to the command's, `xl launch --no-tui` vs plain torchrun.

    .venv/bin/python bench/bench_end.py [--script tqdm|eval|noop] [--repeat N] [--before DIR]

2 CPU ranks (gloo) run a script that trains a small DDP model for a few steps and ends; each rank
writes its pid and the time of its last line (after ``destroy_process_group``, the script's last
act), and from then on the bench watches its process. The end of a command is the time from the
last rank process's exit to the command's exit: torchrun's own teardown, and under xl the
supervisor's and the view's. The ranks' teardown (the last line to the process's exit: the
interpreter's, torch's and under xl the rank entry's) is printed beside it. Scripts:

- ``tqdm``: a tqdm progress bar over the steps (carriage returns on stderr, as a terminal gets
  them);
- ``eval``: the same, then an evaluation pass with its own bar and a printed metrics line;
- ``noop``: init, barrier, leave.

Commands take turns in each round, each in each position equally often (bench/rounds.py); both
draw the same rendezvous delay. Prints per command the median end, the median of the paired
differences xl - torchrun with a bootstrap 95% interval (goal: at most +0.3 s), and the wall time
ratio. Both commands' output goes to a file, as in a batch job.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rounds import bootstrap, in_round, round_env, same_delays

_BODY = """\
import os, sys, time
import torch, torch.distributed as dist
from tqdm import tqdm
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in tqdm(range(STEPS), desc=f"train r{rank}", mininterval=0):
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    time.sleep(0.005)
if EVAL:
    model.eval()
    total = 0.0
    with torch.no_grad():
        for _ in tqdm(range(STEPS), desc=f"eval r{rank}", mininterval=0):
            total += model(torch.randn(32, 64)).pow(2).mean().item()
    print(f"eval loss {total / STEPS:.4f}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""
_NOOP = """\
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""
_STAMP = """
with open(os.environ["BENCH_STAMPS"] + "-" + os.environ["RANK"], "w") as fh:
    fh.write(f"{os.getpid()} {time.time()}")
"""
SCRIPTS = {
    "tqdm": _BODY.replace("STEPS", "200").replace("EVAL", "False"),
    "eval": _BODY.replace("STEPS", "200").replace("EVAL", "True"),
    "noop": "import os, time\n" + _NOOP,
}


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return True
    # exited, not yet reaped
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X")


def _time(argv: list[str], env: dict[str, str], cwd: str, out: Path) -> tuple[float, float, float]:
    """(wall, end, teardown) in seconds: the command's wall time; from the last rank process's
    exit to the command's; from the last rank's last line to its process's exit. Each rank
    writes its pid and the time of its last line; from then on its process is looked at every
    10 ms (a read of /proc/PID/stat), which costs nothing before the end."""
    stamps = Path(cwd) / "stamps" / f"{time.monotonic_ns()}"
    stamps.parent.mkdir(exist_ok=True)
    exits: dict[int, float] = {}
    with open(out, "wb") as fh:
        t0 = time.time()
        c0 = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            env=dict(env, BENCH_STAMPS=str(stamps)),
            cwd=cwd,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
        marks: dict[int, float] = {}
        while proc.poll() is None:
            time.sleep(0.01)
            if len(marks) < 2:
                for path in stamps.parent.glob(stamps.name + "-*"):
                    with contextlib.suppress(ValueError):
                        pid, at = path.read_text().split()
                        marks[int(pid)] = float(at)
            for pid in marks:
                if pid not in exits and _gone(pid):
                    exits[pid] = time.time()
            if time.perf_counter() - c0 > 300:
                proc.kill()
        elapsed = time.perf_counter() - c0
    if proc.returncode != 0:
        raise SystemExit(
            f"{argv[:4]} failed ({proc.returncode}): {out.read_text(errors='replace')[-2000:]}"
        )
    if len(marks) != 2 or len(exits) != 2:
        raise SystemExit(
            f"{argv[:4]}: {len(marks)} of 2 ranks left their marks, {len(exits)} exits seen"
        )
    last_exit = max(exits.values())
    return elapsed, t0 + elapsed - last_exit, last_exit - max(marks.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--script", choices=sorted(SCRIPTS), default="eval")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument(
        "--before", metavar="DIR", help="another xl to time alongside (DIR/xl is its package)"
    )
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="xl-bench-end-") as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(SCRIPTS[ns.script] + _STAMP)
        env = dict(os.environ, XL_HOME=str(Path(tmp) / "home"), OMP_NUM_THREADS="1")
        env["CUDA_VISIBLE_DEVICES"] = ""
        # xl timed as an installed package runs (bench_launch.py)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        xl = [sys.executable, "-m", "xl", "launch", "--no-tui", "--nproc", "2", str(script)]
        torchrun = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            str(script),
        ]
        runs: dict[str, tuple[list[str], dict[str, str]]] = {
            "torchrun": (torchrun, env),
            "xl": (xl, env),
        }
        if ns.before:
            runs["xl (before)"] = (xl, dict(env, PYTHONPATH=os.path.abspath(ns.before)))
        runs = {
            name: (argv, same_delays(Path(tmp) / "same-delays", run_env))
            for name, (argv, run_env) in runs.items()
        }
        out = Path(tmp) / "out.txt"
        for argv, run_env in runs.values():
            _time(argv, run_env, tmp, out)  # warm the page cache and bytecode for each
        times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in runs}
        loads: list[float] = []
        for i in range(ns.repeat):
            for name, (argv, run_env) in in_round(list(runs.items()), i):
                loads.append(os.getloadavg()[0])  # the machine's load as each run starts
                times[name].append(_time(argv, round_env(run_env, i), tmp, out))
    anchor = times["torchrun"]
    print(
        f"script {ns.script}, 2 CPU ranks; {ns.repeat} rounds, alternating;"
        f" load {os.getloadavg()[0]:.1f} at the end"
    )
    print(
        f"load (1-minute average) as the runs started: median {statistics.median(loads):.1f},"
        f" {min(loads):.1f} to {max(loads):.1f}"
    )
    for name, rows in times.items():
        ends = [r[1] for r in rows]
        line = (
            f"{name:12}: end median {statistics.median(ends):.3f}s"
            f" ({', '.join(f'{e:.2f}' for e in ends)}),"
            f" wall median {statistics.median(r[0] for r in rows):.2f}s,"
            f" ranks' teardown median {statistics.median(r[2] for r in rows):.2f}s"
        )
        if name != "torchrun":
            diffs = [x[1] - t[1] for x, t in zip(rows, anchor, strict=True)]
            low, high = bootstrap(diffs)
            ratios = [x[0] / t[0] for x, t in zip(rows, anchor, strict=True)]
            rlow, rhigh = bootstrap(ratios)
            line += (
                f"\n{'':14}end - torchrun's, paired median {statistics.median(diffs):+.3f}s"
                f" [95% {low:+.3f} to {high:+.3f}];"
                f" wall paired {statistics.median(ratios):.3f}x [95% {rlow:.3f}-{rhigh:.3f}]"
            )
        print(line)
    print("goal: xl's end at most torchrun's + 0.3 s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
