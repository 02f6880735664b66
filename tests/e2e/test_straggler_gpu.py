"""A straggler explained by its GPU, on real 2-rank gloo runs on simulated GPUs under the real
`xl launch`.

Rank 1 (tests/support/phases_ddp.py) is slow to compute; its GPU, as the simulated driver reports
it, is either held down by a thermal slowdown (the straggler event, its message and the plain
console say so) or idle-clocked and healthy (the same straggler, with nothing said of its GPU).
The GPU's state is the test's own: it set it in the simulated driver.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from procs import first_run, run_json, wait_no_processes, xl, xl_env
from where import SUPPORT

pytestmark = pytest.mark.e2e

SCRIPT = SUPPORT / "phases_ddp.py"
FAST = {"XL_STRAGGLER_WINDOW_S": "4", "XL_STRAGGLER_SUSTAIN": "3"}
DETAIL = "GPU 1: thermal slowdown at 87 °C, SM 1,290 of 1,980 MHz"


def _events(run_dir: Path) -> list[dict[str, Any]]:
    text = (run_dir / "events.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("throttled", [True, False], ids=["thermal", "healthy"])
def test_a_compute_straggler_names_its_gpu_s_reason_only_when_it_has_one(
    tmp_path: Path, simnvml, simnvml_gpu, throttled: bool
) -> None:
    hot = {"clock_event_reasons": 0x40, "sm_clock_mhz": 1290, "temperature_c": 87}
    idle = {"clock_event_reasons": 0x1, "temperature_c": 41}  # clocks down, nothing wrong
    sim = simnvml(
        gpus=[
            simnvml_gpu(model="H100", **idle),
            simnvml_gpu(model="H100", **(hot if throttled else idle)),
        ]
    )
    home = tmp_path / "home"
    args = [
        "launch", "--no-tui", "--gpus", "0,1", str(SCRIPT), "--steps", "70",
        "--slow", "compute", "--slow-s", "0.25",
    ]  # fmt: skip
    done = xl(args, xl_env(home, **sim.env, **FAST), cwd=tmp_path, timeout=300)
    out = done.stdout + done.stderr
    run_dir = first_run(home)
    assert run_dir is not None, out[-3000:]
    wait_no_processes(run_dir, timeout=30)
    assert done.returncode == 0 and run_json(run_dir)["status"] == "succeeded", out[-3000:]
    sys_lines = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if '"sys"' in line
    ]
    rank1 = [s for s in sys_lines if s["rank"] == 1 and "clock_event_reasons" in s]
    assert rank1 and {(s["gpu"], s["clock_event_reasons"]) for s in rank1} == {
        (1, 0x40 if throttled else 0x1)
    }
    stragglers = [e for e in _events(run_dir) if e["kind"] == "straggler"]
    assert stragglers and {e["rank"] for e in stragglers} == {1}, out[-3000:]
    first = stragglers[0]
    assert (first["phase"], first["gpu"], first["lasting"]) == ("compute", 1, "transient")
    if throttled:
        assert (first["gpu_reason"], first["gpu_detail"]) == ("hw_thermal_slowdown", DETAIL)
        assert first["message"].endswith(f"; {DETAIL}"), first["message"]
        assert DETAIL in out, out[-3000:]  # the plain console's straggler line
    else:
        assert (first["gpu_reason"], first["gpu_detail"]) == (None, None)
        assert "GPU 1" not in first["message"] and "slowdown" not in out
    # `xl runs --json` says the same of the run's straggler, by its last event.
    listed = xl(["runs", "--json"], xl_env(home), timeout=60)
    (run,) = json.loads(listed.stdout)
    (said,) = run["stragglers"]
    last = stragglers[-1]
    keys = ("rank", "phase", "gpu", "gpu_reason", "gpu_detail", "lasting")
    assert {k: said[k] for k in keys} == {k: last[k] for k in keys}
    assert said["message"] == last["message"] and said["since_s"] == last["since_s"]
