"""What the Monitor draws is a snapshot: a RunView (and every RankView in it) stays as the reader
read it, while the reader, on the Monitor's worker thread, goes on reading the run.

The Monitor once waited for each view to be drawn before the next poll (the reader changed its
RankViews in place); now it draws whatever the last poll handed over, on any thread, with no
handshake. These tests hold the reader to its side of that: each poll's view is new, and no
later poll changes an earlier one, whatever the run does meanwhile (new lines, a diagnosis, a
rank's end, a history thinned past its cap).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from xl.atomic import write_json_atomic
from xl.launcher.rundir.events import EventKind
from xl.launcher.view.reader import RunReader
from xl.launcher.view.runview import HISTORY, RankView, RunView


def _append(path: Path, *objs: dict[str, Any]) -> None:
    with open(path, "a") as fh:
        for obj in objs:
            fh.write(json.dumps(obj) + "\n")


def _train(t: float, rank: int, step: int, loss: float) -> dict[str, Any]:
    return {
        "t": t,
        "rank": rank,
        "kind": "train",
        "step": step,
        "total_steps": 100_000,
        "loss": loss,
        "samples_per_s": 10.0 + step,
    }


def _plain(view: RunView) -> dict[str, Any]:
    """Everything a view shows, copied out as plain values."""
    ranks = {}
    for r, rv in view.ranks.items():
        ranks[r] = {
            f.name: list(value)
            if f.name.endswith("_history")
            else dict(value)
            if f.name == "phase_totals"
            else value
            for f in dataclasses.fields(rv)
            for value in (getattr(rv, f.name),)
        }
    return {
        "status": view.status,
        "ranks": ranks,
        "events": [e.to_json() for e in view.events],
        "hang": view.hang,
    }


def _run_json(run_dir: Path, status: str, exit_codes: dict[int, int | None]) -> None:
    ranks = [
        {
            "rank": r,
            "pid": 1000 + r,
            "state": "exited" if c is not None else "running",
            "exit_code": c,
        }
        for r, c in exit_codes.items()
    ]
    write_json_atomic(
        run_dir / "run.json", {"run_id": "r1", "status": status, "world_size": 2, "ranks": ranks}
    )


def test_a_view_handed_out_never_changes_as_the_reader_reads_on(tmp_path: Path) -> None:
    metrics, events = tmp_path / "metrics.jsonl", tmp_path / "events.jsonl"
    _run_json(tmp_path, "running", {0: None, 1: None})
    _append(
        metrics, *(_train(100.0 + i, r, i, 2.0 - i / 100) for i in range(1, 11) for r in (0, 1))
    )
    reader = RunReader(tmp_path)
    first = reader.poll()
    before = _plain(first)
    assert before["ranks"][0]["step"] == 10 and len(before["ranks"][0]["loss_history"]) == 10

    # The run goes on: many more lines (past the history's cap, so it thins), rank 1 stalls,
    # then rank 0 ends.
    _append(
        metrics, *(_train(200.0 + i, r, 10 + i, 1.0) for i in range(1, 2 * HISTORY) for r in (0, 1))
    )
    _append(
        events, {"t": 300.0, "kind": "stalled", "rank": 1, "message": "rank 1 made no progress"}
    )
    later = reader.poll()
    _run_json(tmp_path, "running", {0: 0, 1: None})
    last = reader.poll()

    assert _plain(first) == before, "a later poll changed a view handed out earlier"
    # ...while the reader did read on: the new views say what happened.
    assert later.ranks[0].step == 10 + 2 * HISTORY - 1
    assert HISTORY // 2 < len(later.ranks[0].loss_history) <= HISTORY
    assert later.ranks[0].loss_history[0] == before["ranks"][0]["loss_history"][0]
    assert later.ranks[1].state == "stalled" and first.ranks[1].state == "running"
    assert last.ranks[0].state == "exited" and later.ranks[0].state == "running"
    assert later.ranks[0] is not first.ranks[0]


def test_a_poll_with_nothing_new_hands_out_the_same_figures(tmp_path: Path) -> None:
    """A finished run changes no more: a poll that read nothing says what the last one said."""
    _run_json(tmp_path, "succeeded", {0: 0})
    _append(tmp_path / "metrics.jsonl", _train(100.0, 0, 5, 1.5))
    reader = RunReader(tmp_path)
    one, two = reader.poll(), reader.poll()
    assert _plain(one) == _plain(two) and two.ranks[0].state == "exited"


def test_views_cannot_be_changed_by_whoever_draws_them(tmp_path: Path) -> None:
    _append(tmp_path / "metrics.jsonl", _train(100.0, 0, 5, 1.5))
    view = RunReader(tmp_path).poll()
    rv = view.ranks[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        rv.step = 6  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.ranks = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        rv.phase_totals["data_s"] = 1.0  # type: ignore[index]
    assert not hasattr(rv.loss_history, "append")
    assert RankView(3).loss_history == [] and RankView(3).eta_s is None


def test_a_view_read_on_another_thread_while_the_reader_polls_stays_whole(tmp_path: Path) -> None:
    """The Monitor's case: the main thread draws the last view while the worker polls again."""
    metrics = tmp_path / "metrics.jsonl"
    _append(metrics, *(_train(1.0 + i, 0, i, 1.0 / i) for i in range(1, 50)))
    reader = RunReader(tmp_path)
    views = [reader.poll()]
    stop = threading.Event()
    seen: list[tuple[int, list[tuple[float, float]]]] = []

    def draw() -> None:
        while not stop.is_set():
            view = views[-1]
            seen.append((len(view.ranks[0].loss_history), list(view.ranks[0].loss_history)))

    drawer = threading.Thread(target=draw)
    drawer.start()
    try:
        for k in range(40):
            _append(
                metrics, *(_train(100.0 + k * 50 + i, 0, 50 + k * 50 + i, 0.5) for i in range(50))
            )
            views.append(reader.poll())
    finally:
        stop.set()
        drawer.join(timeout=30)
    assert not drawer.is_alive()
    assert seen and all(n == len(points) for n, points in seen)
    for view in views:  # each still holds its points in time order, as it was read
        times = [t for t, _ in view.ranks[0].loss_history]
        assert times == sorted(times)


def test_a_rank_with_nothing_new_keeps_its_snapshot_and_the_others_get_new_ones(
    tmp_path: Path,
) -> None:
    """A poll makes new snapshots only of the ranks whose lines came (the others' still say it
    all, and being frozen they may be shared); anything that can move every rank's state (an
    event, run.json) makes a new snapshot of each."""
    metrics, events = tmp_path / "metrics.jsonl", tmp_path / "events.jsonl"
    _run_json(tmp_path, "running", {0: None, 1: None})
    _append(metrics, _train(100.0, 0, 1, 2.0), _train(100.0, 1, 1, 2.0))
    reader = RunReader(tmp_path)
    first = reader.poll()

    _append(metrics, _train(101.0, 1, 2, 1.5))
    second = reader.poll()
    assert second.ranks[0] is first.ranks[0]  # rank 0 read nothing new
    assert second.ranks[1] is not first.ranks[1]
    assert (first.ranks[1].step, second.ranks[1].step) == (1, 2)
    assert second.events is first.events == []  # no event came: the same (never changed) list
    assert list(second.ranks[1].loss_history) == [(100.0, 2.0), (101.0, 1.5)]
    assert list(second.ranks) == [0, 1] and second.ranks is not first.ranks

    # A diagnosis of rank 0 with no line of its own: its state is new, so is its snapshot.
    _append(events, {"t": 102.0, "kind": "stalled", "rank": 0, "message": "rank 0 stalled"})
    third = reader.poll()
    assert third.ranks[0] is not second.ranks[0]
    assert (second.ranks[0].state, third.ranks[0].state) == ("running", "stalled")
    assert third.ranks[0].step == 1 and list(third.ranks) == [0, 1]
    assert [e.kind for e in third.events] == [EventKind.STALLED] and second.events == []

    # A rank seen for the first time joins the view in rank order.
    _append(metrics, _train(103.0, 2, 1, 2.0), _train(103.0, 1, 3, 1.0))
    fourth = reader.poll()
    assert list(fourth.ranks) == [0, 1, 2] and fourth.ranks[2].step == 1
    assert list(third.ranks) == [0, 1] and third.ranks[1].step == 2
