"""What runs inside each rank that bench/bench_overhead.py launches (written out as scripts).

``DRIVER`` wraps examples/train.py to time its steps and read CPU times; ``AB_DRIVER`` runs two
replicas of its model side by side, one watched by xl and one plain. Both pick CUDA + NCCL when
the bench runs with ``--gpu`` (BENCH_GPU=1; train.py itself uses CUDA whenever it is there).
"""

from __future__ import annotations

# Runs inside each rank. It wraps xl.log (train.py looks it up on every call) to stamp the
# end of each step; at step ``skip`` and at the last step it reads CPU times, so every CPU
# number covers exactly the steady window of the step times.
DRIVER = r"""
import json, os, runpy, statistics, sys, time
import psutil
import xl

SKIP = int(os.environ["BENCH_SKIP"])
BENCH_PID = int(os.environ["BENCH_PID"])
stamps = []
snaps = {}

def tree():
    # The launch tree: the ancestor of this rank that the bench started, and all below it.
    me = psutil.Process()
    chain = [me]
    while chain[-1].ppid() not in (BENCH_PID, 0, 1):
        chain.append(chain[-1].parent())
    root = chain[-1]
    roles = {me.pid: "rank"}
    names = ["torchrun agent", "xl supervisor", "xl launch (view)"]
    for proc, name in zip(chain[1:], names):
        roles[proc.pid] = name
    out = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        role = roles.get(proc.pid)
        if role is None:
            role = "rank" if proc.ppid() == chain[1].pid else "other"
        out[f"{role}:{proc.pid}"] = t.user + t.system
    return out

def sender_cpu():
    sender = getattr(sys.modules.get("xl.client"), "_sender", None)
    if sender is None or sender.thread.native_id is None:
        return 0.0
    for th in psutil.Process().threads():
        if th.id == sender.thread.native_id:
            return th.user_time + th.system_time
    return 0.0

def snap():
    return {"process": time.process_time(), "main": time.thread_time(), "sender": sender_cpu(),
            "tree": tree() if os.environ.get("RANK", "0") == "0" else {}}

real_log = xl.log
def timed_log(*a, **kw):
    stamps.append(time.perf_counter())
    if len(stamps) == SKIP:
        snaps["start"] = snap()
    elif kw.get("step") is not None and kw.get("step") == kw.get("total_steps"):
        snaps["end"] = snap()
    real_log(*a, **kw)

xl.log = timed_log
if os.environ.get("BENCH_NO_WATCH"):
    xl.watch = lambda model, *a, **k: model
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    end = snaps.get("end") or snap()
    steady = stamps[SKIP - 1:]
    steps = [b - a for a, b in zip(steady, steady[1:])]
    start = snaps.get("start")
    n = len(steps)
    rep = {"steps": n, "median_step_s": statistics.median(steps) if steps else None,
           "mean_step_s": (steady[-1] - steady[0]) / n if n else None}
    if start and n:
        for key in ("process", "main", "sender"):
            rep[f"{key}_cpu_per_step_s"] = (end[key] - start[key]) / n
        rep["tree_cpu_per_step_s"] = {
            k: (v - start["tree"].get(k, 0.0)) / n for k, v in end["tree"].items()
        }
    name = f"rank-{os.environ.get('RANK', '0')}-{os.getpid()}.json"
    path = os.path.join(os.environ["BENCH_OUT"], name)
    with open(path, "w") as fh:
        json.dump(rep, fh)
"""

# Runs inside each rank of one `xl launch`: two replicas of the example's model under DDP on
# the same process group, one as the example has it under xl (xl.watch's comm hook, xl.log
# every step), one as under plain torchrun (DDP's built-in all-reduce, no xl.log). Their steps
# alternate (A B B A ...), so each pair of neighbouring steps sees the same machine load, and
# the per-pair ratio isolates what monitoring adds to the rank's critical path. Work per step
# is train.py's own (model_for, batch, AdamW, loss), imported from the example.
AB_DRIVER = r"""
import json, os, runpy, sys, time
import torch, torch.distributed as dist
from torch import nn
import xl

from xl import client
assert client.active(), "the A/B driver must run under xl launch"
ex = runpy.run_path(sys.argv[1], run_name="bench")
steps, width, batch = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if os.environ.get("BENCH_GPU"):
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
else:
    dev = torch.device("cpu")
if dev.type == "cuda":
    torch.cuda.set_device(dev)
dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
rank = dist.get_rank()
torch.manual_seed(0)
teacher = ex["model_for"](64).to(dev).eval()
gen = torch.Generator(device=dev).manual_seed(1000 + rank)

def replica(watched):
    torch.manual_seed(0)
    ids = [dev.index] if dev.type == "cuda" else None
    model = nn.parallel.DistributedDataParallel(ex["model_for"](width).to(dev), device_ids=ids)
    if watched:
        xl.watch(model)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3)

sides = {"xl": replica(True), "plain": replica(False)}

def step(side, i):
    model, opt = sides[side]
    x = torch.randn(batch, 128, generator=gen, device=dev)
    with torch.no_grad():
        y = teacher(x).argmax(dim=1)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    value = float(loss.detach())
    if side == "xl":
        xl.log(step=i, loss=value, samples=batch, total_steps=steps)

times = {"xl": [], "plain": []}
clock = time.perf_counter
for i in range(steps):
    order = ("xl", "plain") if i % 2 == 0 else ("plain", "xl")
    for side in order:
        dist.barrier()  # both ranks start the step together: the time is this step's alone
        t0 = clock()
        step(side, i)
        times[side].append(clock() - t0)
skip = int(os.environ["BENCH_SKIP"])
with open(os.path.join(os.environ["BENCH_OUT"], f"ab-rank-{rank}.json"), "w") as fh:
    json.dump({k: v[skip:] for k, v in times.items()}, fh)
dist.barrier()
dist.destroy_process_group()
"""
