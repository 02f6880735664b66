"""One schema of metrics.jsonl (xl.figures): every reader of the file reads a line alike."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
from eventlines import Lines

from xl import figures, wire
from xl.launcher.exporter.metrics import ExporterReader
from xl.launcher.rundir.runrecord import RunRecord
from xl.launcher.telemetry import stall as progress
from xl.launcher.telemetry.diagnose import Diagnoser, Thresholds
from xl.launcher.view import digest
from xl.launcher.view.reader import RunReader
from xl.launcher.view.runview import RankView


def _write(path: Path, *recs: dict) -> None:
    with open(path, "a") as fh:
        for rec in recs:
            fh.write(json.dumps(rec) + "\n")


def _timed(
    t: float, rank: int, step: int, data: float, compute: float, comm: float, other: float,
    steps: int = 1,
) -> dict:
    return {
        "t": t,
        "rank": rank,
        "kind": "train",
        "step": step,
        "steps": steps,
        "loss": 1.0 / step,
        "step_s": round(data + compute + comm + other, 6),
        "data_s": data,
        "compute_s": compute,
        "comm_s": comm,
        "other_s": other,
    }


def test_every_figure_shown_per_rank_is_a_rankview_field() -> None:
    fields = {f.name for f in dataclasses.fields(RankView)}
    shown = {f.field for f in figures.FIGURES if f.field}
    assert shown <= fields, shown - fields
    for name in (
        "step_s", "data_s", "compute_s", "comm_s", "other_s", "mem_peak_mib", "mem_mib",
        "gpu_proc_mem_mib",
    ):
        assert name in shown and name in fields
    assert len(figures.BY_KEY) == len(figures.FIGURES), "a figure named twice"
    assert all(figures.BY_KEY[k].field == k for k in figures.TIMED)  # the reader sets them by key


def test_a_line_without_a_time_is_skipped_by_every_reader(tmp_path: Path) -> None:
    """The one rule: no finite t, no line: neither the view, the digest, the stall rule nor the
    diagnoser takes it (before, the diagnoser took it as "now", and a stalled rank looked alive)."""
    good = _timed(100.0, 0, 1, 0.01, 0.05, 0.02, 0.01)
    bad = [
        {"rank": 1, "kind": "train", "step": 7, "loss": 3.0},
        {"t": None, "rank": 1, "kind": "train", "step": 7},
        {"t": "100", "rank": 1, "kind": "train", "step": 7},
        {"t": True, "rank": 1, "kind": "train", "step": 7},
        {"t": 100.0, "rank": True, "kind": "train", "step": 7},
    ]
    _write(tmp_path / "metrics.jsonl", good, *bad)
    (tmp_path / "metrics.jsonl").open("a").write(
        '{"t": NaN, "rank": 1, "kind": "train", "step": 7}\n'
    )
    for rec in bad:
        assert figures.stamp(rec) is None and figures.decode(rec) is None
    view = RunReader(tmp_path).poll()
    assert list(view.ranks) == [0]
    doc = digest.build(
        tmp_path,
        RunRecord.from_json({"started_at": 90.0, "ended_at": 110.0, "status": "succeeded"}),
    )
    assert doc["steps"] == [1] and list(doc["ranks"]) == ["0"]
    assert progress._records(tmp_path) == {0: (100.0, 0.0)}
    events = Lines()
    diag = Diagnoser(events, Thresholds(stall_min_s=30))
    diag.ingest(1, bad)
    diag.ingest(0, [good])
    diag.tick(100.0 + 31)
    assert [e["rank"] for e in events if e["kind"] == "stalled"] == [0], (
        "rank 1 never progressed: nothing to stall"
    )
    events.clear()
    diag.ingest(0, [{"rank": 0, "kind": "train", "step": 2}])  # no time: not progress "now"
    diag.tick(100.0 + 40)
    assert not any(e["kind"] == "recovered" for e in events)
    exporter = ExporterReader(tmp_path)
    _write(
        tmp_path / "metrics.jsonl",
        {"rank": 0, "kind": "train", "step": 9, "samples": 64},
        {"t": 101.0, "rank": 0, "kind": "train", "step": 2, "samples": 32},
    )
    exporter.poll()
    assert exporter.samples_total == {0: 32} and exporter.last_step_t == {0: 101.0}


def test_eta_and_the_stall_rule_count_the_steps_a_line_stands_for(tmp_path: Path) -> None:
    """Lines of 5 steps each, one a second: 5 steps/s; 100 steps to go is 20 s. The stall rule's
    step time is a step's (0.2 s), not a line's."""
    _write(
        tmp_path / "metrics.jsonl",
        *(
            dict(_timed(100.0 + i, 0, 5 * i, 0.05, 0.1, 0.04, 0.01, steps=5), total_steps=200)
            for i in range(1, 21)
        ),
    )
    rv = RunReader(tmp_path).poll().ranks[0]
    assert rv.step == 100 and rv.eta_s == pytest.approx(20.0)
    assert progress._records(tmp_path)[0] == (120.0, pytest.approx(0.2))


def test_figures_are_finite_numbers_never_bools() -> None:
    for good in (0, 1.5, -2, 10**20):
        assert figures.finite(good) and figures.number(good) == good
    for bad in (True, False, None, "1", float("nan"), float("inf"), [1], {"a": 1}):
        assert not figures.finite(bad) and figures.number(bad) is None


def test_the_view_shows_the_latest_split_and_sums_the_phases(tmp_path: Path) -> None:
    rng = random.Random(7)
    recs = []
    want = dict.fromkeys(figures.PHASE_KEYS, 0.0)
    steps = 0
    for i in range(1, 40):
        parts = [round(rng.uniform(0, 0.2), 4) for _ in range(4)]
        n = rng.randint(1, 5)
        recs.append(_timed(100.0 + i, 0, i * 5, *parts, steps=n))
        for key, v in zip(figures.PHASE_KEYS, parts, strict=True):
            want[key] += v * n
        steps += n
    # untimed: no split
    recs.append({"t": 140.0, "rank": 0, "kind": "train", "step": 999, "loss": 0.1})
    recs.append(
        {
            "t": 140.5,
            "rank": 0,
            "kind": "sys",
            "mem_mib": 812.5,
            "gpu_proc_mem_mib": 3000.0,
            "rss_mib": 900.0,
        }
    )
    recs.append({"t": 141.0, "rank": 0, "kind": "train", "step": 1000, "mem_peak_mib": 5123.0})
    _write(tmp_path / "metrics.jsonl", *recs)
    rv = RunReader(tmp_path).poll().ranks[0]
    last = recs[38]
    assert (rv.step_s, rv.data_s, rv.compute_s, rv.comm_s, rv.other_s) == tuple(
        last[k] for k in ("step_s", *figures.PHASE_KEYS)
    )
    assert rv.split == {k: last[k] for k in figures.PHASE_KEYS}
    assert rv.steps_timed == steps
    assert rv.phase_totals == pytest.approx(want)
    assert len(rv.step_s_history) == 39
    assert (rv.mem_mib, rv.gpu_proc_mem_mib, rv.rss_mib, rv.mem_peak_mib) == (
        812.5,
        3000.0,
        900.0,
        5123.0,
    )


def test_a_line_that_misses_a_phase_is_not_a_split(tmp_path: Path) -> None:
    rec = _timed(100.0, 0, 1, 0.01, 0.05, 0.02, 0.01)
    del rec["other_s"]
    _write(tmp_path / "metrics.jsonl", rec)
    rv = RunReader(tmp_path).poll().ranks[0]
    assert rv.split is None and rv.phase_totals == {} and rv.step_s == rec["step_s"]


def test_the_wire_caps_the_scripts_keys_not_xls_figures() -> None:
    """A script that logs 60 keys of its own keeps its step split; 65 of its own are refused."""
    own = {f"k{i}": i for i in range(wire.MAX_KEYS - 3)}
    rec = {
        "t": 1.0,
        "rank": 0,
        "kind": "train",
        **own,
        **_timed(1.0, 0, 1, 0.1, 0.2, 0.3, 0.4),
        "mem_peak_mib": 1.0,
    }
    assert len(rec) > wire.MAX_KEYS
    assert wire.parse_record(json.dumps(rec).encode(), 0)["comm_s"] == 0.3
    too_many = {
        "t": 1.0,
        "rank": 0,
        "kind": "train",
        **{f"k{i}": i for i in range(wire.MAX_KEYS + 1)},
    }
    with pytest.raises(wire.FrameError, match="too_many_keys"):
        wire.parse_record(json.dumps(too_many).encode(), 0)


def test_the_digest_splits_each_ranks_steps_and_the_run_time_by_phase(tmp_path: Path) -> None:
    """digest.json's ``ranks`` and run.json's ``time.phases`` against the sums of the lines."""
    rng = random.Random(11)
    sums = {r: [0, 0.0, 0.0, 0.0, 0.0] for r in range(3)}
    recs = []
    for i in range(1, 60):
        for rank in range(3):
            parts = [round(rng.uniform(0, 0.1), 4) for _ in range(4)]
            n = rng.randint(1, 4)
            recs.append(_timed(100.0 + i, rank, i, *parts, steps=n))
            sums[rank][0] += n
            for j, v in enumerate(parts, 1):
                sums[rank][j] += v * n
    # not a whole split
    recs.append({"t": 170.0, "rank": 0, "kind": "train", "step": 60, "data_s": 5.0})
    _write(tmp_path / "metrics.jsonl", *recs)
    doc = digest.build(
        tmp_path,
        RunRecord.from_json({"started_at": 95.0, "ended_at": 175.0, "status": "succeeded"}),
    )
    for rank, acc in sums.items():
        got = doc["ranks"][str(rank)]
        assert got["steps"] == acc[0]
        assert [got[k] for k in figures.PHASE_KEYS] == pytest.approx(acc[1:], abs=1e-3)
        assert got["step_s"] == pytest.approx(sum(acc[1:]) / acc[0], abs=1e-5)
    phases = doc["time"]["phases"]
    for j, key in enumerate(figures.PHASE_KEYS, 1):
        assert phases[key] == pytest.approx(sum(acc[j] for acc in sums.values()) / 3, abs=1e-3)
    assert phases["steps_s"] == pytest.approx(sum(phases[k] for k in figures.PHASE_KEYS), abs=2e-3)
    assert doc["time"]["total_s"] == pytest.approx(80.0)


def test_a_run_whose_steps_were_not_timed_has_no_split(tmp_path: Path) -> None:
    _write(
        tmp_path / "metrics.jsonl",
        *(
            {"t": 100.0 + i, "rank": 0, "kind": "train", "step": i, "loss": 1.0}
            for i in range(1, 9)
        ),
    )
    doc = digest.build(
        tmp_path,
        RunRecord.from_json({"started_at": 95.0, "ended_at": 110.0, "status": "succeeded"}),
    )
    assert doc["ranks"] == {} and "phases" not in doc["time"]
    assert digest._whole(doc)
