"""The straggler and its phase from timed steps, on simulated synchronous DDP timelines.

Each simulated step: every rank loads its batch (data), computes, runs its own code (other) and
then meets the others at the all-reduce, which ends for all when the last one arrives plus the
reduction's own cost; a rank's comm_s is its wait there. Lines go out at most ten a second, each
the per-step means of the steps since the previous one, as the rank side sends them
(docs/contracts.md, "metrics.jsonl"). The e2e tests run the same on real ranks.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from eventlines import Lines

from xl.launcher.telemetry.diagnose import Diagnoser, Thresholds
from xl.launcher.telemetry.straggler import judge

TH = Thresholds(stall_min_s=300, straggler_window_s=10, straggler_sustain=5)
REDUCE_S = 0.004

Work = Callable[[int, random.Random], tuple[float, float, float]]  # rank -> (data, compute, other)


def _jitter(rng: random.Random, mean: float, rel: float = 0.08) -> float:
    return max(0.0, rng.gauss(mean, mean * rel))


def even(rank: int, rng: random.Random) -> tuple[float, float, float]:
    """A healthy rank: ~5 ms data with a heavy tail (now and then a batch is 10x slower),
    ~80 ms compute with 8% jitter, ~2 ms of its own code."""
    data = _jitter(rng, 0.005, 0.5) * (10 if rng.random() < 0.03 else 1)
    return data, _jitter(rng, 0.080), _jitter(rng, 0.002, 0.5)


def simulate(
    diag: Diagnoser, work: Work, ranks: int, seconds: float, t0: float = 1000.0, seed: int = 1
) -> list[dict[str, Any]]:
    """Steps for ``seconds`` of simulated time, ticking the diagnoser once a second."""
    rng = random.Random(seed)
    t = t0
    pending: dict[int, list[tuple[float, float, float, float]]] = {r: [] for r in range(ranks)}
    last_line = dict.fromkeys(range(ranks), t0)
    next_tick = t0 + 1
    step = 0
    while t < t0 + seconds:
        own = [work(r, rng) for r in range(ranks)]
        arrive = [sum(w) for w in own]
        end = max(arrive) + REDUCE_S
        step += 1
        t += end
        for r in range(ranks):
            data, compute, other = own[r]
            pending[r].append((data, compute, end - arrive[r], other))
            if t - last_line[r] >= 0.1:  # at most ten lines a second
                n = len(pending[r])
                means = [sum(p[i] for p in pending[r]) / n for i in range(4)]
                rec = {
                    "t": round(t, 6),
                    "rank": r,
                    "kind": "train",
                    "step": step,
                    "steps": n,
                    "loss": 1.0,
                    "step_s": round(sum(means), 6),
                    "data_s": round(means[0], 6),
                    "compute_s": round(means[1], 6),
                    "comm_s": round(means[2], 6),
                    "other_s": round(means[3], 6),
                }
                diag.ingest(r, [rec])
                pending[r].clear()
                last_line[r] = t
        while t >= next_tick:
            diag.tick(next_tick)
            next_tick += 1
    return []


def _stragglers(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == "straggler"]


def test_an_even_run_with_ordinary_jitter_has_no_straggler() -> None:
    for ranks in (2, 4, 8):
        for seed in range(8):
            events = Lines()
            simulate(Diagnoser(events, TH), even, ranks, 120, seed=seed)
            assert events == [], (ranks, seed, events)


def test_a_rank_slow_to_load_data_is_named_with_phase_data() -> None:
    def slow_data(rank: int, rng: random.Random) -> tuple[float, float, float]:
        data, compute, other = even(rank, rng)
        return (data + _jitter(rng, 0.200) if rank == 1 else data), compute, other

    events = Lines()
    simulate(Diagnoser(events, TH), slow_data, 4, 30)
    found = _stragglers(events)
    assert [e["rank"] for e in found] == [1], events
    e = found[0]
    assert e["phase"] == "data" and e["method"] == "step_phase"
    assert e["victims"] == [0, 2, 3]
    assert 0.18 < e["phase_s"] < 0.23 and e["others_phase_s"] < 0.02
    assert 0.17 < e["victims_wait_s"] < 0.23 and e["step_s"] > 0.28
    assert e["message"].startswith("rank 1 is the straggler: ")
    assert (
        "step waiting for data; the others wait ~" in e["message"]
        and "ms in communication for it" in e["message"]
    )


def test_a_rank_slow_to_compute_is_named_with_phase_compute_then_recovers() -> None:
    slow = {"on": True}

    def slow_compute(rank: int, rng: random.Random) -> tuple[float, float, float]:
        data, compute, other = even(rank, rng)
        return data, compute * (2.5 if rank == 0 and slow["on"] else 1), other

    events = Lines()
    diag = Diagnoser(events, TH)
    simulate(diag, slow_compute, 2, 30)
    found = _stragglers(events)
    assert [(e["rank"], e["phase"], e["victims"]) for e in found] == [(0, "compute", [1])]
    assert "the other rank waits ~" in found[0]["message"] and "computing" in found[0]["message"]
    assert diag.named() == {0: "straggler"}
    slow["on"] = False
    simulate(diag, slow_compute, 2, 40, t0=1031.0)
    assert [(e["rank"], e["of"]) for e in events if e["kind"] == "recovered"] == [(0, "straggler")]
    assert diag.named() == {}


def test_a_rank_slow_in_its_own_code_is_named_with_phase_other() -> None:
    def logs_a_lot(rank: int, rng: random.Random) -> tuple[float, float, float]:
        data, compute, other = even(rank, rng)
        return data, compute, other + (_jitter(rng, 0.06) if rank == 2 else 0.0)

    events = Lines()
    simulate(Diagnoser(events, TH), logs_a_lot, 3, 30)
    assert [(e["rank"], e["phase"]) for e in _stragglers(events)] == [(2, "other")]


def test_every_rank_slow_to_load_data_is_no_straggler() -> None:
    """Every rank waits ~200 ms for its batch, give or take 30%: whoever is last changes from step
    to step, and now and then one rank is last for a while by chance: nobody is named."""

    def all_slow(rank: int, rng: random.Random) -> tuple[float, float, float]:
        data, compute, other = even(rank, rng)
        return data + _jitter(rng, 0.200, 0.3), compute, other

    for ranks in (2, 4, 8):
        for seed in range(8):
            events = Lines()
            simulate(Diagnoser(events, TH), all_slow, ranks, 120, seed=seed)
            assert events == [], (ranks, seed, events)


def test_a_brief_slow_patch_is_not_a_straggler() -> None:
    """One rank slow for a moment, once: a 2 s pause in one step (a GC pause, a checkpoint's
    write), later five steps 0.3 s slower: nobody is named."""
    calls = {"n": 0}

    def blips(rank: int, rng: random.Random) -> tuple[float, float, float]:
        calls["n"] += 1
        n = calls["n"] // 4  # the step
        data, compute, other = even(rank, rng)
        if rank == 3 and n == 100:
            other += 2.0
        if rank == 2 and 300 <= n < 305:
            other += 0.3
        return data, compute, other

    events = Lines()
    simulate(Diagnoser(events, TH), blips, 4, 60)
    assert calls["n"] // 4 > 400
    assert _stragglers(events) == []


def test_unsynchronised_ranks_compare_step_times_and_name_the_phase() -> None:
    """Ranks that do not wait for each other (no comm to speak of): the slow one by step time."""
    splits = {
        0: {"data_s": 0.01, "compute_s": 0.10, "comm_s": 0.001, "other_s": 0.002},
        1: {"data_s": 0.01, "compute_s": 0.10, "comm_s": 0.080, "other_s": 0.002},  # slow network
        2: {"data_s": 0.01, "compute_s": 0.11, "comm_s": 0.001, "other_s": 0.002},
    }
    blame = judge(splits, min_wait_s=0.02, wait_ratio=0.5, min_share=0.1, step_ratio=1.2)
    assert blame is not None and (blame.rank, blame.phase, blame.method) == (1, "comm", "step_time")
    assert blame.victims == () and "80 ms of its 192 ms step in communication" in blame.message()
    assert (
        judge(
            {0: splits[0], 2: splits[2]},
            min_wait_s=0.02,
            wait_ratio=0.5,
            min_share=0.1,
            step_ratio=1.2,
        )
        is None
    )


def test_small_waits_on_long_steps_are_noise() -> None:
    """The others wait 30 ms of a 3 s step: above the floor, under a tenth of the step."""
    splits = {
        0: {"data_s": 0.0, "compute_s": 2.97, "comm_s": 0.03, "other_s": 0.0},
        1: {"data_s": 0.03, "compute_s": 2.97, "comm_s": 0.0, "other_s": 0.0},
    }
    assert judge(splits, min_wait_s=0.02, wait_ratio=0.5, min_share=0.1, step_ratio=1.2) is None
    assert (
        judge(splits, min_wait_s=0.02, wait_ratio=0.5, min_share=0.005, step_ratio=1.2) is not None
    )
