"""Node 0's own ranks for bench_scale.py: what torchrun would start there, without torch.

    python bench/scale_node0.py torchrun --nproc 8 --world N -- CMD...   (run.json's argv)
    python -m xl.launcher.entry bench/scale_node0.py rank --steps-per-s S  (each rank)

The real supervisor of node 0 starts run.json's argv as torchrun. Real torchrun cannot run here:
its c10d rendezvous waits for every node's agent, and the other nodes are simulated
(bench/scale_sim.py). This stands in for it on node 0 only: it starts ``--nproc`` real rank
processes with the environment torchrun gives them (RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK, ...)
running ``CMD`` (xl's real rank entry, ``-m xl.launcher.entry``: its relay, its stacks door, its
rank record), passes SIGTERM/SIGINT on to them, and exits as torchrun does (0 when every rank did).

Each rank (``rank``) trains as an instrumented script does: ``xl.log`` of step, loss, samples and
the phase times every step, a printed line every ``--log-every`` steps; it ends on SIGTERM. Once
the ``--block-flag`` file exists it waits as a rank of a hung job waits in its all-reduce: in
``all_reduce`` of the ``--shim`` file (bench_scale.py writes it under a ``torch/distributed``
folder, so a stacks capture sees this rank inside torch.distributed, as with a real all-reduce;
it is loaded from its path, never importable as ``torch``).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import subprocess
import sys
import time
from types import FrameType

# The all-reduce a blocked rank waits in (bench_scale.py writes it to .../torch/distributed/).
SHIM = """import os, time


def all_reduce(flag):
    while os.path.exists(flag):
        time.sleep(0.1)
"""


def torchrun(nproc: int, world: int, cmd: list[str]) -> int:
    procs: list[subprocess.Popen[bytes]] = []

    def forward(sig: int, _frame: FrameType | None) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for local in range(nproc):
        env = dict(os.environ)
        env.update(
            {
                "RANK": str(local),
                "LOCAL_RANK": str(local),
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(nproc),
                "GROUP_RANK": "0",
                "ROLE_RANK": str(local),
                "ROLE_WORLD_SIZE": str(world),
                "GROUP_WORLD_SIZE": str(world // nproc),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "1",
                "TORCHELASTIC_RESTART_COUNT": "0",
                "TORCHELASTIC_MAX_RESTARTS": "0",
                "TORCHELASTIC_RUN_ID": "xl-bench-scale",
            }
        )
        procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL))
    codes = []
    for p in procs:
        while True:
            try:
                codes.append(p.wait())
                break
            except InterruptedError:
                continue
    return 0 if all(c == 0 for c in codes) else 1


def rank(steps_per_s: float, log_every: int, block_flag: str | None, shim: str | None) -> int:
    import xl  # noqa: PLC0415 - only a rank logs

    wait = None
    if shim:
        import importlib.util  # noqa: PLC0415 - only a rank that may be told to hang

        spec = importlib.util.spec_from_file_location("xl_bench_allreduce", shim)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        wait = module.all_reduce
    step_s = 1.0 / steps_per_s
    me = int(os.environ.get("RANK", "0"))
    step = 0
    nxt = time.monotonic()
    while True:
        if wait is not None and block_flag and os.path.exists(block_flag):
            wait(block_flag)  # until SIGTERM
        step += 1
        data_s = 0.02 + 0.01 * random.random()
        comm_s = 0.08 + 0.02 * random.random()
        loss = 4.0 * math.exp(-step / 3000) + 0.05 * random.random()
        xl.log(step=step, loss=loss, samples=32, step_s=step_s, data_s=data_s,
               compute_s=step_s - data_s - comm_s - 0.01, comm_s=comm_s, other_s=0.01)
        if log_every and step % log_every == 0:
            print(
                f"rank {me} step {step} loss {loss:.4f} lr 3.0e-04 {step_s * 1000:.0f} ms/step",
                flush=True,
            )
        nxt += step_s
        time.sleep(max(0.0, nxt - time.monotonic()))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("torchrun")
    t.add_argument("--nproc", type=int, required=True)
    t.add_argument("--world", type=int, required=True)
    t.add_argument("cmd", nargs=argparse.REMAINDER)
    r = sub.add_parser("rank")
    r.add_argument("--steps-per-s", type=float, default=2.0)
    r.add_argument("--log-every", type=int, default=10)
    r.add_argument("--block-flag")
    r.add_argument("--shim")
    ns = ap.parse_args(argv)
    if ns.mode == "torchrun":
        cmd = ns.cmd[1:] if ns.cmd[:1] == ["--"] else ns.cmd
        return torchrun(ns.nproc, ns.world, cmd)
    return rank(ns.steps_per_s, ns.log_every, ns.block_flag, ns.shim)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
