"""A straggler explained by its GPU, and how long it lasts, on simulated synchronous timelines.

Each simulated step: every rank computes, then meets the others at the all-reduce, which ends for
all when the last one arrives; a rank's comm_s is its wait there. Each second every rank's sys
line carries its GPU's figures as the sampler writes them (docs/contracts.md, ``sys`` lines). The
GPU's state is the test's own ground truth: a straggler on a GPU held back says so, one on a
healthy GPU (or one idle or at its applications clocks) says nothing of its GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventlines import Lines

from xl.launcher.rundir.events import parse_event
from xl.launcher.telemetry.diagnose import Diagnoser, Thresholds
from xl.launcher.telemetry.straggler import said

TH = Thresholds(stall_min_s=300, straggler_window_s=10, straggler_sustain=5)
HEALTHY: dict[str, Any] = {
    "clock_event_reasons": 0,
    "sm_clock_mhz": 1980,
    "sm_clock_max_mhz": 1980,
    "temp_c": 45,
    "power_w": 300.0,
    "power_limit_w": 700.0,
    "ecc_volatile": 0,
}
HOT = {**HEALTHY, "clock_event_reasons": 0x40, "sm_clock_mhz": 1290, "temp_c": 87}

# (rank, t) -> (data_s, compute_s, other_s) of its step there
Work = Callable[[int, float], tuple[float, float, float]]
# (rank, t) -> its GPU's figures on its sys line there
Gpu = Callable[[int, float], dict[str, Any]]


def slow_compute(culprit: int = 1, until: float = 1e18) -> Work:
    def work(rank: int, t: float) -> tuple[float, float, float]:
        slow = rank == culprit and t < until
        return 0.002, 0.300 if slow else 0.080, 0.002

    return work


def slow_data(rank: int, t: float) -> tuple[float, float, float]:
    return (0.250 if rank == 1 else 0.002), 0.080, 0.002


def simulate(diag: Diagnoser, work: Work, gpu: Gpu, seconds: float, t0: float = 1000.0) -> None:
    ranks = 4
    t, next_tick, step = t0, t0 + 1, 0
    while t < t0 + seconds:
        own = [work(r, t) for r in range(ranks)]
        arrive = [sum(w) for w in own]
        end = max(arrive) + 0.004
        step += 1
        t += end
        for r in range(ranks):
            data, compute, other = own[r]
            comm = end - arrive[r]
            diag.ingest(r, [{
                "t": t, "rank": r, "kind": "train", "step": step, "steps": 1,
                "step_s": end, "data_s": data, "compute_s": compute, "comm_s": comm,
                "other_s": other,
            }])  # fmt: skip
        while t >= next_tick:
            for r in range(ranks):
                line = {"t": next_tick, "rank": r, "kind": "sys", "gpu": 4 + r, **gpu(r, next_tick)}
                diag.ingest(r, [line])
            diag.tick(next_tick)
            next_tick += 1


def run(work: Work, gpu: Gpu, seconds: float = 40) -> list[dict[str, Any]]:
    events = Lines()
    simulate(Diagnoser(events, TH), work, gpu, seconds)
    return [e for e in events if e["kind"] in ("straggler", "recovered")]


def culprit_gpu(state: dict[str, Any], culprit: int = 1) -> Gpu:
    return lambda r, t: state if r == culprit else HEALTHY


def test_a_compute_straggler_on_a_throttled_gpu_names_its_gpu_s_reason() -> None:
    (e,) = run(slow_compute(), culprit_gpu(HOT))
    assert (e["rank"], e["phase"], e["gpu"]) == (1, "compute", 5)
    assert e["gpu_reason"] == "hw_thermal_slowdown"
    assert e["gpu_detail"] == "GPU 5: thermal slowdown at 87 °C, SM 1,290 of 1,980 MHz"
    assert e["message"].endswith("; GPU 5: thermal slowdown at 87 °C, SM 1,290 of 1,980 MHz")
    assert (e["lasting"], e["spells"]) == ("transient", 1) and 4 <= e["since_s"] <= 10


def test_the_same_straggler_on_a_healthy_gpu_names_no_gpu_reason() -> None:
    (e,) = run(slow_compute(), culprit_gpu(HEALTHY))
    assert (e["rank"], e["phase"], e["gpu"]) == (1, "compute", 5)
    assert (e["gpu_reason"], e["gpu_detail"]) == (None, None)
    assert "GPU" not in e["message"]


def test_idle_or_applications_clocks_are_no_reason() -> None:
    for reasons in (0x1, 0x2, 0x1 | 0x2 | 0x10 | 0x100):
        state = {**HEALTHY, "clock_event_reasons": reasons, "sm_clock_mhz": 1410}
        (e,) = run(slow_compute(), culprit_gpu(state))
        assert (e["gpu"], e["gpu_reason"], e["gpu_detail"]) == (5, None, None), reasons


def test_a_rank_waiting_for_data_is_not_blamed_on_its_throttled_gpu() -> None:
    (e,) = run(slow_data, culprit_gpu(HOT))
    assert (e["rank"], e["phase"], e["gpu"], e["gpu_reason"]) == (1, "data", 5, None)


def test_power_cap_xid_and_ecc_each_say_theirs() -> None:
    capped = {**HEALTHY, "clock_event_reasons": 0x4, "sm_clock_mhz": 1500, "power_w": 699.6}
    (e,) = run(slow_compute(), culprit_gpu(capped))
    assert (e["gpu_reason"], e["gpu_detail"]) == (
        "sw_power_cap",
        "GPU 5: power cap at 700 of 700 W, SM 1,500 of 1,980 MHz",
    )
    xid = {**HEALTHY, "xid": 79, "xid_t": 1005.0}
    (e,) = run(slow_compute(), lambda r, t: xid if r == 1 and t >= 1005 else HEALTHY)
    assert e["gpu_reason"] == "xid" and e["gpu_detail"].startswith("GPU 5: XID 79 ")
    old_xid = {**HEALTHY, "xid": 79, "xid_t": 1000.0 - 3600}  # an hour before: not this
    (e,) = run(slow_compute(), culprit_gpu(old_xid))
    assert e["gpu_reason"] is None
    (e,) = run(slow_compute(), culprit_gpu({**HEALTHY, "ecc_volatile": 2}))
    assert (e["gpu_reason"], e["gpu_detail"]) == (
        "ecc",
        "GPU 5: 2 uncorrectable ECC errors since the driver loaded, SM 1,980 of 1,980 MHz",
    )


def test_a_straggler_held_over_many_windows_is_chronic_with_its_duration() -> None:
    events = run(slow_compute(), culprit_gpu(HOT), seconds=120)
    assert [(e["kind"], e["rank"], e.get("lasting")) for e in events] == [
        ("straggler", 1, "transient"),
        ("straggler", 1, "chronic"),
    ]
    chronic = events[1]
    assert 60 <= chronic["since_s"] <= 62 and chronic["gpu_reason"] == "hw_thermal_slowdown"
    assert chronic["message"].endswith("(chronic: for 60 s)"), chronic["message"]


def test_one_that_came_and_went_is_transient_with_how_often() -> None:
    def work(rank: int, t: float) -> tuple[float, float, float]:
        slow = rank == 1 and (1000 <= t < 1025 or 1060 <= t < 1085)  # twice, 25 s each
        return 0.002, 0.300 if slow else 0.080, 0.002

    events = run(work, culprit_gpu(HEALTHY), seconds=110)
    assert [(e["kind"], e["rank"], e.get("lasting"), e.get("spells")) for e in events] == [
        ("straggler", 1, "transient", 1),
        ("recovered", 1, None, None),
        ("straggler", 1, "transient", 2),
        ("recovered", 1, None, None),
    ]
    second = events[2]
    assert 55 <= second["spells_since_s"] <= 75  # from the first spell's first vote
    said = f"(transient: the 2nd time in {int(second['spells_since_s'])} s)"
    assert second["message"].endswith(said), second["message"]


def test_what_was_said_is_each_rank_s_last_straggler_event_and_whether_it_recovered() -> None:
    def work(rank: int, t: float) -> tuple[float, float, float]:
        slow = (rank == 1 and t < 1030) or (rank == 2 and t >= 1060)
        return 0.002, 0.300 if slow else 0.080, 0.002

    def gpu(rank: int, t: float) -> dict[str, Any]:
        return HOT if rank == 2 else HEALTHY

    events = Lines()
    simulate(Diagnoser(events, TH), work, gpu, 100)
    got = said(e for e in map(parse_event, events) if e is not None)
    assert [(s["rank"], s["recovered"], s["gpu_reason"]) for s in got] == [
        (1, True, None),
        (2, False, "hw_thermal_slowdown"),
    ]
    assert got[1]["message"] == [e for e in events if e["kind"] == "straggler"][-1]["message"]
