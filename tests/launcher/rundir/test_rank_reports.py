"""What ranks say of themselves in ``ranks/rank-<r>.json`` (runrecord.RankReport),
and the one name per concept: a report's ``node`` is torchrun's GROUP_RANK (``group_rank``), never
the host that run.json's ``node`` is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xl.launcher.rundir import runrecord as record
from xl.launcher.rundir import settle
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.runrecord import RunRecord


def _run(tmp_path: Path) -> Path:
    layout = RunLayout(tmp_path / "r1")
    for folder in (layout.logs, layout.ranks):
        folder.mkdir(parents=True)
    data = {
        "name": "t",
        "nnodes": 2,
        "node_rank": 1,
        "nproc_per_node": 2,
        "host": "vm-b",
        "started_at": 1.0,
        "ranks": [],
    }
    record.save(layout.root, RunRecord(run_id="r1", data=data))
    return layout.root


def _report(run_dir: Path, rank: int, **fields: Any) -> None:
    data = {
        "rank": rank,
        "local_rank": rank % 2,
        "node": 0,
        "pid": 999_999_000 + rank,
        "started_at": 2.0,
        **fields,
    }
    RunLayout(run_dir).rank_record(rank).write_text(json.dumps(data))


def test_only_rank_records_are_read_and_typed(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    _report(run_dir, 3, exit_code=-9, node=2, error=7)
    RunLayout(run_dir).rank_stacks_socket(3).write_text("{}")
    (RunLayout(run_dir).ranks / "rank-4.json").write_text("not json")
    reports = record.read_rank_reports(run_dir)
    assert list(reports) == [3]
    report = reports[3]
    assert (report.group_rank, report.local_rank, report.exit_code, report.ended) == (
        2,
        1,
        -9,
        True,
    )
    assert report.error is None  # not a string: not an error line


def test_a_rank_only_its_report_knows_is_listed_with_this_node_s_host(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    _report(run_dir, 2, exit_code=0, ended_at=5.0)
    _report(run_dir, 3, exit_code=1, error="ValueError: bad", ended_at=4.0)
    rec = settle.settle(run_dir, stopped=False)
    assert rec is not None and rec.status == "failed"
    assert [(r.rank, r.host, r.node_rank, r.state) for r in rec.ranks] == [
        (2, "vm-b", 1, "exited"),
        (3, "vm-b", 1, "failed"),
    ]
    failure = rec.failure
    assert failure is not None and (failure.rank, failure.host, failure.node_rank) == (3, "vm-b", 1)
