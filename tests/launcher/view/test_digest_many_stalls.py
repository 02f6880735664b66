"""The digest of a run in which thousands of ranks stalled: the same accounting as for a few.

A run of 4,096 ranks whose collector fell behind can see every rank called stalled; the digest
(xl.launcher.view.digest) and the accounting (xl.launcher.view.timing) then hold a stall per
rank. These tests check the figures against the scenario's own ground truth, worked out here from
the times the scenario chose, and the sweep that decides which instants are stalled against the
rule as docs/compare.md states it (an instant is stalled when some stall holds it).
"""

from __future__ import annotations

import json
import random
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from xl.launcher.rundir import runrecord as record
from xl.launcher.view import digest, timing
from xl.launcher.view.timing import Moments, account

T0 = 1_700_000_000.0
RANKS = 4096


def _line(rank: int, step: int, t: float) -> dict[str, Any]:
    return {"t": t, "rank": rank, "kind": "train", "step": step, "loss": 1.0, "samples_per_s": 8.0}


def _scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[float, float]]]:
    """Every rank steps once a second from T0+1, stops after step 10 + rank % 3, is called stalled
    at T0+40 and ends its stall one of three ways: it exits at T0+45 (rank % 4 == 0), it is
    told recovered at T0+48 before its next line at T0+50+rank%5 (odd ranks), or only its next
    line at T0+50+rank%5 ends it; the ranks that go on log up to T0+60. Returns the lines, the
    events and each rank's stall as the scenario made it."""
    lines: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    spans = []
    for r in range(RANKS):
        last = 10 + r % 3
        lines += [_line(r, s, T0 + s) for s in range(1, last + 1)]
        events.append({"t": T0 + 40, "kind": "stalled", "rank": r, "idle_s": 40.0 - last})
        back = 50 + r % 5
        if r % 4 == 0:
            events.append({"t": T0 + 45, "kind": "rank_exited", "rank": r, "exit_code": 0})
            end = 45
        else:
            lines += [_line(r, last + 1 + i, T0 + back + i) for i in range(60 - back + 1)]
            if r % 2:
                events.append({"t": T0 + 48, "kind": "recovered", "rank": r, "of": "stalled"})
            end = 48 if r % 2 else back
        spans.append((T0 + last, T0 + end))
    events.sort(key=lambda e: e["t"])
    return lines, events, spans


def test_4096_stalled_ranks_are_accounted_from_each_one_s_last_step_to_its_end(
    tmp_path: Path,
) -> None:
    lines, events, spans = _scenario()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    end = T0 + 65
    rec = record.RunRecord("run", "succeeded", {"started_at": T0, "ended_at": end, "ranks": []})
    record.save(run_dir, rec)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run_dir / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in events))

    doc = digest.build(run_dir, record.load(run_dir))  # type: ignore[arg-type]

    # The stalls overlap: their union runs from the earliest last step to the latest end.
    first_stall, last_end = min(a for a, _ in spans), max(b for _, b in spans)
    assert (first_stall, last_end) == (T0 + 10, T0 + 54)
    assert doc["time"] == {
        "total_s": 65.0,
        "startup_s": 1.0,  # every rank's first step at T0+1
        "training_s": (first_stall - (T0 + 1)) + (T0 + 60 - last_end),
        "stalled_s": last_end - first_stall,
        "restarts_s": 0.0,
        "shutdown_s": 5.0,  # the last step at T0+60, the run's end at T0+65
    }
    # One query per stall, each with the neighbours the scenario gave it.
    digester = digest.Digester(run_dir)
    digester.poll()
    assert len(digester.queries) == RANKS
    for r, queries in digester._of_rank.items():
        (j,) = queries
        assert digester.before[j][r] == spans[r][0]
        assert digester.after[j].get(r) == (None if r % 4 == 0 else T0 + 50 + r % 5)


def test_a_restart_after_thousands_of_stalls_ends_each_of_them(tmp_path: Path) -> None:
    """A restart is every rank's moment: each stalled rank's stall ends at it (the events after
    the stalls are read in the same poll as the stalls, and in a later one)."""
    lines = [_line(r, s, T0 + s) for s in range(1, 11) for r in range(RANKS)]
    stalls = [{"t": T0 + 30, "kind": "stalled", "rank": r, "idle_s": 20.0} for r in range(RANKS)]
    restart = [
        {"t": T0 + 35, "kind": "rank_exited", "rank": 7, "exit_code": 1},
        {"t": T0 + 36, "kind": "restarted", "attempt": 1},
    ]
    lines_after = [_line(r, s, T0 + 40 + s) for s in range(1, 11) for r in range(RANKS)]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rec = record.RunRecord("run", "succeeded", {"started_at": T0, "ended_at": T0 + 55, "ranks": []})
    record.save(run_dir, rec)
    metrics, events = run_dir / "metrics.jsonl", run_dir / "events.jsonl"
    metrics.write_text("".join(json.dumps(x) + "\n" for x in lines))
    events.write_text("".join(json.dumps(x) + "\n" for x in stalls))
    digester = digest.Digester(run_dir)
    digester.poll()  # the stalls first, as a live run's digest reads them
    with events.open("a") as fh:
        fh.write("".join(json.dumps(x) + "\n" for x in restart))
    with metrics.open("a") as fh:
        fh.write("".join(json.dumps(x) + "\n" for x in lines_after))
    digester.poll()
    t = digester.doc(record.load(run_dir))["time"]  # type: ignore[arg-type]
    # Stalled from the last step (T0+10) to the failure (T0+35), where the restart's time
    # begins; it lasts until the ranks log again (T0+41).
    assert t["stalled_s"] == pytest.approx(25.0)
    assert t["restarts_s"] == pytest.approx(6.0)
    assert t["training_s"] == pytest.approx(9.0 + 9.0)
    assert t["total_s"] == pytest.approx(55.0)


def _inside_each(t: float, spans: list[tuple[float, float]]) -> bool:
    """The rule, point by point: some span holds ``t``, its ends included."""
    return any(a <= t <= b for a, b in spans)


def _account_point_by_point(m: Moments) -> dict[str, float]:
    """run.json's ``time`` by the rule stated in timing's docstring, looking at every span for
    every instant: what account() must give, however it finds the spans that hold an instant."""
    start, end = m.started_at, max(m.started_at, m.ended_at)
    parts = dict.fromkeys(timing.PARTS, 0.0)
    assert m.first_step_at is not None and m.last_step_at is not None
    first = min(max(m.first_step_at, start), end)
    last = min(max(m.last_step_at, first), end)
    restarts = [(max(a, start), min(b, end)) for a, b in m.restarts if min(b, end) > max(a, start)]
    stalled = [(max(a, start), min(b, end)) for a, b in m.stalled if min(b, end) > max(a, start)]
    cuts = sorted({start, end, first, last, *(x for s in (*restarts, *stalled) for x in s)})
    for a, b in pairwise(cuts):
        mid = (a + b) / 2
        if _inside_each(mid, restarts):
            part = "restarts_s"
        elif _inside_each(mid, stalled):
            part = "stalled_s"
        elif mid < first:
            part = "startup_s"
        elif mid > last:
            part = "shutdown_s"
        else:
            part = "training_s"
        parts[part] += b - a
    out = {k: round(v, 3) for k, v in parts.items()}
    return {"total_s": round(sum(out.values()), 3), **out}


@pytest.mark.parametrize("seed", range(40))
def test_the_sweep_finds_the_same_stalled_instants_as_looking_at_every_stall(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([1, 2, 5, 50, 400])
    spans = []
    for _ in range(n):
        a = T0 + rng.uniform(-5, 100)
        spans.append((a, a + rng.choice([0.0, rng.uniform(0, 3), rng.uniform(0, 40)])))
    # Touching and nested spans, and spans that share an end, are the sweep's edge cases.
    spans += [(T0 + 20, T0 + 30), (T0 + 30, T0 + 31), (T0 + 22, T0 + 25), (T0 + 25, T0 + 30)]
    restarts = [(T0 + 60, T0 + 62)] if seed % 2 else []
    m = Moments(T0, T0 + 90, T0 + 3, T0 + 85, stalled=spans, restarts=restarts)
    got = account(m)
    assert got == _account_point_by_point(m)
    assert got["stalled_s"] > 0
