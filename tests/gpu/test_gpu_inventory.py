"""`xl gpus --json` on a real GPU machine agrees with nvidia-smi and with torch.cuda."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from xl.gpu.devices import resolve_visible_devices
from xl.gpu.nvml import inventory

pytestmark = pytest.mark.gpu

SMI_FIELDS = "index,uuid,name,pci.bus_id,memory.total,memory.used,utilization.gpu,driver_version"


def _xl_gpus(env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "xl", "gpus", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    assert doc["driver"]["error"] is None, doc["driver"]
    return doc


def _torch_uuids(env: dict[str, str]) -> list[str]:
    code = (
        "import torch\n"
        "for i in range(torch.cuda.device_count()):\n"
        "    u = str(torch.cuda.get_device_properties(i).uuid)\n"
        "    print(u if u.startswith(('GPU-', 'MIG-')) else 'GPU-' + u)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_same_gpus_and_figures_as_nvidia_smi(env: dict[str, str], box: Any) -> None:
    doc = _xl_gpus(env)
    rows = box.nvidia_smi(SMI_FIELDS)
    if rows is None:
        pytest.skip("nvidia-smi not found on PATH: nothing to compare `xl gpus` with")
    gpus = doc["gpus"]
    assert [g["index"] for g in gpus] == [int(r[0]) for r in rows]
    assert [g["uuid"] for g in gpus] == [r[1] for r in rows]
    assert [g["name"] for g in gpus] == [r[2] for r in rows]
    assert [g["pci_bus_id"].upper() for g in gpus] == [r[3].upper() for r in rows]
    assert doc["driver"]["version"] == rows[0][7]
    for g, r in zip(gpus, rows, strict=True):
        mem, util = g["memory"], g["utilization"]
        assert abs(mem["total_mib"] - float(r[4])) <= 1.0, (g["index"], mem, r)
        assert 0 <= mem["used_mib"] <= mem["total_mib"]
        assert 0 <= mem["free_mib"] <= mem["total_mib"]
        # Memory in use moves between the two reads; a GiB of slack covers any real workload.
        assert abs(mem["used_mib"] - float(r[5])) <= 1024 + 0.05 * mem["total_mib"]
        for v in (util["gpu"], util["memory"]):
            assert v is None or 0 <= v <= 100
        assert g["lost"] is False and g["error"] is None, g


def test_torch_numbers_them_as_nvidia_smi_under_pci_bus_id(
    env: dict[str, str], machine: Any
) -> None:
    doc = _xl_gpus(env)
    if any(g["mig_mode"] for g in doc["gpus"]):
        pytest.skip("MIG is on: CUDA sees MIG instances, not the GPUs nvidia-smi lists")
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and "CUDA_VISIBLE_DEVICES" not in env
    assert _torch_uuids(env) == [g["uuid"] for g in doc["gpus"]]
    assert [d["name"] for d in machine.devices] == [g["name"] for g in doc["gpus"]]


def test_cuda_visible_devices_by_uuid_prefix_resolves_as_cuda_does(env: dict[str, str]) -> None:
    """What xl predicts a rank sees (xl.gpu.devices) is what CUDA then gives it, reversed."""
    gpus = inventory(processes=False).gpus
    if any(g.mig_mode for g in gpus):
        pytest.skip("MIG is on: CUDA sees MIG instances, not the GPUs nvidia-smi lists")
    chosen = ",".join(g.uuid[:12] for g in reversed(gpus))  # "GPU-xxxxxxxx": a unique prefix
    picked = {**env, "CUDA_VISIBLE_DEVICES": chosen}
    predicted = [g.uuid for g in resolve_visible_devices(gpus, picked).devices]
    assert predicted == [g.uuid for g in reversed(gpus)]
    assert _torch_uuids(picked) == predicted
