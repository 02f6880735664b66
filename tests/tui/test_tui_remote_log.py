"""The Monitor on node 0 of a two-node run: the log pane of a rank of node 1 (whose output stays in
node 1's run dir) asks node 1 for it through the backend, for the followed rank only, and shows
it as a local rank's; when node 1 cannot answer, one line says where the output is; once the run
is over, the lines node 0 kept. A rank of node 0 is read from its log and node 1 is never asked.

The backend here answers as node 0's supervisor does (``ask_logs``: pieces of at most 64 KiB of
a growing output, with its size); the door itself is tested in
tests/launcher/multinode/test_logs_fetch.py; the last test here puts LocalBackend in front of it.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import runfixtures
from pilotwait import until
from procs import wait_for
from where import FIXTURES

from xl.launcher.multinode import nodelink
from xl.launcher.multinode.protocol import LogsMessage
from xl.launcher.supervisor.follower import read_piece
from xl.launcher.telemetry.service import Telemetry
from xl.tui.app import build_app
from xl.tui.backend import LocalBackend, OutputPiece
from xl.tui.screens.monitor import LOG_TAIL
from xl.tui.widgets.rank_log import RankLog
from xl.tui.widgets.rank_table import RankTable

NOW = runfixtures.T0 + 130
PIECE = 64 << 10  # the most a node sends a time (protocol.MAX_LOGS_DATA)
WHERE = (
    "rank 5 ran on node 1 (trn-a07), which keeps its output, and node 0 cannot ask it now; "
    "on node 1, run: xl logs RUN --rank 5 (its 'xl runs' names RUN)"
)


class Nodes(LocalBackend):
    """Node 1 answering for its ranks' output (``outputs``; None: it does not answer)."""

    def __init__(self, outputs: dict[int, bytes] | None) -> None:
        super().__init__()
        self.outputs = outputs
        self.asked: list[tuple[int, int, int]] = []  # (rank, node, offset)
        self.lock = threading.Lock()

    def rank_output(
        self, run_dir: Path, rank: int, node: int, offset: int
    ) -> OutputPiece | None:
        with self.lock:
            self.asked.append((rank, node, offset))
            if self.outputs is None or node != 1 or rank not in self.outputs:
                return None
            out = self.outputs[rank]
        return OutputPiece(out[offset : offset + PIECE], len(out))

    def add(self, rank: int, more: bytes) -> None:
        with self.lock:
            assert self.outputs is not None
            self.outputs[rank] += more


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Node 0's run dir of a live two-node run: ranks 0-3 here, 4-7 on node 1 (no logs here)."""
    runs = tmp_path / "xlhome" / "runs"
    run = runs / "20260530-twonode"
    shutil.copytree(FIXTURES / "runs" / "20260530-twonode", run)
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    doc = json.loads((run / "run.json").read_text())
    doc["node_rank"] = 0
    for row in doc["ranks"]:
        row["node_rank"] = 0 if row["node"] == "trn-b12" else 1
    (run / "run.json").write_text(json.dumps(doc))
    for rank in range(4, 8):
        (run / "logs" / f"rank-{rank}.log").unlink()
    return run


def text(log: RankLog) -> str:
    """The pane's rows joined (a long line is wrapped into several)."""
    return "".join(log.lines)


def numbered(start: int, count: int) -> bytes:
    return b"".join(b"[rank 5] step %06d loss 2.1\n" % i for i in range(start, start + count))


async def follow(pilot: Any, rank: int) -> RankLog:
    table = pilot.app.screen.query_one(RankTable)
    await until(pilot, lambda: table.row_count == 8, "eight ranks")
    log = pilot.app.screen.query_one(RankLog)
    await until(pilot, lambda: log.rank == 0 and log.line_count > 0, "rank 0's log")
    table.move_cursor(row=rank)
    await until(pilot, lambda: log.rank == rank, f"rank {rank}'s pane")
    return log


async def test_a_followed_rank_of_another_node_shows_what_its_node_sends(run_dir: Path) -> None:
    # 200 KiB so far: the pane starts at its last 64 KiB, from a whole line, saying what it left
    # out and the command that prints it all.
    nodes = Nodes({5: numbered(0, 7000), 6: b"never asked\n"})
    app = build_app(nodes, monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(220, 60)) as pilot:
        log = await follow(pilot, 5)
        await until(pilot, lambda: "step 006999" in text(log), "rank 5's last line")
        assert log.lines[0].startswith("… earlier output skipped: it is on node 1 (trn-a07)")
        assert "xl logs 20260530-twonode --rank 5 prints it all" in text(log)
        shown = [line for line in log.lines if line.startswith("[rank 5] step ")]
        # as many lines as a local rank's pane starts with
        assert shown == [f"[rank 5] step {i:06d} loss 2.1" for i in range(7000 - LOG_TAIL, 7000)]
        # It keeps following: what the rank writes next comes by offset, once.
        nodes.add(5, numbered(7000, 3) + b"[rank 5] no newline yet")
        await until(pilot, lambda: "step 007002" in text(log), "rank 5's new lines", timeout=30)
        nodes.add(5, b", now\n")
        await until(pilot, lambda: "no newline yet, now" in text(log), "the line's end", timeout=30)
        assert sum("step 007001" in line for line in log.lines) == 1
        assert "".join(log.lines).count("no newline yet") == 1
        with nodes.lock:
            asked = list(nodes.asked)
        # Only the followed rank, of its node; never the whole output again.
        assert {(rank, node) for rank, node, _ in asked} == {(5, 1)}
        offsets = [offset for _, _, offset in asked]
        assert offsets[:2] == [0, len(numbered(0, 7000)) - PIECE]
        assert offsets[2:] == sorted(offsets[2:]) and min(offsets[2:]) > 0
        # Back to a rank of node 0: read here, node 1 is not asked for it.
        before = len(asked)
        pilot.app.screen.query_one(RankTable).move_cursor(row=2)
        await until(pilot, lambda: log.rank == 2 and "[rank 2]" in text(log), "rank 2's log")
        await pilot.pause(2.5)
        with nodes.lock:
            assert nodes.asked[before:] == []


async def test_more_lines_than_the_pane_starts_with_are_said_to_be_left_out(
    run_dir: Path,
) -> None:
    # under 64 KiB, over LOG_TAIL lines: the pane starts with LOG_TAIL, and says so
    nodes = Nodes({5: numbered(0, 1000)})
    assert len(numbered(0, 1000)) < PIECE
    app = build_app(nodes, monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(220, 60)) as pilot:
        log = await follow(pilot, 5)
        await until(pilot, lambda: "step 000999" in text(log), "rank 5's last line")
        assert log.lines[0].startswith("… earlier output skipped: it is on node 1 (trn-a07)")
        shown = [line for line in log.lines if line.startswith("[rank 5] step ")]
        assert shown == [f"[rank 5] step {i:06d} loss 2.1" for i in range(1000 - LOG_TAIL, 1000)]
    # a short output: all of it, no such line
    nodes = Nodes({5: numbered(0, 10)})
    app = build_app(nodes, monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(220, 60)) as pilot:
        log = await follow(pilot, 5)
        await until(pilot, lambda: "step 000009" in text(log), "rank 5's last line")
        assert log.lines == [f"[rank 5] step {i:06d} loss 2.1" for i in range(10)]


async def test_a_node_that_cannot_answer_is_named_in_one_line(run_dir: Path) -> None:
    nodes = Nodes(None)
    app = build_app(nodes, monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(220, 60)) as pilot:
        log = await follow(pilot, 5)
        await until(pilot, lambda: WHERE in text(log), "where rank 5's output is")
        await pilot.pause(1.0)
        assert text(log) == WHERE  # said once, no traceback, nothing else
        with nodes.lock:
            assert {rank for rank, _, _ in nodes.asked} == {5}


async def test_a_local_rank_never_asks_another_node(run_dir: Path) -> None:
    nodes = Nodes({5: numbered(0, 3)})
    app = build_app(nodes, monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(220, 60)) as pilot:
        log = await follow(pilot, 3)
        await until(pilot, lambda: "[rank 3]" in text(log), "rank 3's log")
        await pilot.pause(1.0)
        with nodes.lock:
            assert nodes.asked == []


async def test_once_the_run_is_over_the_pane_shows_the_lines_node_0_kept(run_dir: Path) -> None:
    doc = json.loads((run_dir / "run.json").read_text())
    doc["status"], doc["ended_at"] = "failed", runfixtures.T0 + 120
    (run_dir / "run.json").write_text(json.dumps(doc))
    (run_dir / "logs" / "rank-5.log").write_bytes(b"kept line 1\nValueError: the end\n")
    nodes = Nodes({5: b"never asked\n"})
    app = build_app(nodes, monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(220, 60)) as pilot:
        log = await follow(pilot, 5)
        await until(pilot, lambda: "ValueError: the end" in text(log), "the kept lines")
        assert log.lines[0].startswith("… node 0 kept rank 5's last lines only")
        assert "there, run: xl logs RUN --rank 5" in text(log)
        assert "never asked" not in text(log)
        with nodes.lock:
            assert nodes.asked == []


async def test_this_machine_s_backend_asks_through_node_0_s_real_door(run_dir: Path) -> None:
    """LocalBackend.rank_output end to end: node 0's real collector and door, a link from node 1
    that answers as a follower does (``read_piece`` of its rank's log file)."""
    token = "test-token-0123456789abcdef"
    node1_log = run_dir.parent / "node1-rank-5.log"
    node1_log.write_bytes(b"[rank 5] from node 1\n")
    tel = Telemetry(run_dir, token=token, inventory=False, on_node=lambda *_: None)
    host, port = tel.start()["XL_COLLECTOR"].rsplit(":", 1)
    link = nodelink.NodeLink(host, int(port), token, 1, "trn-a07")
    stop = threading.Event()

    def answer() -> None:
        while not stop.is_set():
            for ask in link.commands():
                if isinstance(ask, nodelink.LogsAsk) and ask.rank == 5:
                    data, size = read_piece(node1_log, ask.offset)
                    link.send(LogsMessage(ask.id, 5, ask.offset, data, size))
            stop.wait(0.05)

    answering = threading.Thread(target=answer, daemon=True)
    try:
        link.start()
        answering.start()
        wait_for(lambda: link.heard_at is not None, timeout=30, what="node 1's link")
        app = build_app(
            LocalBackend(), monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2
        )
        async with app.run_test(size=(220, 60)) as pilot:
            log = await follow(pilot, 5)
            await until(pilot, lambda: "[rank 5] from node 1" in text(log), "node 1's output")
            with open(node1_log, "ab") as fh:
                fh.write(b"[rank 5] and later\n")
            await until(pilot, lambda: "[rank 5] and later" in text(log), "more", timeout=30)
    finally:
        stop.set()
        answering.join(timeout=10)
        link.close(0.5)
        tel.stop()
    assert not answering.is_alive()
