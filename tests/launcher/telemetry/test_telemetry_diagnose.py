"""Diagnoses on synthetic timelines (the e2e tests cover them on real runs)."""

from __future__ import annotations

from typing import Any

from eventlines import Lines

from xl.launcher.telemetry.diagnose import Diagnoser, Thresholds

TH = Thresholds(stall_min_s=30, straggler_window_s=10, straggler_sustain=3)


def _steps(diag: Diagnoser, rank: int, step_s: float, n: int, t0: float = 1000.0) -> float:
    t = t0
    for i in range(1, n + 1):
        diag.ingest(rank, [{"t": t, "rank": rank, "kind": "train", "step": i, "loss": 1.0}])
        t += step_s
    return t


def _kinds(events: list[dict[str, Any]], kind: str) -> list[int]:
    return [e["rank"] for e in events if e["kind"] == kind]


def test_unsynchronised_ranks_compare_step_times() -> None:
    events = Lines()
    diag = Diagnoser(events, TH)
    for rank, step_s in ((0, 0.10), (1, 0.10), (2, 0.13)):  # 1.3x the median
        _steps(diag, rank, step_s, 30)
    for tick in range(2):
        diag.tick(1003.0 + tick)
    assert _kinds(events, "straggler") == []  # not yet sustained
    diag.tick(1005.0)
    assert _kinds(events, "straggler") == [2]
    assert "1.3x" in events[-1]["message"]
    diag.tick(1006.0)
    assert _kinds(events, "straggler") == [2], "named once, not every tick"
    assert diag.named() == {2: "straggler"}


def test_equal_step_times_name_nobody() -> None:
    events = Lines()
    diag = Diagnoser(events, TH)
    for rank in range(4):
        _steps(diag, rank, 0.1 + rank * 0.005, 30)  # within 1.2x
    for tick in range(10):
        diag.tick(1003.0 + tick)
    assert events == []


def _waits(diag: Diagnoser, waits: dict[int, float], t: float) -> None:
    for rank, wait in waits.items():
        diag.ingest(rank, [{"t": t, "rank": rank, "kind": "sys", "comm_wait_s": wait}])


def test_collective_waits_name_the_rank_that_waits_least_then_clear() -> None:
    events = Lines()
    diag = Diagnoser(events, TH)
    t = 2000.0
    for _ in range(4):
        _waits(diag, {0: 0.08, 1: 0.002, 2: 0.09, 3: 0.07}, t)
        diag.tick(t)
        t += 1
    stragglers = [e for e in events if e["kind"] == "straggler"]
    assert [e["rank"] for e in stragglers] == [1]
    assert stragglers[0]["victims"] == [0, 2, 3] and stragglers[0]["method"] == "collective_wait"
    assert stragglers[0]["phase"] is None  # xl.watch's waits alone do not say where its time goes
    # The slow rank catches up: everyone waits a little, nobody much.
    for _ in range(15):
        _waits(diag, {0: 0.003, 1: 0.002, 2: 0.004, 3: 0.003}, t)
        diag.tick(t)
        t += 1
    recovered = [e for e in events if e["kind"] == "recovered"]
    assert [(e["rank"], e["of"]) for e in recovered] == [(1, "straggler")]
    assert diag.named() == {}


def test_small_waits_are_not_a_straggler() -> None:
    events = Lines()
    diag = Diagnoser(events, TH)
    for i in range(10):
        _waits(diag, {0: 0.004, 1: 0.0005}, 3000.0 + i)  # 8x apart but only 4 ms
        diag.tick(3000.0 + i)
    assert events == []


def test_stall_threshold_is_max_of_floor_and_ten_median_steps() -> None:
    events = Lines()
    diag = Diagnoser(events, TH)
    end_fast = _steps(diag, 0, 0.5, 10)  # 10 x 0.5 s = 5 s < 30 s floor
    end_slow = _steps(diag, 1, 5.0, 10)  # 10 x 5 s = 50 s
    diag.tick(end_fast + 29)
    assert events == []
    diag.tick(end_fast + 31)
    assert _kinds(events, "stalled") == [0]
    diag.tick(end_slow + 45)
    assert _kinds(events, "stalled") == [0]
    diag.tick(end_slow + 51)
    assert _kinds(events, "stalled") == [0, 1]
    # progress again clears it
    diag.ingest(0, [{"t": end_slow + 52, "rank": 0, "kind": "train", "step": 11}])
    assert [(e["rank"], e["of"]) for e in events if e["kind"] == "recovered"] == [(0, "stalled")]
    assert diag.named() == {1: "stalled"}


def test_exited_ranks_are_never_stalled() -> None:
    events = Lines()
    diag = Diagnoser(events, TH)
    end = _steps(diag, 0, 0.1, 5)
    diag.set_alive(0, False)
    diag.tick(end + 1000)
    assert events == []


def test_nan_loss_reported_once_per_rank() -> None:
    events = Lines()
    diag = Diagnoser(events, TH)
    for step in (7, 8):
        rec = {
            "t": 1.0,
            "rank": 2,
            "kind": "train",
            "step": step,
            "loss": None,
            "nonfinite": {"loss": "nan"},
        }
        diag.ingest(2, [rec])
    diag.ingest(
        2,
        [{"t": 1.0, "rank": 2, "kind": "train", "step": 9, "lr": None, "nonfinite": {"lr": "inf"}}],
    )
    assert [(e["kind"], e["rank"], e["step"]) for e in events] == [("nan_loss", 2, 7)]
    assert "nan" in events[0]["message"]


def test_gpu_memory_high_once_until_it_drops() -> None:
    events = Lines()
    diag = Diagnoser(events, TH)

    def mem(used: float) -> None:
        diag.ingest(
            0,
            [
                {
                    "t": 1.0,
                    "rank": 0,
                    "kind": "sys",
                    "gpu": 3,
                    "gpu_mem_used_mib": used,
                    "gpu_mem_total_mib": 1000.0,
                }
            ],
        )

    for used in (900, 960, 970, 800, 990):
        mem(used)
    assert [e["kind"] for e in events] == ["gpu_mem_high", "gpu_mem_high"]
    assert "GPU 3" in events[0]["message"] and "96%" in events[0]["message"]


def test_a_paused_supervisor_judges_ranks_by_their_own_records_after_it() -> None:
    events = Lines()
    diag = Diagnoser(events, TH)
    _steps(diag, 1, 0.1, 50)
    end = _steps(diag, 0, 0.1, 50)  # both ranks' last step at 1004.9
    diag.tick(1005.0, mono=10.0)
    # The supervisor did not run for 50 s: the first tick after it finds only old records.
    diag.tick(1055.0, mono=60.0)
    assert _kinds(events, "stalled") == []
    assert [e["paused_s"] for e in events if e["kind"] == "supervisor_paused"] == [50.0]
    # Rank 0's records of the pause come in with its own times (it stepped throughout); rank 1's
    # never do: it stopped. Only rank 1 is named, once the threshold has passed since the pause.
    _steps(diag, 0, 0.1, 600, t0=end)
    for second in range(1, 26):  # ticks at their usual pace, 1 s apart
        diag.tick(1055.0 + second, mono=60.0 + second)
    assert _kinds(events, "stalled") == []
    for second in range(26, 32):
        diag.tick(1055.0 + second, mono=60.0 + second)
    assert _kinds(events, "stalled") == [1]
    # its real idle time, the pause's included
    assert "no progress for 81 s" in events[-1]["message"]
    assert len([e for e in events if e["kind"] == "supervisor_paused"]) == 1
