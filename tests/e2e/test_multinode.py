"""Multi-node for real, on one machine: two `xl launch --nnodes 2 --node-rank 0|1 --rdzv ...`
"nodes" on localhost, one CPU/gloo rank each, torchrun's c10d rendezvous at the --rdzv address.

Under c10d torch numbers nodes in the order they join, so which node's rank is global rank 0
varies from run to run: the tests take each node's global ranks from that node's own run dir and
check what must hold whatever the order (one world of the right size, each node's ranks a
contiguous block in LOCAL_RANK order, every rank on node 0 with its xl node_rank, failures
attributed to the right xl node).

What a person sees: both launches train one world of 2 (global ranks 0 and 1); node 0's run dir
is the one view of the run (every rank's logs, metrics, lifecycle, failure), each node keeps its
own records too; a rank failing or a node dying anywhere ends the run on every node and node 0
names the node and rank; Ctrl-C on one node leaves no process of either behind. The nodes share
the run's token as Slurm passes it (XL_TOKEN in both environments) or as node 0 prints it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest
from procs import (
    XL,
    kill_run,
    only_run,
    rdzv_port,
    run_json,
    run_processes,
    wait_for,
    wait_no_processes,
    xl,
    xl_env,
)

from xl import handshake

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
print(f"rank {rank} of {dist.get_world_size()} node {os.environ['GROUP_RANK']}: all_reduce sum {total.item():g}", flush=True)
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

pytestmark = pytest.mark.e2e
TOKEN = "test-token-0123456789abcdef"


def _start_nodes(
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
        argv = [*XL, "launch", "--no-tui", "--nnodes", "2", "--node-rank", str(node), "--rdzv", rdzv, "--nproc", str(nprocs[node]), "mn.py"]
        env = xl_env(home, XL_TOKEN=TOKEN, **extra, **per_node[node])
        procs.append(
            subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    return procs


def _finish(procs: list[subprocess.Popen[str]], timeout: float = 45) -> list[tuple[int, str]]:
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


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def _cleanup(homes: tuple[Path, Path], procs: Sequence[subprocess.Popen[str]] = ()) -> None:
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


def _own_ranks(run_dir: Path) -> list[int]:
    """The global ranks of the node whose run dir this is (torch's numbering), by LOCAL_RANK."""
    run = run_json(run_dir)
    mine = [r for r in run["ranks"] if r.get("node_rank", 0) == run["node_rank"]]
    return [r["rank"] for r in sorted(mine, key=lambda r: r["local_rank"])]


def _logs_say(run_dir: Path, count: int, text: str) -> bool:
    """``count`` rank logs in ``run_dir`` and each says ``text`` (node 0's has every node's)."""
    logs = list((run_dir / "logs").glob("rank-*.log"))
    return len(logs) == count and all(text in p.read_text(errors="replace") for p in logs)


def _assert_layout(run0: Path, run1: Path, counts: dict[int, int]) -> dict[int, int]:
    """Node 0 lists one world of sum(counts) ranks, ``counts[n]`` of them on xl node n, each node's
    a contiguous block in LOCAL_RANK order (torch numbers ranks node after node, nodes in arrival
    order), node 1's as node 1 itself has them. Returns {rank: node_rank}."""
    ranks = run_json(run0)["ranks"]
    nodes = {r["rank"]: r["node_rank"] for r in ranks}
    assert sorted(nodes) == list(range(sum(counts.values()))) and len(ranks) == len(nodes), ranks
    for node, count in counts.items():
        block = [r["rank"] for r in sorted((r for r in ranks if r["node_rank"] == node), key=lambda r: r["local_rank"])]
        assert len(block) == count and block == list(range(block[0], block[0] + count)), (node, ranks)
    assert _own_ranks(run0) == [r for r, n in sorted(nodes.items()) if n == 0]
    assert _own_ranks(run1) == [r for r, n in sorted(nodes.items()) if n == 1]
    return nodes


def _assert_one_view(run0: Path, run1: Path, counts: dict[int, int]) -> None:
    """Node 0's run dir holds every rank of a run that trained 3 steps, with its xl node."""
    nodes = _assert_layout(run0, run1, counts)
    run = run_json(run0)
    assert all(r["node"] == socket.gethostname() and r["exit_code"] == 0 for r in run["ranks"]), run["ranks"]
    for rank in nodes:
        log = (run0 / "logs" / f"rank-{rank}.log").read_text()
        assert f"rank {rank} of {len(nodes)}" in log and "done" in log, log
        steps = sorted(m["step"] for m in _train(run0) if m["rank"] == rank)
        assert steps == [0, 1, 2], (rank, steps)
    events = _events(run0)
    for rank, node in nodes.items():
        assert any(e["kind"] == "rank_started" and e["rank"] == rank and e.get("node_rank", 0) == node for e in events)
        assert any(e["kind"] == "rank_exited" and e["rank"] == rank and e["exit_code"] == 0 for e in events)
    assert events[0]["kind"] == "run_started" and events[-1]["kind"] == "run_ended", [e["kind"] for e in events]
    assert any(e["kind"] == "node_ended" and e["node_rank"] == 1 for e in events)


def test_two_nodes_on_localhost_form_one_world(tmp_path: Path) -> None:
    # One XL_HOME for both, as on a cluster whose home directory every node shares.
    home = tmp_path / "home"
    homes = (home, home)
    try:
        results = _finish(_start_nodes(tmp_path, homes))
        for code, out in results:
            assert code == 0, out[-3000:]
        # The token came from the environment (as srun passes it): node 0 does not print it back.
        assert TOKEN not in results[0][1] and "XL_TOKEN=\"$XL_TOKEN\" xl launch" in results[0][1]
        run0, run1 = _runs(homes)
        for node, run_dir in enumerate((run0, run1)):
            run = run_json(run_dir)
            assert run["status"] == "succeeded" and run["nnodes"] == 2 and run["world_size"] == 2
            mine = next(r for r in run["ranks"] if r["node_rank"] == node)
            assert (mine["local_rank"], mine["node"]) == (0, socket.gethostname())
            assert mine["state"] == "exited" and mine["exit_code"] == 0
            rank = mine["rank"]
            log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
            # One rank a node: torch's node number (GROUP_RANK) is the global rank.
            assert f"rank {rank} of 2 node {rank}: all_reduce sum 3" in log and "done" in log
            wait_no_processes(run_dir, timeout=5)
        # Node 0 is the one view: both ranks' logs, metrics, lifecycle.
        _assert_one_view(run0, run1, {0: 1, 1: 1})
        [r0], [r1] = _own_ranks(run0), _own_ranks(run1)
        by_step = {m["step"]: m for m in _train(run0) if m["rank"] == r1}
        assert by_step[2]["loss"] == pytest.approx(1 / 3)
        # Node 1 still keeps its own rank only; its xl.log metrics went to node 0.
        assert [r["rank"] for r in run_json(run1)["ranks"]] == [r1]
        assert not (run1 / "logs" / f"rank-{r0}.log").exists()
        assert json.loads((run0 / "collector.json").read_text())["node_frames"] > 0
        assert json.loads((run1 / "collector.json").read_text())["host"] == "127.0.0.1"
    finally:
        _cleanup(homes)


@pytest.mark.parametrize("mode", ["mid", "late"])
def test_rank_failing_on_node_1_ends_node_0(tmp_path: Path, mode: str) -> None:
    """mid: rank 1 raises while rank 0 waits in an all_reduce (rank 0 then fails too, of gloo's
    error: node 0 still blames rank 1, which failed first). late: rank 1 raises after the last
    collective, so rank 0 succeeds and its torchrun waits at its exit barrier for node 1's
    torchrun, which never comes (torch alone would hold node 0's run for 300 s): node 0 learns of
    the failure from node 1 and ends its part."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    try:
        results = _finish(_start_nodes(tmp_path, homes, per_node=({}, {"MN_FAIL": "1"}), MN_MODE=mode))
        run0, run1 = (run_json(only_run(h)) for h in homes)
        assert results[1][0] == 1, results[1][1][-3000:]
        [r0], [r1] = _own_ranks(only_run(homes[0])), _own_ranks(only_run(homes[1]))
        assert {r0, r1} == {0, 1}
        boom = f"RuntimeError: {'late ' if mode == 'late' else ''}boom on rank {r1}"
        assert run1["status"] == "failed" and run1["failure"]["rank"] == r1
        assert boom in run1["failure"]["traceback"]
        assert 'mn.py", line' in run1["failure"]["traceback"]
        [rank1] = run1["ranks"]
        assert rank1["rank"] == r1 and rank1["state"] == "failed" and rank1["exit_code"] == 1
        assert f"boom on rank {r1}" in results[1][1]
        # Node 0's run failed, and names node 1's rank with its traceback.
        assert results[0][0] == 1 and run0["status"] == "failed", results[0][1][-3000:]
        failure = run0["failure"]
        assert (failure["rank"], failure["node_rank"], failure["node"]) == (r1, 1, socket.gethostname()), failure
        assert failure["exit_code"] == 1 and failure["message"].startswith("node 1 (")
        assert boom in failure["traceback"]
        assert f"boom on rank {r1}" in (only_run(homes[0]) / "logs" / f"rank-{r1}.log").read_text()
        states = {r["rank"]: (r["node_rank"], r["state"]) for r in run0["ranks"]}
        assert states[r1] == (1, "failed") and states[r0][0] == 0, states
        if mode == "late":
            assert states[r0][1] == "exited"
        for home in homes:
            wait_no_processes(only_run(home), timeout=5)
    finally:
        _cleanup(homes)


def test_ctrl_c_on_node_0_ends_both_nodes(tmp_path: Path) -> None:
    """Node 1 runs 2 processes, node 0 one: torch numbers them node after node in arrival order,
    0 | 1, 2 or 0, 1 | 2 (not node_rank * nproc)."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    procs = _start_nodes(tmp_path, homes, (1, 2), MN_MODE="loop", MN_WORLD="3")
    try:

        def both_training() -> bool:
            if not all((h / "runs").is_dir() and any((h / "runs").iterdir()) for h in homes):
                return False
            return _logs_say(only_run(homes[0]), 3, "ready") and _logs_say(only_run(homes[1]), 2, "ready")

        wait_for(both_training, timeout=60, what="both nodes to train")
        run1 = run_json(only_run(homes[1]))
        assert run1["world_size"] == 3
        first = run1["ranks"][0]["rank"]
        assert first in (0, 1), run1["ranks"]
        assert [(r["rank"], r["local_rank"], r["state"]) for r in run1["ranks"]] == [(first, 0, "running"), (first + 1, 1, "running")]
        procs[0].send_signal(signal.SIGINT)  # Ctrl-C in node 0's terminal
        results = _finish(procs, timeout=30)
        run0, run1 = (run_json(only_run(h)) for h in homes)
        assert run0["status"] == "stopped", results[0][1][-3000:]
        # Node 0 lists the three ranks of both nodes; its own was stopped.
        nodes = _assert_layout(only_run(homes[0]), only_run(homes[1]), {0: 1, 1: 2})
        [own] = [r for r in run0["ranks"] if nodes[r["rank"]] == 0]
        assert own["state"] == "stopped", run0["ranks"]
        # Node 0 tells node 1 to stop (its rank would also lose its peer at the next all_reduce).
        assert run1["status"] in ("failed", "stopped") and results[1][0] != 0, results[1][1][-3000:]
        # Grace is 1 s (xl_env): everything of both nodes is gone a few seconds later.
        for home in homes:
            wait_no_processes(only_run(home), timeout=5)
    finally:
        _cleanup(homes, procs)


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


def test_rdzv_in_the_plan_is_c10d_rendezvous_at_node_0(tmp_path: Path) -> None:
    """torchrun's c10d rendezvous at node 0's address (IPv6 stays bracketed, as torch parses it),
    no --node-rank (torch ignores it under c10d), node 0 hosting the store, an id every node of the run derives alike from
    the run's token without showing it, another id for another run on the same endpoint."""
    (tmp_path / "mn.py").write_text(SCRIPT)

    def plan(node: str, **env: str) -> list[str]:
        args = ["launch", "--dry-run", "--json", "--nnodes", "2", "--node-rank", node, "--rdzv", "[::1]:29511", "mn.py"]
        proc = xl(args, xl_env(tmp_path / "home", **env), cwd=tmp_path, timeout=30)
        assert proc.returncode == 0, proc.stderr
        return list(json.loads(proc.stdout)["argv"])

    argv = plan("1", XL_TOKEN=TOKEN)

    def opt(name: str) -> str:
        return str(argv[argv.index(name) + 1])

    assert opt("--nnodes") == "2" and opt("--rdzv-backend") == "c10d" and opt("--rdzv-endpoint") == "[::1]:29511"
    assert opt("--rdzv-id") == "xl-" + hashlib.sha256(TOKEN.encode()).hexdigest()[:12]
    assert opt("--max-restarts") == "0"
    assert not {"--node-rank", "--master-addr", "--master-port", "--standalone"} & set(argv), argv
    assert TOKEN not in " ".join(argv)
    assert opt("--rdzv-conf") == "is_host=0"  # node 0 serves the store, whatever its hostname says
    node0 = plan("0", XL_TOKEN=TOKEN)
    assert node0[node0.index("--rdzv-conf") + 1] == "is_host=1"
    assert node0[node0.index("--rdzv-id") + 1] == opt("--rdzv-id")  # the same rendezvous
    other = plan("1", XL_TOKEN=TOKEN + "x")
    assert other[other.index("--rdzv-id") + 1] != opt("--rdzv-id")  # the next run on that endpoint
    bare = plan("0")  # node 0 before it made the token: the endpoint names it
    assert bare[bare.index("--rdzv-id") + 1] == "xl---1-29511"

    # The text dry run says which xl node this is and that torch numbers nodes as they join.
    args = ["launch", "--dry-run", "--nnodes", "2", "--node-rank", "1", "--rdzv", "[::1]:29511", "mn.py"]
    proc = xl(args, xl_env(tmp_path / "home", XL_TOKEN=TOKEN), cwd=tmp_path, timeout=30)
    assert proc.returncode == 0 and "# xl node 1 of 2 (node 0 gathers every node)" in proc.stdout, proc.stdout


def _read_lines(stream: Any, into: list[str]) -> threading.Thread:
    def pump() -> None:
        for line in stream:
            into.append(line)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def test_node_1_joins_with_the_command_node_0_printed(tmp_path: Path) -> None:
    """Node 0 alone makes the token and prints the exact command for node 1; a person runs it
    there. The token is in that command and nowhere else: not in either run dir, not in any
    process's command line."""
    (tmp_path / "mn.py").write_text(SCRIPT)
    homes = (tmp_path / "node0", tmp_path / "node1")
    rdzv = f"127.0.0.1:{rdzv_port()}"
    env0 = xl_env(homes[0], MN_STEPS="3", MN_PAUSE="0.3")
    env0.pop("XL_TOKEN", None)
    argv0 = [*XL, "launch", "--no-tui", "--nnodes", "2", "--node-rank", "0", "--rdzv", rdzv, "--nproc", "1", "mn.py"]
    with open(tmp_path / "node0.out", "w") as out0:
        node0 = subprocess.Popen(argv0, env=env0, cwd=tmp_path, stdout=out0, stderr=subprocess.PIPE, text=True)
    err0: list[str] = []
    reader = _read_lines(node0.stderr, err0)
    node1: subprocess.Popen[str] | None = None
    try:
        line = wait_for(lambda: next((ln for ln in err0 if "xl launch" in ln), None), timeout=30, what="node 0's command")
        assert any(f"on the other node, in {tmp_path}, run:" in ln for ln in err0), err0
        words = shlex.split(line)
        # VAR=value assignments, then the command.
        assigns = dict(w.split("=", 1) for w in words[: words.index("xl")])
        token = assigns["XL_TOKEN"]
        assert len(token) >= 32 and set(assigns) == {"XL_TOKEN"}, assigns
        argv = words[words.index("xl") :]
        assert argv == ["xl", "launch", "--nproc", "1", "--nnodes", "2", "--node-rank", "1", "--rdzv", rdzv, "--", "mn.py"]
        env1 = xl_env(homes[1], MN_STEPS="3", MN_PAUSE="0.3", **assigns)
        node1 = subprocess.Popen([*XL, *argv[1:], "--no-tui"], env=env1, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

        def training() -> bool:
            return all((h / "runs").is_dir() and any((h / "runs").iterdir()) for h in homes) and (
                _logs_say(only_run(homes[0]), 2, "ready") and _logs_say(only_run(homes[1]), 1, "ready")
            )

        wait_for(training, timeout=60, what="both nodes to train")
        running = run_processes(only_run(homes[0])) + run_processes(only_run(homes[1]))
        assert running
        for proc in running:
            try:
                assert token not in " ".join(proc.cmdline()), proc.cmdline()
            except psutil.Error:
                continue
        out1, _ = node1.communicate(timeout=60)
        assert node1.returncode == 0, out1[-3000:]
        assert node0.wait(timeout=60) == 0, (tmp_path / "node0.out").read_text()[-3000:]
        reader.join(timeout=10)
        run0, run1 = only_run(homes[0]), only_run(homes[1])
        _assert_one_view(run0, run1, {0: 1, 1: 1})
        for run_dir in (run0, run1):
            for path in run_dir.rglob("*"):
                if path.is_file():
                    assert token.encode() not in path.read_bytes(), path
            wait_no_processes(run_dir, timeout=5)
        assert token not in out1 and token not in (tmp_path / "node0.out").read_text()
        assert sum(token in ln for ln in err0) == 1
    finally:
        _cleanup(homes, [p for p in (node0, node1) if p is not None])


def test_node_with_a_wrong_token_is_told_and_node_0_waits_for_the_right_one(tmp_path: Path) -> None:
    """Node 1 started with a mistyped XL_TOKEN: node 0's collector answers its link that the
    token is wrong (nothing more), node 1's `xl launch` says so in one line with the fix and
    exits 1 with nothing of it left; node 0 records the attempt, says it, and waits on: the node
    started right afterwards joins and the run succeeds."""
    (tmp_path / "mn.py").write_text(SCRIPT)
    homes = (tmp_path / "node0", tmp_path / "node1-wrong", tmp_path / "node1")
    rdzv = f"127.0.0.1:{rdzv_port()}"

    def argv(node: int) -> list[str]:
        return ["launch", "--no-tui", "--nnodes", "2", "--node-rank", str(node), "--rdzv", rdzv, "--nproc", "1", "mn.py"]

    wrong_token = TOKEN[:-1] + "X"
    with open(tmp_path / "node0.out", "w") as out0:
        env0 = xl_env(homes[0], XL_TOKEN=TOKEN, MN_STEPS="3")
        node0 = subprocess.Popen([*XL, *argv(0)], env=env0, cwd=tmp_path, stdout=out0, stderr=subprocess.STDOUT, text=True)
    try:
        run0 = wait_for(lambda: (homes[0] / "runs").is_dir() and next((homes[0] / "runs").iterdir(), None), timeout=30, what="node 0's run")
        start = time.monotonic()
        wrong = xl(argv(1), xl_env(homes[1], XL_TOKEN=wrong_token, MN_STEPS="3"), cwd=tmp_path, timeout=45)
        took = time.monotonic() - start
        out = wrong.stdout + wrong.stderr
        assert wrong.returncode == 1, out[-3000:]
        said = [ln for ln in out.splitlines() if "refused" in ln]
        assert len(said) == 1, out
        assert "node 0 (127.0.0.1:" in said[0] and "refused this node's XL_TOKEN: it is not the run's token" in said[0]
        assert "run the exact command node 0's 'xl launch' printed" in said[0], said
        assert "Traceback" not in out and TOKEN not in out, out
        assert took < 20, (took, out)
        run_wrong = only_run(homes[1])
        assert run_json(run_wrong)["status"] == "failed"
        wait_no_processes(run_wrong, timeout=5)
        # Node 0 says a node with a wrong token tried to join, and waits on for the right one.
        [refused] = [e for e in _events(run0) if e["kind"] == "node_refused"]
        assert refused["node_rank"] == 1 and "wrong XL_TOKEN" in refused["message"], refused
        assert node0.poll() is None and run_json(run0)["status"] == "running"
        assert not any(e["kind"] in ("node_lost", "failure") for e in _events(run0))
        right = xl(argv(1), xl_env(homes[2], XL_TOKEN=TOKEN, MN_STEPS="3"), cwd=tmp_path, timeout=60)
        assert right.returncode == 0, (right.stdout + right.stderr)[-3000:]
        assert node0.wait(timeout=60) == 0, (tmp_path / "node0.out").read_text()[-3000:]
        assert "tried to join with a wrong XL_TOKEN and was refused" in (tmp_path / "node0.out").read_text()
        _assert_one_view(run0, only_run(homes[2]), {0: 1, 1: 1})
        assert json.loads((run0 / "collector.json").read_text())["rejects"].get("bad_token", 0) >= 1
        for home in homes:
            wait_no_processes(only_run(home), timeout=5)
    finally:
        _cleanup(homes, [node0])


@pytest.mark.parametrize("victim", ["node", "rank"])
def test_a_dead_node_or_rank_on_node_1_ends_the_run_on_both(tmp_path: Path, victim: str) -> None:
    """SIGKILL every process of node 1 (the node is gone for node 0) or its rank, mid-run: both
    nodes end, node 0 names node 1 (and the rank), nothing of either is left."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    procs = _start_nodes(tmp_path, homes, MN_MODE="loop")
    try:

        def both_training() -> bool:
            if not all((h / "runs").is_dir() and any((h / "runs").iterdir()) for h in homes):
                return False
            return _logs_say(only_run(homes[0]), 2, "ready") and _logs_say(only_run(homes[1]), 1, "ready")

        wait_for(both_training, timeout=60, what="both nodes to train")
        run1 = wait_for(lambda: (r := run_json(only_run(homes[1])))["ranks"][0]["pid"] and r, timeout=10, what="node 1's rank's pid")
        r1 = run1["ranks"][0]["rank"]
        if victim == "node":
            os.kill(run1["supervisor_pid"], signal.SIGKILL)
            for proc in run_processes(only_run(homes[1])):
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, signal.SIGKILL)
        else:
            os.kill(run1["ranks"][0]["pid"], signal.SIGKILL)
        results = _finish(procs, timeout=60)
        run0 = run_json(only_run(homes[0]))
        assert results[0][0] == 1 and run0["status"] == "failed", results[0][1][-3000:]
        if victim == "rank":
            assert results[1][0] != 0 and run_json(only_run(homes[1]))["status"] in ("failed", "stopped"), results[1][1][-3000:]
        failure = run0["failure"]
        assert failure["node_rank"] == 1 and failure["node"] == socket.gethostname(), failure
        if victim == "node":
            assert failure["rank"] is None and f"was lost with rank(s) {r1} running" in failure["message"], failure
            assert any(e["kind"] == "node_lost" and e["node_rank"] == 1 for e in _events(only_run(homes[0])))
        else:
            assert failure["rank"] == r1 and failure["exit_code"] == -signal.SIGKILL, failure
            assert f"rank {r1} was killed by SIGKILL" in failure["message"], failure
        for home in homes:
            wait_no_processes(only_run(home), timeout=10)
    finally:
        _cleanup(homes, procs)


def _routable_ipv4() -> str | None:
    for name, addrs in psutil.net_if_addrs().items():
        for addr in addrs:
            if addr.family == socket.AF_INET and not addr.address.startswith("127.") and name != "lo":
                return str(addr.address)
    return None


def test_collector_on_a_routable_address_takes_only_frames_with_the_token(tmp_path: Path) -> None:
    """A run spanning nodes: node 0's collector listens on the --rdzv address (not loopback).
    Peers that skip the handshake or prove a wrong token (as a rank or as a node) are refused
    (REFUSED, then closed) and counted; the frames they send after are never read; node 0 records
    a node's attempt by its number and address only; the real ranks are unaffected."""
    host = _routable_ipv4()
    if host is None:
        pytest.skip("this machine has no non-loopback IPv4 address to bind node 0's collector to")
    homes = (tmp_path / "node0", tmp_path / "node1")
    procs = _start_nodes(tmp_path, homes, host=host, MN_STEPS="3", MN_PAUSE="1.5")
    try:
        run0 = wait_for(lambda: (homes[0] / "runs").is_dir() and next((homes[0] / "runs").iterdir(), None), timeout=30, what="node 0's run")
        status = wait_for(lambda: (run0 / "collector.json").exists() and json.loads((run0 / "collector.json").read_text()), timeout=30, what="collector.json")
        assert status["host"] == host
        port = int(status["port"])
        rec = {"t": time.time(), "rank": 0, "kind": "train", "step": 4242}
        line = json.dumps(rec).encode()
        base = {"v": 1, "rank": 0, "pid": 1, "seq": 1, "dropped": 0}
        node = {"v": 1, "node": 1, "host": "intruder\x1b]52;c;SGk=\x07", "pid": 1, "seq": 1}
        log = json.dumps({"type": "log", "rank": 0, "data": "INJECTED\n"}).encode()
        attempts = [
            (None, None, base, line),  # no handshake: its frame is read as a HELLO, and refused
            (handshake.ROLE_RANK, "wrong-token-0123456789", base, line),
            (handshake.ROLE_RANK, TOKEN[:-1] + "X", base, line),
            (handshake.ROLE_NODE, "wrong-token-0123456789", node, log),
            (handshake.ROLE_NODE, TOKEN[:-1] + "X", node, log),
        ]
        for role, token, header, body in attempts:
            with socket.create_connection((host, port), timeout=10) as sock:
                payload = json.dumps(header).encode() + b"\n" + body
                if role is None:
                    assert sock.recv(handshake.CHALLENGE_SIZE).startswith(handshake.MAGIC)
                    sock.sendall(struct.pack(">I", len(payload)) + payload)
                    assert sock.recv(64) == handshake.REFUSED
                else:
                    assert token is not None
                    verdict = handshake.client_handshake(sock, token.encode(), role, 1 if role == handshake.ROLE_NODE else 0)
                    assert verdict == handshake.REFUSED_TOKEN
                    with contextlib.suppress(OSError):
                        sock.sendall(struct.pack(">I", len(payload)) + payload)
                sock.settimeout(2)
                rest = b""
                with contextlib.suppress(ConnectionResetError):  # a reset: the frame hit a closed socket
                    rest = sock.recv(4096)
                assert rest == b""  # closed, nothing more said
        results = _finish(procs, timeout=60)
        for code, out in results:
            assert code == 0, out[-3000:]
        rejects = json.loads((run0 / "collector.json").read_text())["rejects"]
        assert rejects.get("bad_token") == 5, rejects
        # Node 0 says so, once per node link that tried, and carried on; no text of theirs.
        refused = [e for e in _events(run0) if e["kind"] == "node_refused"]
        assert len(refused) == 2 and {e["node_rank"] for e in refused} == {1}, refused
        assert not any("intruder" in json.dumps(e) for e in _events(run0))
        _assert_one_view(run0, only_run(homes[1]), {0: 1, 1: 1})
        assert 4242 not in {m["step"] for m in _train(run0)}
        assert not any("INJECTED" in p.read_text() for p in (run0 / "logs").glob("rank-*.log"))
        for home in homes:
            wait_no_processes(only_run(home), timeout=5)
    finally:
        _cleanup(homes, procs)


@pytest.mark.parametrize(
    ("node_rank", "env", "says"),
    [
        ("1", {}, "--node-rank 1 needs XL_TOKEN, the run's token: run the command node 0's 'xl launch' printed"),
        ("1", {"XL_TOKEN": "short"}, "XL_TOKEN must be 16-256 letters, digits or -_.~+/="),
        ("0", {"XL_COLLECTOR_PORT": "http"}, "XL_COLLECTOR_PORT='http' is not a port; use 1-65535, the same on every node"),
        ("0", {"RDZV_PORT": "65535"}, "--rdzv port 65535 leaves no port for node 0's collector"),
    ],
)
def test_bad_node_contract_is_one_line_and_exit_2(tmp_path: Path, node_rank: str, env: dict[str, str], says: str) -> None:
    (tmp_path / "mn.py").write_text(SCRIPT)
    home = tmp_path / "home"
    port = env.pop("RDZV_PORT", "29511")
    base = xl_env(home, **env)
    if "XL_TOKEN" not in env:
        base.pop("XL_TOKEN", None)
    args = ["launch", "--no-tui", "--nnodes", "2", "--node-rank", node_rank, "--rdzv", f"127.0.0.1:{port}", "mn.py"]
    proc = xl(args, base, cwd=tmp_path, timeout=30)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xl launch: ") and says in lines[0], proc.stderr
    assert not (home / "runs").is_dir() or not any((home / "runs").iterdir())


@pytest.mark.parametrize("late", [1, 0])
def test_the_node_whose_ranks_finish_later_is_waited_for(tmp_path: Path, late: int) -> None:
    """Under c10d global rank 0 may be on node 1, and one node's ranks may legitimately work on
    after the last collective (saving a checkpoint) well past the stop grace + 10 s. late=1:
    node 0 waits for node 1 as long as node 1 heartbeats with ranks running, keeps its collector
    (and its torchrun, which serves node 1's c10d store) up for node 1's last words, and ends
    with node 1's end, not before. late=0: node 1 ends its part when its ranks are done; node 0's
    ranks are not cut by it."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    tail = 16.0  # grace (1 s in xl_env) + 10 s + some
    per_node: list[dict[str, str]] = [{}, {}]
    per_node[late] = {"MN_TAIL": str(tail)}
    procs = _start_nodes(tmp_path, homes, per_node=(per_node[0], per_node[1]))
    try:
        results = _finish(procs, timeout=90)
        for code, out in results:
            assert code == 0, out[-3000:]
        run0, run1 = only_run(homes[0]), only_run(homes[1])
        for run_dir in (run0, run1):
            assert run_json(run_dir)["status"] == "succeeded", run_json(run_dir)
        [r1] = _own_ranks((run0, run1)[late])
        # Node 0 has the late rank's last words, node 1's end, and did not give up on it.
        log = (run0 / "logs" / f"rank-{r1}.log").read_text()
        assert f"tail {tail:g}s" in log and "done" in log, log
        events = _events(run0)
        assert not any(e["kind"] in ("nodes_unfinished", "node_lost") for e in events), events
        ended = next(e for e in events if e["kind"] == "node_ended" and e["node_rank"] == 1)
        assert events[-1]["kind"] == "run_ended" and events[-1]["t"] >= ended["t"]
        assert run_json(run0)["ended_at"] >= ended["t"]
        _assert_one_view(run0, run1, {0: 1, 1: 1})
        for home in homes:
            wait_no_processes(only_run(home), timeout=5)
    finally:
        _cleanup(homes, procs)


def test_node_0_gives_up_on_a_late_node_only_when_its_heartbeat_is_lost(tmp_path: Path) -> None:
    """Node 0's ranks are done and node 1's work on; node 1 then goes silent without its
    connection closing (every process of it frozen, as on a hung machine): node 0 declares it
    lost after XL_NODE_TIMEOUT of silence, names it with its running rank, and ends."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    procs = _start_nodes(tmp_path, homes, per_node=({"XL_NODE_TIMEOUT": "3"}, {"MN_TAIL": "120"}))
    frozen: list[int] = []
    try:
        run1 = wait_for(lambda: (homes[1] / "runs").is_dir() and next((homes[1] / "runs").iterdir(), None), timeout=30, what="node 1's run")
        wait_for(lambda: _logs_say(run1, 1, "tail 120s"), timeout=60, what="node 1's rank to work on after the last collective")
        run0 = only_run(homes[0])
        wait_for(lambda: (r := run_json(run0)).get("ranks") and any(x["state"] == "exited" for x in r["ranks"]), timeout=30, what="node 0's rank to end")
        frozen = [int(run_json(run1)["supervisor_pid"]), *(p.pid for p in run_processes(run1))]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        code0, out0 = _finish(procs[:1], timeout=45)[0]
        assert code0 == 1, out0[-3000:]
        assert time.monotonic() - stopped_at < 20
        run = run_json(run0)
        [r1] = [r["rank"] for r in run["ranks"] if r["node_rank"] == 1]
        assert run["status"] == "failed" and run["failure"]["node_rank"] == 1, run["failure"]
        assert f"was lost with rank(s) {r1} running: nothing came from it for 3s" in run["failure"]["message"], run["failure"]
        assert not any(e["kind"] == "nodes_unfinished" for e in _events(run0))
        # Node 1 thawed and stopped: nothing of either node is left (node 0's run.json lists
        # node 1's frozen rank too).
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        os.kill(frozen[0], signal.SIGTERM)
        frozen = []
        code1, out1 = _finish(procs[1:], timeout=30)[0]
        assert code1 != 0, out1[-3000:]
        wait_no_processes(run1, timeout=10)
        wait_no_processes(run0, timeout=10)
    finally:
        for pid in frozen:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        _cleanup(homes, procs)


def test_node_1_trains_on_when_node_0_cannot_be_reached(tmp_path: Path) -> None:
    """Node 1 dials the wrong collector port: the run still trains and succeeds, node 1 keeps its
    own full records (its rank spooled its metrics), and node 0 says it never heard from node 1."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    nowhere = str(rdzv_port())
    try:
        results = _finish(_start_nodes(tmp_path, homes, per_node=({}, {"XL_COLLECTOR_PORT": nowhere})), timeout=90)
        for code, out in results:
            assert code == 0, out[-3000:]
        run0, run1 = only_run(homes[0]), only_run(homes[1])
        [r1] = _own_ranks(run1)
        assert sorted(m["step"] for m in _train(run1) if m["rank"] == r1) == [0, 1, 2]
        assert "done" in (run1 / "logs" / f"rank-{r1}.log").read_text()
        assert [r["rank"] for r in run_json(run0)["ranks"]] == [1 - r1]
        assert any(e["kind"] == "nodes_unfinished" for e in _events(run0))
        assert "cannot connect yet" in (run1 / "supervisor.log").read_text()
        for home in homes:
            wait_no_processes(only_run(home), timeout=5)
    finally:
        _cleanup(homes)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_node_1_trains_on_when_only_its_supervisor_is_killed_or_frozen(tmp_path: Path, sig: signal.Signals) -> None:
    """Node 1's supervisor alone is SIGKILLed or frozen mid-run: its rank trains on and its
    frames still reach node 0, so node 0 says the supervisor is gone (no lost node, no failure),
    keeps taking rank 1's output and metrics to the last step, and the run succeeds."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    steps = 120
    procs = _start_nodes(tmp_path, homes, MN_MODE="loop", MN_STEPS=str(steps), MN_PAUSE="0.1", XL_NODE_TIMEOUT="4")
    frozen: int | None = None
    try:
        wait_for(lambda: all((h / "runs").is_dir() and any((h / "runs").iterdir()) for h in homes), timeout=60, what="both runs")
        run0, run1 = only_run(homes[0]), only_run(homes[1])
        wait_for(lambda: _logs_say(run0, 2, "ready") and _logs_say(run1, 1, "ready"), timeout=60, what="both nodes to train")
        sup = int(run_json(run1)["supervisor_pid"])
        [r1] = _own_ranks(run1)
        os.kill(sup, sig)
        frozen = sup if sig == signal.SIGSTOP else None
        code0, out0 = _finish(procs[:1], timeout=90)[0]
        assert code0 == 0, out0[-3000:]
        run = run_json(run0)
        assert run["status"] == "succeeded" and run["failure"] is None, run
        events = _events(run0)
        said = [e for e in events if e["kind"] == "node_supervisor_lost"]
        assert len(said) == 1 and said[0]["node_rank"] == 1 and f"rank(s) {r1} still send" in said[0]["message"], said
        assert not any(e["kind"] in ("node_lost", "failure") for e in events), events
        # Rank 1's records kept coming after its supervisor was gone, to its last step.
        assert steps - 1 in {m["step"] for m in _train(run0) if m["rank"] == r1}
        assert {r["rank"]: r["state"] for r in run["ranks"]}[r1] == "exited", run["ranks"]
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
            frozen = None
        code1, out1 = _finish(procs[1:], timeout=60)[0]
        assert code1 == 0 and wait_for(lambda: run_json(run1).get("status") == "succeeded", timeout=30, what="node 1's record"), out1[-3000:]
        assert "done" in (run1 / "logs" / f"rank-{r1}.log").read_text()  # its output stayed on its node
        for run_dir in (run0, run1):
            wait_no_processes(run_dir, timeout=10)
    finally:
        if frozen is not None:
            with contextlib.suppress(OSError):
                os.kill(frozen, signal.SIGCONT)
        _cleanup(homes, procs)


@contextlib.contextmanager
def _netns_pair() -> Any:
    """A network namespace joined to this one by a veth pair: (namespace, host-side interface,
    node 0's address, node 1's address, node 1's interface); removed afterwards (root only)."""
    tag = f"{os.getpid() % 10000}{int(time.monotonic() * 1000) % 1000}"
    ns, here, there = f"xlns{tag}", f"xl{tag}a", f"xl{tag}b"
    net = 16 + os.getpid() % 200
    addr0, addr1 = f"10.77.{net}.1", f"10.77.{net}.2"
    setup = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", here, "type", "veth", "peer", "name", there],
        ["ip", "link", "set", there, "netns", ns],
        ["ip", "addr", "add", f"{addr0}/24", "dev", here],
        ["ip", "link", "set", here, "up"],
        ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{addr1}/24", "dev", there],
        ["ip", "netns", "exec", ns, "ip", "link", "set", there, "up"],
        ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
    ]
    # torchrun hands its ranks the address of the node whose agent is group rank 0 as its FQDN,
    # "localhost" on this machine: inside the namespace that name is node 0 (`ip netns exec`
    # mounts /etc/netns/<ns>/hosts over /etc/hosts), as a real second machine would resolve it.
    etc = Path("/etc/netns")
    made_etc = not etc.exists()
    try:
        for cmd in setup:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
            if done.returncode != 0:
                pytest.skip(f"cannot make a network namespace here ({' '.join(cmd)}: {done.stderr.strip()})")
        (etc / ns).mkdir(parents=True)
        (etc / ns / "hosts").write_text(f"{addr0} localhost\n127.0.0.1 {socket.gethostname()}\n")
        yield ns, here, addr0, addr1, there
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=30, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)
        with contextlib.suppress(OSError):
            (etc / ns / "hosts").unlink()
            (etc / ns).rmdir()
            if made_etc:
                etc.rmdir()


def test_a_link_going_down_between_the_nodes_is_noticed_on_both(tmp_path: Path) -> None:
    """Node 1 in its own network namespace, joined by a veth pair; the link goes down mid-run:
    node 0 names node 1 lost, and node 1 says node 0 no longer answers (it used to stay
    "running" without a word); `xl stop` on node 1 then ends what is left there."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    (tmp_path / "mn.py").write_text(SCRIPT)
    procs: list[subprocess.Popen[str]] = []
    with _netns_pair() as (ns, here, addr0, _addr1, there):
        try:
            rdzv = f"{addr0}:{rdzv_port(addr0)}"
            for node, (home, ifname) in enumerate(zip(homes, (here, there), strict=True)):
                argv = [*XL, "launch", "--no-tui", "--nnodes", "2", "--node-rank", str(node), "--rdzv", rdzv, "--nproc", "1", "mn.py"]
                env = xl_env(home, XL_TOKEN=TOKEN, MN_MODE="loop", XL_NODE_TIMEOUT="5", GLOO_SOCKET_IFNAME=ifname)
                prefix = ["ip", "netns", "exec", ns] if node else []
                procs.append(subprocess.Popen([*prefix, *argv], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
                if not node:  # node 0 joins first: its agent is group rank 0 (see _netns_pair)
                    wait_for(lambda: (homes[0] / "runs").is_dir() and any((homes[0] / "runs").iterdir()), timeout=60, what="node 0's run")
            wait_for(lambda: all((h / "runs").is_dir() and any((h / "runs").iterdir()) for h in homes), timeout=60, what="both runs")
            run0, run1 = only_run(homes[0]), only_run(homes[1])
            wait_for(lambda: _logs_say(run0, 2, "ready") and _logs_say(run1, 1, "ready"), timeout=90, what="both nodes to train")
            subprocess.run(["ip", "link", "set", here, "down"], check=True, timeout=30)
            down_at = time.monotonic()
            code0, out0 = _finish(procs[:1], timeout=60)[0]
            assert code0 == 1, out0[-3000:]
            failure = run_json(run0)["failure"]
            assert failure["node_rank"] == 1 and "nothing came from it for 5s" in failure["message"], failure

            def node_1_noticed() -> dict[str, Any] | None:
                return next((e for e in _events(run1) if e["kind"] == "node_lost" and e.get("node_rank") == 0), None)

            said = wait_for(node_1_noticed, timeout=30, what="node 1 to notice that node 0 is gone")
            assert f"node 0 ({rdzv.rsplit(':', 1)[0]}:" in said["message"] and "has not answered for 5s" in said["message"], said
            assert said["t"] - time.time() + (time.monotonic() - down_at) < 20  # within the timeout and a few seconds
            stop = xl(["stop", run1.name], xl_env(homes[1]))
            assert stop.returncode == 0 and stop.stdout.strip() == f"{run1.name} stopped", stop.stdout + stop.stderr
            _finish(procs[1:], timeout=30)
            for run_dir in (run0, run1):
                wait_no_processes(run_dir, timeout=10)
        finally:
            _cleanup(homes, procs)


def test_stopping_node_0_while_node_1_never_joined_is_prompt_and_says_so(tmp_path: Path) -> None:
    """Node 0 waits in the rendezvous for a node 1 nobody started; `xl stop` ends it at once
    (no wait for a node that has nothing to end), and the record says node 1 never joined,
    not that it "had not reported the end of its part"."""
    home = tmp_path / "home"
    (tmp_path / "mn.py").write_text(SCRIPT)
    argv = [*XL, "launch", "--no-tui", "--nnodes", "2", "--node-rank", "0", "--rdzv", f"127.0.0.1:{rdzv_port()}", "--nproc", "1", "mn.py"]
    node0 = subprocess.Popen(argv, env=xl_env(home, XL_TOKEN=TOKEN), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run0 = wait_for(lambda: (home / "runs").is_dir() and next((home / "runs").iterdir(), None), timeout=60, what="node 0's run")
        wait_for(lambda: run_json(run0).get("torchrun_pid"), timeout=60, what="node 0's torchrun")
        time.sleep(2)  # in the rendezvous
        asked = time.monotonic()
        stop = xl(["stop", run0.name], xl_env(home))
        took = time.monotonic() - asked
        assert stop.returncode == 0 and stop.stdout.strip() == f"{run0.name} stopped", stop.stdout + stop.stderr
        assert took < 8.0, took  # the grace (1 s) and the supervisor's own ending; it waited 11 s for node 1
        events = _events(run0)
        assert not any(e["kind"] == "nodes_unfinished" for e in events), events
        never = [e for e in events if e["kind"] == "nodes_never_joined"]
        assert len(never) == 1 and "node(s) 1 never joined" in never[0]["message"], events
        assert run_json(run0)["status"] == "stopped"
        code, out = _finish([node0], timeout=30)[0]
        assert code != 0, out
        wait_no_processes(run0, timeout=5)
    finally:
        _cleanup((home, home), [node0])


@pytest.mark.timeout(330)  # node 0 comes two minutes late on purpose
def test_node_1_started_two_minutes_before_node_0_still_joins(tmp_path: Path) -> None:
    """torchrun's c10d client gives up on node 0's store after its 60 s read_timeout ("The
    connection to the C10d store has failed"; 111 s after its start on this busy machine), its
    rendezvous after 600 s: node 1 waits for node 0 as long as the rendezvous would, says so, and
    the run trains when node 0 comes 120 s later. Node 1's own summary lists its rank only, ended."""
    home = tmp_path / "home"
    (tmp_path / "mn.py").write_text(SCRIPT)
    rdzv = f"127.0.0.1:{rdzv_port()}"
    procs: list[subprocess.Popen[str]] = []


    def launch(node: int) -> None:
        argv = [*XL, "launch", "--no-tui", "--nnodes", "2", "--node-rank", str(node), "--rdzv", rdzv, "--nproc", "1", "mn.py"]
        procs.append(subprocess.Popen(argv, env=xl_env(home, XL_TOKEN=TOKEN), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))

    try:
        launch(1)
        first = wait_for(lambda: (home / "runs").is_dir() and next((home / "runs").iterdir(), None), timeout=60, what="node 1's run")
        said = wait_for(lambda: (first / "events.jsonl").exists() and next((e for e in _events(first) if e["kind"] == "waiting_for_node_0"), None),
                        timeout=30, what="node 1 to wait")
        assert f"waiting for node 0's rendezvous at {rdzv}" in said["message"], said
        time.sleep(120)
        assert procs[0].poll() is None and run_json(first)["status"] == "running"
        launch(0)
        (code1, out1), (code0, out0) = _finish(procs, timeout=150)
        assert code0 == 0 and code1 == 0, (out0[-3000:], out1[-3000:])
        run0, run1 = _runs((home, home))
        assert "C10d store has failed" not in (run1 / "logs" / "torchrun.log").read_text()
        _assert_one_view(run0, run1, {0: 1, 1: 1})
        assert [(r["state"], r["exit_code"]) for r in run_json(run1)["ranks"]] == [("exited", 0)], run_json(run1)["ranks"]
        table = [line for line in out1.splitlines() if line.startswith("|") and "rank" not in line and "---" not in line]
        assert len(table) == 1 and "running" not in table[0], out1[-3000:]
        for run_dir in (run0, run1):
            wait_no_processes(run_dir, timeout=5)
    finally:
        _cleanup((home, home), procs)


def test_attach_last_on_a_shared_home_shows_node_0_s_whole_run(tmp_path: Path) -> None:
    """Node 1 started after node 0 on the XL_HOME every node shares: its part is the newest run,
    yet `xl attach last` shows node 0's run (every rank), and says so."""
    home = tmp_path / "home"
    (tmp_path / "mn.py").write_text(SCRIPT)
    rdzv = f"127.0.0.1:{rdzv_port()}"
    procs: list[subprocess.Popen[str]] = []
    try:
        for node in (0, 1):
            argv = [*XL, "launch", "--no-tui", "--nnodes", "2", "--node-rank", str(node), "--rdzv", rdzv, "--nproc", "1", "mn.py"]
            procs.append(subprocess.Popen(argv, env=xl_env(home, XL_TOKEN=TOKEN), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            if node == 0:
                wait_for(lambda: (home / "runs").is_dir() and next((home / "runs").iterdir(), None), timeout=60, what="node 0's run")
                time.sleep(1.1)  # node 1's part is the newer run
        for code, out in _finish(procs, timeout=90):
            assert code == 0, out[-3000:]
        run0, run1 = _runs((home, home))
        listed = xl(["runs", "--json"], xl_env(home))
        assert json.loads(listed.stdout)[-1]["run_id"] == run1.name  # `last` is node 1's part
        attach = xl(["attach", "last", "--no-tui"], xl_env(home))
        assert attach.returncode == 0, attach.stdout + attach.stderr
        assert f"showing node 0's {run0.name}" in attach.stderr and f"'xl attach {run1.name}'" in attach.stderr, attach.stderr
        assert run0.name in attach.stdout and run1.name not in attach.stdout, attach.stdout
        rows = [line for line in attach.stdout.splitlines() if line.startswith("|") and "rank" not in line and "---" not in line]
        assert len(rows) == 2, attach.stdout
        # A single-node run or node 0 itself is shown as it is, without a word.
        attach0 = xl(["attach", run0.name, "--no-tui"], xl_env(home))
        assert attach0.returncode == 0 and "showing" not in attach0.stderr, attach0.stderr
        for run_dir in (run0, run1):
            wait_no_processes(run_dir, timeout=5)
    finally:
        _cleanup((home, home), procs)
