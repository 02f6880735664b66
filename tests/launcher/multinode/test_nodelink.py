"""The node link of a node > 0, against node 0's real collector (in this process, no training).

What a person notices: node 0 gets this node's output and records in order, node 0's stop reaches
the node, a wrong XL_TOKEN is refused for good (not retried forever), a listener that cannot prove
it holds the token gets nothing, and training never waits on the link (node 0 late or gone).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from nodelines import forge
from procs import rdzv_port, wait_for

from xl import handshake
from xl.launcher.multinode import nodelink
from xl.launcher.multinode.protocol import (
    EndMessage,
    EventMessage,
    FailureMessage,
    LogMessage,
    NodeMessage,
    RecMessage,
    RefusedMessage,
)
from xl.launcher.rundir.events import EventKind
from xl.launcher.rundir.outcome import Failure
from xl.launcher.rundir.runrecord import RunStatus
from xl.launcher.telemetry.service import Telemetry

Got = list[tuple[int, str, NodeMessage]]  # (node, host, message) as node 0's supervisor gets them

TOKEN = "test-token-0123456789abcdef"


def _collector(run_dir: Path, got: Got, **kw: Any) -> tuple[Telemetry, str, int]:
    tel = Telemetry(
        run_dir,
        token=TOKEN,
        inventory=False,
        on_node=lambda n, h, msgs: got.extend((n, h, m) for m in msgs),
        **kw,
    )
    host, port = tel.start()["XL_COLLECTOR"].rsplit(":", 1)
    return tel, host, int(port)


def test_node_link_to_node_0_collector_and_back(tmp_path: Path) -> None:
    """Messages arrive in order, sampled records are stored, the stop reaches the node; bad
    messages are refused."""
    got: Got = []
    tel, host, port = _collector(tmp_path, got)
    link = nodelink.NodeLink(host, port, TOKEN, 1, "node-b")
    try:
        link.start()
        link.send_log(1, b"hello \xff world\n")
        rec = {"t": time.time(), "rank": 1, "kind": "sys", "rss_mib": 12.5}
        link.send(RecMessage(1, json.dumps(rec)))
        link.send(
            EventMessage(
                EventKind.RANK_STARTED,
                {"kind": "rank_started", "rank": 1, "message": "rank 1 started"},
            )
        )
        # not a forwarded kind
        forge(link, {"type": "event", "event": {"kind": "stalled", "rank": 1}})
        forge(link, {"type": "ranks", "ranks": [{"rank": "one"}]})
        wait_for(lambda: len(got) >= 2, timeout=10, what="the link's messages")
        assert [(n, h, type(m)) for n, h, m in got] == [
            (1, "node-b", LogMessage),
            (1, "node-b", EventMessage),
        ]
        log, event = got[0][2], got[1][2]
        assert isinstance(log, LogMessage) and log.rank == 1
        assert log.data.encode("utf-8", "surrogateescape") == b"hello \xff world\n"
        assert isinstance(event, EventMessage) and event.kind is EventKind.RANK_STARTED
        assert event.event["message"] == "rank 1 started"
        assert link.heard_at is not None  # node 0 answers: the follower knows it is there
        tel.stop_nodes(
            {"reason": "failure", "failure": {"rank": 0, "node_rank": 0, "message": "boom"}}
        )
        [cmd] = wait_for(link.commands, timeout=10, what="node 0's stop")
        assert isinstance(cmd, nodelink.StopCommand) and not cmd.requested
        assert cmd.failure is not None and (cmd.failure.message, cmd.failure.node_rank) == (
            "boom", 0,
        )
        assert link.close(5.0)
    finally:
        link.close(0.1)
        tel.stop()
    status = json.loads((tmp_path / "collector.json").read_text())
    assert status["rejects"] == {"bad_kind": 1, "bad_rank": 1}, status
    assert [
        json.loads(x)["rss_mib"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ] == [12.5]


def test_node_link_clips_a_long_failure_so_node_0_takes_it(tmp_path: Path) -> None:
    """A load_state_dict error easily exceeds node 0's caps (4096 characters for the error and
    message, 64 KiB for the traceback): the link clips it, keeping the head of the error and
    message and the tail of the traceback, and node 0 takes both the failure and the end."""
    error = (
        "RuntimeError: Error(s) in loading state_dict: " + "Missing key(s): 'layer.weight', " * 2000
    )
    traceback = (
        "Traceback (most recent call last):\n"
        + '  File "train.py", line 1, in <module>\n' * 5000
        + error
        + "\n"
    )
    failure = {
        "rank": 1,
        "exit_code": 1,
        "traceback": traceback,
        "error": error,
        "message": f"rank 1 failed first: {error}",
        "node": "node-b",
        "node_rank": 1,
    }
    got: Got = []
    tel, host, port = _collector(tmp_path, got)
    link = nodelink.NodeLink(host, port, TOKEN, 1, "node-b")
    try:
        link.start()
        failed = FailureMessage(Failure.from_json(failure), time.time())
        link.send(failed)
        link.send(EndMessage(RunStatus.FAILED, failed, time.time()))
        wait_for(lambda: len(got) >= 2, timeout=10, what="the failure and the end at node 0")
        assert link.close(5.0)
    finally:
        link.close(0.1)
        tel.stop()
    assert [type(m) for _, _, m in got] == [FailureMessage, EndMessage]
    for _, _, msg in got:
        took = msg.failure if isinstance(msg, EndMessage) else msg
        assert isinstance(took, FailureMessage) and took.own  # node 1's own, of node 1
        sent = took.failure
        assert sent.error is not None and sent.traceback is not None
        assert len(sent.error) <= 4096 and error.startswith(sent.error.removesuffix("[...]"))
        assert len(sent.message) <= 4096 and sent.message.startswith(
            "rank 1 failed first: RuntimeError: Error(s)"
        )
        assert len(sent.traceback) <= 64 << 10 and sent.traceback.endswith(error[-1000:] + "\n")
        assert (sent.rank, sent.exit_code, sent.host, sent.node_rank, sent.cause) == (
            1, 1, "node-b", 1, None,
        )
    assert len(failure["error"]) == len(error)  # the node's own copy is whole
    status = json.loads((tmp_path / "collector.json").read_text())
    assert not status["rejects"], status


def test_node_link_never_blocks_when_node_0_is_unreachable() -> None:
    link = nodelink.NodeLink("127.0.0.1", rdzv_port(), TOKEN, 1, "node-b")
    link.start()
    start = time.monotonic()
    for i in range(1000):
        link.send_log(1, f"line {i}\n".encode())
    assert time.monotonic() - start < 1.0
    assert link.close(0.5) is False  # nothing acked; the node keeps its own records
    assert time.monotonic() - start < 5.0


def test_what_was_sent_before_node_0_listened_arrives_once_it_does(tmp_path: Path) -> None:
    """Node 1's supervisor started first: its first output waits in the link, and node 0 gets it,
    in order, once its collector is up."""
    port = rdzv_port()
    link = nodelink.NodeLink("127.0.0.1", port, TOKEN, 1, "node-b")
    got: Got = []
    tel: Telemetry | None = None
    try:
        link.start()
        for i in range(3):
            link.send_log(1, f"early {i}\n".encode())
        time.sleep(0.5)  # a few refused connections meanwhile
        assert link.heard_at is None
        tel, _host, _port = _collector(tmp_path, got, port=port)
        wait_for(lambda: len(got) >= 3, timeout=20, what="the early lines at node 0")
        assert [m.data for _, _, m in got if isinstance(m, LogMessage)] == [
            "early 0\n", "early 1\n", "early 2\n",
        ]
        assert len(got) == 3
        assert link.close(5.0)
    finally:
        link.close(0.1)
        if tel is not None:
            tel.stop()


def test_a_wrong_token_is_refused_for_good_and_said_once(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    got: Got = []
    tel, host, port = _collector(tmp_path, got)
    link = nodelink.NodeLink(host, port, TOKEN[:-1] + "X", 1, "node-b")
    try:
        link.start()
        link.send_log(1, b"never sent\n")
        cmds = wait_for(link.commands, timeout=10, what="node 0's refusal")
        assert cmds == [nodelink.Refused("bad_token")] and link.refused == "bad_token"
        link.send_log(1, b"nor this\n")
        assert link.close(1.0) is False
    finally:
        link.close(0.1)
        tel.stop()
    # Node 0 hears of the attempt (to say so), and nothing the node sent.
    assert [(n, type(m), getattr(m, "reason", None)) for n, _, m in got] == [
        (1, RefusedMessage, "bad_token")
    ], got
    assert json.loads((tmp_path / "collector.json").read_text())["rejects"] == {"bad_token": 1}
    err = capfd.readouterr().err
    assert err.count("refused this node's XL_TOKEN (not the run's token); the link stops") == 1, err


def test_a_listener_that_cannot_prove_the_token_gets_nothing(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Another program on node 0's port (or one pretending to be node 0): it sends a challenge and a
    made-up proof; the link sends it no message, says so, and tries again later."""
    received: list[bytes] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        server.settimeout(10)
        port = server.getsockname()[1]

        def impostor() -> None:
            with server.accept()[0] as conn:
                conn.settimeout(3)
                conn.sendall(handshake.MAGIC + os.urandom(handshake.NONCE))
                received.append(conn.recv(handshake.HELLO_SIZE))
                conn.sendall(os.urandom(handshake.MAC))
                try:
                    while data := conn.recv(4096):
                        received.append(data)
                except OSError:
                    pass

        thread = threading.Thread(target=impostor, daemon=True)
        thread.start()
        link = nodelink.NodeLink("127.0.0.1", port, TOKEN, 1, "node-b")
        try:
            link.start()
            link.send_log(1, b"a line for node 0 only\n")
            thread.join(10)
        finally:
            link.close(0.1)
    assert b"node 0 only" not in b"".join(received)
    assert len(b"".join(received)) == handshake.HELLO_SIZE  # its hello, nothing more
    assert TOKEN.encode() not in b"".join(received)
    assert "did not prove it holds this run's XL_TOKEN" in capfd.readouterr().err


def test_node_0_s_collector_gone_for_a_while_loses_nothing_of_what_came_meanwhile(
    tmp_path: Path,
) -> None:
    """The connection to node 0 drops (here its collector is gone and comes back): what this node
    sent meanwhile waits and arrives once node 0 listens again, each line once, in order."""
    got: Got = []
    port = rdzv_port()
    tel, host, _ = _collector(tmp_path / "first", got, port=port)
    link = nodelink.NodeLink(host, port, TOKEN, 1, "node-b")
    again: Telemetry | None = None
    try:
        link.start()
        link.send_log(1, b"before\n")
        wait_for(lambda: len(got) >= 1, timeout=10, what="the first line at node 0")
        tel.stop()
        for i in range(3):
            link.send_log(1, f"meanwhile {i}\n".encode())
        time.sleep(0.5)  # the link finds node 0 gone and retries
        again, _, _ = _collector(tmp_path / "again", got, port=port)
        def meanwhile() -> list[str]:
            return [m.data for _, _, m in got
                    if isinstance(m, LogMessage) and m.data.startswith("meanwhile")]

        wait_for(lambda: len(meanwhile()) >= 3, timeout=20, what="the lines sent meanwhile")
        assert link.close(5.0)
        # ("before" may come twice: a collector started anew cannot know it had it, if its ack
        # had not reached this node yet.)
        first = got[0][2]
        assert isinstance(first, LogMessage) and first.data == "before\n" and meanwhile() == [
            "meanwhile 0\n",
            "meanwhile 1\n",
            "meanwhile 2\n",
        ]
    finally:
        link.close(0.1)
        tel.stop()
        if again is not None:
            again.stop()
