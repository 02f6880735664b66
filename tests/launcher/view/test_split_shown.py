"""Where each rank's step time went, where people look: the plain view's end table, `xl runs
--json`, `xl compare` (text and --json); each held to the sums of the lines the ranks wrote."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest
from procs import xl, xl_env
from runfixtures import make_run

from xl.figures import PHASE_KEYS, PHASES
from xl.launcher.cli import console, splittable
from xl.launcher.cli.compare import render
from xl.launcher.rundir import runrecord as record
from xl.launcher.view import comparison, digest
from xl.launcher.view.reader import RunReader

T0 = 1_780_000_000.0


def _timed_run(root: Path, run_id: str, slow: dict[int, str], seed: int) -> dict[int, list[float]]:
    """A finished 2-rank run (runfixtures' healthy one) whose ranks also timed 50 lines of steps;
    rank r slow in ``slow[r]``. Returns each rank's truth: [steps, data, compute, comm, other]
    summed."""
    run_dir = make_run(root, "healthy", t0=T0, run_id=run_id)
    rng = random.Random(seed)
    truth = {r: [0, 0.0, 0.0, 0.0, 0.0] for r in (0, 1)}
    with open(run_dir / "metrics.jsonl", "a") as fh:
        for i in range(50):
            for r in (0, 1):
                parts = [round(rng.uniform(0.001, 0.02), 6) for _ in PHASES]
                if r in slow:
                    parts[PHASES.index(slow[r])] += 0.2
                n = rng.randint(1, 3)
                rec = {
                    "t": T0 + 2 + i,
                    "rank": r,
                    "kind": "train",
                    "step": 100 + i,
                    "steps": n,
                    "step_s": round(sum(parts), 6),
                }
                rec.update(zip(PHASE_KEYS, parts, strict=True))
                fh.write(json.dumps(rec) + "\n")
                truth[r][0] += n
                for j, v in enumerate(parts, 1):
                    truth[r][j] += v * n
    rec = record.load(run_dir)
    assert rec is not None
    digest.close_run(run_dir, rec)  # digest.json, and run.json's time (as the supervisor's end)
    record.save(run_dir, rec)
    return truth


def _per_step(t: list[float]) -> dict[str, float]:
    return {k: t[j] / t[0] for j, k in enumerate(PHASE_KEYS, 1)}


def test_the_end_table_shows_each_ranks_step_split(tmp_path: Path) -> None:
    truth = _timed_run(tmp_path, "20260530-120000-a", {1: "data"}, 1)
    ranks = RunReader(tmp_path / "20260530-120000-a").poll().ranks
    rows = splittable.rank_rows(ranks)
    assert [r[:2] for r in rows] == [["0", str(truth[0][0])], ["1", str(truth[1][0])]]
    for row, r in zip(rows, (0, 1), strict=True):
        want = _per_step(truth[r])
        step = sum(want.values())
        assert row[2] == f"{step * 1000:.0f} ms"
        for cell, key in zip(row[3:], PHASE_KEYS, strict=True):
            assert cell.endswith(f" {want[key] / step:.0%}"), (cell, key, want)
    text = splittable.render(ranks)
    assert (
        text.startswith("where the step time went (per step)\nrank  steps  step") and "data" in text
    )
    # A run whose steps were not timed has no such table.
    plain = make_run(tmp_path, "failed", t0=T0, run_id="20260530-130000-b")
    assert splittable.render(RunReader(plain).poll().ranks) == ""


def test_the_plain_view_ends_with_the_split_table(tmp_path: Path) -> None:
    _timed_run(tmp_path, "20260530-120000-a", {1: "compute"}, 2)
    out = io.StringIO()
    console.watch_plain(console.ConsoleRun(tmp_path / "20260530-120000-a"), out, lines=False)
    text = out.getvalue()
    assert "where the step time went (per step)" in text
    # before the outcome line
    assert text.index("where the step time went") < text.rindex("xl: run ")
    assert "\ntime in steps (" in text and " per rank): data " in text


def test_runs_json_gives_each_ranks_split(tmp_path: Path) -> None:
    home = tmp_path / "home"
    truth = _timed_run(home / "runs", "20260530-120000-a", {0: "other"}, 3)
    make_run(home / "runs", "straggler", t0=T0 + 500, run_id="20260530-130000-b")  # live: no split
    done = xl(["runs", "--json"], xl_env(home))
    assert done.returncode == 0, done.stderr
    a, b = json.loads(done.stdout)
    assert b["split"] is None
    for r in (0, 1):
        got = a["split"][str(r)]
        assert got["steps"] == truth[r][0]
        assert {k: got[k] for k in PHASE_KEYS} == pytest.approx(_per_step(truth[r]), abs=1e-5)
        assert got["step_s"] == pytest.approx(sum(_per_step(truth[r]).values()), abs=1e-5)
    phases = a["time"]["phases"]
    for j, key in enumerate(PHASE_KEYS, 1):
        assert phases[key] == pytest.approx((truth[0][j] + truth[1][j]) / 2, abs=1e-3)


def test_compare_shows_both_splits_side_by_side(tmp_path: Path) -> None:
    ta = _timed_run(tmp_path, "20260530-120000-a", {1: "data"}, 4)
    tb = _timed_run(tmp_path, "20260530-130000-b", {}, 5)
    make_run(tmp_path, "failed", t0=T0, run_id="20260530-140000-c")
    c = comparison.compare(tmp_path / "20260530-120000-a", tmp_path / "20260530-130000-b")
    for side, truth in (("a", ta), ("b", tb)):
        split = c.doc["split"][side]
        for key in PHASE_KEYS:
            assert split[key] == pytest.approx(
                (_per_step(truth[0])[key] + _per_step(truth[1])[key]) / 2, abs=1e-5
            )
    assert c.doc["split"]["a"]["data_s"] > 0.1 > c.doc["split"]["b"]["data_s"]
    rows = {label: (a, b) for label, a, b in comparison.rows(c)}
    assert (
        "step split (mean of ranks)" in rows
        and rows["  data"][0].endswith("%")
        and rows["  data"][1].endswith("%")
    )
    assert "step split (mean of ranks)" in render(c)
    # One side untimed: its column says so, the other still shows.
    c = comparison.compare(tmp_path / "20260530-120000-a", tmp_path / "20260530-140000-c")
    assert c.doc["split"]["b"] is None
    rows = {label: (a, b) for label, a, b in comparison.rows(c)}
    assert rows["  compute"][1] == "-" and rows["  compute"][0] != "-"
    # Neither timed: no such section.
    make_run(tmp_path, "failed", t0=T0, run_id="20260530-150000-d")
    c = comparison.compare(tmp_path / "20260530-140000-c", tmp_path / "20260530-150000-d")
    assert c.doc["split"] == {"a": None, "b": None}
    assert "step split" not in render(c)
