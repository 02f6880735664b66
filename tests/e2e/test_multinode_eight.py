"""Eight nodes of four CPU ranks on one machine: real `xl launch` per node (each its own XL_HOME,
one XL_TOKEN), 32 gloo ranks in one world.

Each node's ranks send their metrics to their own node's supervisor, which sends node 0 a
summary over its link: node 0 holds no connection of another node's rank, and still shows every
rank's figures (checked against the losses each rank wrote), a remote rank's output (`xl logs`
reads it through its node while the run lives; the last lines of it once it ended), every rank's
end, and names a remote rank's hang and no other rank.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from procs import XL, kill_run, rdzv_port, run_json, wait_for, wait_no_processes, xl_env
from where import SUPPORT

pytestmark = pytest.mark.e2e

NODES, NPROC, STEPS, HANG_AT = 8, 4, 10, 5
TOKEN = "test-token-0123456789abcdef"
SCRIPT = SUPPORT / "eight_nodes.py"
STRAY_NODE, STRAY_LOCAL = 5, 2


def _run_dir(home: Path) -> Path | None:
    runs = (
        [d for d in (home / "runs").iterdir() if (d / "run.json").exists()]
        if (home / "runs").is_dir()
        else []
    )
    return runs[0] if len(runs) == 1 else None


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def _train(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if m["kind"] == "train" and "step" in m]


def test_eight_nodes_of_four_ranks_gather_on_node_0(tmp_path: Path) -> None:
    homes = [tmp_path / f"node{n}" for n in range(NODES)]
    out, release = tmp_path / "losses", tmp_path / "release"
    out.mkdir()
    rdzv = f"127.0.0.1:{rdzv_port()}"
    common = {
        "XL_TOKEN": TOKEN,
        "XL_STALL_MIN_S": "8",
        "E8_STEPS": str(STEPS),
        "E8_HANG_AT": str(HANG_AT),
        "E8_ASTRAY_LOCAL": str(STRAY_LOCAL),
        "E8_RELEASE": str(release),
        "E8_OUT": str(out),
    }
    procs: list[subprocess.Popen[str]] = []
    for node, home in enumerate(homes):
        argv = [
            *XL, "launch", "--no-tui", "--nnodes", str(NODES), "--node-rank", str(node),
            "--rdzv", rdzv, "--nproc", str(NPROC),
            *(["--env", "HANG_HERE=1"] if node == STRAY_NODE else []),
            str(SCRIPT),
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(
                argv,
                env=xl_env(home, **common),
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",  # the astray rank prints bytes that are not UTF-8
            )
        )
    env0 = xl_env(homes[0], XL_TOKEN=TOKEN)
    runs: list[Path] = []
    try:
        runs = wait_for(
            lambda: all(found := [_run_dir(h) for h in homes]) and found,
            timeout=120,
            what="every node's run dir",
        )
        run0 = runs[0]
        stray = wait_for(
            lambda: next(
                (
                    r["rank"]
                    for r in run_json(runs[STRAY_NODE]).get("ranks") or []
                    if r.get("local_rank") == STRAY_LOCAL and r.get("pid")
                ),
                None,
            ),
            timeout=300,
            what="the astray rank's number",
        )
        # Node 0 names the remote rank that went astray, and only it.
        hang = wait_for(
            lambda: next((e for e in _events(run0) if e["kind"] == "hang"), None),
            timeout=300,
            what="node 0's hang event",
        )
        assert hang["ranks"] == [stray] and "astray at eight_nodes.py:" in hang["message"], hang
        # Its output stays on its node; node 0's `xl logs` reads it through that node, byte for
        # byte, in pieces.
        assert not (run0 / "logs" / f"rank-{stray}.log").exists()
        there = (runs[STRAY_NODE] / "logs" / f"rank-{stray}.log").read_bytes()
        assert len(there) > 150_000 and there.endswith(
            b"line 1999 of its dump \xff " + b"x" * 60 + b"\n"
        )
        fetched = subprocess.run(
            [*XL, "logs", run0.name, "--rank", str(stray)],
            env=env0,
            capture_output=True,
            timeout=60,
        )
        assert fetched.returncode == 0 and fetched.stdout == there, fetched.stderr
        release.write_text("go")
        results = []
        for p in procs:
            try:
                text, _ = p.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                p.kill()
                text, _ = p.communicate(timeout=10)
            results.append((p.returncode, text))
        for node, (code, text) in enumerate(results):
            assert code == 0, (node, text[-3000:])
        run = run_json(run0)
        assert run["status"] == "succeeded" and run["failure"] is None, run["failure"]
        ranks = {r["rank"]: r for r in run["ranks"]}
        assert sorted(ranks) == list(range(NODES * NPROC))
        assert all(r["state"] == "exited" and r["exit_code"] == 0 for r in ranks.values())
        assert {n: sum(r["node_rank"] == n for r in ranks.values()) for n in range(NODES)} == {
            n: NPROC for n in range(NODES)
        }
        # Every rank's figures on node 0, against the losses the rank computed: node 0's own
        # ranks a line a step, the others' rows each standing for `steps` of them.
        truth = {
            int(d["rank"]): {int(k): v for k, v in d["losses"].items()}
            for d in (json.loads(p.read_text()) for p in out.glob("rank-*.json"))
        }
        assert sorted(truth) == sorted(ranks)
        lines = _train(run0)
        for rank, info in ranks.items():
            mine = [m for m in lines if m["rank"] == rank]
            steps = [m["step"] for m in mine]
            assert steps and steps == sorted(steps) and steps[-1] == STEPS - 1, (rank, steps)
            assert sum(m.get("steps", 1) for m in mine) == STEPS, (rank, mine)
            assert sum(m["samples"] for m in mine) == 2 * STEPS, (rank, mine)
            for m in mine:
                assert m["loss"] == pytest.approx(truth[rank][m["step"]]), (rank, m)
            if info["node_rank"] == 0:
                assert steps == list(range(STEPS)), (rank, steps)
        # Node 0 held no connection of another node's rank: only its own four sent it frames.
        assert json.loads((run0 / "collector.json").read_text())["rank_peers"] == NPROC
        # Node 0 diagnosed the hang: every `stalled` event names the astray rank, or waits on it.
        for e in _events(run0):
            if e["kind"] == "stalled":
                assert e["rank"] == stray or e.get("waiting_on") == [stray], e
            assert e["kind"] != "hang" or e["ranks"] == [stray], e
        # After the run, node 0 has the last lines its node sent as the rank exited.
        shown = subprocess.run(
            [*XL, "logs", run0.name, "--rank", str(stray)],
            env=env0,
            capture_output=True,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        # the whole lines at the end of the rank's output, as its node has it
        whole = (runs[STRAY_NODE] / "logs" / f"rank-{stray}.log").read_bytes()
        assert shown.stdout.endswith(f"rank {stray} done\n".encode()), shown.stdout[-500:]
        assert whole.endswith(shown.stdout) and whole[-len(shown.stdout) - 1 :][:1] == b"\n"
        kept = (run0 / "logs" / f"rank-{stray}.log").stat().st_size
        assert 0 < kept <= 64 << 10, kept
        for run_dir in runs:
            wait_no_processes(run_dir, timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=10)
        for run_dir in runs:
            kill_run(run_dir)
