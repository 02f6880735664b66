"""Multi-node for real, on one machine (tests/support/twonodes.py): the run's token.

The nodes share the run's token as node 0 prints it (and it shows nowhere else), a node with a
wrong token is told so while node 0 waits for the right one, and node 0's collector on a routable
address takes only frames from peers that prove the token.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from procs import (
    XL,
    first_run,
    only_run,
    rdzv_port,
    run_dirs,
    run_json,
    run_processes,
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
    logs_say,
    run_events,
    start_nodes,
    train_records,
)

from xl import handshake

pytestmark = pytest.mark.e2e


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
    argv0 = [
        *XL, "launch", "--no-tui", "--nnodes", "2", "--node-rank", "0", "--rdzv", rdzv, "--nproc",
        "1", "mn.py",
    ]
    with open(tmp_path / "node0.out", "w") as out0:
        node0 = subprocess.Popen(
            argv0, env=env0, cwd=tmp_path, stdout=out0, stderr=subprocess.PIPE, text=True
        )
    err0: list[str] = []
    reader = _read_lines(node0.stderr, err0)
    node1: subprocess.Popen[str] | None = None
    try:
        line = wait_for(
            lambda: next((ln for ln in err0 if "xl launch" in ln), None),
            timeout=30,
            what="node 0's command",
        )
        assert any(f"on the other node, in {tmp_path}, run:" in ln for ln in err0), err0
        words = shlex.split(line)
        # VAR=value assignments, then the command.
        assigns = dict(w.split("=", 1) for w in words[: words.index("xl")])
        token = assigns["XL_TOKEN"]
        assert len(token) >= 32 and set(assigns) == {"XL_TOKEN"}, assigns
        argv = words[words.index("xl") :]
        assert argv == [
            "xl", "launch", "--nproc", "1", "--nnodes", "2", "--node-rank", "1", "--rdzv", rdzv,
            "--", "mn.py",
        ]
        env1 = xl_env(homes[1], MN_STEPS="3", MN_PAUSE="0.3", **assigns)
        node1 = subprocess.Popen(
            [*XL, *argv[1:], "--no-tui"],
            env=env1,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

        def training() -> bool:
            return all(run_dirs(h) for h in homes) and (
                logs_say(only_run(homes[0]), 1, "ready")
                and logs_say(only_run(homes[1]), 1, "ready")
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
        assert_one_view(run0, run1, {0: 1, 1: 1})
        for run_dir in (run0, run1):
            for path in run_dir.rglob("*"):
                if path.is_file():
                    assert token.encode() not in path.read_bytes(), path
            wait_no_processes(run_dir, timeout=5)
        assert token not in out1 and token not in (tmp_path / "node0.out").read_text()
        assert sum(token in ln for ln in err0) == 1
    finally:
        cleanup(homes, [p for p in (node0, node1) if p is not None])


def test_node_with_a_wrong_token_is_told_and_node_0_waits_for_the_right_one(tmp_path: Path) -> None:
    """Node 1 started with a mistyped XL_TOKEN: node 0's collector answers its link that the
    token is wrong (nothing more), node 1's `xl launch` says so in one line with the fix and
    exits 1 with nothing of it left; node 0 records the attempt, says it, and waits on: the node
    started right afterwards joins and the run succeeds."""
    (tmp_path / "mn.py").write_text(SCRIPT)
    homes = (tmp_path / "node0", tmp_path / "node1-wrong", tmp_path / "node1")
    rdzv = f"127.0.0.1:{rdzv_port()}"

    def argv(node: int) -> list[str]:
        return [
            "launch", "--no-tui", "--nnodes", "2", "--node-rank", str(node), "--rdzv", rdzv,
            "--nproc", "1", "mn.py",
        ]

    wrong_token = TOKEN[:-1] + "X"
    with open(tmp_path / "node0.out", "w") as out0:
        env0 = xl_env(homes[0], XL_TOKEN=TOKEN, MN_STEPS="3")
        node0 = subprocess.Popen(
            [*XL, *argv(0)],
            env=env0,
            cwd=tmp_path,
            stdout=out0,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        run0 = wait_for(lambda: first_run(homes[0]), timeout=30, what="node 0's run")
        start = time.monotonic()
        wrong = xl(
            argv(1), xl_env(homes[1], XL_TOKEN=wrong_token, MN_STEPS="3"), cwd=tmp_path, timeout=45
        )
        took = time.monotonic() - start
        out = wrong.stdout + wrong.stderr
        assert wrong.returncode == 1, out[-3000:]
        # Said as it happens (the run's one failure event) and in the run's closing line, as
        # every failure is; never more.
        said = [ln for ln in out.splitlines() if "refused" in ln]
        assert len(said) == 2 and said[1].startswith("xl: run ") and " failed after " in said[1], (
            out
        )
        assert (
            "node 0 (127.0.0.1:" in said[0]
            and "refused this node's XL_TOKEN: it is not the run's token" in said[0]
        )
        assert "run the exact command node 0's 'xl launch' printed" in said[0], said
        assert "Traceback" not in out and TOKEN not in out, out
        assert took < 20, (took, out)
        run_wrong = only_run(homes[1])
        assert run_json(run_wrong)["status"] == "failed"
        wait_no_processes(run_wrong, timeout=5)
        # Node 0 says a node with a wrong token tried to join, and waits on for the right one.
        [refused] = [e for e in run_events(run0) if e["kind"] == "node_refused"]
        assert refused["node_rank"] == 1 and "wrong XL_TOKEN" in refused["message"], refused
        assert node0.poll() is None and run_json(run0)["status"] == "running"
        assert not any(e["kind"] in ("node_lost", "failure") for e in run_events(run0))
        right = xl(
            argv(1), xl_env(homes[2], XL_TOKEN=TOKEN, MN_STEPS="3"), cwd=tmp_path, timeout=60
        )
        assert right.returncode == 0, (right.stdout + right.stderr)[-3000:]
        assert node0.wait(timeout=60) == 0, (tmp_path / "node0.out").read_text()[-3000:]
        assert (
            "tried to join with a wrong XL_TOKEN and was refused"
            in (tmp_path / "node0.out").read_text()
        )
        assert_one_view(run0, only_run(homes[2]), {0: 1, 1: 1})
        assert json.loads((run0 / "collector.json").read_text())["rejects"].get("bad_token", 0) >= 1
        for home in homes:
            wait_no_processes(only_run(home), timeout=5)
    finally:
        cleanup(homes, [node0])


def _routable_ipv4() -> str | None:
    for name, addrs in psutil.net_if_addrs().items():
        for addr in addrs:
            if (
                addr.family == socket.AF_INET
                and not addr.address.startswith("127.")
                and name != "lo"
            ):
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
    procs = start_nodes(tmp_path, homes, host=host, MN_STEPS="3", MN_PAUSE="1.5")
    try:
        run0 = wait_for(lambda: first_run(homes[0]), timeout=30, what="node 0's run")
        status = wait_for(
            lambda: (
                (run0 / "collector.json").exists()
                and json.loads((run0 / "collector.json").read_text())
            ),
            timeout=30,
            what="collector.json",
        )
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
                    verdict = handshake.client_handshake(
                        sock, token.encode(), role, 1 if role == handshake.ROLE_NODE else 0
                    )
                    assert verdict == handshake.REFUSED_TOKEN
                    with contextlib.suppress(OSError):
                        sock.sendall(struct.pack(">I", len(payload)) + payload)
                sock.settimeout(2)
                rest = b""
                # a reset: the frame hit a closed socket
                with contextlib.suppress(ConnectionResetError):
                    rest = sock.recv(4096)
                assert rest == b""  # closed, nothing more said
        results = finish(procs, timeout=60)
        for code, out in results:
            assert code == 0, out[-3000:]
        rejects = json.loads((run0 / "collector.json").read_text())["rejects"]
        assert rejects.get("bad_token") == 5, rejects
        # Node 0 says so, once per node link that tried, and carried on; no text of theirs.
        refused = [e for e in run_events(run0) if e["kind"] == "node_refused"]
        assert len(refused) == 2 and {e["node_rank"] for e in refused} == {1}, refused
        assert not any("intruder" in json.dumps(e) for e in run_events(run0))
        assert_one_view(run0, only_run(homes[1]), {0: 1, 1: 1})
        assert 4242 not in {m["step"] for m in train_records(run0)}
        assert not any("INJECTED" in p.read_text() for p in (run0 / "logs").glob("rank-*.log"))
        for home in homes:
            wait_no_processes(only_run(home), timeout=5)
    finally:
        cleanup(homes, procs)
