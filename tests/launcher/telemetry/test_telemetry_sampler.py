"""The 1 Hz sampler against the simulated NVML driver and real processes."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
from eventlines import Lines
from xltele import assert_gone, rank_env

from xl.launcher.telemetry import sampler as sampler_module
from xl.launcher.telemetry.diagnose import Diagnoser
from xl.launcher.telemetry.roster import from_rows
from xl.launcher.telemetry.sampler import Sampler


def _sleeper(env: dict[str, str] | None = None) -> subprocess.Popen:
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "time.sleep(60)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], env=rank_env(env))


def _wait_for_child(pid: int) -> None:
    # Each sleeper starts one child: the rank's process tree has two processes.
    deadline = time.monotonic() + 30
    while not psutil.Process(pid).children() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_each_rank_gets_its_gpu_and_process_tree(simnvml, simnvml_gpu) -> None:
    procs = [_sleeper(), _sleeper(), _sleeper({"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "3,0"})]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(30)
    try:
        # Rank 0 holds a context on GPU 1 (NVML's process list says so); rank 1 is nowhere in
        # the lists but the launcher assigned it GPU 2; rank 2 is found from its own
        # LOCAL_RANK and CUDA_VISIBLE_DEVICES.
        sim = simnvml(
            gpus=[
                simnvml_gpu(model="A100", util_gpu=11, memory_used_mib=1000),
                simnvml_gpu(model="A100", util_gpu=22, memory_used_mib=2000),
                simnvml_gpu(model="A100", util_gpu=33, memory_used_mib=40000),
                simnvml_gpu(model="A100", util_gpu=44),
            ]
        )
        sim.add_process(1, procs[0].pid, 2048)
        ranks = from_rows(
            [
                {"rank": 0, "local_rank": 0, "node": 0, "pid": procs[0].pid, "gpu": None},
                {"rank": 1, "local_rank": 1, "node": 0, "pid": procs[1].pid, "gpu": 2},
                {"rank": 2, "local_rank": 1, "node": 0, "pid": procs[2].pid, "gpu": None},
                {"rank": 3, "local_rank": 3, "node": 0, "pid": dead.pid, "gpu": 3},
            ]
        )
        for p in procs:
            _wait_for_child(p.pid)
        events = Lines()
        diag = Diagnoser(events)
        with sim.in_process():
            sampler = Sampler()
            sampler.sample(ranks)
            total = sim.gpus[2].resolved(2).memory_total_mib
            sim.update(2, memory_used_mib=total * 0.97)
            records, gone = sampler.sample(ranks, cuda={1: {"cuda_alloc_mib": 512.0}})
        for rec in records:
            diag.ingest(rec["rank"], [rec])
    finally:
        for p in procs:
            for kid in psutil.Process(p.pid).children(recursive=True):
                kid.kill()
            p.kill()
            p.wait(10)
    by_rank = {r["rank"]: r for r in records}
    assert gone == [3] and set(by_rank) == {0, 1, 2}
    assert (by_rank[0]["gpu"], by_rank[0]["gpu_util"], by_rank[0]["gpu_proc_mem_mib"]) == (
        1,
        22,
        2048,
    )
    assert (by_rank[1]["gpu"], by_rank[1]["gpu_util"]) == (2, 33)
    assert (by_rank[2]["gpu"], by_rank[2]["gpu_util"]) == (0, 11)
    assert by_rank[1]["cuda_alloc_mib"] == 512.0
    for rec in records:
        assert rec["kind"] == "sys" and rec["nproc"] == 2 and rec["rss_mib"] > 5
        assert rec["gpu_mem_total_mib"] > 0
    high = [e for e in events if e["kind"] == "gpu_mem_high"]
    assert [e["rank"] for e in high] == [1] and "97%" in high[0]["message"]
    assert_gone({p.pid for p in procs})


def test_without_nvml_the_process_figures_remain(simnvml) -> None:
    proc = _sleeper()
    try:
        _wait_for_child(proc.pid)
        sim = simnvml(gpus=2, init_error="driver_not_loaded")
        with sim.in_process():
            records, gone = Sampler().sample(from_rows([{"rank": 0, "pid": proc.pid, "gpu": 0}]))
    finally:
        for kid in psutil.Process(proc.pid).children(recursive=True):
            kid.kill()
        proc.kill()
        proc.wait(10)
    assert gone == [] and len(records) == 1
    assert records[0]["rss_mib"] > 5 and records[0]["nproc"] == 2
    assert "gpu_util" not in records[0]
    assert_gone({proc.pid})


def _cpu_s(proc: subprocess.Popen) -> float:
    times = psutil.Process(proc.pid).cpu_times()
    return times.user + times.system


def test_cpu_is_a_busy_rank_s_and_not_an_idle_one_s() -> None:
    """Each figure against the CPU time the process really used over the same period, read here
    alongside: on a shared machine the spinning rank gets what the scheduler gives it (a quarter
    of a core as well as a whole one), so no fixed share is expected of it; only that the figure
    is what it used, and that the busy rank reads above the idle one measured with it."""
    busy = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nend = time.time() + 120\nwhile time.time() < end: pass",
        ],
        env=rank_env(),
    )
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=rank_env())
    ranks = from_rows([{"rank": 0, "pid": busy.pid}, {"rank": 1, "pid": idle.pid}])
    procs = (busy, idle)
    try:
        sampler = Sampler(inventory=False)
        # Outer and inner brackets of the sampler's own period: what each process used within
        # them bounds what it used within the period.
        wall0, cpu0 = time.monotonic(), [_cpu_s(p) for p in procs]
        first, _ = sampler.sample(ranks)
        wall1, cpu1 = time.monotonic(), [_cpu_s(p) for p in procs]
        # One sampling period at least, and long enough for the busy rank to have used 0.2 s of
        # CPU however loaded the machine is (the clock tick is 10 ms).
        deadline = time.monotonic() + 60
        while (
            time.monotonic() - wall1 < 1.0 or _cpu_s(busy) - cpu1[0] < 0.2
        ) and time.monotonic() < deadline:
            time.sleep(0.1)
        wall2, cpu2 = time.monotonic(), [_cpu_s(p) for p in procs]
        records, gone = sampler.sample(ranks)
        wall3, cpu3 = time.monotonic(), [_cpu_s(p) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
    assert [r["cpu_pct"] for r in first] == [0.0, 0.0]  # a first reading has no period to tell
    by_rank = {r["rank"]: r for r in records}
    assert gone == []
    tick = 100 * 0.02 / (wall2 - wall1)  # two clock ticks of reading error, in percent
    for i in (0, 1):
        low = 100 * (cpu2[i] - cpu1[i]) / (wall3 - wall0)
        high = 100 * (cpu3[i] - cpu0[i]) / (wall2 - wall1)
        assert low - tick <= by_rank[i]["cpu_pct"] <= high + tick, (
            i,
            low,
            by_rank[i]["cpu_pct"],
            high,
        )
    assert by_rank[0]["cpu_pct"] > by_rank[1]["cpu_pct"], by_rank
    assert all(r["nproc"] == 1 and r["rss_mib"] > 1 for r in records)
    assert_gone({busy.pid, idle.pid})


def test_a_rank_whose_pid_now_belongs_to_another_process_is_gone(monkeypatch) -> None:
    proc = _sleeper()
    try:
        _wait_for_child(proc.pid)
        sampler = Sampler(inventory=False)
        ranks = from_rows([{"rank": 0, "pid": proc.pid}])
        assert sampler.sample(ranks)[1] == []
        real = sampler_module.cpu_rss

        def reused(pid: int) -> tuple[int, float, int] | None:
            figures = real(pid)
            # started later
            return None if figures is None else (figures[0] + 1, figures[1], figures[2])

        monkeypatch.setattr(sampler_module, "cpu_rss", reused)
        records, gone = sampler.sample(ranks)
    finally:
        for kid in psutil.Process(proc.pid).children(recursive=True):
            kid.kill()
        proc.kill()
        proc.wait(10)
    assert records == [] and gone == [0]
    assert_gone({proc.pid})


def test_a_sample_that_keeps_failing_is_said_once_in_the_supervisor_log(tmp_path, capfd) -> None:
    """Sampling errors never end telemetry, and are not silent either: caught every second in
    silence, one would switch off stall detection with no trace of why."""
    from xl.launcher.telemetry.service import Telemetry  # noqa: PLC0415 - this test only

    telemetry = Telemetry(tmp_path, token="t" * 32, inventory=False, sample_interval=0.01)
    telemetry.start()
    tried: list[float] = []

    def broken(*_args: object) -> None:
        tried.append(time.monotonic())
        raise OSError(5, "Input/output error")

    try:
        assert telemetry.sampler is not None
        telemetry.sampler.sample = broken  # type: ignore[method-assign]
        deadline = time.monotonic() + 10
        while len(tried) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        telemetry.stop()
    assert len(tried) >= 5  # it went on sampling
    err = capfd.readouterr().err
    assert (
        err.count(
            "xl: telemetry's sample failed (stall detection waits for the next one): OSError(5, "
            "'Input/output error')"
        )
        == 1
    ), err
