"""Multi-node for real, on one machine (tests/support/twonodes.py): an end anywhere ends the run
everywhere.

A rank failing or a node dying anywhere ends the run on every node, and node 0 names the node and
rank (failures attributed to the right xl node whichever order torch numbered the nodes in);
Ctrl-C on one node leaves no process of either behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from pathlib import Path

import pytest
from procs import only_run, run_dirs, run_json, run_processes, wait_for, wait_no_processes
from twonodes import (
    assert_layout,
    cleanup,
    finish,
    logs_say,
    own_ranks,
    run_events,
    start_nodes,
)

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("mode", ["mid", "late"])
def test_rank_failing_on_node_1_ends_node_0(tmp_path: Path, mode: str) -> None:
    """mid: rank 1 raises while rank 0 waits in an all_reduce (rank 0 then fails too, of gloo's
    error: node 0 still blames rank 1, which failed first). late: rank 1 raises after the last
    collective, so rank 0 succeeds and its torchrun waits at its exit barrier for node 1's
    torchrun, which never comes (torch alone would hold node 0's run for 300 s): node 0 learns of
    the failure from node 1 and ends its part."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    try:
        results = finish(
            start_nodes(tmp_path, homes, per_node=({}, {"MN_FAIL": "1"}), MN_MODE=mode)
        )
        run0, run1 = (run_json(only_run(h)) for h in homes)
        assert results[1][0] == 1, results[1][1][-3000:]
        [r0], [r1] = own_ranks(only_run(homes[0])), own_ranks(only_run(homes[1]))
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
        assert (failure["rank"], failure["node_rank"], failure["node"]) == (
            r1,
            1,
            socket.gethostname(),
        ), failure
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
        cleanup(homes)


def test_ctrl_c_on_node_0_ends_both_nodes(tmp_path: Path) -> None:
    """Node 1 runs 2 processes, node 0 one: torch numbers them node after node in arrival order,
    0 | 1, 2 or 0, 1 | 2 (not node_rank * nproc)."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    procs = start_nodes(tmp_path, homes, (1, 2), MN_MODE="loop", MN_WORLD="3")
    try:

        def both_training() -> bool:
            if not all(run_dirs(h) for h in homes):
                return False
            return logs_say(only_run(homes[0]), 1, "ready") and logs_say(
                only_run(homes[1]), 2, "ready"
            )

        wait_for(both_training, timeout=60, what="both nodes to train")
        run1 = run_json(only_run(homes[1]))
        assert run1["world_size"] == 3
        first = run1["ranks"][0]["rank"]
        assert first in (0, 1), run1["ranks"]
        assert [(r["rank"], r["local_rank"], r["state"]) for r in run1["ranks"]] == [
            (first, 0, "running"),
            (first + 1, 1, "running"),
        ]
        procs[0].send_signal(signal.SIGINT)  # Ctrl-C in node 0's terminal
        results = finish(procs, timeout=30)
        run0, run1 = (run_json(only_run(h)) for h in homes)
        assert run0["status"] == "stopped", results[0][1][-3000:]
        # Node 0 lists the three ranks of both nodes; its own was stopped.
        nodes = assert_layout(only_run(homes[0]), only_run(homes[1]), {0: 1, 1: 2})
        [own] = [r for r in run0["ranks"] if nodes[r["rank"]] == 0]
        assert own["state"] == "stopped", run0["ranks"]
        # Node 0 tells node 1 to stop (its rank would also lose its peer at the next all_reduce).
        assert run1["status"] in ("failed", "stopped") and results[1][0] != 0, results[1][1][-3000:]
        # Grace is 1 s (xl_env): everything of both nodes is gone a few seconds later.
        for home in homes:
            wait_no_processes(only_run(home), timeout=5)
    finally:
        cleanup(homes, procs)


@pytest.mark.parametrize("victim", ["node", "rank"])
def test_a_dead_node_or_rank_on_node_1_ends_the_run_on_both(tmp_path: Path, victim: str) -> None:
    """SIGKILL every process of node 1 (the node is gone for node 0) or its rank, mid-run: both
    nodes end, node 0 names node 1 (and the rank), nothing of either is left."""
    homes = (tmp_path / "node0", tmp_path / "node1")
    procs = start_nodes(tmp_path, homes, MN_MODE="loop")
    try:

        def both_training() -> bool:
            if not all(run_dirs(h) for h in homes):
                return False
            return logs_say(only_run(homes[0]), 1, "ready") and logs_say(
                only_run(homes[1]), 1, "ready"
            )

        wait_for(both_training, timeout=60, what="both nodes to train")
        run1 = wait_for(
            lambda: (r := run_json(only_run(homes[1])))["ranks"][0]["pid"] and r,
            timeout=10,
            what="node 1's rank's pid",
        )
        r1 = run1["ranks"][0]["rank"]
        if victim == "node":
            os.kill(run1["supervisor_pid"], signal.SIGKILL)
            for proc in run_processes(only_run(homes[1])):
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, signal.SIGKILL)
        else:
            os.kill(run1["ranks"][0]["pid"], signal.SIGKILL)
        results = finish(procs, timeout=60)
        run0 = run_json(only_run(homes[0]))
        assert results[0][0] == 1 and run0["status"] == "failed", results[0][1][-3000:]
        if victim == "rank":
            assert results[1][0] != 0 and run_json(only_run(homes[1]))["status"] in (
                "failed",
                "stopped",
            ), results[1][1][-3000:]
        failure = run0["failure"]
        assert failure["node_rank"] == 1 and failure["node"] == socket.gethostname(), failure
        if victim == "node":
            assert (
                failure["rank"] is None
                and f"was lost with rank {r1} running" in failure["message"]
            ), failure
            assert any(
                e["kind"] == "node_lost" and e["node_rank"] == 1
                for e in run_events(only_run(homes[0]))
            )
        else:
            assert failure["rank"] == r1 and failure["exit_code"] == -signal.SIGKILL, failure
            assert f"rank {r1} was killed by SIGKILL" in failure["message"], failure
        for home in homes:
            wait_no_processes(only_run(home), timeout=10)
    finally:
        cleanup(homes, procs)
