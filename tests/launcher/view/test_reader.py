"""RunReader: the incremental view of a run directory that the TUI and live view use."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from xl.atomic import write_json_atomic
from xl.launcher.exporter.metrics import ExporterReader
from xl.launcher.rundir import jsonl
from xl.launcher.rundir.events import EventKind
from xl.launcher.rundir.metrics import MetricKind, read_rows
from xl.launcher.view.reader import RunReader
from xl.launcher.view.runview import HISTORY, History


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
    reader = RunReader(tmp_path)
    loss = reader.poll().ranks[0].loss
    assert loss is not None and loss != loss
    _append(tmp_path / "metrics.jsonl", _train(2.0, 1, 1, loss=None, nonfinite={"loss": "-inf"}))
    assert reader.poll().ranks[1].loss == float("-inf")
    # A malformed marker is no figure, and does not break the poll.
    _append(tmp_path / "metrics.jsonl", _train(3.0, 0, 2, loss=None, nonfinite={"loss": "abc"}))
    assert reader.poll().ranks[0].loss is None


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
    assert [e.kind for e in view.new_events] == [EventKind.STRAGGLER, EventKind.STALLED]
    _append(events, {"t": 3, "kind": "recovered", "rank": 2, "of": "stalled", "message": "ok"})
    view = reader.poll()
    assert view.ranks[2].state == "running" and view.ranks[2].diagnosis is None
    assert [e.kind for e in view.new_events] == [EventKind.RECOVERED]
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


def test_a_damaged_run_json_keeps_the_last_good_one_in_view(tmp_path: Path) -> None:
    """A copy caught half-written (or broken by hand) never blanks the Monitor's header."""
    reader = RunReader(tmp_path)
    assert reader.poll().status == "unknown" and reader.poll().run_id is None  # not written yet
    write_json_atomic(tmp_path / "run.json", {"run_id": "r1", "status": "running", "ranks": []})
    assert reader.poll().status == "running"
    (tmp_path / "run.json").write_text('{"run_id": "r1", "status": "succ')
    view = reader.poll()
    assert view.run_id == "r1" and view.status == "running"
    write_json_atomic(tmp_path / "run.json", {"run_id": "r1", "status": "succeeded", "ranks": []})
    view = reader.poll()
    assert view.status == "succeeded" and view.record.final and view.record.exit_code == 0


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
                {
                    "rank": 2,
                    "node": "n",
                    "pid": 3,
                    "gpu": None,
                    "exit_code": -9,
                    "state": "stopped",
                },
            ],
            "failure": {"rank": 1, "exit_code": 1, "traceback": "Traceback ..."},
        },
    )
    view = RunReader(tmp_path).poll()
    assert {r: v.state for r, v in view.ranks.items()} == {0: "stopped", 1: "failed", 2: "stopped"}


@pytest.fixture(params=["orjson", "json"])
def decoder(request, monkeypatch) -> str:
    """Each test that takes it runs with orjson's fast path and with the json module alone."""
    if request.param == "json":
        monkeypatch.setattr(jsonl, "_fast", lambda: None)
    else:
        monkeypatch.setattr(jsonl, "FAST_FROM", 1)  # every poll, however few its lines
        assert jsonl._fast() is not None, "orjson is a dependency: the fast path must be there"
    return request.param


def test_each_line_parses_as_json_loads_would(tmp_path: Path, decoder: str) -> None:
    # A bad line must cost only itself, and a line must be one JSON document (json.loads'
    # verdict) to count, whichever decoder reads it.
    metrics = tmp_path / "metrics.jsonl"
    _append(metrics, _train(1.0, 0, 1, loss=3.0))
    with open(metrics, "ab") as fh:
        # not UTF-8, surrounding whitespace, a BOM, a torn write, two documents, not ASCII:
        fh.write(b'{"t": 2.0, "rank": 0, "kind": "train", "step": 2, "note": "\xff"}\n')
        fh.write(b'  {"t": 3.0, "rank": 0, "kind": "train", "step": 3, "loss": 2.0}\r\n')
        fh.write(b'\xef\xbb\xbf{"t": 3.5, "rank": 1, "kind": "train", "step": 7}\n')
        fh.write(b'{"t": 4.0, "rank": 0, "kind": "tr{"t": 4.1, "rank": 0, "step": 9}\n')
        fh.write(b'{"t": 5.0, "rank": 0, "step": 10}, {"t": 5.1, "rank": 0, "step": 11}\n')
        fh.write(b'{"t": 6.0, "rank": 0, "step": 12}{"t": 6.1, "rank": 0, "step": 13}\n')
        fh.write(b'{"t": 7.0, "rank": 2, "kind": "train", "step": 1, "unit": "\xc2\xb5s"}\n')
        # NaN and a lone surrogate: json.loads takes both (orjson does not).
        fh.write(
            b'{"t": 8.0, "rank": 3, "kind": "train", "step": 4, "loss": NaN, "n": "\\ud800"}\n'
        )
    view = RunReader(tmp_path).poll()
    assert sorted(view.ranks) == [0, 1, 2, 3]
    r0 = view.ranks[0]
    assert (r0.step, r0.loss, r0.last_seen) == (3, 2.0, 3.0)
    assert list(r0.loss_history) == [(1.0, 3.0), (3.0, 2.0)]
    assert view.ranks[1].step == 7 and view.ranks[2].last_seen == 7.0
    assert view.ranks[3].step == 4 and view.ranks[3].loss is None


def test_events_skip_bad_lines(tmp_path: Path, decoder: str) -> None:
    with open(tmp_path / "events.jsonl", "wb") as fh:
        fh.write(b'{"t": 1, "kind": "a", "rank": null}\n\xff\xfe\n[1]\n{"t": 2, "kind": "b"}\n')
    view = RunReader(tmp_path).poll()
    assert [(e.kind, e.name) for e in view.events] == [(None, "a"), (None, "b")]


def test_fields_follow_the_latest_line_that_has_them(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    reader = RunReader(tmp_path)
    _append(
        metrics,
        _train(10.0, 0, 1, lr=0.1, tokens_per_s=900.0, steps_per_s=2.0, total_steps=100),
        _train(11.0, 0, 2, learning_rate=0.05),  # HF's name for lr
        _train(9.0, 0, 3),  # late and out of order: last_seen does not go back
        {"t": 11.5, "rank": 0, "kind": "sys", "gpu": 3, "pid": 77, "comm_wait_s": 0.25},
        {"t": 11.6, "rank": 0, "kind": "sys", "pid": 78, "gpu_util": None, "rss_mib": 10},
        {"t": 11.7, "rank": 0, "kind": "sys", "gpu_util": 40, "gpu_mem_used_mib": True},
    )
    r0 = reader.poll().ranks[0]
    assert (r0.lr, r0.tokens_per_s, r0.steps_per_s, r0.total_steps) == (0.05, 900.0, 2.0, 100)
    assert (r0.step, r0.last_seen) == (3, 11.7)
    assert (r0.gpu, r0.pid, r0.comm_wait_s, r0.rss_mib) == (3, 77, 0.25, 10)
    assert (r0.gpu_util, r0.gpu_mem_used_mib) == (40, None)
    assert list(r0.gpu_util_history) == [(11.7, 40)]
    # A line that carries a key with a bad value clears the field; one without the key keeps it.
    _append(metrics, _train(12.0, 0, 4, lr="x", tokens_per_s=float("nan")), _train(13.0, 0, 5))
    r0 = reader.poll().ranks[0]
    assert (r0.lr, r0.tokens_per_s, r0.steps_per_s) == (None, None, 2.0)


def test_histories_and_eta_across_polls(tmp_path: Path) -> None:

    metrics = tmp_path / "metrics.jsonl"
    reader = RunReader(tmp_path)
    _append(
        metrics,
        *(
            _train(float(i), 0, i, loss=1.0 / (i + 1), samples_per_s=float(i), total_steps=10_000)
            for i in range(10)
        ),
    )
    r0 = reader.poll().ranks[0]
    assert r0.eta_s == pytest.approx(10_000 - 9)  # 1 step/s
    # The next poll continues the same histories and rate; they keep at most HISTORY points,
    # spread from the run's first point to its newest.
    _append(
        metrics,
        *(
            _train(10.0 + i / 2, 0, 10 + i, loss=0.5, samples_per_s=None if i == 3 else 7.0)
            for i in range(HISTORY)
        ),
    )
    r0 = reader.poll().ranks[0]
    last_t = 10.0 + (HISTORY - 1) / 2
    assert HISTORY // 2 < len(r0.loss_history) <= HISTORY
    assert r0.loss_history[0] == (0.0, 1.0) and r0.loss_history[-1] == (last_t, 0.5)
    times = [t for t, _ in r0.loss_history]
    assert times == sorted(times)
    assert HISTORY // 2 < len(r0.samples_history) <= HISTORY
    assert r0.samples_history[0] == (0.0, 0.0) and r0.samples_history[-1] == (last_t, 7.0)
    assert r0.samples_per_s == 7.0
    assert r0.eta_s == pytest.approx((10_000 - (10 + HISTORY - 1)) / 2)  # 2 steps/s
    # A restarted count (a new phase) forgets the old rate: no ETA until it has two points.
    _append(metrics, _train(last_t + 1, 0, 0))
    r0 = reader.poll().ranks[0]
    assert r0.step == 0 and r0.eta_s is None
    _append(metrics, _train(last_t + 5, 0, 4))
    assert reader.poll().ranks[0].eta_s == pytest.approx((10_000 - 4) / 1)


def test_history_spans_the_whole_run_in_at_most_cap_points() -> None:
    """A rank logging 100 times a second for 100 s: the chart still covers the whole run (a
    deque of the last points would show the last 6 s), evenly, with the newest point last."""

    history = History(cap=600)
    for i in range(10_000):
        history.append((i / 100, float(i)))
        assert len(history) <= 600
        assert history[-1] == (i / 100, float(i))
    points = list(history)
    assert points[0] == (0.0, 0.0) and points[-1] == (99.99, 9999.0)
    assert len(points) > 300
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(points[:-1])]
    assert max(gaps) <= min(gaps) * 1.01  # evenly spread (the newest may sit closer)


def test_only_finite_numbers_are_taken_as_figures(tmp_path: Path, decoder: str) -> None:
    """Booleans, strings, NaN and infinities are not figures: a line whose time is one is
    skipped, a figure that is one clears the field and adds no chart point."""
    metrics = tmp_path / "metrics.jsonl"
    _append(metrics, _train(1.0, 0, 1, loss=2.0, samples_per_s=10.0))
    _append(
        metrics,
        raw='{"t": NaN, "rank": 0, "step": 50, "loss": 0.1}\n'
        '{"t": true, "rank": 0, "step": 51, "loss": 0.1}\n'
        '{"t": 2.0, "rank": true, "step": 52}\n'
        '{"t": 3.0, "rank": 0, "step": true, "loss": Infinity, "samples_per_s": "fast"}\n'
        '{"t": 4.0, "rank": 0, "step": 2.5, "loss": 3, "samples_per_s": -Infinity}\n',
    )
    view = RunReader(tmp_path).poll()
    assert sorted(view.ranks) == [0]  # `true` is no rank (it used to read as rank 1)
    r0 = view.ranks[0]
    assert r0.last_seen == 4.0  # the NaN and `true` times were skipped
    assert r0.step == 2.5  # `true` is not a step, 2.5 is
    assert r0.loss == 3 and list(r0.loss_history) == [(1.0, 2.0), (4.0, 3)]
    assert r0.samples_per_s is None and list(r0.samples_history) == [(1.0, 10.0)]


def test_a_hang_s_victims_read_as_waiting_and_its_culprit_as_stalled(tmp_path: Path) -> None:
    """The culprit of a hang is stalled; the ranks that wait for it in a collective are not
    stalled in their own right: they read "waiting" until the culprit moves again."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"run_id": "run", "status": "running", "ranks": [
        {"rank": 0, "state": "running"}, {"rank": 1, "state": "running"}]}))
    (run / "metrics.jsonl").write_text("")
    events = [
        {"t": 1.0, "kind": "stalled", "rank": 1, "message": "rank 1 is in astray at hang.py:25"},
        {
            "t": 1.0,
            "kind": "stalled",
            "rank": 0,
            "waiting_on": [1],
            "message": "rank 0 waits in all_reduce #4 for rank 1",
        },
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    reader = RunReader(run)
    view = reader.poll()
    assert (view.ranks[0].state, view.ranks[1].state) == ("waiting", "stalled")
    with open(run / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"t": 2.0, "kind": "recovered", "rank": 1, "of": "stalled"}) + "\n")
        fh.write(json.dumps({"t": 2.0, "kind": "recovered", "rank": 0, "of": "stalled"}) + "\n")
    view = reader.poll()
    assert (view.ranks[0].state, view.ranks[1].state) == ("running", "running")


@pytest.mark.parametrize("reader", [RunReader, ExporterReader])
def test_each_poll_shows_the_new_lines_of_the_ranks_they_came_for(tmp_path: Path, reader) -> None:
    """Polls with nothing but new metrics lines renew the snapshots of those ranks only, in
    RunReader and in the exporter's, which sees each line first."""
    metrics = tmp_path / "metrics.jsonl"
    _append(metrics, _train(100.0, 0, 1, samples=4), _train(100.0, 1, 1, samples=4))
    r = reader(tmp_path)
    first = r.poll()
    for step in (2, 3):
        _append(metrics, _train(100.0 + step, 1, step, samples=4))
        view = r.poll()
        assert (view.ranks[0].step, view.ranks[1].step) == (1, step)
        assert view.ranks[0] is first.ranks[0]
    assert first.ranks[1].step == 1
    if isinstance(r, ExporterReader):
        assert r.samples_total == {0: 4.0, 1: 12.0} and r.last_step_t[1] == 103.0


def test_a_metrics_line_is_read_once_into_a_typed_row(decoder: str) -> None:
    """metrics.jsonl's one parse: the rank, time and kind typed, the figures kept as the line
    gave them; a line without an int rank or a finite time is no row for anyone (the lines of
    the shape xl writes and every other shape, by either decoder)."""
    lines = [
        b'{"t": 10.5, "rank": 0, "kind": "train", "step": 3, "loss": 2.5}',
        b'{"t": 11, "rank": 1, "kind": "sys", "gpu_util": 40, "gpu": "MIG-1"}',
        b'{"t": 12.0, "rank": 2, "kind": "checkpoint", "path": "/c"}',  # a kind xl does not write
        b'{"t": 13.0, "rank": 3}',  # no kind at all: the reader takes it as the rank's own line
        b'{"t": 1.0, "rank": true, "kind": "train"}',
        b'{"t": NaN, "rank": 0, "kind": "train"}',
        b'{"t": "now", "rank": 0, "kind": "train"}',
        b'{"rank": 0, "kind": "train", "step": 9}',
        b'{"t": 2.0, "rank": 0, "kind": ["train"]}',
        b"[1, 2]",
        b"{torn",
        b'{"t": 1e999, "rank": 0, "kind": "train"}',  # JSON's overflow: an infinite time
        b'{"t": -Infinity, "rank": 0, "kind": "sys"}',
        b'{"t": 4.0, "rank": 1.0, "kind": "train"}',  # a float is no rank
        b'{"t": 5.0, "rank": "0", "kind": "sys"}',
        b'{"t": 6.0, "kind": "sys"}',
        b'{"t": 7.0, "rank": 4, "kind": null}',
        b'{"t": 8.0, "rank": 5, "kind": 1}',
        b'{"t": 9, "rank": 6, "kind": "train"}',  # an int time is a time
        b'"train"',
        b"null",
    ]
    rows = read_rows(lines)
    assert [(rank, t, kind) for rank, t, kind, _ in rows] == [
        (0, 10.5, MetricKind.TRAIN),
        (1, 11, MetricKind.SYS),
        (2, 12.0, None),
        (3, 13.0, None),
        (0, 2.0, None),
        (4, 7.0, None),
        (5, 8.0, None),
        (6, 9, MetricKind.TRAIN),
    ]
    assert rows[0][3] == {"t": 10.5, "rank": 0, "kind": "train", "step": 3, "loss": 2.5}
    assert rows[1][3]["gpu"] == "MIG-1"  # every key of the line stays, the figures and the rest


def test_the_rarer_figures_are_read_whatever_else_a_line_holds(
    tmp_path: Path, decoder: str
) -> None:
    """A line's eval loss, learning rate and step time are read whether it names its kind or not
    (a hand-written line, another tool's kind), and a plain line after them keeps them shown."""
    metrics = tmp_path / "metrics.jsonl"
    _append(
        metrics,
        {"t": 1.0, "rank": 0, "eval_loss": 1.5},  # no kind, no other figure
        {"t": 2.0, "rank": 1, "kind": "mine", "lr": 0.01, "step": 3},  # a kind xl does not write
        {"t": 3.0, "rank": 2, "kind": "train", "step": 4, "loss": 2.0, "step_s": 0.25},
        {"t": 4.0, "rank": 2, "kind": "train", "step": 5, "loss": 1.9, "samples_per_s": 8.0},
    )
    view = RunReader(tmp_path).poll()
    assert view.ranks[0].eval_loss == 1.5 and view.ranks[0].loss is None
    assert (view.ranks[1].lr, view.ranks[1].step) == (0.01, 3)
    r2 = view.ranks[2]
    assert (r2.step_s, r2.step, r2.loss, r2.samples_per_s) == (0.25, 5, 1.9, 8.0)
