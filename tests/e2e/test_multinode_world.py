"""Multi-node for real, on one machine (tests/support/twonodes.py): two nodes form one world.

Both launches train one world of 2; node 0's run dir is the one view of the run (every rank's
logs, metrics, lifecycle), each node keeps its own records too; a node whose ranks work on after
the last collective is waited for; `xl attach last` on a shared XL_HOME shows node 0's whole run.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest
from procs import (
    first_run,
    only_run,
    rdzv_port,
    run_json,
    wait_for,
    wait_no_processes,
    xl,
    xl_env,
)
from twonodes import (
    SCRIPT,
    TOKEN,
    assert_one_view,
    cleanup,
    finish,
    node_argv,
    node_runs,
    own_ranks,
    run_events,
    start_nodes,
    train_records,
)

pytestmark = pytest.mark.e2e


def test_two_nodes_on_localhost_form_one_world(tmp_path: Path) -> None:
    # One XL_HOME for both, as on a cluster whose home directory every node shares.
    home = tmp_path / "home"
    homes = (home, home)
    try:
        results = finish(start_nodes(tmp_path, homes))
        for code, out in results:
            assert code == 0, out[-3000:]
        # The token came from the environment (as srun passes it): node 0 does not print it back.
        assert TOKEN not in results[0][1] and "XL_TOKEN=\"$XL_TOKEN\" xl launch" in results[0][1]
        run0, run1 = node_runs(homes)
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
        assert_one_view(run0, run1, {0: 1, 1: 1})
        [r0], [r1] = own_ranks(run0), own_ranks(run1)
        by_step = {m["step"]: m for m in train_records(run0) if m["rank"] == r1}
        assert by_step[2]["loss"] == pytest.approx(1 / 3)
        # Node 1's rank sent its frames to node 1's own collector (node 0 holds no connection
        # of it): node 0 took its figures as node 1's summary over the link.
        assert json.loads((run0 / "collector.json").read_text())["rank_peers"] == 1
        # Node 1 still keeps its own rank only; its xl.log metrics went to node 0.
        assert [r["rank"] for r in run_json(run1)["ranks"]] == [r1]
        assert not (run1 / "logs" / f"rank-{r0}.log").exists()
        assert json.loads((run0 / "collector.json").read_text())["node_frames"] > 0
        assert json.loads((run1 / "collector.json").read_text())["host"] == "127.0.0.1"
    finally:
        cleanup(homes)


@pytest.mark.parametrize("late", [1, 0])
def test_the_node_whose_ranks_finish_later_is_waited_for(tmp_path: Path, late: int) -> None:
    """Under c10d global rank 0 may be on node 1, and one node's ranks may legitimately work on
    after the last collective (saving a checkpoint) well past the stop grace + XL_NODE_END_WAIT
    (10 s; 3 s here). late=1:
    node 0 waits for node 1 as long as node 1 heartbeats with ranks running, keeps its collector
    (and its torchrun, which serves node 1's c10d store) up for node 1's last words, and ends
    with node 1's end, not before. late=0: node 1 ends its part when its ranks are done; node 0's
    ranks are not cut by it."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    tail = 9.0  # grace (1 s in xl_env) + XL_NODE_END_WAIT (3 s) + some
    per_node: list[dict[str, str]] = [{}, {}]
    per_node[late] = {"MN_TAIL": str(tail)}
    procs = start_nodes(tmp_path, homes, per_node=(per_node[0], per_node[1]), XL_NODE_END_WAIT="3")
    try:
        results = finish(procs, timeout=90)
        for code, out in results:
            assert code == 0, out[-3000:]
        run0, run1 = only_run(homes[0]), only_run(homes[1])
        for run_dir in (run0, run1):
            assert run_json(run_dir)["status"] == "succeeded", run_json(run_dir)
        [r1] = own_ranks((run0, run1)[late])
        # Node 0 has the late rank's last words, node 1's end, and did not give up on it.
        log = (run0 / "logs" / f"rank-{r1}.log").read_text()
        assert f"tail {tail:g}s" in log and "done" in log, log
        events = run_events(run0)
        assert not any(e["kind"] in ("nodes_unfinished", "node_lost") for e in events), events
        ended = next(e for e in events if e["kind"] == "node_ended" and e["node_rank"] == 1)
        assert events[-1]["kind"] == "run_ended" and events[-1]["t"] >= ended["t"]
        assert run_json(run0)["ended_at"] >= ended["t"]
        assert_one_view(run0, run1, {0: 1, 1: 1})
        for home in homes:
            wait_no_processes(only_run(home), timeout=5)
    finally:
        cleanup(homes, procs)


def test_attach_last_on_a_shared_home_shows_node_0_s_whole_run(tmp_path: Path) -> None:
    """Node 1 started after node 0 on the XL_HOME every node shares: its part is the newest run,
    yet `xl attach last` shows node 0's run (every rank), and says so."""
    home = tmp_path / "home"
    (tmp_path / "mn.py").write_text(SCRIPT)
    rdzv = f"127.0.0.1:{rdzv_port()}"
    procs: list[subprocess.Popen[str]] = []
    try:
        for node in (0, 1):
            argv = node_argv(node, rdzv)
            procs.append(
                subprocess.Popen(
                    argv,
                    env=xl_env(home, XL_TOKEN=TOKEN),
                    cwd=tmp_path,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
            if node == 0:
                wait_for(lambda: first_run(home), timeout=60, what="node 0's run")
                time.sleep(1.1)  # node 1's part is the newer run
        for code, out in finish(procs, timeout=90):
            assert code == 0, out[-3000:]
        run0, run1 = node_runs((home, home))
        listed = xl(["runs", "--json"], xl_env(home))
        assert json.loads(listed.stdout)[-1]["run_id"] == run1.name  # `last` is node 1's part
        attach = xl(["attach", "last", "--no-tui"], xl_env(home))
        assert attach.returncode == 0, attach.stdout + attach.stderr
        assert (
            f"showing node 0's {run0.name}" in attach.stderr
            and f"'xl attach {run1.name}'" in attach.stderr
        ), attach.stderr
        assert run0.name in attach.stdout and run1.name not in attach.stdout, attach.stdout
        rows = [
            line
            for line in attach.stdout.splitlines()
            if line.startswith("|") and "rank" not in line and "---" not in line
        ]
        assert len(rows) == 2, attach.stdout
        # A single-node run or node 0 itself is shown as it is, without a word.
        attach0 = xl(["attach", run0.name, "--no-tui"], xl_env(home))
        assert attach0.returncode == 0 and "showing" not in attach0.stderr, attach0.stderr
        for run_dir in (run0, run1):
            wait_no_processes(run_dir, timeout=5)
    finally:
        cleanup((home, home), procs)
