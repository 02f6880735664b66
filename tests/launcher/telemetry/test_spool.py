"""What ranks left in ``spool/`` is stored once the rank that wrote it is gone
(xl.launcher.telemetry.spool): each line once, torn lines left out, a live rank's file left to
it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from xl import wire
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.metrics import MetricsWriter
from xl.launcher.telemetry.spool import ingest_spool

GONE = 4_194_999  # above any pid_max Linux allows: no such process


def _line(rank: int, step: int) -> bytes:
    return wire.dumps_record(
        {"t": 1795569985.0 + step, "rank": rank, "kind": "train", "step": step, "loss": 1.0 / step}
    )


def _ingest(run_dir: Path) -> tuple[int, dict[int, list[dict[str, Any]]], list[dict[str, Any]]]:
    seen: dict[int, list[dict[str, Any]]] = {}
    writer = MetricsWriter(run_dir)
    try:
        stored = ingest_spool(
            run_dir, writer, lambda rank, recs: seen.setdefault(rank, []).extend(recs)
        )
    finally:
        writer.close()
    metrics = RunLayout(run_dir).metrics.read_text().splitlines()
    return stored, seen, [json.loads(line) for line in metrics]


def test_a_gone_rank_s_lines_are_stored_once_and_its_torn_last_line_left_out(
    tmp_path: Path,
) -> None:
    run = RunLayout(tmp_path)
    run.spool.mkdir()
    run.spool_file(1, GONE).write_bytes(_line(1, 1) + b"\n" + _line(1, 2) + b"\n" + b'{"t": 17955')
    stored, seen, metrics = _ingest(tmp_path)
    assert stored == 2 and [r["step"] for r in seen[1]] == [1, 2]
    assert [(m["rank"], m["step"]) for m in metrics] == [(1, 1), (1, 2)]
    assert list(run.spool.iterdir()) == []  # claimed and removed: never stored twice
    assert _ingest(tmp_path)[0] == 0


def test_a_replay_the_rank_never_finished_is_stored_and_a_live_rank_s_file_is_left_to_it(
    tmp_path: Path,
) -> None:
    run = RunLayout(tmp_path)
    run.spool.mkdir()
    replay = run.spool_file(0, GONE).with_name(run.spool_file(0, GONE).name + ".replay")
    replay.write_bytes(_line(0, 7) + b"\n")
    live = run.spool_file(2, os.getppid())  # a live process that is not this one
    live.write_bytes(_line(2, 1) + b"\n")
    (run.spool / "notes.txt").write_text("not a spool file")
    stored, seen, metrics = _ingest(tmp_path)
    assert stored == 1 and list(seen) == [0] and [m["step"] for m in metrics] == [7]
    assert sorted(p.name for p in run.spool.iterdir()) == sorted([live.name, "notes.txt"])


def test_a_line_of_another_rank_is_not_stored(tmp_path: Path) -> None:
    run = RunLayout(tmp_path)
    run.spool.mkdir()
    run.spool_file(3, GONE).write_bytes(_line(4, 1) + b"\n" + _line(3, 1) + b"\n")
    stored, seen, metrics = _ingest(tmp_path)
    assert (
        stored == 1 and [m["rank"] for m in metrics] == [3] and [r["rank"] for r in seen[3]] == [3]
    )


def test_no_spool_no_work(tmp_path: Path) -> None:
    assert _ingest(tmp_path)[0] == 0
