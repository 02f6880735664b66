"""Node 0 reading another node's rank's output through its link (``xl logs`` there), against node
0's real collector and door, with a node that answers as a follower does (``read_piece``).

What a person notices: the output comes byte for byte (bytes that are not UTF-8 too), in pieces
of at most 64 KiB; a node that is not connected, or a rank it does not answer for, gives nothing
(``xl logs`` then says where the output is) rather than a wait without end.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from procs import wait_for

from xl.launcher.multinode import nodelink
from xl.launcher.multinode.protocol import MAX_LOGS_DATA, LogsMessage
from xl.launcher.stacks.nodes import ask_logs
from xl.launcher.supervisor.follower import read_piece
from xl.launcher.telemetry.service import Telemetry

TOKEN = "test-token-0123456789abcdef"


def _answering(link: nodelink.NodeLink, logs: Path, stop: threading.Event) -> threading.Thread:
    """Node 1's supervisor: answers node 0's logs requests for its rank 5 from ``logs``."""

    def run() -> None:
        while not stop.is_set():
            for ask in link.commands():
                if not isinstance(ask, nodelink.LogsAsk) or ask.rank != 5:
                    continue
                data, size = read_piece(logs, ask.offset)
                link.send(LogsMessage(ask.id, 5, ask.offset, data, size))
            time.sleep(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_rank_s_output_comes_through_its_node_in_bounded_pieces(tmp_path: Path) -> None:
    run0, node1 = tmp_path / "run0", tmp_path / "node1.log"
    run0.mkdir()
    output = b"".join(b"line %d \xff\xfe caf\xc3\xa9 " % i + b"y" * 50 + b"\n" for i in range(3000))
    node1.write_bytes(output)
    tel = Telemetry(run0, token=TOKEN, inventory=False, on_node=lambda *_: None)
    host, port = tel.start()["XL_COLLECTOR"].rsplit(":", 1)
    link = nodelink.NodeLink(host, int(port), TOKEN, 1, "node-b")
    stop = threading.Event()
    try:
        link.start()
        _answering(link, node1, stop)
        wait_for(lambda: link.heard_at is not None, timeout=10, what="node 1's link")
        got, offset, pieces = b"", 0, 0
        while offset < len(output):
            piece = ask_logs(run0, 5, 1, offset)
            assert piece is not None and piece["size"] == len(output), piece
            data = piece["data"].encode("utf-8", "surrogateescape")
            assert 0 < len(data) <= MAX_LOGS_DATA
            got, offset, pieces = got + data, offset + len(data), pieces + 1
        assert got == output and pieces == -(-len(output) // MAX_LOGS_DATA)
        # a rank node 1 does not answer for, and a node that is not there: nothing, in time
        assert ask_logs(run0, 6, 1, 0, timeout=1.0) is None
        assert ask_logs(run0, 5, 2, 0, timeout=1.0) is None
    finally:
        stop.set()
        link.close(0.5)
        tel.stop()
    assert ask_logs(run0, 5, 1, 0, timeout=1.0) is None  # the run is over: no door
