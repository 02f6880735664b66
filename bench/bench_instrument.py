"""What torch's step hooks cost: a plain DDP loop's step time under `xl launch` with them vs
`xl launch --no-instrument`, and the hooks' own cost per step in microseconds.

    .venv/bin/python bench/bench_instrument.py [--pairs 8] [--steps 600] [--skip 100] [--width 384]
    .venv/bin/python bench/bench_instrument.py --before 6ed9b41 --pairs 10 --width 720
    .venv/bin/python bench/bench_instrument.py --micro-only
    .venv/bin/python bench/bench_instrument.py --toggle 50 --block-pairs 400 --width 700

1. Launch pairs. Both sides run the same plain script (2 CPU ranks, gloo DDP, a DataLoader, a
   ~10 ms step at the default width on a quiet 2-core machine) under the real `xl launch --no-tui`;
   the only difference is `--no-instrument`. The script never calls xl: it timestamps each step
   itself and writes rank 0's steady-state mean step (after ``--skip`` warm-up steps) to a file.
   Runs come in pairs, A B then B A; each pair gives one ratio instrumented/not; the answer is
   the median ratio with a bootstrap 95% CI (bench_overhead.median_ci). Goal: +1% at most.
   ``--before COMMIT`` adds a third side in every round: the same launch with the hooks of that
   commit (its tree from ``git archive``, put first on PYTHONPATH), so a change is measured
   against the code before it in the same rounds; the sides' order rotates round by round.
   ``--pin`` puts each rank on a core of its own. Besides the step, each side's rank 0 says its
   training thread's CPU, its time waiting on a run queue and its involuntary switches, and the
   whole machine's busy CPU, a step.
   ``--toggle STEPS`` instead: one instrumented launch (2 ranks) whose script takes xl's hooks
   out (torch's own functions back, from each wrapper's ``__wrapped__``; the optimizer's global
   step hooks cleared) and puts them back in alternating blocks of STEPS steps, on both ranks at
   the same step; the sender thread and the collector run all along. Each pair of blocks is one
   ratio on/off with no launch-to-launch spread in it (a 2-rank launch on 2 cores moves by +-10%
   run to run, more than the hooks cost); the answer is their median with a bootstrap 95% CI.
2. Micro. In this process, the same kind of step (a 3-layer MLP, a DataLoader batch, backward,
   SGD) with the hooks in place and without, in alternating blocks; the median per-block
   difference of the thread's CPU time is the hooks' cost per step on the training thread (the
   sender thread's reading is not in it: it runs four times a second, not per step).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# bench/ is sys.path[0] when run as a script
from bench_overhead import median_ci, mlp, pct, step_cpu_s

REPO = Path(__file__).resolve().parent.parent

# Both launch scripts' model, data and per-thread CPU reading.
_SETUP = """
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(
        nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)
    )
)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(steps * 32, width)
loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=32)
def cpu_by_thread():
    # Each thread's CPU seconds, seconds waiting on a run queue (schedstat) and involuntary
    # context switches, by its Python name: MainThread, xl-log (the sender).
    names = {t.native_id: t.name for t in threading.enumerate()}
    got = {}
    for tid in os.listdir("/proc/self/task"):
        name = names.get(int(tid), tid)
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as fh:
                fields = fh.read().split()
            with open(f"/proc/self/task/{tid}/status") as fh:
                switches = [l for l in fh if l.startswith("nonvoluntary_ctxt_switches")]
        except (OSError, ValueError, IndexError):
            continue
        got[name] = int(fields[0]) / 1e9
        got[name + ":queued"] = int(fields[1]) / 1e9
        if switches:
            got[name + ":preempted"] = float(switches[0].split()[1])
    with open("/proc/stat") as fh:  # the whole machine's busy CPU (every process, both cores)
        ticks = [int(v) for v in fh.readline().split()[1:]]
    got["machine"] = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    return got
"""

SCRIPT = """
import os, sys, time, json, threading
import torch, torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
steps, skip, width, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if os.environ.get("XL_BENCH_PIN"):  # each rank on a core of its own (--pin)
    os.sched_setaffinity(0, {int(os.environ["LOCAL_RANK"]) % os.cpu_count()})
""" + _SETUP + """
marks = []
for i, (xb, yb) in enumerate(loader):
    if i == skip + 1:
        cpu0 = cpu_by_thread()
    loss = nn.functional.mse_loss(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    marks.append(time.perf_counter())
    if i % 100 == 0 and rank == 0:
        print(f"step {i} loss {loss.item():.3f}", flush=True)
cpu1 = cpu_by_thread()
if rank == 0:
    window = marks[skip:]
    n = len(window) - 1
    cpu = {k: (v - cpu0.get(k, 0.0)) / n for k, v in cpu1.items()
           if k.split(":")[0] in ("MainThread", "xl-log", "machine")}
    with open(out, "w") as fh:
        json.dump({"mean_step_s": (window[-1] - window[0]) / n, "cpu_per_step_s": cpu}, fh)
dist.barrier()
dist.destroy_process_group()
"""

TOGGLE_SCRIPT = """
import os, sys, time, json, threading
import torch, torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import torch.utils.data.dataloader as dataloader
from torch.amp import grad_scaler
from torch.optim import optimizer as optim
steps, skip, width, out, block = (
    int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
if not getattr(torch, "_xl_steps", False):
    sys.exit("torch is not instrumented: run this under xl launch without --no-instrument")
# xl's patches as the rank entry put them in, and torch's own functions under them (each
# wrapper keeps its original as __wrapped__); the optimizer's global step hooks are xl's only.
PATCHED = [(torch.autograd, "backward"), (nn.Module, "__call__"),
           (dataloader._BaseDataLoaderIter, "__next__"),
           (torch._C._distributed_c10d.Work, "wait"),
           (grad_scaler.GradScaler, "scale"), (grad_scaler.GradScaler, "step")]
hooked = {key: getattr(*key) for key in PATCHED}
plain = {key: getattr(fn, "__wrapped__", fn) for key, fn in hooked.items()}
assert all(hooked[key] is not plain[key] for key in PATCHED), "a patch is missing"
global_hooks = [(optim._global_optimizer_pre_hooks, dict(optim._global_optimizer_pre_hooks)),
                (optim._global_optimizer_post_hooks, dict(optim._global_optimizer_post_hooks))]
def hooks(on):
    for key in PATCHED:
        setattr(*key, (hooked if on else plain)[key])
    for table, saved in global_hooks:
        table.clear()
        if on:
            table.update(saved)
""" + _SETUP + """
blocks = []  # (on, seconds a step, training thread CPU a step, sender CPU a step)
mark = None
for i, (xb, yb) in enumerate(loader):
    if i >= skip and (i - skip) % block == 0:
        # Pairs of blocks, on then off, then off then on: the same step on both ranks.
        k = (i - skip) // block
        on = (k % 2 == 0) == ((k // 2) % 2 == 0)
        now, got = time.perf_counter(), cpu_by_thread()
        if mark is not None:
            blocks.append((mark[0], (now - mark[1]) / block,
                           (got["MainThread"] - mark[2]["MainThread"]) / block,
                           (got.get("xl-log", 0.0) - mark[2].get("xl-log", 0.0)) / block))
        hooks(on)
        mark = (on, time.perf_counter(), cpu_by_thread())
    loss = nn.functional.mse_loss(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
hooks(True)
if rank == 0:
    with open(out, "w") as fh:
        json.dump({"blocks": blocks}, fh)
dist.barrier()
dist.destroy_process_group()
"""


def checkout(commit: str, into: Path) -> Path:
    """The repo's tree at ``commit`` under ``into``, importable as ``xl`` from PYTHONPATH (the
    editable install maps xl.launcher etc. to top-level folders: links put them under xl/)."""
    root = into / "before"
    root.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit],
        capture_output=True,
        timeout=120,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, timeout=120, check=True)
    for name in ("launcher", "doctor", "tui", "examples"):
        if (root / name).is_dir() and not (root / "xl" / name).exists():
            (root / "xl" / name).symlink_to(root / name)
    return root


def run_once(side: str, args: argparse.Namespace, tmp: Path, n: int) -> float:
    """One launch; ``side``: "on" (this tree's hooks), "before" (--before's), "off"."""
    script = tmp / "plain_loop.py"
    if not script.exists():
        script.write_text(SCRIPT)
    out = tmp / f"step-{n}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", XL_HOME=str(tmp / "home"), XL_STOP_GRACE="1")
    for key in ("XL_COLLECTOR", "XL_TOKEN", "XL_RUN_DIR", "XL_RUN_ID", "XL_INSTRUMENT"):
        env.pop(key, None)
    if args.pin:
        env["XL_BENCH_PIN"] = "1"
    if side == "before":
        env["PYTHONPATH"] = str(tmp / "before")
    argv = [sys.executable, "-m", "xl", "launch", "--nproc", "2", "--no-tui"]
    if side == "off":
        argv.append("--no-instrument")
    argv += ["--", str(script), str(args.steps), str(args.skip), str(args.width), str(out)]
    proc = subprocess.run(argv, env=env, cwd=tmp, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"run {n} failed: {proc.stderr[-1500:]}")
    got = json.loads(out.read_text())
    CPU[side].append(got.get("cpu_per_step_s", {}))
    return float(got["mean_step_s"])


# Rank 0's CPU per step by thread (training thread, sender), per side, run by run.
CPU: dict[str, list[dict[str, float]]] = {"on": [], "off": [], "before": []}


def _thread_cpu_us(side: str, thread: str) -> float | None:
    values = [run[thread] * 1e6 for run in CPU[side] if thread in run]
    return round(statistics.median(values), 1) if values else None


def launch_pairs(args: argparse.Namespace) -> dict[str, object]:
    sides = ["on", "off"] + (["before"] if args.before else [])
    steps: dict[str, list[float]] = {side: [] for side in sides}
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="xl-bench-instrument-") as name:
        tmp = Path(name)
        if args.before:
            checkout(args.before, tmp)
        for i in range(args.pairs):
            k = i % len(sides)
            order = sides[k:] + sides[:k]
            if i % 2:
                order.reverse()
            for j, side in enumerate(order):
                steps[side].append(run_once(side, args, tmp, len(sides) * i + j))
            loads.append(os.getloadavg()[0])
            got = {side: steps[side][-1] for side in sides}
            print(
                f"round {i + 1} (load {loads[-1]:.1f}): "
                + ", ".join(f"{side} {got[side] * 1e3:.2f} ms" for side in sides)
                + f"; on/off {pct(got['on'] / got['off'])}"
                + (f", before/off {pct(got['before'] / got['off'])}" if args.before else ""),
                flush=True,
            )
    figures: dict[str, object] = {
        "pairs": args.pairs,
        "load_1min": [
            round(min(loads), 1),
            round(statistics.median(loads), 1),
            round(max(loads), 1),
        ],
    }
    for side in sides:
        figures[f"step_ms_{side}"] = round(statistics.median(steps[side]) * 1e3, 3)
    compared = [("on", "off")] + ([("before", "off"), ("on", "before")] if args.before else [])
    for a, b in compared:
        ratios = [x / y for x, y in zip(steps[a], steps[b], strict=True)]
        lo, hi = median_ci(ratios)
        med = statistics.median(ratios)
        figures[f"{a}/{b}"] = {"median": round(med, 4), "ci95": [round(lo, 4), round(hi, 4)]}
        print(f"step time, {a} / {b}: median {pct(med)} (95% CI {pct(lo)} .. {pct(hi)})")
    print(
        "steps (medians): "
        + ", ".join(f"{side} {figures[f'step_ms_{side}']} ms" for side in sides)
        + f"; load {figures['load_1min']} (min, median, max)"
    )
    # CPU time is far less moved by other processes than the wall clock: what each side's rank 0
    # spent per step on its training thread and on its sender thread (none under off).
    for side in sides:
        for thread, key in (("MainThread", "train_thread"), ("xl-log", "sender_thread")):
            figures[f"{key}_cpu_us_{side}"] = _thread_cpu_us(side, thread)
        print(
            f"rank 0's CPU per step, {side}: training thread "
            f"{figures[f'train_thread_cpu_us_{side}']} us, "
            f"sender thread {figures[f'sender_thread_cpu_us_{side}']} us"
        )
    # The same round's runs paired: the training thread's extra CPU per step against off, and
    # the sender's against the commit before.
    pairs = [("MainThread", "on", "off")]
    # Where the rest goes: rank 0's training thread's time waiting on a run queue and its
    # involuntary switches (another process took its core), and the whole machine's busy CPU
    # (both ranks, the sender threads, xl's supervisor and collector, everything else).
    for key, unit, scale in (
        ("MainThread:queued", "us", 1e6),
        ("MainThread:preempted", "per 100 steps", 100.0),
        ("machine", "us of CPU", 1e6),
    ):
        for side in sides:
            values = [run[key] * scale for run in CPU[side] if key in run]
            if values:
                figures[f"{key}_{side}"] = round(statistics.median(values), 2)
        diffs = [
            (x[key] - y[key]) * scale
            for x, y in zip(CPU["on"], CPU["off"], strict=True)
            if key in x and key in y
        ]
        if len(diffs) >= 2:
            lo, hi = median_ci(diffs)
            med = statistics.median(diffs)
            ci = [round(lo, 2), round(hi, 2)]
            figures[f"{key}_on-off"] = {"median": round(med, 2), "ci95": ci}
            print(
                f"{key} a step ({unit}): on {figures.get(f'{key}_on')}, off "
                f"{figures.get(f'{key}_off')}; on - off median {med:+.2f} "
                f"(95% CI {lo:+.2f} .. {hi:+.2f})"
            )
    if args.before:
        pairs += [("MainThread", "before", "off"), ("xl-log", "on", "before")]
    for thread, a, b in pairs:
        diffs = [
            (x[thread] - y[thread]) * 1e6
            for x, y in zip(CPU[a], CPU[b], strict=True)
            if thread in x and thread in y
        ]
        if len(diffs) < 2:
            continue
        lo, hi = median_ci(diffs)
        med = statistics.median(diffs)
        figures[f"cpu_us_{thread}_{a}-{b}"] = {
            "median": round(med, 1),
            "ci95": [round(lo, 1), round(hi, 1)],
        }
        print(
            f"{thread} CPU per step, {a} - {b}: median {med:+.1f} us "
            f"(95% CI {lo:+.1f} .. {hi:+.1f})"
        )
    return figures


def toggled(args: argparse.Namespace) -> dict[str, object]:
    """One instrumented launch whose script takes xl's hooks out and puts them back in
    alternating blocks of steps (the sender thread and the collector running all along): each
    pair of blocks one ratio, on/off, with no launch-to-launch spread in it."""
    with tempfile.TemporaryDirectory(prefix="xl-bench-instrument-") as name:
        tmp = Path(name)
        script = tmp / "toggle_loop.py"
        script.write_text(TOGGLE_SCRIPT)
        out = tmp / "blocks.json"
        env = dict(os.environ, OMP_NUM_THREADS="1", XL_HOME=str(tmp / "home"), XL_STOP_GRACE="1")
        for key in ("XL_COLLECTOR", "XL_TOKEN", "XL_RUN_DIR", "XL_RUN_ID", "XL_INSTRUMENT"):
            env.pop(key, None)
        if args.before:  # that commit's xl launches and hooks the ranks
            env["PYTHONPATH"] = str(checkout(args.before, tmp))
        steps = args.skip + 2 * args.toggle * args.block_pairs + 1
        argv = [sys.executable, "-m", "xl", "launch", "--nproc", "2", "--no-tui", "--",
                str(script), str(steps), str(args.skip), str(args.width), str(out),
                str(args.toggle)]
        load0 = os.getloadavg()[0]
        proc = subprocess.run(
            argv, env=env, cwd=tmp, capture_output=True, text=True, timeout=3600
        )
        if proc.returncode != 0 or not out.exists():
            raise SystemExit(f"the toggled launch failed: {proc.stderr[-1500:]}")
        blocks = json.loads(out.read_text())["blocks"]
    pairs = [(a, b) if a[0] else (b, a) for a, b in zip(blocks[::2], blocks[1::2], strict=False)]
    ratios = [on[1] / off[1] for on, off in pairs]
    cpu = [(on[2] - off[2]) * 1e6 for on, off in pairs]
    sender = [(on[3] - off[3]) * 1e6 for on, off in pairs]
    figures: dict[str, object] = {
        "hooks": args.before or "this tree",
        "block_steps": args.toggle,
        "pairs": len(pairs),
        "load_1min": [round(load0, 1), round(os.getloadavg()[0], 1)],
        "step_ms_on": round(statistics.median(on[1] for on, _ in pairs) * 1e3, 3),
        "step_ms_off": round(statistics.median(off[1] for _, off in pairs) * 1e3, 3),
    }
    for key, values, unit in (
        ("on/off", ratios, "ratio"),
        ("train_thread_cpu_us_on-off", cpu, "us"),
        ("sender_cpu_us_on-off", sender, "us"),
    ):
        lo, hi = median_ci(values)
        med = statistics.median(values)
        figures[key] = {"median": round(med, 4), "ci95": [round(lo, 4), round(hi, 4)]}
        if unit == "ratio":
            print(f"step time, hooks on / off: median {pct(med)} (95% CI {pct(lo)} .. {pct(hi)})")
        else:
            print(f"{key}: median {med:+.1f} us (95% CI {lo:+.1f} .. {hi:+.1f})")
    print(
        f"{len(pairs)} pairs of {args.toggle}-step blocks; steps (medians): on "
        f"{figures['step_ms_on']} ms, off {figures['step_ms_off']} ms"
    )
    return figures


def micro(args: argparse.Namespace) -> dict[str, object]:
    import torch  # noqa: PLC0415 - only the micro benchmark needs torch in this process
    from torch.utils.data import DataLoader, TensorDataset  # noqa: PLC0415 - as above

    from xl.integrations import torchsteps  # noqa: PLC0415 - imports torch's hooks' module
    from xl.integrations.stepclock import StepClock  # noqa: PLC0415 - as above
    from xl.integrations.steplines import StepLines  # noqa: PLC0415 - as above

    torch.set_num_threads(1)
    model = mlp(16, args.micro_ddp)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4096 * 8, 16)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)

    def block(n: int) -> float:
        return step_cpu_s(model, opt, loader, n)

    block(200)
    diffs, ons, offs = [], [], []
    for i in range(args.blocks):
        clock = StepClock()
        unhook = torchsteps.hook(torch, clock)
        try:
            on = block(args.block_steps)
        finally:
            unhook()
        StepLines(clock).collect()
        off = block(args.block_steps)
        ons.append(on)
        offs.append(off)
        diffs.append((on - off) * 1e6)
        if i % 10 == 9:
            print(
                f"micro block {i + 1}: hooks {on * 1e6:.1f} us, none {off * 1e6:.1f} us", flush=True
            )
    lo, hi = median_ci(diffs)
    med = statistics.median(diffs)
    # The least disturbed block of each side: on a busy machine the other load only ever adds.
    quiet = (min(ons) - min(offs)) * 1e6
    print(
        f"the hooks' cost per step on the training thread: median {med:.1f} us "
        f"(95% CI {lo:.1f} .. {hi:.1f}); "
        f"least-disturbed blocks {quiet:.1f} us of a {min(offs) * 1e6:.0f} us step"
    )
    return {
        "hook_us_per_step": round(med, 2),
        "hook_us_ci95": [round(lo, 2), round(hi, 2)],
        "hook_us_quietest": round(quiet, 2),
        "step_us_quietest": round(min(offs) * 1e6, 1),
        "blocks": len(diffs),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--pairs", type=int, default=8, help="A/B pairs of launches (each is one ratio)"
    )
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--skip", type=int, default=100, help="warm-up steps left out")
    ap.add_argument("--width", type=int, default=384, help="the MLP's width (sets the step time)")
    ap.add_argument("--blocks", type=int, default=60, help="micro: alternating blocks")
    ap.add_argument("--block-steps", type=int, default=100, help="micro: steps per block")
    ap.add_argument("--micro-only", action="store_true")
    ap.add_argument(
        "--toggle",
        type=int,
        metavar="STEPS",
        help="instead: one instrumented launch, hooks out and in, blocks of STEPS steps",
    )
    ap.add_argument("--block-pairs", type=int, default=100, help="--toggle: pairs of blocks")
    ap.add_argument("--pin", action="store_true", help="launch: pin each rank to a core of its own")
    ap.add_argument("--launch-only", action="store_true")
    ap.add_argument("--micro-ddp", action="store_true", help="micro: a one-rank gloo DDP model")
    ap.add_argument("--before", metavar="COMMIT", help="also launch with that commit's hooks")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    figures: dict[str, object] = {
        "cpu_count": os.cpu_count(),
        "load_1min": round(os.getloadavg()[0], 2),
    }
    if args.toggle:
        figures["toggled"] = toggled(args)
        print(json.dumps(figures))
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
        return 0
    if not args.launch_only:
        figures["micro"] = micro(args)
    if not args.micro_only:
        figures["launch"] = launch_pairs(args)
    print(json.dumps(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
