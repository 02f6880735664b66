"""Peers on the network, done for real on loopback (docs/security.md, round 2: rows 2, 6, 13).

- row 13: the ranks' collector connections are destroyed from outside (``ss -K``), twice, and
  then the collector's listening socket too. Every record logged is stored exactly once (frames
  resent after a lost ack carry their sequence number and are not stored again), the listener is
  opened again, and the run's events say so.
- row 6: a peer that holds the token sends output for 25,000 made-up ranks to node 0: none of it
  is taken, node 0's supervisor keeps a bounded number of descriptors and goes on; the node's own
  rank's output is kept.
- row 2: a node's free-text host name reaches node 0's records with its control characters drawn.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from procs import (
    XL,
    kill_run,
    rdzv_port,
    run_json,
    wait_for,
    wait_no_processes,
    wait_run,
    xl,
    xl_env,
)
from xltele import assert_gone, rank_env

from xl.launcher.multinode import nodelink
from xl.launcher.multinode.protocol import LogMessage, RanksMessage
from xl.launcher.rundir.rows import RankRow
from xl.launcher.supervisor.logsink import LogSink
from xl.launcher.telemetry.service import Telemetry

TOKEN = "security-token-" + "fedcba9876543210"
RANK_CODE = textwrap.dedent(
    """
    import sys, time, xl
    n, pause = int(sys.argv[1]), float(sys.argv[2])
    for step in range(1, n + 1):
        xl.log(step=step, loss=1.0 / step)
        time.sleep(pause)
    import xl.client as c
    s = c._sender
    assert xl.flush(30.0), (
        "not everything was acknowledged", len(s.unacked), len(s.queue), s.spool.pending(),
        s.dropped, s.sock, s.unverified, s.spool.replay,
    )
    """
)


def _ss_kill(*filter_: str) -> None:
    done = subprocess.run(["ss", "-K", "-t", *filter_], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to destroy sockets")
def test_killed_connections_and_listener_store_every_record_once_and_listen_again(
    tmp_path: Path,
) -> None:
    tel = Telemetry(tmp_path, token=TOKEN, inventory=False)
    env = rank_env({**tel.start(), "XL_RUN_DIR": str(tmp_path), "RANK": "0"})
    port = env["XL_COLLECTOR"].rsplit(":", 1)[1]
    proc = subprocess.Popen(
        [sys.executable, "-c", RANK_CODE, "1500", "0.004"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert tel.collector is not None
        for _ in range(2):
            wait_for(
                lambda: (
                    tel.collector is not None and tel.collector.records > 0 and tel.collector.peers
                ),
                timeout=30,
                what="records",
            )
            time.sleep(0.5)
            _ss_kill("dport", "=", port)  # the ranks' side of every connection
            _ss_kill("sport", "=", port)  # and the collector's
        time.sleep(0.5)
        _ss_kill("-l", "sport", "=", port)  # the listening socket itself
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        tel.stop()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = sorted(r["step"] for r in lines if r["kind"] == "train")
    assert steps == list(range(1, 1501)), "every record logged is stored exactly once"
    status = json.loads((tmp_path / "collector.json").read_text())
    assert (
        status["rejects"].get("listener_died", 0) >= 1
        and status["rejects"].get("listener_reopened", 0) >= 1
    ), status
    reopened = [e for e in _events(tmp_path) if e["kind"] == "collector_reopened"]
    assert reopened and f"127.0.0.1:{port}" in reopened[0]["message"], _events(tmp_path)
    assert list(reopened[0]) == ["t", "kind", "message", "rank"] and reopened[0]["rank"] is None
    assert_gone({proc.pid})


def test_node_0_takes_output_only_for_ranks_a_node_has(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = tmp_path / "wait.py"
    script.write_text("import os, sys, time\nprint('ready', flush=True)\ntime.sleep(120)\n")
    rdzv = rdzv_port()
    env = xl_env(home, XL_TOKEN=TOKEN)
    launch = subprocess.run(
        [
            *XL,
            "launch",
            "--detach",
            "--nnodes",
            "2",
            "--node-rank",
            "0",
            "--rdzv",
            f"127.0.0.1:{rdzv}",
            "--nproc",
            "1",
            str(script),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert launch.returncode == 0, launch.stdout + launch.stderr
    run_dir = wait_run(home)
    link = None
    try:
        wait_for(
            lambda: (run_dir / "collector.json").exists(), timeout=60, what="node 0's collector"
        )
        link = nodelink.NodeLink("127.0.0.1", rdzv + 1, TOKEN, 1, "node-b\x1b]52;c;SGk=\x07")
        link.start()
        row = {"rank": 1, "local_rank": 0, "state": "running", "pid": 4242}
        link.send(RanksMessage((RankRow.from_json(row),)))
        # Node 0 starts its torchrun once every node joined (this one sent no fingerprint).
        sup = psutil.Process(
            wait_for(
                lambda: run_json(run_dir).get("supervisor_pid"), timeout=60, what="the supervisor"
            )
        )
        link.send(LogMessage(1, "rank 1 is real\n"))
        for rank in range(2, 25_002):  # made up: this node has rank 1 only
            link.send(LogMessage(rank, f"rank {rank} made up\n"))
        link.send(LogMessage(1, "rank 1 after the flood\n"))
        log1 = run_dir / "logs" / "rank-1.log"
        wait_for(
            lambda: log1.exists() and "after the flood" in log1.read_text(),
            timeout=120,
            what="node 1's real output",
        )
        assert sup.is_running() and sup.num_fds() < 300, sup.num_fds()
        assert {p.name for p in (run_dir / "logs").glob("rank-*.log")} <= {
            "rank-0.log",
            "rank-1.log",
        }  # none made up
        assert log1.read_text() == "rank 1 is real\nrank 1 after the flood\n"
        said = (run_dir / "supervisor.log").read_text()
        assert said.count("which it does not have; dropped") == 1, said
        # Its host name, from a peer that proved the token, is recorded drawn.
        ranks = wait_for(
            lambda: [r for r in run_json(run_dir).get("ranks", []) if r.get("rank") == 1],
            timeout=30,
            what="node 1's rank",
        )
        assert ranks[0]["node"] == "node-b␛]52;c;SGk=␇", ranks
        stop = xl(["stop", run_dir.name], env, timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        wait_no_processes(run_dir, timeout=30)
        assert "crashed" not in (run_dir / "supervisor.log").read_text()
    finally:
        if link is not None:
            link.close(0.5)
        kill_run(run_dir)


def test_other_nodes_logs_stay_within_a_bounded_number_of_open_files(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    sink = LogSink(tmp_path)
    for rank in range(1000):
        sink.append(rank, f"first of {rank}\n".encode(), b"")
    for rank in range(1000):
        sink.append(rank, f"second of {rank}\n".encode(), b"")
    assert len(sink.log_fds) <= 256 and sink.refused() == []  # no write was refused
    sink.close_all()
    for rank in (0, 500, 999):
        assert (
            tmp_path / "logs" / f"rank-{rank}.log"
        ).read_text() == f"first of {rank}\nsecond of {rank}\n"
