"""What this machine offers the GPU acceptance suite: torch's CUDA view, NVML's, nvidia-smi's.

Shared by tests/gpu/conftest.py (skip unless a CUDA device is visible) and
bench/gpu_acceptance.py (the one command, and its summary). torch is read in a subprocess with a
timeout, so the test process never imports it and a wedged driver cannot hang the suite.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

PROBE_TIMEOUT_S = 120

# Runs in a subprocess under CUDA_DEVICE_ORDER=PCI_BUS_ID (nvidia-smi's order).
_TORCH_PROBE = r"""
import json
try:
    import torch
except Exception as exc:
    print(json.dumps({"error": f"torch cannot be imported: {type(exc).__name__}: {exc}"}))
    raise SystemExit(0)
c = torch.cuda
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "devices": []}
try:
    n = c.device_count() if c.is_available() else 0
    for i in range(n):
        p = c.get_device_properties(i)
        uuid = str(getattr(p, "uuid", "") or "")
        out["devices"].append({"name": p.name, "uuid": uuid if uuid.startswith(("GPU-", "MIG-"))
                               else ("GPU-" + uuid if uuid else ""),
                               "total_mib": p.total_memory / 2**20})
except Exception as exc:
    out["error"] = f"torch.cuda failed: {type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


@dataclass
class Machine:
    python: str
    torch: str | None = None
    torch_cuda: str | None = None
    devices: list[dict[str, Any]] = field(default_factory=list)  # torch's, cuda:k = devices[k]
    driver: str | None = None
    driver_cuda: str | None = None
    nvml_error: str | None = None
    gpu_names: list[str] = field(default_factory=list)  # NVML's, nvidia-smi order
    error: str | None = None

    @property
    def why_not(self) -> str | None:
        """None when a CUDA device is visible; else one line saying why there is none."""
        if self.devices:
            return None
        if self.error:
            why = self.error
        elif self.torch is None:
            why = "torch is not installed"
        elif self.torch_cuda is None:
            why = f"torch {self.torch} is a CPU-only build"
        else:
            why = f"torch {self.torch} (CUDA {self.torch_cuda}) sees no CUDA device"
        driver = self.nvml_error or f"NVIDIA driver {self.driver}, {len(self.gpu_names)} GPU(s)"
        return f"no CUDA device visible: {why}; {driver[:1].lower() + driver[1:]}"

    def summary(self) -> str:
        gpus = ", ".join(sorted(set(self.gpu_names))) or "no GPU"
        return (
            f"{len(self.devices)} x {gpus}; driver {self.driver or 'n/a'} (CUDA "
            f"{self.driver_cuda or 'n/a'}); torch {self.torch or 'n/a'} (CUDA "
            f"{self.torch_cuda or 'n/a'}); python {sys.version.split()[0]}"
        )


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any run's or device selection's variables: the acceptance run
    sees every GPU in nvidia-smi order."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XL_", "CUDA_VISIBLE"))}
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env.update(extra)
    return env


def probe(python: str = sys.executable) -> Machine:
    m = Machine(python=python)
    try:
        out = subprocess.run(
            [python, "-c", _TORCH_PROBE],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
        doc = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else {}
        if not doc:
            m.error = f"the torch probe failed: {out.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired:
        doc, m.error = {}, f"the torch probe did not answer in {PROBE_TIMEOUT_S} s"
    m.torch, m.torch_cuda = doc.get("torch"), doc.get("cuda")
    m.devices = doc.get("devices") or []
    m.error = m.error or doc.get("error")
    gpus = xl_gpus()
    driver = gpus.get("driver") or {}
    m.driver, m.driver_cuda = driver.get("version"), driver.get("cuda_version")
    m.nvml_error = driver.get("error")
    m.gpu_names = [g.get("name", "") for g in gpus.get("gpus", [])]
    return m


def xl_gpus(timeout: float = 60) -> dict[str, Any]:
    """`xl gpus --json` (NVML) in a subprocess; {} when it failed (its stderr is lost here)."""
    out = subprocess.run(
        [sys.executable, "-m", "xl", "gpus", "--json"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    try:
        doc: dict[str, Any] = json.loads(out.stdout)
    except ValueError:
        return {}
    return doc


def nvidia_smi(fields: str, timeout: float = 60) -> list[list[str]] | None:
    """``nvidia-smi --query-gpu=FIELDS`` rows (csv, no units), None when nvidia-smi is absent."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(f"nvidia-smi failed ({out.returncode}): {out.stderr.strip()}")
    return [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line]
