"""What `xl stacks` costs: the time to get 8 ranks' stacks, and a step's cost while nobody asks.

    .venv/bin/python bench/bench_stacks.py [--ranks 8] [--asks 10] [--pairs 4] [--steps 3000]
    .venv/bin/python bench/bench_stacks.py --read REV [--read-ranks 4096] [--rounds 8]

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
3. Reading (``--read REV``: this part alone). The CPU to read a stacks document of
   ``--read-ranks`` ranks and judge it, as node 0 does with every rank's answer: ``json.loads``,
   the entries read into their values (where this tree has them) and the verdict, in a process
   of this tree and one of REV's package (bench_reader.unpack) that take turns, the order turning
   each round; each process reports its median of 7. Two documents: ``fr``, every rank with its
   Flight Recorder's 8 newest entries (shapes, start times) and its main thread in a DDP step,
   and ``sim``, the answers bench_scale's simulated nodes send (two collectives, no shapes).
   Rank 1 is elsewhere, the others wait for it in all-reduce #12. Prints each tree's medians
   and the median of the rounds' ratios with a bootstrap 95% interval.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from procs import XL, kill_run, wait_ranks_running, xl, xl_env  # noqa: E402
from rounds import bootstrap  # noqa: E402
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


# Run in each tree's process (its package first on PYTHONPATH): a median of 7 of the CPU to read
# and judge the document at argv[1]; this tree's typed values, or the dicts an earlier tree judged.
READER = """
import json, statistics, sys, time
text = open(sys.argv[1]).read()
try:
    from xl.launcher.stacks.model import RankStacks
    from xl.launcher.stacks.verdict import verdict
    def judge(doc):
        return verdict([RankStacks.from_json(e) for e in doc["ranks"]]).message
except ImportError:
    from xl.launcher.telemetry.verdict import verdict
    def judge(doc):
        return verdict(doc["ranks"])["message"]
took = []
for _ in range(7):
    t0 = time.process_time()
    said = judge(json.loads(text))
    took.append(time.process_time() - t0)
print(statistics.median(took) * 1e3)
print(said)
"""
_PY = "/opt/venv/lib/python3.11/"
_TORCH = _PY + "site-packages/torch/"


def _entry(rank: int, shape: str) -> dict[str, object]:
    """A rank's answer as the rank sends it: waiting in all-reduce #12 (rank 1: in its own code)."""
    wait = rank != 1
    code = [("<frozen runpy>", 88, "_run_code"), ("/work/proj/train.py", 120, "<module>"),
        ("/work/proj/train.py", 97, "main"), ("/work/proj/train.py", 61, "train_step")]
    code += [(_TORCH + "nn/parallel/distributed.py", 1637, "forward"),
        (_TORCH + "distributed/c10d_logger.py", 81, "wrapper"),
        (_TORCH + "distributed/distributed_c10d.py", 2806, "all_reduce")] if wait else [
        ("/work/proj/train.py", 44, "load_batch")]  # fmt: skip
    frames = [{"file": f, "line": n, "function": fn} for f, n, fn in code]
    sender = [{"file": _PY + "threading.py", "line": n, "function": fn}
        for n, fn in ((1002, "_bootstrap"), (331, "wait"))]  # fmt: skip
    if shape == "sim":
        colls: list[dict[str, object]] = [
            {"pg": "0", "seq": s, "op": "allreduce", "state": "completed"} for s in (11,)
        ] + ([{"pg": "0", "seq": 12, "op": "allreduce", "state": "scheduled"}] if wait else [])
    else:
        sizes = [[1024, 1024]]
        colls = [
            {"pg": "default_pg", "seq": s, "op": "allreduce",
             "state": "scheduled" if s == 12 else "completed", "pg_id": "0", "in": sizes,
             "out": sizes, "t": round(1765100000.0 + s + rank / 1e4, 3)}
            for s in range(5 if wait else 4, 13 if wait else 12)
        ]  # fmt: skip
    threads = [{"name": "MainThread", "frames": frames}, {"name": "xl-log", "frames": sender}]
    return {"rank": rank, "node": f"node-{rank // 8}", "pid": 4000 + rank, "threads": threads,
        "collectives": colls}  # fmt: skip


def _judged(python_path: str | None, doc: Path) -> tuple[float, str]:
    env = dict(os.environ)
    if python_path is not None:
        env["PYTHONPATH"] = python_path
    out = subprocess.run(
        [sys.executable, "-c", READER, str(doc)],
        capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), timeout=600,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"the reader failed: {out.stderr.strip()[-400:]}")
    ms, said = out.stdout.split("\n", 1)
    return float(ms), said.strip()


def read(args: argparse.Namespace, tmp: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_reader import unpack  # noqa: PLC0415 - a bench module beside this one

    (tmp / "rev").mkdir()
    pkg = str(unpack(args.read, tmp / "rev"))
    for shape in ("fr", "sim"):
        doc = tmp / f"{shape}.json"
        entries = [_entry(r, shape) for r in range(args.read_ranks)]
        doc.write_text(json.dumps({"run_id": "bench", "t": 1765100100.0, "ranks": entries}))
        got: dict[str, list[float]] = {"this": [], "rev": []}
        told: dict[str, str] = {}
        for i in range(args.rounds):
            for side in ("this", "rev") if i % 2 == 0 else ("rev", "this"):
                ms, told[side] = _judged(None if side == "this" else pkg, doc)
                got[side].append(ms)
        ours, theirs = got["this"], got["rev"]
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        lo, hi = bootstrap(ratios)
        print(
            f"reading + verdict, {args.read_ranks} ranks, {shape}: this tree "
            f"{statistics.median(ours):.1f} ms, {args.read} {statistics.median(theirs):.1f} ms "
            f"(CPU, medians of {args.rounds} rounds); this / {args.read}: "
            f"{statistics.median(ratios):.3f}x [{lo:.3f}, {hi:.3f}]; load {os.getloadavg()[0]:.1f}"
        )
        same = "the same in both" if told["this"] == told["rev"] else f"{args.read}'s differs"
        print(f"  verdict ({same}): {told['this'][:160]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--asks", type=int, default=10)
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--read", metavar="REV", help="time reading + the verdict against REV alone")
    p.add_argument("--read-ranks", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.read:
            read(args, Path(tmp))
            return 0
        ask(args, Path(tmp))
        idle(args, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
