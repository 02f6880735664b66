"""The sampler's ``sys`` lines carry what holds each rank's GPU back (clock-event reasons, SM clock,
temperature, power, ECC, XID) and the rank's own GPU memory, against the simulated NVML driver and
real processes."""

from __future__ import annotations

import subprocess
import sys

from xltele import assert_gone, rank_env

from xl.gpu.clocks import ClockReader
from xl.launcher.telemetry.roster import from_rows
from xl.launcher.telemetry.sampler import Sampler


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env=rank_env(None)
    )


def test_each_rank_s_line_carries_its_own_gpu_s_state(simnvml, simnvml_gpu) -> None:
    """Ranks 0 and 1 share GPU 0, held down by a thermal slowdown; rank 2's GPU 1 is idle (its
    clocks down for that, which is no problem but is still reported as NVML says it). Each line
    has its own GPU's figures, and a GPU shared by two ranks is read once."""
    procs = [_sleeper() for _ in range(3)]
    try:
        sim = simnvml(
            gpus=[
                simnvml_gpu(
                    model="H100",
                    clock_event_reasons=0x40,
                    sm_clock_mhz=1290,
                    temperature_c=87,
                    power_w=655.0,
                    memory_used_mib=60000,
                ),
                simnvml_gpu(model="H100", clock_event_reasons=0x1, temperature_c=35),
            ]
        )
        sim.add_process(0, procs[0].pid, 20000)
        sim.add_process(0, procs[1].pid, 30000)
        ranks = from_rows(
            [
                {"rank": 0, "pid": procs[0].pid, "gpu": 0},
                {"rank": 1, "pid": procs[1].pid, "gpu": 0},
                {"rank": 2, "pid": procs[2].pid, "gpu": 1},
            ]
        )
        with sim.in_process():
            reader = ClockReader()
            records, gone = Sampler(clocks=reader.read).sample(ranks)
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
    by_rank = {r["rank"]: r for r in records}
    assert gone == [] and set(by_rank) == {0, 1, 2} and reader.reads == 2
    for rank in (0, 1):
        rec = by_rank[rank]
        assert (rec["gpu"], rec["clock_event_reasons"], rec["sm_clock_mhz"]) == (0, 0x40, 1290)
        assert (rec["sm_clock_max_mhz"], rec["temp_c"], rec["power_w"]) == (1980, 87, 655.0)
        assert (rec["power_limit_w"], rec["ecc_volatile"]) == (700.0, 0)
        assert "xid" not in rec
    # Each rank's own memory on the GPU, not the GPU's 60,000 MiB used by both.
    assert (by_rank[0]["gpu_proc_mem_mib"], by_rank[1]["gpu_proc_mem_mib"]) == (20000, 30000)
    assert by_rank[0]["gpu_mem_used_mib"] == by_rank[1]["gpu_mem_used_mib"] == 60000
    idle = by_rank[2]
    assert (idle["gpu"], idle["clock_event_reasons"], idle["temp_c"]) == (1, 0x1, 35)
    assert "gpu_proc_mem_mib" not in idle  # NVML lists no process of rank 2's
    assert_gone({p.pid for p in procs})


def test_an_xid_reaches_the_next_lines_of_the_ranks_on_that_gpu(simnvml, simnvml_gpu) -> None:
    proc = _sleeper()
    try:
        sim = simnvml(gpus=[simnvml_gpu(model="A100"), simnvml_gpu(model="A100")])
        ranks = from_rows([{"rank": 0, "pid": proc.pid, "gpu": 1}])
        with sim.in_process():
            sampler = Sampler(clocks=ClockReader(min_interval_s=0).read)
            (before,), _ = sampler.sample(ranks)
            sim.update(1, xids=(48,))
            sim.update(0, xids=(13,))  # another GPU's XID is not this rank's
            (after,), _ = sampler.sample(ranks)
    finally:
        proc.kill()
        proc.wait(10)
    assert "xid" not in before and before["clock_event_reasons"] == 0
    assert after["xid"] == 48 and after["xid_t"] >= before["t"] - 1
    assert_gone({proc.pid})
