"""Where a run's time went: the accounting's rules (xl.launcher.view.timing) and the digest that
reads them off a run dir (xl.launcher.view.digest), on run dirs written here line by line.

The real runs (a rank stalled for a known time, through the real `xl launch`) are in
test_compare.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from xl.launcher.rundir import runrecord as record
from xl.launcher.view import digest, timing
from xl.launcher.view.timing import Moments, account

T0 = 1_700_000_000.0


def _sum(t: dict[str, float]) -> float:
    return sum(t[k] for k in timing.PARTS)


def test_a_plain_run_is_startup_training_and_shutdown_summing_to_its_length() -> None:
    t = account(Moments(T0, T0 + 100, first_step_at=T0 + 10, last_step_at=T0 + 95))
    assert t == {
        "total_s": 100.0,
        "startup_s": 10.0,
        "training_s": 85.0,
        "stalled_s": 0.0,
        "restarts_s": 0.0,
        "shutdown_s": 5.0,
    }


def test_a_stall_is_cut_out_of_training_and_a_restart_out_of_both() -> None:
    t = account(
        Moments(
            T0,
            T0 + 100,
            T0 + 10,
            T0 + 95,
            stalled=[(T0 + 20, T0 + 30), (T0 + 25, T0 + 35)],
            restarts=[(T0 + 50, T0 + 60), (T0 + 33, T0 + 40)],
        )
    )
    # stalled 20..35 less the restart 33..35; restarts 33..40 and 50..60.
    assert t["stalled_s"] == 13.0 and t["restarts_s"] == 17.0
    assert t["training_s"] == 85.0 - 13.0 - 17.0
    assert abs(_sum(t) - t["total_s"]) < 1e-6


def test_a_hang_after_the_last_step_is_stalled_time_not_shutdown() -> None:
    # The last step at 40, stalled from then until someone stopped it at 100.
    t = account(Moments(T0, T0 + 100, T0 + 5, T0 + 40, stalled=[(T0 + 40, T0 + 99)]))
    assert t["stalled_s"] == 59.0 and t["shutdown_s"] == 1.0


def test_a_run_that_never_logged_a_step_is_all_startup() -> None:
    t = account(Moments(T0, T0 + 7.5))
    assert t["startup_s"] == 7.5 == t["total_s"] and t["training_s"] == 0.0


def test_spans_outside_the_run_and_nonsense_count_for_nothing() -> None:
    t = account(
        Moments(
            T0,
            T0 + 10,
            T0 + 1,
            T0 + 9,
            stalled=[(T0 - 50, T0 - 40), (float("nan"), T0 + 5), (T0 + 8, T0 + 3)],
        )
    )
    assert t["stalled_s"] == 0.0 and t["training_s"] == 8.0


def test_the_line_names_each_part_that_took_time() -> None:
    line = timing.describe(
        {
            "total_s": 155,
            "startup_s": 14,
            "training_s": 131,
            "stalled_s": 8,
            "restarts_s": 0,
            "shutdown_s": 2,
        }
    )
    assert (
        line
        == "time: startup 14 s (9%), training 131 s (85%), stalled 8.0 s (5%), shutdown 2.0 s (1%)"
    )
    assert timing.describe(None) is None
    # a damaged record says nothing rather than nonsense
    assert timing.describe({"total_s": "x"}) is None


def test_a_run_without_steps_is_not_called_all_startup() -> None:
    """A script that prints no progress xl reads still trains: its record is all startup, but
    the line and the table say that no step was logged, not "startup 31 s (100%)"."""
    t = account(Moments(T0, T0 + 31))
    assert t["startup_s"] == t["total_s"] == 31.0
    assert (
        timing.describe(t)
        == "time: 31 s (not split into startup and training: no rank logged a step)"
    )
    assert dict(timing.rows(t))["startup"] == "31 s (no step logged)"
    # A run that did log steps, even late, is split as usual.
    late = account(Moments(T0, T0 + 31, T0 + 30, T0 + 30.5))
    assert (
        timing.describe(late)
        == "time: startup 30 s (97%), training 0.5 s (2%), shutdown 0.5 s (2%)"
    )


# ---------------------------------------------------------------------------------- the digest
def _run(
    tmp_path: Path, lines: list[dict[str, Any]], events: list[dict[str, Any]], end: float
) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rec = record.RunRecord("run", "succeeded", {"started_at": T0, "ended_at": end, "ranks": []})
    record.save(run_dir, rec)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run_dir / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in events))
    return run_dir


def _steps(
    ranks: int, steps: range, start: float, dt: float, gap: tuple[int, float] = (0, 0.0)
) -> list[dict[str, Any]]:
    """Lockstep train lines; ``gap``: (step, seconds) added before that step on every rank."""
    out, t = [], start
    for s in steps:
        t += dt + (gap[1] if s == gap[0] else 0.0)
        out += [
            {"t": t, "rank": r, "kind": "train", "step": s, "loss": 1.0 / s, "samples_per_s": 100.0}
            for r in range(ranks)
        ]
    return out


def test_a_stall_seen_by_telemetry_counts_from_last_progress_to_progress_again(
    tmp_path: Path,
) -> None:
    lines = _steps(2, range(1, 41), T0 + 5, 0.1, gap=(20, 8.0))  # step 19 at 6.9, step 20 at 15.0
    events = [
        {"t": T0 + 9.0, "kind": "stalled", "rank": 1, "idle_s": 2.1},
        {"t": T0 + 15.2, "kind": "recovered", "rank": 1, "of": "stalled"},
    ]
    run_dir = _run(tmp_path, lines, events, end=T0 + 20)
    t = digest.build(run_dir, record.load(run_dir))["time"]  # type: ignore[arg-type]
    assert t["stalled_s"] == pytest.approx(8.1, abs=1e-3)  # the 8 s gap and its step's own 0.1 s
    assert t["startup_s"] == pytest.approx(5.1, abs=1e-3)
    assert abs(_sum(t) - t["total_s"]) < 1e-6 and t["total_s"] == pytest.approx(20.0)


def test_lines_that_came_late_from_a_spool_are_placed_by_their_time(tmp_path: Path) -> None:
    lines = _steps(2, range(1, 41), T0 + 5, 0.1, gap=(20, 8.0))
    late = lines[:20]  # steps 1..10 of both ranks, spooled while the collector was away
    events = [{"t": T0 + 9.0, "kind": "stalled", "rank": 1, "idle_s": 2.1}]
    run_dir = _run(tmp_path, lines[20:] + late, events, end=T0 + 20)
    t = digest.build(run_dir, record.load(run_dir))["time"]  # type: ignore[arg-type]
    assert t["stalled_s"] == pytest.approx(8.1, abs=1e-3) and t["startup_s"] == pytest.approx(
        5.1, abs=1e-3
    )


def test_a_slow_step_nobody_called_a_stall_is_training(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, _steps(2, range(1, 41), T0 + 5, 0.1, gap=(20, 8.0)), [], end=T0 + 20)
    t = digest.build(run_dir, record.load(run_dir))["time"]  # type: ignore[arg-type]
    # Steps 1..40 from 5.1 s to 17.0 s, the 8 s gap inside: all of it training.
    assert (
        t["stalled_s"] == 0.0
        and t["training_s"] == pytest.approx(11.9)
        and t["shutdown_s"] == pytest.approx(3.0)
    )


def test_a_restart_lasts_from_the_failure_until_the_ranks_log_again(tmp_path: Path) -> None:
    # attempt 2 logs from 10.1
    lines = _steps(2, range(1, 11), T0 + 2, 0.1) + _steps(2, range(1, 11), T0 + 10, 0.1)
    events = [
        {"t": T0 + 4.0, "kind": "rank_exited", "rank": 1, "exit_code": 1},
        {"t": T0 + 4.1, "kind": "rank_exited", "rank": 0, "exit_code": -15},
        {"t": T0 + 6.0, "kind": "restarted", "attempt": 1},
    ]
    run_dir = _run(tmp_path, lines, events, end=T0 + 12)
    doc = digest.build(run_dir, record.load(run_dir))  # type: ignore[arg-type]
    assert doc["time"]["restarts_s"] == pytest.approx(6.1, abs=1e-3)
    assert doc["time"]["startup_s"] == pytest.approx(2.1, abs=1e-3)


def test_waits_speed_and_series(tmp_path: Path) -> None:
    lines = _steps(2, range(1, 101), T0 + 1, 0.05)
    lines += [
        {"t": T0 + 3, "rank": 0, "kind": "sys", "comm_wait_s": 0.2, "comm_steps": 10},
        {"t": T0 + 3, "rank": 1, "kind": "sys", "gpu_util": 5},
    ]
    run_dir = _run(tmp_path, lines, [], end=T0 + 7)
    doc = digest.build(run_dir, record.load(run_dir))  # type: ignore[arg-type]
    assert doc["waited_s"] == {"0": 2.0}  # rank 1 was not watched: no figure rather than 0
    assert doc["speed"]["step_s"] == pytest.approx(0.05) and doc["speed"]["samples_per_s"] == 200.0
    assert doc["steps"][:3] == [1, 2, 3] and doc["loss"][1] == 0.5


def test_a_long_run_keeps_the_same_steps_as_another_of_about_its_length() -> None:
    a, b = (
        digest._thin([float(s) for s in range(1, 100_001)]),
        digest._thin([float(s) for s in range(1, 90_001)]),
    )
    assert len(a) <= digest.SERIES_POINTS and len(b) <= digest.SERIES_POINTS
    assert len(set(a) & set(b)) >= len(b) - 1


def test_a_damaged_metrics_file_is_read_around(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, _steps(1, range(1, 11), T0 + 1, 0.1), [], end=T0 + 3)
    with open(run_dir / "metrics.jsonl", "ab") as fh:
        fh.write(
            b'{"t": "soon", "rank": 0, "kind": "train"}\n\xff\xfe not json\n{"t": 1e999, "rank": '
            b'true}\n[1,2]\n'
        )
    doc = digest.build(run_dir, record.load(run_dir))  # type: ignore[arg-type]
    assert doc["time"]["startup_s"] == pytest.approx(1.1) and len(doc["steps"]) == 10


def test_a_digest_followed_as_the_run_goes_comes_to_what_one_read_whole_does(
    tmp_path: Path,
) -> None:
    lines = _steps(2, range(1, 41), T0 + 5, 0.1, gap=(20, 8.0))  # the stall: after step 19 (6.9 s)
    stall = {"t": T0 + 9.0, "kind": "stalled", "rank": 1, "idle_s": 2.1}
    run_dir = _run(tmp_path, [], [], end=T0 + 20)
    rec = record.load(run_dir)
    assert rec is not None
    live = digest.Digester(run_dir)
    text = "".join(json.dumps(x) + "\n" for x in lines[:38])  # steps 1..19 of both ranks
    metrics, events = run_dir / "metrics.jsonl", run_dir / "events.jsonl"
    metrics.write_text(text[:-7])  # the last line half written
    live.poll()
    metrics.write_text(text)
    live.poll()
    events.write_text(json.dumps(stall) + "\n")  # the stall is seen after the lines before it
    live.poll()
    with open(metrics, "a") as fh:
        fh.write("".join(json.dumps(x) + "\n" for x in lines[38:]))
    live.poll()
    followed, whole = live.doc(rec), digest.build(run_dir, rec)
    assert followed == whole
    assert (
        followed["time"]["stalled_s"] == pytest.approx(8.1, abs=1e-3)
        and len(followed["steps"]) == 40
    )


@pytest.mark.parametrize(
    "damage",
    [
        b"{not json",
        b'{"version": 1, "steps": "abc", "loss": [], "samples_per_s": [], "speed": {}, "time": '
        b'null, "waited_s": {}}',
        b'{"version": 1, "steps": [1, 2], "loss": [1.0], "samples_per_s": [null, null], "speed": '
        b'{"step_s": "fast"}, "time": null, "waited_s": {}}',
    ],
)
def test_a_damaged_digest_is_made_again_from_the_run(tmp_path: Path, damage: bytes) -> None:
    run_dir = _run(tmp_path, _steps(2, range(1, 11), T0 + 1, 0.1), [], end=T0 + 3)
    rec = record.load(run_dir)
    assert rec is not None
    (run_dir / "digest.json").write_bytes(damage)
    doc = digest.load(run_dir, rec)
    assert doc["steps"] == list(range(1, 11)) and doc == digest.build(run_dir, rec)
    assert json.loads((run_dir / "digest.json").read_text()) == doc  # kept, whole, for next time
