"""A gloo CPU run in which one rank goes astray at step --at (for the stacks tests).

--mode sleep    : rank --rank sleeps outside any collective (its peers wait in all_reduce)
--mode regex    : rank --rank parses a record with a catastrophically backtracking regex (in
                  parse_record): C code holding the GIL
--mode busy     : rank --rank spins in a pure-Python loop
--mode bcast    : rank --rank calls broadcast where its peers call all_reduce
--mode none     : nobody goes astray; the run trains --steps steps and ends
--mode slow     : nobody goes astray, but rank --rank computes --slow-s longer every step
--mode eval     : rank --rank computes for --eval-s at step --at (an evaluation), then trains on
--rank -1       : the rank astray is the one whose environment has HANG_HERE=1
--bcast-each    : every step begins with a broadcast from rank 0 (two collectives a step)
Every rank prints "ready" after its first all_reduce and logs each step with xl.log.
"""

from __future__ import annotations

import argparse
import os
import re
import time

import torch
import torch.distributed as dist

import xl


def parse_record(line: str) -> bool:
    # exponential on "aaa...b": holds the GIL for hours
    return re.match(r"(a+)+$", line) is not None


def compute(seconds: float) -> None:
    end = time.monotonic() + seconds
    x = torch.ones(64, 64)
    while time.monotonic() < end:
        x = x @ x / 64


def astray(mode: str) -> None:
    if mode == "sleep":
        time.sleep(3600)
    elif mode == "regex":
        parse_record("a" * 64 + "b")
    elif mode == "busy":
        n = 0
        while True:
            n += 1


def here(rank: int, astray_rank: int) -> bool:
    """--rank -1: the rank of the node launched with HANG_HERE=1 (multi-node numbers vary)."""
    return os.environ.get("HANG_HERE") == "1" if astray_rank < 0 else rank == astray_rank


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="sleep")
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--at", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--step-s", type=float, default=0.05)
    ap.add_argument("--slow-s", type=float, default=0.3)
    ap.add_argument("--eval-s", type=float, default=10.0)
    ap.add_argument("--bcast-each", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(8)
    dist.all_reduce(t)
    print("ready", flush=True)
    for step in range(1, args.steps + 1):
        if args.bcast_each:
            dist.broadcast(t, 0)
        if args.mode == "slow" and here(rank, args.rank):
            compute(args.slow_s)
        elif args.mode == "eval" and step == args.at and here(rank, args.rank):
            print(f"rank {rank} evaluates", flush=True)
            compute(args.eval_s)
        elif step == args.at and here(rank, args.rank) and args.mode != "none":
            print(f"rank {rank} goes astray ({args.mode})", flush=True)
            if args.mode == "bcast":
                dist.broadcast(t, 0)
            else:
                astray(args.mode)
        dist.all_reduce(t)
        xl.log(step=step, loss=1.0 / step)
        time.sleep(args.step_s)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
