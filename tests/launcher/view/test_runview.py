"""RunView, the one derived model every view draws: the hang rule, the root-cause failure, the
style table and what the views read off it (nodes, progress, elapsed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xl.atomic import write_json_atomic
from xl.launcher.rundir.events import EventKind, EventLine, parse_event
from xl.launcher.rundir.runrecord import RunRecord
from xl.launcher.view.reader import RunReader
from xl.launcher.view.runview import (
    LIFECYCLE_STYLE,
    HangRule,
    RankView,
    RunView,
    failure_of,
    lifecycle_style,
    node_labels,
    outcome_style,
)

HANG = {
    "t": 5.0,
    "kind": "hang",
    "rank": None,
    "ranks": [1, 3],
    "message": "ranks 1,3 never entered all_reduce #12",
    "stacks": "stacks/5.json",
}


def _recovered(rank: int, of: str = "stalled") -> dict[str, Any]:
    return {"t": 6.0, "kind": "recovered", "rank": rank, "of": of}


def _read(event: dict[str, Any]) -> EventLine:
    line = parse_event(event)
    assert line is not None
    return line


def _seen(*events: dict[str, Any]) -> HangRule:
    rule = HangRule()
    for event in events:
        rule.see(_read(event))
    return rule


def test_a_hang_lasts_until_every_culprit_moved_again() -> None:
    assert _seen().hang is None
    hang = _seen(HANG).hang
    assert hang is not None and hang.culprits == (1, 3) and hang.stacks == "stacks/5.json"
    assert hang.message == "ranks 1,3 never entered all_reduce #12"
    assert _seen(HANG, _recovered(0)).hang is not None  # a victim moving ends nothing
    # nor a straggler catching up
    assert _seen(HANG, _recovered(1, of="straggler")).hang is not None
    rule = _seen(HANG, _recovered(1))
    assert rule.hang is not None and rule.hang.stuck == {3} and rule.hang.culprits == (1, 3)
    assert _seen(HANG, _recovered(1), _recovered(3)).hang is None
    # A hang that names no culprit is over once any rank moves; a new hang starts over.
    assert _seen({**HANG, "ranks": []}, _recovered(2)).hang is None
    assert _seen(HANG, _recovered(1), _recovered(3), HANG).hang is not None


def _view(run: dict[str, Any], events: list[dict[str, Any]], **kw: Any) -> RunView:
    record = RunRecord.from_json(run, "r")
    lines = [_read(e) for e in events]
    failed = next((e for e in reversed(lines) if e.kind is EventKind.FAILURE), None)
    return RunView(
        record=record,
        ranks={},
        events=lines,
        new_events=[],
        failure=failure_of(record, failed),
        **kw,
    )


def test_no_hang_once_the_run_ended() -> None:
    hang = _seen(HANG).hang
    assert _view({"status": "running"}, [], hang_found=hang).hang == hang
    assert _view({"status": "failed"}, [], hang_found=hang).hang is None


def test_the_failure_is_run_json_s_else_the_newest_failure_event() -> None:
    event = {"t": 1.0, "kind": "failure", "rank": 2, "message": "rank 2 exited with code 1"}
    assert _view({"status": "running"}, []).failure is None
    early = _view({"status": "running"}, [event]).failure
    assert early is not None and (early.rank, early.message, early.traceback) == (
        2,
        "rank 2 exited with code 1",
        None,
    )
    recorded = {"rank": 1, "exit_code": 3, "traceback": "Traceback ...", "message": "rank 1 failed"}
    view = _view({"status": "failed", "failure": recorded}, [event])
    assert view.failed and view.failure is not None
    assert (view.failure.rank, view.failure.exit_code, view.failure.traceback) == (
        1,
        3,
        "Traceback ...",
    )


def test_one_style_table_for_states() -> None:
    assert (
        lifecycle_style("failed") == "bold red"
        and lifecycle_style("exited") == lifecycle_style("stopped") == "dim"
    )
    assert lifecycle_style("nonsense") == "" and lifecycle_style(None, "bold") == "bold"
    # The run's last line, the same in the app and the console view: only success and failure stand
    # out.
    assert (outcome_style("succeeded"), outcome_style("failed"), outcome_style("stopped")) == (
        "bold green",
        "bold red",
        "bold yellow",
    )
    assert {
        "running",
        "starting",
        "straggler",
        "stalled",
        "waiting",
        "exited",
        "failed",
        "stopped",
        "succeeded",
    } <= set(LIFECYCLE_STYLE)


def test_two_nodes_on_one_host_are_told_apart() -> None:
    ranks = {
        0: RankView(0, host="h", node_rank=0),
        1: RankView(1, host="h", node_rank=1),
        2: RankView(2, host="g"),
    }
    assert node_labels(ranks) == {0: "h #0", 1: "h #1", 2: "g"}
    assert node_labels({0: RankView(0, node_rank=2)}) == {0: "node 2"}


def test_the_reader_builds_the_view_once_per_poll(tmp_path: Path) -> None:
    write_json_atomic(
        tmp_path / "run.json",
        {
            "run_id": "r",
            "status": "running",
            "started_at": 100.0,
            "world_size": 4,
            "nnodes": 1,
            "devices": [{"index": 1, "name": "A"}, {"index": 0, "name": "A"}],
            "ranks": [
                {"rank": 0, "node": "h", "pid": 5, "state": "running"},
                {"rank": 1, "node": "h", "state": "starting"},
                {"rank": 2, "node": "h", "pid": 7, "state": "failed"},
            ],
        },
    )
    lines = [
        {"t": 101.0, "rank": r, "kind": "train", "step": s, "total_steps": 10}
        for r, s in ((0, 4), (1, 2))
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "events.jsonl").write_text(json.dumps({**HANG, "ranks": [1]}) + "\n")
    reader = RunReader(tmp_path)
    assert not RunReader(tmp_path / "nothing").poll().loaded
    view = reader.poll()
    assert view.loaded and view.record.run_id == "r" and view.world_size == 4
    assert (
        view.elapsed(130.0) == 30.0 and view.devices_text == "GPU 1,0 (A)" and view.all_nodes_joined
    )
    # run.json's word on a rank that ended stands without an exit code; "starting" until its pid is
    # known.
    assert {r: v.state for r, v in view.ranks.items()} == {0: "running", 1: "starting", 2: "failed"}
    assert view.nodes == ["h"] and view.hang is not None and view.hang.culprits == (1,)
    progress = view.progress()
    assert progress is not None and (progress.step, progress.total) == (2, 10)
