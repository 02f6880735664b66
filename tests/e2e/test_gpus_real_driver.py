"""`xl gpus` and `xl doctor` against the simulated driver taught what a real one said.

The GPU acceptance run of 2026-11-26 (an H200, driver 580.159.04, CUDA 13.0; bench/README.md
'GPU acceptance') recorded what `xl gpus --json` and `xl doctor --json` answered there and what
NVML itself returned. ``simnvml.seen_h200()`` answers the same NVML calls the same way (the
driver's reserved memory, NOT_SUPPORTED fan and page retirement); on it, xl must print the rows
it printed on the real machine, so a change that would have broken them shows here, without a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from simnvml import seen_h200

pytestmark = pytest.mark.e2e

# What the real machine printed (`xl gpus --json`, idle; `xl doctor --json`'s driver row).
REAL_DRIVER = {"version": "580.159.04", "cuda_version": "13.0", "error": None, "error_kind": None}
REAL_GPU = {
    "index": 0,
    "uuid": "GPU-6091723c-1489-8531-612c-d2c983e2ea71",
    "name": "NVIDIA H200",
    "pci_bus_id": "00000000:00:06.0",
    "memory": {"total_mib": 143771, "used_mib": 0, "free_mib": 143155, "reserved_mib": 615},
    "utilization": {"gpu": 0, "memory": 0},
    "temperature_c": 37,
    "power_w": 76.744,
    "power_limit_w": 700.0,
    "compute_capability": "9.0",
    "mig_mode": False,
    "processes": [],
    "lost": False,
    "error": None,
}


@pytest.fixture
def env(simnvml: Any, tmp_path: Any) -> dict[str, str]:
    sim = simnvml(gpus=[seen_h200()], driver_version="580.159.04", cuda_version=13000)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("XL_", "CUDA_VISIBLE"))}
    return {**base, **sim.env, "XL_HOME": str(tmp_path / "xl-home")}


def _json(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "xl", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode in (0, 1), out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def test_xl_gpus_prints_what_it_printed_on_the_real_h200(env: dict[str, str]) -> None:
    doc = _json(["gpus", "--json"], env)
    assert doc["driver"] == REAL_DRIVER
    assert doc["gpus"] == [REAL_GPU]


def test_doctor_finds_the_real_h200_healthy(env: dict[str, str]) -> None:
    """On the real machine the driver and GPU checks were ok: NOT_SUPPORTED fan and page
    retirement, and memory the driver reserves, are not problems."""
    doc = _json(["doctor", "--json"], env)
    checks = {c["id"]: c for c in doc["checks"]}
    assert checks["driver"]["status"] == "ok", checks["driver"]
    assert checks["driver"]["detail"] == "driver 580.159.04 supports CUDA up to 13.0"
    assert checks["gpus"]["status"] == "ok", checks["gpus"]
    assert checks["gpus"]["detail"] == "1x NVIDIA H200"
    assert doc["driver"] == REAL_DRIVER
    assert doc["gpus"] == [REAL_GPU]
