"""Multi-node for real, on one machine: two `xl launch --nnodes 2 --node-rank 0|1 --rdzv ...`
"nodes" on localhost, one CPU/gloo rank each, rendezvous at node 0's torchrun.

What a person sees: both launches train one world of 2 (global ranks 0 and 1), each node's run
records its own rank and metrics; a rank failing on one node is explained there and ends the other
node's run instead of leaving it hanging; Ctrl-C on one node leaves no process of either behind.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from procs import (
    XL,
    kill_run,
    only_run,
    run_json,
    wait_for,
    wait_no_processes,
    xl,
    xl_env,
)

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
fail = os.environ.get("MN_FAIL_RANK") == str(rank)
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
assert total.item() == world * (world + 1) / 2, total
print(f"rank {rank} of {dist.get_world_size()} node {os.environ['GROUP_RANK']}: all_reduce sum {total.item():g}", flush=True)
for step in range(1000 if mode == "loop" else 3):
    if fail and mode == "mid" and step == 1:
        raise RuntimeError(f"boom on rank {rank}")
    dist.all_reduce(torch.ones(1))
    xl.log(step=step, loss=1.0 / (step + 1), samples=4)
    if step == 0:
        print("ready", flush=True)
    if mode == "loop":
        time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
if fail and mode == "late":
    raise RuntimeError(f"late boom on rank {rank}")
print("done", flush=True)
'''

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_nodes(
    tmp_path: Path, homes: tuple[Path, Path], nprocs: tuple[int, int] = (1, 1), **extra: str
) -> list[subprocess.Popen[str]]:
    """Both nodes' `xl launch`, as two people would type them on two machines."""
    script = tmp_path / "mn.py"
    script.write_text(SCRIPT)
    rdzv = f"127.0.0.1:{_free_port()}"
    procs = []
    for node, home in enumerate(homes):
        argv = [*XL, "launch", "--no-tui", "--nnodes", "2", "--node-rank", str(node), "--rdzv", rdzv, "--nproc", str(nprocs[node]), "mn.py"]
        procs.append(
            subprocess.Popen(argv, env=xl_env(home, **extra), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    return procs


def _finish(procs: list[subprocess.Popen[str]], timeout: float = 45) -> list[tuple[int, str]]:
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        out.append((p.returncode, stdout + stderr))
    return out


def _runs(homes: tuple[Path, Path]) -> list[Path]:
    """Run dirs of node 0 and node 1 (one XL_HOME or two)."""
    found: dict[int, Path] = {}
    for home in set(homes):
        for d in (home / "runs").iterdir():
            found[int(run_json(d)["node_rank"])] = d
    return [found[0], found[1]]


def _train(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if m["kind"] == "train"]


def _cleanup(homes: tuple[Path, Path]) -> None:
    for home in set(homes):
        for d in (home / "runs").iterdir() if (home / "runs").is_dir() else ():
            kill_run(d)


def test_two_nodes_on_localhost_form_one_world(tmp_path: Path) -> None:
    # One XL_HOME for both, as on a cluster whose home directory every node shares.
    home = tmp_path / "home"
    homes = (home, home)
    try:
        results = _finish(_start_nodes(tmp_path, homes))
        for code, out in results:
            assert code == 0, out[-3000:]
        for node, run_dir in enumerate(_runs(homes)):
            run = run_json(run_dir)
            assert run["status"] == "succeeded" and run["nnodes"] == 2 and run["world_size"] == 2
            [rank] = run["ranks"]
            assert (rank["rank"], rank["local_rank"], rank["node"]) == (node, 0, socket.gethostname())
            assert rank["state"] == "exited" and rank["exit_code"] == 0
            log = (run_dir / "logs" / f"rank-{node}.log").read_text()
            assert f"rank {node} of 2 node {node}: all_reduce sum 3" in log and "done" in log
            # This node's metrics hold its own rank's steps, nothing of the other node's.
            train = _train(run_dir)
            assert {m["rank"] for m in train} == {node}
            by_step = {m["step"]: m for m in train}
            assert sorted(by_step) == [0, 1, 2] and len(train) == 3
            assert by_step[2]["loss"] == pytest.approx(1 / 3)
            wait_no_processes(run_dir, timeout=5)
    finally:
        _cleanup(homes)


@pytest.mark.parametrize("mode", ["mid", "late"])
def test_rank_failing_on_node_1_ends_node_0(tmp_path: Path, mode: str) -> None:
    """mid: rank 1 raises while rank 0 waits in an all_reduce. late: rank 1 raises after the last
    collective, so rank 0 succeeds and its torchrun waits at its exit barrier for node 1's torchrun,
    which never comes (torch alone would hold node 0's run for 300 s)."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    try:
        results = _finish(_start_nodes(tmp_path, homes, MN_MODE=mode, MN_FAIL_RANK="1"))
        run0, run1 = (run_json(only_run(h)) for h in homes)
        assert results[1][0] == 1, results[1][1][-3000:]
        assert run1["status"] == "failed" and run1["failure"]["rank"] == 1
        assert f"RuntimeError: {'late ' if mode == 'late' else ''}boom on rank 1" in run1["failure"]["traceback"]
        assert 'mn.py", line' in run1["failure"]["traceback"]
        [rank1] = run1["ranks"]
        assert rank1["rank"] == 1 and rank1["state"] == "failed" and rank1["exit_code"] == 1
        assert "boom on rank 1" in results[1][1]
        if mode == "mid":
            # Rank 0 learns it from gloo (the peer closed the connection) and fails on its own.
            assert results[0][0] == 1 and run0["status"] in ("failed", "stopped"), results[0][1][-3000:]
        else:
            assert results[0][0] == 0 and run0["status"] == "succeeded", results[0][1][-3000:]
            events = [json.loads(line) for line in (only_run(homes[0]) / "events.jsonl").read_text().splitlines()]
            assert any(e["kind"] == "exit_barrier" for e in events)
        assert run0["ranks"][0]["rank"] == 0
        for home in homes:
            wait_no_processes(only_run(home), timeout=5)
    finally:
        _cleanup(homes)


def test_ctrl_c_on_node_0_ends_both_nodes(tmp_path: Path) -> None:
    """Node 1 runs 2 processes, node 0 one: torch numbers them 0 | 1, 2 (not node_rank * nproc)."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    procs = _start_nodes(tmp_path, homes, (1, 2), MN_MODE="loop", MN_WORLD="3")
    try:

        def both_training() -> bool:
            if not all((h / "runs").is_dir() and any((h / "runs").iterdir()) for h in homes):
                return False
            logs = [only_run(homes[0]) / "logs" / "rank-0.log"]
            logs += [only_run(homes[1]) / "logs" / f"rank-{r}.log" for r in (1, 2)]
            return all(p.exists() and "ready" in p.read_text(errors="replace") for p in logs)

        wait_for(both_training, timeout=60, what="both nodes to train")
        run1 = run_json(only_run(homes[1]))
        assert run1["world_size"] == 3
        assert [(r["rank"], r["local_rank"], r["state"]) for r in run1["ranks"]] == [(1, 0, "running"), (2, 1, "running")]
        procs[0].send_signal(signal.SIGINT)  # Ctrl-C in node 0's terminal
        results = _finish(procs, timeout=30)
        run0, run1 = (run_json(only_run(h)) for h in homes)
        assert run0["status"] == "stopped", results[0][1][-3000:]
        assert [(r["rank"], r["state"]) for r in run0["ranks"]] == [(0, "stopped")]
        # Node 1's rank loses its peer at the next all_reduce: its run ends too, on its own.
        assert run1["status"] in ("failed", "stopped") and results[1][0] != 0, results[1][1][-3000:]
        # Grace is 1 s (xl_env): everything of both nodes is gone a few seconds later.
        for home in homes:
            wait_no_processes(only_run(home), timeout=5)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
        _cleanup(homes)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--rdzv", "127.0.0.1"], "--rdzv '127.0.0.1' is not HOST:PORT"),
        (["--rdzv", "127.0.0.1:"], "is not HOST:PORT"),
        (["--rdzv", "127.0.0.1:70000"], "port 70000 is out of range; use 1-65535"),
        (["--rdzv", "127.0.0.1:0"], "port 0 is out of range"),
        (["--rdzv", "::1:29500"], "is not HOST:PORT (e.g. --rdzv 10.0.0.1:29500 or [fd00::1]:29500)"),
        (["--node-rank", "2", "--rdzv", "127.0.0.1:29500"], "--node-rank 2 must be in 0..1"),
    ],
)
def test_bad_rendezvous_is_one_line_and_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    (tmp_path / "mn.py").write_text(SCRIPT)
    home = tmp_path / "home"
    proc = xl(["launch", "--no-tui", "--nnodes", "2", *args, "mn.py"], xl_env(home), cwd=tmp_path, timeout=30)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xl launch: ") and says in lines[0], proc.stderr
    assert proc.stdout == ""
    # Nothing was started.
    assert not (home / "runs").is_dir() or not any((home / "runs").iterdir())


def test_rdzv_in_the_plan_is_static_rendezvous_at_node_0(tmp_path: Path) -> None:
    """torchrun's static rendezvous: this node's rank as given, node 0's address as master
    (an IPv6 address written [ADDR]:PORT reaches torchrun bare)."""
    (tmp_path / "mn.py").write_text(SCRIPT)
    args = ["launch", "--dry-run", "--json", "--nnodes", "2", "--node-rank", "1", "--rdzv", "[::1]:29511", "mn.py"]
    proc = xl(args, xl_env(tmp_path / "home"), cwd=tmp_path, timeout=30)
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(proc.stdout)["argv"]
    def opt(name: str) -> str:
        return str(argv[argv.index(name) + 1])

    assert opt("--nnodes") == "2" and opt("--node-rank") == "1"
    assert (opt("--master-addr"), opt("--master-port")) == ("::1", "29511")
    assert "--rdzv-endpoint" not in argv and "--rdzv-backend" not in argv
