"""A node > 0's summary of its ranks (one row a rank a second) and node 0 storing it.

What a person notices on node 0: another node's rank shows its last step and loss, the samples
it trained on (none lost, none twice), its step split as the mean of its steps, and an
evaluation's sign of life; a row node 0 cannot take is counted and the others kept.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from procs import wait_for

from xl.launcher.multinode import nodelink
from xl.launcher.multinode.protocol import TrainMessage
from xl.launcher.multinode.summary import Summary
from xl.launcher.telemetry.service import Telemetry

TOKEN = "test-token-0123456789abcdef"


def _step(step: int, step_s: float, *, steps: int = 1, t: float = 100.0) -> dict[str, Any]:
    return {
        "t": t + step,
        "rank": 3,
        "kind": "train",
        "step": step,
        "loss": 1.0 / (step + 1),
        "samples": 4 * steps,
        "steps": steps,
        "step_s": step_s,
        "data_s": step_s / 2,
        "compute_s": step_s / 4,
        "comm_s": step_s / 8,
        "other_s": step_s / 8,
    }


def test_a_row_stands_for_the_steps_since_the_last() -> None:
    summary = Summary()
    summary.add(3, [_step(0, 0.1), _step(1, 0.3)])
    summary.add(3, [_step(4, 0.2, steps=3)])  # a line that already stands for 3 steps
    summary.add(5, [{"t": 1.0, "rank": 5, "kind": "sys", "rss_mib": 10.0}])
    row, sys = summary.take()
    assert (row["step"], row["steps"], row["samples"], row["t"]) == (4, 5, 20, 104.0)
    assert row["loss"] == pytest.approx(1 / 5)
    # per-step means over the 5 steps: (0.1 + 0.3 + 3 * 0.2) / 5
    assert row["step_s"] == pytest.approx(0.2) and row["data_s"] == pytest.approx(0.1)
    assert row["samples_per_s"] == pytest.approx(20 / 1.0)
    assert sys == {"t": 1.0, "rank": 5, "kind": "sys", "rss_mib": 10.0}
    assert summary.take() == []  # nothing new: nothing sent


def test_an_evaluation_after_the_last_step_comes_along_and_a_step_after_it_wins() -> None:
    summary = Summary()
    evaluating = {"t": 200.0, "rank": 3, "kind": "train", "eval_batches": 7}
    summary.add(3, [_step(0, 0.1), evaluating])
    assert [r.get("eval_batches") for r in summary.take()] == [None, 7]
    summary.add(3, [evaluating, _step(1, 0.1)])
    [row] = summary.take()
    assert row["step"] == 1 and "eval_batches" not in row


def test_node_0_stores_the_rows_as_train_lines_and_counts_a_bad_one(tmp_path: Path) -> None:
    seen: list[tuple[int, dict[str, Any]]] = []
    tel = Telemetry(tmp_path, token=TOKEN, inventory=False, on_node=lambda *_: None)
    tel.diagnoser.ingest = lambda rank, recs: seen.extend((rank, r) for r in recs)  # type: ignore[method-assign]
    host, port = tel.start()["XL_COLLECTOR"].rsplit(":", 1)
    link = nodelink.NodeLink(host, int(port), TOKEN, 1, "node-b")
    try:
        link.start()
        good = _step(9, 0.2, steps=10, t=time.time())
        link.send(TrainMessage([good, {**good, "rank": "three"}]))
        link.send(TrainMessage([{**good, "kind": "sys"}]))  # not a train row
        wait_for(lambda: seen, timeout=10, what="the row at node 0")
        assert link.close(5.0)
    finally:
        link.close(0.1)
        tel.stop()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [good] and seen == [(3, good)]
    status = json.loads((tmp_path / "collector.json").read_text())
    assert status["rejects"] == {"bad_rank": 1, "bad_kind": 1}, status
