"""Multi-node on one machine (tests/support/twonodes.py): the rendezvous and the node contract.

Bad --rdzv, --node-rank and node settings are one line and exit 2 with nothing started; the plan
is torchrun's c10d rendezvous at node 0; node 0 waiting for a node 1 nobody started stops at once;
node 1 started long before node 0 waits for it and the run then trains.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import XL, first_run, rdzv_port, run_json, wait_for, wait_no_processes, xl, xl_env
from twonodes import (
    SCRIPT,
    TOKEN,
    assert_one_view,
    cleanup,
    finish,
    node_argv,
    node_runs,
    run_events,
)
from where import SUPPORT

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--rdzv", "127.0.0.1"], "--rdzv '127.0.0.1' is not HOST:PORT"),
        (["--rdzv", "127.0.0.1:"], "is not HOST:PORT"),
        (["--rdzv", "127.0.0.1:70000"], "port 70000 is out of range; use 1-65535"),
        (["--rdzv", "127.0.0.1:0"], "port 0 is out of range"),
        (
            ["--rdzv", "::1:29500"],
            "is not HOST:PORT (e.g. --rdzv 10.0.0.1:29500 or [fd00::1]:29500)",
        ),
        (["--node-rank", "2", "--rdzv", "127.0.0.1:29500"], "--node-rank 2 must be in 0..1"),
    ],
)
def test_bad_rendezvous_is_one_line_and_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    (tmp_path / "mn.py").write_text(SCRIPT)
    home = tmp_path / "home"
    proc = xl(
        ["launch", "--no-tui", "--nnodes", "2", *args, "mn.py"],
        xl_env(home),
        cwd=tmp_path,
        timeout=30,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xl launch: ") and says in lines[0], proc.stderr
    assert proc.stdout == ""
    # Nothing was started.
    assert not (home / "runs").is_dir() or not any((home / "runs").iterdir())


def test_rdzv_in_the_plan_is_c10d_rendezvous_at_node_0(tmp_path: Path) -> None:
    """torchrun's c10d rendezvous at node 0's address (IPv6 stays bracketed, as torch parses it),
    no --node-rank (torch ignores it under c10d), node 0 hosting the store, an id every node of the
    run derives alike from the run's token without showing it, another id for another run on the
    same endpoint."""
    (tmp_path / "mn.py").write_text(SCRIPT)

    def plan(node: str, **env: str) -> list[str]:
        args = [
            "launch", "--dry-run", "--json", "--nnodes", "2", "--node-rank", node, "--rdzv",
            "[::1]:29511", "mn.py",
        ]
        proc = xl(args, xl_env(tmp_path / "home", **env), cwd=tmp_path, timeout=30)
        assert proc.returncode == 0, proc.stderr
        return list(json.loads(proc.stdout)["argv"])

    argv = plan("1", XL_TOKEN=TOKEN)

    def opt(name: str) -> str:
        return str(argv[argv.index(name) + 1])

    assert (
        opt("--nnodes") == "2"
        and opt("--rdzv-backend") == "c10d"
        and opt("--rdzv-endpoint") == "[::1]:29511"
    )
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
    args = [
        "launch", "--dry-run", "--nnodes", "2", "--node-rank", "1", "--rdzv", "[::1]:29511",
        "mn.py",
    ]
    proc = xl(args, xl_env(tmp_path / "home", XL_TOKEN=TOKEN), cwd=tmp_path, timeout=30)
    assert proc.returncode == 0 and "# xl node 1 of 2 (node 0 gathers every node)" in proc.stdout, (
        proc.stdout
    )


@pytest.mark.parametrize(
    ("node_rank", "env", "says"),
    [
        (
            "1",
            {},
            "--node-rank 1 needs XL_TOKEN, the run's token: run the command node 0's 'xl launch' "
            "printed",
        ),
        ("1", {"XL_TOKEN": "short"}, "XL_TOKEN must be 16-256 letters, digits or -_.~+/="),
        (
            "0",
            {"XL_COLLECTOR_PORT": "http"},
            "XL_COLLECTOR_PORT='http' is not a port; use 1-65535, the same on every node",
        ),
        ("0", {"RDZV_PORT": "65535"}, "--rdzv port 65535 leaves no port for node 0's collector"),
    ],
)
def test_bad_node_contract_is_one_line_and_exit_2(
    tmp_path: Path, node_rank: str, env: dict[str, str], says: str
) -> None:
    (tmp_path / "mn.py").write_text(SCRIPT)
    home = tmp_path / "home"
    port = env.pop("RDZV_PORT", "29511")
    base = xl_env(home, **env)
    if "XL_TOKEN" not in env:
        base.pop("XL_TOKEN", None)
    args = [
        "launch", "--no-tui", "--nnodes", "2", "--node-rank", node_rank, "--rdzv",
        f"127.0.0.1:{port}", "mn.py",
    ]
    proc = xl(args, base, cwd=tmp_path, timeout=30)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xl launch: ") and says in lines[0], proc.stderr
    assert not (home / "runs").is_dir() or not any((home / "runs").iterdir())


def test_stopping_node_0_while_node_1_never_joined_is_prompt_and_says_so(tmp_path: Path) -> None:
    """Node 0 waits for a node 1 nobody started (to compare its environment before its
    rendezvous starts); `xl stop` ends it at once (no wait for a node that has nothing to end),
    and the record says node 1 never joined, not that it "had not reported the end of its
    part"."""
    home = tmp_path / "home"
    (tmp_path / "mn.py").write_text(SCRIPT)
    argv = [
        *XL, "launch", "--no-tui", "--nnodes", "2", "--node-rank", "0", "--rdzv",
        f"127.0.0.1:{rdzv_port()}", "--nproc", "1", "mn.py",
    ]
    node0 = subprocess.Popen(
        argv,
        env=xl_env(home, XL_TOKEN=TOKEN),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        run0 = wait_for(lambda: first_run(home), timeout=60, what="node 0's run")
        wait_for(lambda: (run0 / "collector.json").exists(), timeout=60, what="node 0's collector")
        time.sleep(2)  # waiting for node 1
        asked = time.monotonic()
        stop = xl(["stop", run0.name], xl_env(home))
        took = time.monotonic() - asked
        assert stop.returncode == 0 and stop.stdout.strip() == f"{run0.name} stopped", (
            stop.stdout + stop.stderr
        )
        # the grace (1 s) and the supervisor's own ending; it waited 11 s for node 1
        assert took < 8.0, took
        events = run_events(run0)
        assert not any(e["kind"] == "nodes_unfinished" for e in events), events
        never = [e for e in events if e["kind"] == "nodes_never_joined"]
        assert len(never) == 1 and "node(s) 1 never joined" in never[0]["message"], events
        assert run_json(run0)["status"] == "stopped"
        code, out = finish([node0], timeout=30)[0]
        assert code != 0, out
        wait_no_processes(run0, timeout=5)
    finally:
        cleanup((home, home), [node0])


# torchrun's c10d client gives up on node 0's store after its read_timeout: torch's 60 s, 10 s
# for node 1's torchrun here (tests/support/rdzvshort), so node 0 need not be minutes late.
READ_TIMEOUT_S = 10


def _torchrun_without_the_wait(tmp_path: Path, rdzv: str) -> subprocess.CompletedProcess[str]:
    """torchrun as node 1 would run it if xl did not wait first, with the same client timeout."""
    conf = f"is_host=0,read_timeout={READ_TIMEOUT_S}"
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv, "--rdzv-id", "without-the-wait",
        "--rdzv-conf", conf, "mn.py",
    ]
    return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=180)


@pytest.mark.timeout(300)
def test_node_1_started_long_before_node_0_still_joins(tmp_path: Path) -> None:
    """torchrun's c10d client gives up on node 0's store after its read_timeout ("The connection
    to the C10d store has failed"), its rendezvous only after 600 s: node 1 waits for node 0 as
    long as the rendezvous would, says so, and the run trains when node 0 comes after node 1's
    torchrun, started without that wait, would have given up (a torchrun started that way once
    node 1 waits, with the same timeout, has failed before node 0 starts). Node 1's own summary
    lists its rank only, ended."""
    home = tmp_path / "home"
    (tmp_path / "mn.py").write_text(SCRIPT)
    rdzv = f"127.0.0.1:{rdzv_port()}"
    procs: list[subprocess.Popen[str]] = []
    timeouts = tmp_path / "read_timeouts.log"
    short_client = {
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(SUPPORT / "rdzvshort"), os.environ.get("PYTHONPATH")) if p
        ),
        "XL_TEST_RDZV_READ_TIMEOUT": str(READ_TIMEOUT_S),
        "XL_TEST_RDZV_READ_TIMEOUT_LOG": str(timeouts),
    }

    def launch(node: int, **env: str) -> None:
        argv = node_argv(node, rdzv)
        procs.append(
            subprocess.Popen(
                argv,
                env=xl_env(home, XL_TOKEN=TOKEN, **env),
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )

    try:
        launch(1, **short_client)
        first = wait_for(lambda: first_run(home), timeout=60, what="node 1's run")
        said = wait_for(
            lambda: (
                (first / "events.jsonl").exists()
                and next((e for e in run_events(first) if e["kind"] == "waiting_for_node_0"), None)
            ),
            timeout=30,
            what="node 1 to wait",
        )
        assert (
            f"waiting for node 0's rendezvous at {rdzv}" in said["message"]
            and "(up to 600s, as torchrun's own)" in said["message"]
        ), said
        # Started after node 1's own torchrun would have been, it gives up before node 0 comes.
        gave_up = _torchrun_without_the_wait(tmp_path, rdzv)
        assert (
            gave_up.returncode != 0
            and "The connection to the C10d store has failed" in gave_up.stderr
        ), gave_up.stderr[-3000:]
        assert procs[0].poll() is None and run_json(first)["status"] == "running"
        launch(0)
        (code1, out1), (code0, out0) = finish(procs, timeout=150)
        assert code0 == 0 and code1 == 0, (out0[-3000:], out1[-3000:])
        run0, run1 = node_runs((home, home))
        # Node 1's torchrun, and it alone, ran with the short client timeout.
        torchrun = run_json(run1)["torchrun_pid"]
        assert timeouts.read_text().splitlines() == [
            f"read_timeout={READ_TIMEOUT_S} pid={torchrun}"
        ], (timeouts.read_text(), torchrun)
        assert "C10d store has failed" not in (run1 / "logs" / "torchrun.log").read_text()
        assert_one_view(run0, run1, {0: 1, 1: 1})
        assert [(r["state"], r["exit_code"]) for r in run_json(run1)["ranks"]] == [("exited", 0)], (
            run_json(run1)["ranks"]
        )
        table = [
            line
            for line in out1.splitlines()
            if line.startswith("|") and "rank" not in line and "---" not in line
        ]
        assert len(table) == 1 and "running" not in table[0], out1[-3000:]
        for run_dir in (run0, run1):
            wait_no_processes(run_dir, timeout=5)
    finally:
        cleanup((home, home), procs)
