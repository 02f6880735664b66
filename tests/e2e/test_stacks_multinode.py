"""A hang on the second node of a 2-node run (two `xl launch` nodes on localhost, gloo CPU).

Node 1's rank sleeps outside the all_reduce its peer on node 0 waits in. Node 0's `xl stacks`
asks its own rank and, through node 0's supervisor and node 1's link, node 1's rank: the document
has that rank's frames and the verdict names it with its function and file:line; node 1's own
`xl stacks` says the same. Node 0's automatic capture on the stall gathers the same way.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from procs import (
    XL,
    kill_run,
    rdzv_port,
    run_json,
    wait_for,
    wait_no_processes,
    xl,
    xl_env,
)
from where import SUPPORT

pytestmark = pytest.mark.e2e

SCRIPT = SUPPORT / "hang_ddp.py"


def _run_dirs(home: Path) -> dict[int, Path]:
    found = {}
    for d in (home / "runs").iterdir() if (home / "runs").is_dir() else ():
        node = run_json(d).get("node_rank")
        if isinstance(node, int):
            found[node] = d
    return found


def _ready(run_dir: Path) -> bool:
    """This node's ranks have their pids and said "ready" (in its own run dir)."""
    node = run_json(run_dir).get("node_rank")
    mine = [r for r in run_json(run_dir).get("ranks") or [] if r.get("node_rank", 0) == node]
    return bool(mine) and all(
        r.get("pid")
        and (log := run_dir / "logs" / f"rank-{r['rank']}.log").exists()
        and "ready" in log.read_text(errors="replace")
        for r in mine
    )


def test_a_hang_on_node_1_is_named_from_node_0(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = xl_env(home, XL_TOKEN="test-token-0123456789abcdef", XL_STALL_MIN_S="3")
    rdzv = f"127.0.0.1:{rdzv_port()}"
    procs = []
    for node in (0, 1):
        argv = [
            *XL,
            "launch",
            "--no-tui",
            "--nnodes",
            "2",
            "--node-rank",
            str(node),
            "--rdzv",
            rdzv,
            "--nproc",
            "1",
            *(["--env", "HANG_HERE=1"] if node == 1 else []),
            str(SCRIPT),
            "--mode",
            "sleep",
            "--rank",
            "-1",
        ]
        procs.append(
            subprocess.Popen(
                argv, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        )
    dirs: dict[int, Path] = {}
    try:
        dirs = wait_for(
            lambda: len(found := _run_dirs(home)) == 2 and found,
            timeout=60,
            what="both nodes' run dirs",
        )
        run0, run1 = dirs[0], dirs[1]
        # each node's own ranks (a rank's output stays in its node's run dir)
        wait_for(lambda: _ready(run0) and _ready(run1), timeout=90, what="both nodes' ranks ready")
        [far] = [r["rank"] for r in run_json(run1)["ranks"]]
        [near] = [r["rank"] for r in run_json(run0)["ranks"] if r["rank"] != far]

        def named() -> dict[str, Any] | None:
            done = xl(["stacks", run0.name, "--json"], env, timeout=30)
            assert done.returncode == 0, done.stderr
            doc = json.loads(done.stdout)
            return doc if doc["verdict"]["ranks"] == [far] else None

        doc = wait_for(named, timeout=60, what="node 0 naming node 1's rank", interval=0.5)
        message = doc["verdict"]["message"]
        assert message.startswith(f"rank {far} never entered all_reduce #"), message
        assert (
            "it is in astray at hang_ddp.py:" in message
            and f"rank {near} waits in all_reduce #" in message
        )
        entry = next(e for e in doc["ranks"] if e["rank"] == far)
        assert "error" not in entry, entry
        assert any(
            f["function"] == "astray" and f["file"].endswith("hang_ddp.py")
            for f in entry["threads"][0]["frames"]
        )
        there = xl(["stacks", run1.name], env, timeout=30)
        assert there.returncode == 0 and f"rank {far} is in astray at hang_ddp.py:" in there.stdout
        # Node 0's own capture on the stall: one hang event naming node 1's rank.
        hang = wait_for(
            lambda: next(
                (
                    e
                    for e in map(json.loads, (run0 / "events.jsonl").read_text().splitlines())
                    if e["kind"] == "hang"
                ),
                None,
            ),
            timeout=60,
            what="the hang event on node 0",
        )
        assert hang["ranks"] == [far] and "astray at hang_ddp.py:" in hang["message"], hang
        saved = json.loads((run0 / hang["stacks"]).read_text())
        assert next(e for e in saved["ranks"] if e["rank"] == far).get("threads"), saved
    finally:
        for d in dirs.values():
            xl(["stop", d.name], env, timeout=60)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        for d in dirs.values():
            kill_run(d)
            wait_no_processes(d, timeout=30)
