"""Node 0 gathers other nodes' stacks: its door, its collector and a node's link (no training).

The requester (what `xl stacks` and the hang capture run on node 0) asks through the door in the
run dir; the collector sends the request over the link; the node answers with a ``stacks``
message, clipped to what node 0 takes. A node that keeps quiet costs the deadline and no more,
and its ranks are listed with an error that says where to ask them.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from procs import wait_for

from xl import wire
from xl.launcher.multinode import nodelink
from xl.launcher.multinode.clip import clip_stacks
from xl.launcher.multinode.protocol import EventMessage, StacksMessage, parse_message
from xl.launcher.rundir.events import EventKind
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.stacks import gather as capture
from xl.launcher.stacks import nodes as nodestacks
from xl.launcher.stacks.model import Frame, RankStacks, Target
from xl.launcher.stacks.verdict import verdict
from xl.launcher.telemetry.service import Telemetry

TOKEN = "test-token-0123456789abcdef"


def _node_1(tmp_path: Path) -> tuple[Telemetry, nodelink.NodeLink]:
    got: list[dict[str, Any]] = []
    tel = Telemetry(
        tmp_path, token=TOKEN, inventory=False, on_node=lambda n, h, msgs: got.extend(msgs)
    )
    env = tel.start()
    host, port = env["XL_COLLECTOR"].rsplit(":", 1)
    link = nodelink.NodeLink(host, int(port), TOKEN, 1, "node-b")
    link.start()
    link.send(
        EventMessage(
            EventKind.RANK_STARTED, {"kind": "rank_started", "rank": 1, "message": "rank 1 started"}
        )
    )
    wait_for(lambda: got, timeout=10, what="node 1's link at node 0")
    return tel, link


def _deep_entry(rank: int) -> dict[str, Any]:
    frames = [
        {"file": f"/src/{'x' * 900}/lib{i}.py", "line": i, "function": f"f{i}"} for i in range(300)
    ]
    frames.append({"file": "/src/train.py", "line": 41, "function": "astray"})
    threads = [{"name": "MainThread", "frames": frames}] + [
        {"name": f"T{i}", "frames": frames} for i in range(40)
    ]
    return {"rank": rank, "node": "node-b", "pid": 4242, "threads": threads, "collectives": []}


def test_node_0_gathers_a_node_s_stacks_through_its_link(tmp_path: Path) -> None:
    tel, link = _node_1(tmp_path)
    try:

        def answer() -> None:  # node 1's supervisor: answer the first stacks request
            [ask] = wait_for(link.commands, timeout=10, what="node 0's stacks request")
            assert isinstance(ask, nodelink.StacksAsk)
            assert ask.rank is None and ask.timeout is not None and 0 < ask.timeout < 3.0
            link.send(StacksMessage(ask.id, clip_stacks([_deep_entry(1)])))

        node = threading.Thread(target=answer, daemon=True)
        node.start()
        doc = nodestacks.ask(tmp_path, None, 3.0)
        node.join(5)
    finally:
        link.close(0.1)
        tel.stop()
    assert doc is not None and doc.asked == {1}
    [entry] = doc.entries
    assert entry.rank == 1 and entry.node_rank == 1 and entry.pid == 4242
    # Clipped to fit one frame, the innermost frames kept: the place it is stuck is there.
    assert entry.threads is not None
    assert entry.threads[0].frames[-1] == Frame("/src/train.py", 41, "astray")
    # node 0's socket closes with the collector
    assert not RunLayout(tmp_path).nodes_stacks_socket.exists()
    status = json.loads((tmp_path / "collector.json").read_text())
    assert not status["rejects"], status


def test_a_quiet_node_costs_the_deadline_and_its_ranks_say_so(tmp_path: Path) -> None:
    tel, link = _node_1(tmp_path)
    try:
        start = time.monotonic()
        doc = capture.document(
            tmp_path, "run", [Target(1, "node-b", 4242, 1, remote=True)], timeout=1.0
        )
        took = time.monotonic() - start
    finally:
        link.close(0.1)
        tel.stop()
    [entry] = doc.ranks
    error = entry.error or ""
    assert "node 1 did not answer within 1 s" in error and "xl stacks RUN" in error
    # The asker is back once the deadline passed, not after the 30 s node 0 allows a request:
    # 20 s leaves a busy machine its slack.
    assert took < 20.0, took
    # Rank 0 waits in the all_reduce; the quiet node's rank is the one it waits for.
    near = {
        "rank": 0,
        "threads": [
            {"name": "MainThread", "frames": [{"file": "train.py", "line": 9, "function": "main"}]}
        ],
        "collectives": [{"pg": "0", "seq": 5, "op": "all_reduce", "state": "started"}],
    }
    v = verdict([RankStacks.from_json(near), entry])
    assert v.ranks == (1,) and v.message.startswith("rank 0 waits in all_reduce #5 for rank 1")


def test_node_0_refuses_stacks_it_cannot_hold() -> None:
    good = {"type": "stacks", "id": "abc", "ranks": clip_stacks([_deep_entry(3)])}
    took = parse_message(json.loads(json.dumps(good)), 1)
    assert isinstance(took, StacksMessage) and took.ranks[0]["rank"] == 3
    # A collective's tensor shapes (the mismatch verdict compares them) cross; ill-formed ones
    # are clipped off.
    coll = {
        "pg": "0",
        "pg_id": "0",
        "seq": 5,
        "op": "all_reduce",
        "state": "started",
        "in": [[4, 2]],
        "out": [[4, 2]],
    }
    shaped = {
        "type": "stacks",
        "id": "abc",
        "ranks": clip_stacks([{**_deep_entry(3), "collectives": [coll, {**coll, "in": [["x"]]}]}]),
    }
    took = parse_message(json.loads(json.dumps(shaped)), 1)
    assert isinstance(took, StacksMessage)
    got = took.ranks[0]["collectives"]
    assert got[0]["in"] == [[4, 2]] and "in" not in got[1] and got[1]["out"] == [[4, 2]]
    for bad in (
        {
            "type": "stacks",
            "id": "abc",
            "ranks": [{"rank": 3, "collectives": [{**coll, "in": [[{"a": 1}]]}]}],
        },
        {"type": "stacks", "id": "abc", "ranks": [{"rank": 3, "threads": "main"}]},
        {"type": "stacks", "id": "abc", "ranks": [_deep_entry(3)]},  # not clipped: too many threads
        {"type": "stacks", "id": "", "ranks": []},
        {"type": "stacks", "id": "abc", "ranks": [{"rank": -1}]},
    ):
        with pytest.raises(wire.FrameError):
            parse_message(bad, 1)
