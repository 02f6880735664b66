"""The diagnoses' once-a-second pass over 4,096 ranks names what it names over a few.

Node 0's diagnoser reads every rank's recent figures each second; at thousands of ranks it keeps
them so that a read costs what is new (xl.stats). These runs check the verdicts a person
sees at that size against the scenario's truth, both ways: a straggler and a stalled rank are
named (and no other rank), an even run names nobody. The windows themselves are checked against
the plain reading (every figure kept, filtered and sorted) on orders a rank's spool can produce.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from eventlines import Lines

from xl.figures import phases
from xl.launcher.telemetry.diagnose import Diagnoser, Thresholds
from xl.stats import RunningMedian, TimedWindow, median

RANKS = 4096
T0 = 1000.0
STEP_S = 0.5  # two steps a second, as bench_scale's simulated ranks
TH = Thresholds(stall_min_s=5, straggler_window_s=10, straggler_sustain=5)


def _run(
    work: dict[int, tuple[float, float, float]],
    seconds: int,
    *,
    split: bool = True,
    stops: dict[int, float] | None = None,
    stalls: bool = False,
    step_s: float = STEP_S,
) -> list[dict[str, Any]]:
    """Synchronous steps of every rank, one train line a step (its split when ``split``), the
    diagnoser ticked once a second; ``work``: a rank's (data, compute, other) when not the even
    one; ``stops``: rank -> the time after which it logs nothing. Returns the events."""
    events = Lines()
    diag = Diagnoser(events, TH)
    rng = random.Random(7)
    stops = stops or {}
    t, step, next_tick = T0, 0, T0 + 1
    even = (0.02, step_s - 0.03, 0.01)
    while t < T0 + seconds:
        own = {r: work.get(r, even) for r in range(RANKS)}
        jitter = {r: rng.uniform(0.0, 0.004) for r in range(RANKS)}
        arrive = {r: sum(own[r]) + jitter[r] for r in range(RANKS)}
        end = max(arrive.values()) + 0.004
        step += 1
        t += end
        for r in range(RANKS):
            if t > stops.get(r, float("inf")):
                continue
            data, compute, other = own[r]
            rec: dict[str, Any] = {"t": t, "rank": r, "kind": "train", "step": step, "loss": 1.0}
            if split:
                rec.update(
                    data_s=data + jitter[r],
                    compute_s=compute,
                    comm_s=end - arrive[r],
                    other_s=other,
                )
            else:
                # Not synchronised: each rank's own pace shows in its line's time.
                rec["t"] = T0 + step * sum(own[r])
            diag.ingest(r, [rec])
        while t >= next_tick:
            diag.tick(next_tick, mono=next_tick)
            next_tick += 1
    assert stalls or not [e for e in events if e["kind"] == "stalled"]
    return events


def _kinds(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind]


def test_one_straggler_among_4096_synchronised_ranks_is_named_with_its_phase() -> None:
    slow = 3001
    events = _run({slow: (0.2, STEP_S - 0.03, 0.01)}, seconds=12)
    named = _kinds(events, "straggler")
    assert [e["rank"] for e in named] == [slow]
    assert named[0]["phase"] == "data" and named[0]["method"] == "step_phase"
    assert named[0]["victims"] == [r for r in range(RANKS) if r != slow]
    assert named[0]["phase_s"] == pytest.approx(0.2, abs=0.005)


def test_slow_steps_of_4096_ranks_name_the_straggler_and_an_even_run_nobody() -> None:
    """Steps of 2.5 s: a line every few ticks, so most ticks see most ranks' windows as they
    were (and the diagnoser reuses what it made of them); the verdicts are the same."""
    slow = 77
    events = _run({slow: (1.0, 2.5 - 0.03, 0.01)}, seconds=30, step_s=2.5)
    named = _kinds(events, "straggler")
    assert [e["rank"] for e in named] == [slow]
    assert named[0]["phase"] == "data" and named[0]["phase_s"] == pytest.approx(1.0, abs=0.005)
    assert _kinds(_run({}, seconds=30, step_s=2.5), "straggler") == []


def test_an_even_run_of_4096_ranks_names_nobody() -> None:
    events = _run({}, seconds=12)
    assert _kinds(events, "straggler") == [] and _kinds(events, "stalled") == []


def test_a_slow_rank_of_4096_unsynchronised_ones_is_named_by_its_step_time() -> None:
    slow = 17
    events = _run({slow: (0.02, 1.5 * STEP_S - 0.03, 0.01)}, seconds=12, split=False)
    named = _kinds(events, "straggler")
    assert [e["rank"] for e in named] == [slow]
    assert named[0]["method"] == "step_time"
    assert named[0]["step_s"] == pytest.approx(0.75, abs=0.01)
    assert named[0]["median_step_s"] == pytest.approx(STEP_S, abs=0.01)


@pytest.mark.parametrize("culprit", [None, 2222])
def test_xl_watch_waits_of_4096_ranks_name_the_one_the_others_wait_for(culprit: int | None) -> None:
    """Without a step split, xl.watch's waits at the all-reduce: the rank that waits least while
    the others wait much is named, with every other rank as its victim; even waits, nobody."""
    events = Lines()
    diag = Diagnoser(events, TH)
    for second in range(1, 12):
        t = T0 + second
        for r in range(RANKS):
            wait = 0.001 if r == culprit else 0.2 + (r % 5) / 1000
            diag.ingest(r, [{"t": t, "rank": r, "kind": "sys", "comm_wait_s": wait}])
        diag.tick(t + 0.5, mono=t + 0.5)
    named = _kinds(events, "straggler")
    if culprit is None:
        assert named == []
        return
    assert [e["rank"] for e in named] == [culprit]
    assert named[0]["method"] == "collective_wait"
    assert named[0]["victims"] == [r for r in range(RANKS) if r != culprit]
    assert named[0]["victims_wait_s"] == pytest.approx(0.202, abs=0.001)


def test_one_rank_of_4096_that_stops_is_called_stalled_and_no_other() -> None:
    events = _run({}, seconds=14, stops={2048: T0 + 3}, stalls=True)
    stalled = _kinds(events, "stalled")
    assert [e["rank"] for e in stalled] == [2048]
    assert stalled[0]["idle_s"] > TH.stall_min_s


@pytest.mark.parametrize("seed", range(30))
def test_a_window_holds_what_filtering_every_kept_line_holds(seed: int) -> None:
    """Lines mostly in time order, now and then a late batch (a spool merged on reconnect): the
    window read from the newest end is the plain filter's, in the same order."""
    rng = random.Random(seed)
    maxlen = rng.choice([4, 16, 64])
    timed: TimedWindow[tuple[float, int]] = TimedWindow(maxlen)
    kept: list[tuple[float, int]] = []
    t = 0.0
    for i in range(400):
        t += rng.choice([0.0, 0.1, 0.5])
        at = t - rng.uniform(0, 5) if rng.random() < 0.03 else t
        timed.append((at, i))
        kept = [*kept, (at, i)][-maxlen:]
        since = t - rng.uniform(0, 3)
        assert timed.since(since) == [x for x in kept if x[0] >= since]


@pytest.mark.parametrize("seed", range(20))
def test_the_kept_median_is_the_median_of_the_values_kept(seed: int) -> None:
    rng = random.Random(seed)
    maxlen = rng.choice([1, 2, 5, 200])
    times = RunningMedian(maxlen=maxlen)
    kept: list[float] = []
    for _ in range(600):
        # Repeated values (a steady step) and outliers alike.
        dt = rng.choice([0.5, 0.5, round(rng.uniform(0.1, 1.0), 2), rng.uniform(0, 100)])
        times.append(dt)
        kept = [*kept, dt][-maxlen:]
        assert times.median() == median(kept)
        assert sorted(times.last(20)) == sorted(kept[-20:])


ODD: list[Any] = [0.0, 0.2, 3, -0.1, -1, None, True, False, "0.1", float("nan"), float("inf"), [1]]


@pytest.mark.parametrize("odd", ODD)
@pytest.mark.parametrize("where", ["data_s", "compute_s", "comm_s", "other_s"])
def test_a_line_s_split_counts_exactly_when_the_figures_rule_reads_one(
    odd: Any, where: str
) -> None:
    """The diagnoser reads a line's four parts as xl.figures.phases does: a line whose split
    that rule refuses times no step of the straggler check (its window has no line)."""
    rec = {"t": T0, "rank": 0, "kind": "train", "step": 1}
    rec |= {"data_s": 0.01, "compute_s": 0.2, "comm_s": 0.05, "other_s": 0.001, where: odd}
    diag = Diagnoser(lambda e: None, TH)
    diag.ingest(0, [rec, {**rec, "t": T0 + 0.5, "step": 2}, {**rec, "t": T0 + 1, "step": 3}])
    window = diag._ranks[0].splits.since(T0)
    if phases(rec) is None:
        assert window == []
    else:
        assert [s[2:] for s in window] == [tuple(phases(rec).values())] * 3  # type: ignore[union-attr]
