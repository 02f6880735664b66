"""Contract: `xl gpus --json` (docs/contracts.md lists every key).

Pinned against fixtures/gpus_keys.json (recorded from the code before the package moves): the
key sets of the document, of ``driver``, of each GPU (a healthy one and a lost one alike), of
``memory`` / ``utilization`` and of each process, and ``driver.error_kind`` for each way nvmlInit
fails. When NVML can't be used, `driver` carries the error, `gpus` is empty and the exit code is
0. A GPU process is attributed to its rank and run through its RANK / LOCAL_RANK / XL_RUN_ID.
The GPUs are simulated (tests/support/simnvml.py).

Re-record the fixture on purpose (a contract change) with ``XL_CONTRACTS_RECORD=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import simnvml as _sim
from golden import golden_entry

pytestmark = pytest.mark.e2e

XL = [sys.executable, "-m", "xl"]



def _gpus(sim_env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("XL_", "CUDA_")) and k != "LD_LIBRARY_PATH"
    }
    env.update(sim_env)
    return subprocess.run(
        [*XL, "gpus", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def rank_like_process() -> Iterator[subprocess.Popen[bytes]]:
    """A process that looks like rank 1 of run 'contract-run' to anyone reading its /proc."""
    env = {**os.environ, "RANK": "1", "LOCAL_RANK": "0", "XL_RUN_ID": "contract-run"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env=env, stdin=subprocess.DEVNULL
    )
    try:
        yield proc
    finally:
        proc.kill()
        assert proc.wait(timeout=10) is not None  # gone and reaped


def test_gpus_json_keys(
    simnvml: Callable[..., Any], rank_like_process: subprocess.Popen[bytes]
) -> None:
    gpus = [_sim.SimGPU(model="A100"), _sim.SimGPU(model="H100", util_gpu=37), _sim.SimGPU(lost=1)]
    sim = simnvml(gpus=gpus)
    sim.add_process(1, rank_like_process.pid, used_mib=1234)
    proc = _gpus(sim.env, "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    doc = json.loads(proc.stdout)
    rows = doc["gpus"]
    assert [g["index"] for g in rows] == [0, 1, 2]
    healthy, busy, lost = rows
    assert doc["driver"]["version"] == "550.54.15" and doc["driver"]["cuda_version"] == "12.4"
    assert doc["driver"]["error"] is None and doc["driver"]["error_kind"] is None
    assert healthy["uuid"] == _sim.default_uuid(0) and healthy["pci_bus_id"] == _sim.default_pci(0)
    assert busy["name"] == "NVIDIA H100 80GB HBM3" and busy["utilization"]["gpu"] == 37
    assert lost["lost"] is True and healthy["lost"] is False
    [p] = busy["processes"]
    assert (p["pid"], p["used_mib"], p["rank"], p["local_rank"], p["run_id"]) == (
        rank_like_process.pid,
        1234.0,
        1,
        0,
        "contract-run",
    )
    golden_entry(
        "gpus_keys.json",
        "keys",
        {
            "top": sorted(doc),
            "driver": sorted(doc["driver"]),
            "gpu": sorted(healthy),
            "gpu_lost": sorted(lost),
            "memory": sorted(healthy["memory"]),
            "utilization": sorted(healthy["utilization"]),
            "process": sorted(p),
        },
    )
    # Every GPU row has the same keys, whatever state the GPU is in.
    assert sorted(busy) == sorted(healthy)


@pytest.mark.parametrize(
    "init_error",
    ["library_not_found", "driver_not_loaded", "version_mismatch", "no_permission", "unknown"],
)
def test_gpus_json_when_nvml_cannot_be_used(simnvml: Callable[..., Any], init_error: str) -> None:
    sim = simnvml(gpus=2, init_error=init_error)
    proc = _gpus(sim.env, "--json")
    assert proc.returncode == 0, proc.stderr  # listing nothing is not an error
    doc = json.loads(proc.stdout)
    assert doc["gpus"] == []
    driver = doc["driver"]
    assert isinstance(driver["error"], str) and driver["error"]
    assert driver["version"] is None and driver["cuda_version"] is None
    golden_entry(
        "gpus_keys.json",
        f"no_driver_{init_error}",
        {"top": sorted(doc), "driver": sorted(driver), "error_kind": driver["error_kind"]},
    )


def test_gpus_human_output_with_no_driver_exits_0(simnvml: Callable[..., Any]) -> None:
    sim = simnvml(gpus=0, init_error="library_not_found")
    proc = _gpus(sim.env)
    assert proc.returncode == 0
    assert "Traceback" not in proc.stdout + proc.stderr
