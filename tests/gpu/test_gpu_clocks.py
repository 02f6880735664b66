"""What holds a real GPU back (xl.gpu.clocks) agrees with nvidia-smi: clock-event reasons, SM
clock and its top, temperature, power and its limit; the XID event set opens on a real driver
(or the driver says it offers none) without an error; an idle GPU's reasons name no slowdown."""

from __future__ import annotations

import subprocess

import pytest

from xl.gpu.clocks import ClockReader, slowing
from xl.gpu.nvml import inventory

pytestmark = pytest.mark.gpu

SMI = "index,clocks_event_reasons.active,clocks.sm,clocks.max.sm,temperature.gpu,power.limit"


def _smi() -> dict[int, list[str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={SMI}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    rows = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line]
    return {int(r[0]): r[1:] for r in rows}


def test_each_gpu_s_clocks_read_as_nvidia_smi_reads_them() -> None:
    indices = [g.index for g in inventory(processes=False).gpus if not g.lost]
    assert indices
    got = ClockReader().read(indices)
    smi = _smi()
    for i in indices:
        clocks = got[i]
        reasons, sm, top, temp, limit = smi[i]
        assert clocks.clock_event_reasons is not None and clocks.sm_clock_max_mhz
        # nvidia-smi prints the mask as hex; an idle GPU's may change between the two reads
        assert clocks.clock_event_reasons & ~0x1 == int(reasons, 16) & ~0x1, (i, reasons, clocks)
        assert clocks.sm_clock_max_mhz == int(top)
        assert abs((clocks.sm_clock_mhz or 0) - int(sm)) <= int(top) // 2  # it moves under load
        assert clocks.temp_c is not None and abs(clocks.temp_c - int(temp)) <= 5
        assert clocks.power_limit_w == pytest.approx(float(limit), abs=1.0)
        assert clocks.power_w is not None and 0 < clocks.power_w <= clocks.power_limit_w * 1.2
        assert "xid" not in clocks.to_fields()  # no XID happened since the set was made
        if not clocks.clock_event_reasons & ~0x3:  # idle or at applications clocks
            assert slowing(clocks.clock_event_reasons) == []


def test_many_reads_in_a_row_keep_answering_with_the_event_set_open() -> None:
    indices = [g.index for g in inventory(processes=False).gpus if not g.lost]
    reader = ClockReader(min_interval_s=0)
    for _ in range(20):
        assert set(reader.read(indices)) == set(indices)
    assert reader.reads == 20 * len(indices)
