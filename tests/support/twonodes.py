"""Two xl "nodes" on one machine, for tests/e2e/test_multinode_*.py.

Two `xl launch --nnodes 2 --node-rank 0|1 --rdzv ...` on localhost, one CPU/gloo rank each by
default, torchrun's c10d rendezvous at the --rdzv address, the training script SCRIPT (its
behaviour set by MN_* variables). Under c10d torch numbers nodes in the order they join, so which
node's rank is global rank 0 varies from run to run: the helpers take each node's global ranks
from that node's own run dir, and the assertions check what must hold whatever the order.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from procs import XL, kill_run, rdzv_port, run_json, xl_env

SCRIPT = '''
import os, time
import torch
import torch.distributed as dist
import xl

rank, world = int(os.environ["RANK"]), int(os.environ.get("MN_WORLD", "2"))
assert int(os.environ["WORLD_SIZE"]) == world, "WORLD_SIZE=" + os.environ["WORLD_SIZE"]
dist.init_process_group("gloo")
assert dist.get_rank() == rank and dist.get_world_size() == world
mode = os.environ.get("MN_MODE", "")
fail = os.environ.get("MN_FAIL") == "1"  # set on one xl node: its rank fails
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
assert total.item() == world * (world + 1) / 2, total
print(f"rank {rank} of {dist.get_world_size()} node {os.environ['GROUP_RANK']}: "
      f"all_reduce sum {total.item():g}", flush=True)
pause = float(os.environ.get("MN_PAUSE", "0.05" if mode == "loop" else "0"))
for step in range(int(os.environ.get("MN_STEPS", "1000" if mode == "loop" else "3"))):
    if fail and mode == "mid" and step == 1:
        raise RuntimeError(f"boom on rank {rank}")
    dist.all_reduce(torch.ones(1))
    xl.log(step=step, loss=1.0 / (step + 1), samples=4)
    if step == 0:
        print("ready", flush=True)
    time.sleep(pause)
dist.barrier()
dist.destroy_process_group()
if fail and mode == "late":
    raise RuntimeError(f"late boom on rank {rank}")
tail = float(os.environ.get("MN_TAIL", "0"))  # work after the last collective (a checkpoint save)
if tail:
    print(f"tail {tail:g}s", flush=True)
    time.sleep(tail)
print("done", flush=True)
'''

TOKEN = "test-token-0123456789abcdef"


def node_argv(node: int, rdzv: str, nproc: int = 1) -> list[str]:
    """`xl launch` of xl node ``node`` of 2, running SCRIPT (written as mn.py in its cwd)."""
    return [
        *XL, "launch", "--no-tui", "--nnodes", "2", "--node-rank", str(node), "--rdzv", rdzv,
        "--nproc", str(nproc), "mn.py",
    ]


def start_nodes(
    tmp_path: Path,
    homes: tuple[Path, Path],
    nprocs: tuple[int, int] = (1, 1),
    host: str = "127.0.0.1",
    per_node: tuple[dict[str, str], dict[str, str]] = ({}, {}),
    **extra: str,
) -> list[subprocess.Popen[str]]:
    """Both nodes' `xl launch` at once, with the same XL_TOKEN, as `srun` starts them."""
    script = tmp_path / "mn.py"
    script.write_text(SCRIPT)
    rdzv = f"{host}:{rdzv_port(host)}"
    procs = []
    for node, home in enumerate(homes):
        argv = node_argv(node, rdzv, nprocs[node])
        env = xl_env(home, XL_TOKEN=TOKEN, **extra, **per_node[node])
        procs.append(
            subprocess.Popen(
                argv,
                env=env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def launch_node(
    tmp_path: Path,
    home: Path,
    node: int,
    rdzv: str,
    *opts: str,
    nnodes: int = 2,
    **extra: str,
) -> subprocess.Popen[str]:
    """One node's `xl launch` of ``nnodes``, one rank, running SCRIPT (mn.py in ``tmp_path``,
    written by the caller) with ``opts`` before it, XL_TOKEN and ``extra`` in its environment."""
    argv = [
        *XL, "launch", "--no-tui", "--nnodes", str(nnodes), "--node-rank", str(node),
        "--rdzv", rdzv, "--nproc", "1", *opts, "mn.py",
    ]  # fmt: skip
    return subprocess.Popen(
        argv,
        env=xl_env(home, XL_TOKEN=TOKEN, **extra),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(procs: list[subprocess.Popen[str]], timeout: float = 45) -> list[tuple[int, str]]:
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            try:
                # a supervisor forked from it may hold its pipes: never wait on them for long
                stdout, stderr = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                stdout, stderr = "", "(killed after the timeout; its output could not be read)"
        out.append((p.returncode, stdout + stderr))
    return out


def node_runs(homes: tuple[Path, Path]) -> list[Path]:
    """Run dirs of node 0 and node 1 (one XL_HOME or two)."""
    found: dict[int, Path] = {}
    for home in set(homes):
        for d in (home / "runs").iterdir():
            found[int(run_json(d)["node_rank"])] = d
    return [found[0], found[1]]


def train_records(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if m["kind"] == "train"]


def assert_steps(run_dir: Path, rank: int, count: int, *, every: bool) -> None:
    """``run_dir``'s metrics.jsonl has ``rank``'s steps 0..count-1 with SCRIPT's losses: a line a
    step (``every``), or rows that each stand for ``steps`` of them (another node's summary: the
    step and loss its last one's, the samples summed), every step counted once."""
    lines = [m for m in train_records(run_dir) if m["rank"] == rank and "step" in m]
    steps = [m["step"] for m in lines]
    assert steps == sorted(steps) and steps and steps[-1] == count - 1, (rank, steps)
    assert sum(m.get("steps", 1) for m in lines) == count, (rank, lines)
    assert sum(m["samples"] for m in lines) == 4 * count, (rank, lines)
    for m in lines:
        assert m["loss"] == pytest.approx(1.0 / (m["step"] + 1)), m
    if every:
        assert steps == list(range(count)), (rank, steps)


def run_events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def cleanup(homes: tuple[Path, Path], procs: Sequence[subprocess.Popen[str]] = ()) -> None:
    """Test cleanup: kill what a failing test left (launch processes, then each run's)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
        # a supervisor forked from it may hold its pipes: never wait on them for long
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.communicate(timeout=10)
    for home in set(homes):
        for d in (home / "runs").iterdir() if (home / "runs").is_dir() else ():
            kill_run(d)


def own_ranks(run_dir: Path) -> list[int]:
    """The global ranks of the node whose run dir this is (torch's numbering), by LOCAL_RANK."""
    run = run_json(run_dir)
    mine = [r for r in run["ranks"] if r.get("node_rank", 0) == run["node_rank"]]
    return [r["rank"] for r in sorted(mine, key=lambda r: r["local_rank"])]


def logs_say(run_dir: Path, count: int, text: str) -> bool:
    """``count`` rank logs in ``run_dir`` and each says ``text`` (a node's own ranks' while the run
    lives: node 0 gets another node's last lines at that node's end)."""
    logs = list((run_dir / "logs").glob("rank-*.log"))
    return len(logs) == count and all(text in p.read_text(errors="replace") for p in logs)


def assert_layout(run0: Path, run1: Path, counts: dict[int, int]) -> dict[int, int]:
    """Node 0 lists one world of sum(counts) ranks, ``counts[n]`` of them on xl node n, each node's
    a contiguous block in LOCAL_RANK order (torch numbers ranks node after node, nodes in arrival
    order), node 1's as node 1 itself has them. Returns {rank: node_rank}."""
    ranks = run_json(run0)["ranks"]
    nodes = {r["rank"]: r["node_rank"] for r in ranks}
    assert sorted(nodes) == list(range(sum(counts.values()))) and len(ranks) == len(nodes), ranks
    for node, count in counts.items():
        block = [
            r["rank"]
            for r in sorted(
                (r for r in ranks if r["node_rank"] == node), key=lambda r: r["local_rank"]
            )
        ]
        assert len(block) == count and block == list(range(block[0], block[0] + count)), (
            node,
            ranks,
        )
    assert own_ranks(run0) == [r for r, n in sorted(nodes.items()) if n == 0]
    assert own_ranks(run1) == [r for r, n in sorted(nodes.items()) if n == 1]
    return nodes


def assert_one_view(run0: Path, run1: Path, counts: dict[int, int]) -> None:
    """Node 0's run dir holds every rank of a run that trained 3 steps, with its xl node."""
    nodes = assert_layout(run0, run1, counts)
    run = run_json(run0)
    assert all(r["node"] == socket.gethostname() and r["exit_code"] == 0 for r in run["ranks"]), (
        run["ranks"]
    )
    for rank, node in nodes.items():
        log = (run0 / "logs" / f"rank-{rank}.log").read_text()
        assert f"rank {rank} of {len(nodes)}" in log and "done" in log, log
        # Node 0's own ranks' every step; node 1's as its summary rows, standing for each step.
        assert_steps(run0, rank, 3, every=node == 0)
        if node == 1:
            assert_steps(run1, rank, 3, every=True)  # node 1's own file has every step
    events = run_events(run0)
    for rank, node in nodes.items():
        assert any(
            e["kind"] == "rank_started" and e["rank"] == rank and e.get("node_rank", 0) == node
            for e in events
        )
        assert any(
            e["kind"] == "rank_exited" and e["rank"] == rank and e["exit_code"] == 0 for e in events
        )
    assert events[0]["kind"] == "run_started" and events[-1]["kind"] == "run_ended", [
        e["kind"] for e in events
    ]
    assert any(e["kind"] == "node_ended" and e["node_rank"] == 1 for e in events)


