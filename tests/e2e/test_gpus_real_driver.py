"""`xl gpus` and `xl doctor` against the simulated driver taught what a real one said.

The GPU acceptance runs (an H200 on 2026-11-26 and an H100 on 2026-11-27, driver 580.159.04,
CUDA 13.0; bench/README.md 'GPU acceptance') recorded what `xl gpus --json` and `xl doctor --json`
answered there and what NVML itself returned. ``simnvml.seen_h200()`` and ``seen_h100()`` answer
the same NVML calls the same way (the driver's reserved memory, NOT_SUPPORTED fan and page
retirement, the H100's one remapped row); on them, xl must print the rows it printed on the real
machines, so a change that would have broken them shows here, without a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from simnvml import SimGPU, seen_h100, seen_h200

pytestmark = pytest.mark.e2e

# What the real machine printed (`xl gpus --json`, idle; `xl doctor --json`'s driver row).
REAL_DRIVER = {"version": "580.159.04", "cuda_version": "13.0", "error": None, "error_kind": None}
REAL_H200 = {
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
REAL_H100 = {
    **REAL_H200,
    "uuid": "GPU-b1173ee3-17e1-e199-e2a2-b3741a8888ad",
    "name": "NVIDIA H100 80GB HBM3",
    "memory": {"total_mib": 81559, "used_mib": 0, "free_mib": 81079, "reserved_mib": 480},
    "temperature_c": 58,
    "power_w": 80.45,
}
# What the real H100's `gpus` check recorded of its health: one uncorrectable error in the GPU's
# life, its row remapped, nothing since the driver loaded and nothing pending.
REAL_H100_HEALTH = {
    "index": 0,
    "compute_mode": "default",
    "ecc_uncorrected": 0,
    "ecc_uncorrected_total": 1,
    "remapped_rows": 1,
    "remap_pending": False,
    "remap_failed": False,
    "retired_pages": None,
    "retired_pending": None,
}
MACHINES = {"h200": (seen_h200, REAL_H200), "h100": (seen_h100, REAL_H100)}


def _env(simnvml: Any, tmp_path: Any, gpu: SimGPU) -> dict[str, str]:
    sim = simnvml(gpus=[gpu], driver_version="580.159.04", cuda_version=13000)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("XL_", "CUDA_VISIBLE"))}
    return {**base, **sim.env, "XL_HOME": str(tmp_path / "xl-home")}


@pytest.fixture(params=sorted(MACHINES))
def machine(request: Any, simnvml: Any, tmp_path: Any) -> tuple[dict[str, str], dict[str, Any]]:
    seen, real = MACHINES[request.param]
    return _env(simnvml, tmp_path, seen()), real


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


def test_xl_gpus_prints_what_it_printed_on_the_real_gpu(
    machine: tuple[dict[str, str], dict[str, Any]],
) -> None:
    env, real = machine
    doc = _json(["gpus", "--json"], env)
    assert doc["driver"] == REAL_DRIVER
    assert doc["gpus"] == [real]


def test_doctor_finds_the_real_gpu_healthy(machine: tuple[dict[str, str], dict[str, Any]]) -> None:
    """On the real machines the driver and GPU checks were ok: NOT_SUPPORTED fan and page
    retirement, memory the driver reserves, and (the H100) an uncorrectable error of long ago
    whose row was remapped, are not problems."""
    env, real = machine
    doc = _json(["doctor", "--json"], env)
    checks = {c["id"]: c for c in doc["checks"]}
    assert checks["driver"]["status"] == "ok", checks["driver"]
    assert checks["driver"]["detail"] == "driver 580.159.04 supports CUDA up to 13.0"
    assert checks["gpus"]["status"] == "ok", checks["gpus"]
    assert checks["gpus"]["detail"] == f"1x {real['name']}"
    assert doc["driver"] == REAL_DRIVER
    assert doc["gpus"] == [real]
    if real is REAL_H100:
        assert checks["gpus"]["data"]["health"] == {"0": REAL_H100_HEALTH}


def test_doctor_names_the_h100_once_its_remap_waits_for_a_reset(
    simnvml: Any, tmp_path: Any
) -> None:
    """The other way: the same H100 with its remap still pending (a reset not yet done) keeps the
    bad row in use, and the doctor says so, with its fix."""
    gpu = seen_h100()
    gpu.remap_pending = 1
    doc = _json(["doctor", "--json"], _env(simnvml, tmp_path, gpu))
    checks = {c["id"]: c for c in doc["checks"]}
    assert checks["gpus"]["status"] != "ok", checks["gpus"]
    assert "remap pending" in checks["gpus"]["detail"], checks["gpus"]
    assert checks["gpus"]["fix"], checks["gpus"]
