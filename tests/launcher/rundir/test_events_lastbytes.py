"""events.jsonl's one writer (xl.launcher.rundir.events) and reading the end of a run-dir file in
whole lines (xl.launcher.rundir.lastbytes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xl.launcher.rundir.events import (
    Diagnosis,
    EventKind,
    Hang,
    Notice,
    RankExited,
    append_event,
    event_line,
    newest_events,
)
from xl.launcher.rundir.lastbytes import last_lines
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.supervisor.failure import latest_hang


def test_an_event_gets_its_time_and_a_null_rank_when_missing() -> None:
    line = event_line(Notice(EventKind.RUN_STARTED, "run started"))
    event = json.loads(line)
    assert line.endswith("\n") and line.count("\n") == 1
    assert event["rank"] is None and isinstance(event["t"], float)
    given = json.loads(event_line(Diagnosis(EventKind.NAN_LOSS, 1, "rank 1: loss is nan", t=5.0)))
    assert (given["rank"], given["t"]) == (1, 5.0)


def test_events_are_appended_one_line_each(tmp_path: Path) -> None:
    for kind in (EventKind.RUN_STARTED, EventKind.RUN_ENDED):
        append_event(tmp_path, Notice(kind, kind.value))
    lines = RunLayout(tmp_path).events.read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["run_started", "run_ended"]


def test_an_event_that_cannot_be_written_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        append_event(tmp_path / "gone", RankExited(0, 1, "rank 0 exited with code 1"))


def test_last_lines_are_whole_within_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(100)))
    assert last_lines(path, 1 << 20)[-1] == b"line 99" and len(last_lines(path, 1 << 20)) == 100
    assert last_lines(path, 20) == [b"line 98", b"line 99"]  # the line the seek cut is left out
    path.write_bytes(b"x" * 100)
    assert last_lines(path, 10) == [b"x" * 10]  # nothing else there: the cut line is all there is
    assert last_lines(tmp_path / "missing", 10) == []


def test_the_newest_events_are_read_from_the_end_of_the_file(tmp_path: Path) -> None:
    """What the supervisor reads at a failure: the newest hang verdict, past whatever came after
    it, and none when the run never hung (a stall's recovery is no verdict)."""
    assert newest_events(tmp_path) == [] and latest_hang(tmp_path) is None
    append_event(tmp_path, Notice(EventKind.RUN_STARTED, "x" * 500))
    append_event(tmp_path, Hang(5.0, 1, [1], "rank 1 never entered all_reduce #12", "s.json", []))
    append_event(tmp_path, RankExited(0, 1, "rank 0 exited with code 1"))
    with RunLayout(tmp_path).events.open("a") as fh:
        fh.write('{"kind": "hang", "t": 6.0}\n{torn')
    kinds = [e.kind for e in newest_events(tmp_path, 400)]  # the first line is cut: left out
    assert kinds == [EventKind.HANG, EventKind.RANK_EXITED, EventKind.HANG]
    # the newest verdict that says something
    assert latest_hang(tmp_path) == "rank 1 never entered all_reduce #12"
    calm = tmp_path / "calm"
    calm.mkdir()
    append_event(calm, Diagnosis(EventKind.RECOVERED, 1, "hang", {"of": "stalled"}))
    assert latest_hang(calm) is None
