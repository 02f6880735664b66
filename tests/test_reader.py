"""RunReader: the incremental view of a run directory that the TUI and live view use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xl.fsutil import write_json_atomic
from xl.launcher.reader import RunReader


def _append(path: Path, *objs: dict, raw: str = "") -> None:
    with open(path, "a") as fh:
        for obj in objs:
            fh.write(json.dumps(obj) + "\n")
        fh.write(raw)


def _train(t: float, rank: int, step: int, **kw) -> dict:
    return {"t": t, "rank": rank, "kind": "train", "step": step, **kw}


def test_poll_reads_only_new_complete_lines(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    _append(metrics, _train(100.0, 0, 1, loss=2.0, samples_per_s=50.0, total_steps=11))
    reader = RunReader(tmp_path)
    view = reader.poll()
    assert view.ranks[0].step == 1 and view.ranks[0].loss == 2.0
    # Half a line (a writer mid-append) is not read until it is complete.
    _append(metrics, _train(101.0, 0, 2, loss=1.5), raw='{"t": 102.0, "rank": 0, "kind": "tr')
    view = reader.poll()
    assert view.ranks[0].step == 2
    _append(metrics, raw='ain", "step": 3, "loss": 1.0}\n')
    _append(
        metrics,
        {
            "t": 102.5,
            "rank": 0,
            "kind": "sys",
            "gpu": 1,
            "gpu_util": 87,
            "gpu_mem_used_mib": 1000.0,
            "gpu_mem_total_mib": 4000.0,
            "rss_mib": 300.0,
        },
    )
    view = reader.poll()
    r0 = view.ranks[0]
    assert (r0.step, r0.loss, r0.gpu, r0.gpu_util, r0.rss_mib) == (3, 1.0, 1, 87, 300.0)
    assert [loss for _, loss in r0.loss_history] == [2.0, 1.5, 1.0]
    assert list(r0.samples_history) == [(100.0, 50.0)]
    # 2 steps in 2 s, 8 to go: 8 s.
    assert r0.eta_s == pytest.approx(8.0)
    assert r0.progress == pytest.approx(3 / 11)
    assert r0.last_seen == 102.5
    assert reader.poll().new_events == []


def test_nonfinite_loss_is_shown_as_nan(tmp_path: Path) -> None:
    _append(tmp_path / "metrics.jsonl", _train(1.0, 0, 1, loss=None, nonfinite={"loss": "nan"}))
    loss = RunReader(tmp_path).poll().ranks[0].loss
    assert loss is not None and loss != loss


def test_rank_states_from_run_json_and_diagnoses(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    run = {
        "run_id": "r1",
        "status": "running",
        "ranks": [
            {"rank": 0, "local_rank": 0, "node": 0, "pid": 10, "gpu": 0, "exit_code": None},
            {"rank": 1, "local_rank": 1, "node": 0, "pid": 11, "gpu": 1, "exit_code": None},
            {"rank": 2, "local_rank": 2, "node": 0, "pid": 12, "gpu": 2, "exit_code": None},
        ],
    }
    write_json_atomic(tmp_path / "run.json", run)
    _append(
        events,
        {"t": 1, "kind": "straggler", "rank": 1, "message": "rank 1 is the straggler"},
        {"t": 2, "kind": "stalled", "rank": 2, "message": "rank 2 made no progress for 31 s"},
    )
    reader = RunReader(tmp_path)
    view = reader.poll()
    assert view.run_id == "r1" and view.status == "running"
    assert [v.state for v in view.ranks.values()] == ["running", "straggler", "stalled"]
    assert view.ranks[2].diagnosis == "rank 2 made no progress for 31 s"
    assert [e["kind"] for e in view.new_events] == ["straggler", "stalled"]
    _append(events, {"t": 3, "kind": "recovered", "rank": 2, "of": "stalled", "message": "ok"})
    view = reader.poll()
    assert view.ranks[2].state == "running" and view.ranks[2].diagnosis is None
    assert [e["kind"] for e in view.new_events] == ["recovered"]
    assert len(view.events) == 3
    run["ranks"][0]["exit_code"] = 0
    run["ranks"][1]["exit_code"] = 1
    run["status"] = "failed"
    write_json_atomic(tmp_path / "run.json", run)
    view = reader.poll()
    assert [v.state for v in view.ranks.values()] == ["exited", "failed", "running"]
    run["status"] = "stopped"
    run["ranks"][2]["exit_code"] = -15
    write_json_atomic(tmp_path / "run.json", run)
    assert [v.state for v in reader.poll().ranks.values()] == ["exited", "stopped", "stopped"]


def test_logs_tail_and_new_lines(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "rank-1.log"
    log.write_text("".join(f"line {i}\n" for i in range(500)))
    reader = RunReader(tmp_path)
    assert reader.read_log(1, 3) == ["line 497", "line 498", "line 499"]
    assert len(reader.new_log_lines(1)) == 500
    assert reader.new_log_lines(1) == []
    with open(log, "a") as fh:
        fh.write("next\npart")
    assert reader.new_log_lines(1) == ["next"]
    assert reader.read_log(7, 10) == []
    assert reader.new_log_lines(7) == []


def test_garbage_lines_are_skipped(tmp_path: Path) -> None:
    _append(tmp_path / "metrics.jsonl", {"rank": "x"}, _train(1.0, 0, 5), raw="not json\n[1]\n")
    _append(tmp_path / "events.jsonl", raw="{broken\n")
    view = RunReader(tmp_path).poll()
    assert list(view.ranks) == [0] and view.ranks[0].step == 5 and view.events == []


def test_only_the_root_cause_rank_is_failed(tmp_path: Path) -> None:
    # The supervisor ends the other ranks when one fails: they were stopped, not failed.
    write_json_atomic(
        tmp_path / "run.json",
        {
            "status": "failed",
            "ranks": [
                {"rank": 0, "node": "n", "pid": 1, "gpu": None, "exit_code": -15},
                {"rank": 1, "node": "n", "pid": 2, "gpu": None, "exit_code": 1},
                {"rank": 2, "node": "n", "pid": 3, "gpu": None, "exit_code": -9, "state": "stopped"},
            ],
            "failure": {"rank": 1, "exit_code": 1, "traceback": "Traceback ..."},
        },
    )
    view = RunReader(tmp_path).poll()
    assert {r: v.state for r, v in view.ranks.items()} == {0: "stopped", 1: "failed", 2: "stopped"}
