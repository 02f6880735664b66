"""`xl stacks` asks the other nodes at once, not one after another: node 0's collector sends the
request over every node's link before any node answers, so a request costs one deadline however
many nodes there are (docs/multinode.md, "Stacks across nodes").

The proof takes no clock: each simulated node (xl's own NodeLink) answers only once every node
has received the request. Asked one at a time, the first node would wait for the others forever
(until its barrier gives up) and the answer would lack every node.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from procs import wait_for

from xl.launcher.multinode import nodelink
from xl.launcher.multinode.clip import clip_stacks
from xl.launcher.multinode.protocol import EventMessage, StacksMessage
from xl.launcher.rundir.events import EventKind
from xl.launcher.stacks import gather as capture
from xl.launcher.stacks.model import Target
from xl.launcher.telemetry.service import Telemetry

TOKEN = "test-token-0123456789abcdef"
NODES = 8
RANKS_PER_NODE = 2
DEADLINE_S = 20.0  # generous for a busy machine: the proof is the barrier, not the clock


def _entry(rank: int, node: int) -> dict[str, Any]:
    frames = [{"file": "/src/train.py", "line": 40 + node, "function": "all_reduce_wait"}]
    return {
        "rank": rank,
        "node": f"node-{node}",
        "pid": 5000 + rank,
        "threads": [{"name": "MainThread", "frames": frames}],
        "collectives": [],
    }


def test_every_node_is_asked_before_any_answers(tmp_path: Path) -> None:
    seen: set[int] = set()
    tel = Telemetry(
        tmp_path,
        token=TOKEN,
        inventory=False,
        on_node=lambda n, h, msgs: seen.add(n),
    )
    env = tel.start()
    host, port = env["XL_COLLECTOR"].rsplit(":", 1)
    links = []
    answered: list[int] = []
    all_asked = threading.Barrier(NODES, timeout=DEADLINE_S - 2)
    threads = []
    try:
        for node in range(1, NODES + 1):
            link = nodelink.NodeLink(host, int(port), TOKEN, node, f"node-{node}")
            link.start()
            link.send(
                EventMessage(
                    EventKind.RANK_STARTED,
                    {"kind": "rank_started", "rank": node, "message": "started"},
                )
            )
            links.append((node, link))
        wait_for(lambda: len(seen) == NODES, timeout=30, what="every node's link at node 0")

        def answer(node: int, link: nodelink.NodeLink) -> None:
            [ask] = wait_for(link.commands, timeout=30, what=f"node {node}'s stacks request")
            assert isinstance(ask, nodelink.StacksAsk)
            all_asked.wait()  # BrokenBarrierError: some node was never asked while this waited
            ranks = [node * RANKS_PER_NODE + i for i in range(RANKS_PER_NODE)]
            entries = clip_stacks([_entry(r, node) for r in ranks])
            link.send(StacksMessage(ask.id, entries))
            answered.append(node)

        for node, link in links:
            t = threading.Thread(target=answer, args=(node, link), daemon=True)
            t.start()
            threads.append(t)
        remote = [
            Target(
                node * RANKS_PER_NODE + i,
                f"node-{node}",
                5000 + node * RANKS_PER_NODE + i,
                node,
                remote=True,
            )
            for node in range(1, NODES + 1)
            for i in range(RANKS_PER_NODE)
        ]
        doc = capture.document(tmp_path, "run", remote, timeout=DEADLINE_S)
        for t in threads:
            t.join(5)
    finally:
        for _, link in links:
            link.close(0.1)
        tel.stop()
    assert sorted(answered) == list(range(1, NODES + 1))
    entries = doc.ranks
    assert [e.rank for e in entries] == [r.rank for r in remote]
    assert not [e for e in entries if e.error], entries
    assert {e.node_rank for e in entries} == set(range(1, NODES + 1))
    # Each node's ranks came with their own stacks (the line says which node answered).
    for e in entries:
        assert e.threads is not None and e.node_rank is not None
        assert e.threads[0].frames[-1].line == 40 + e.node_rank
