"""Contract: `xl doctor --json` and its exit codes (docs/contracts.md, "`xl doctor --json`").

Pinned for every setup: one JSON object on stdout; the check ids, in docs/contracts.md's order; each
check's keys (``id``, ``status``, ``title``, ``detail``, ``fix``, optional ``data``); statuses
from ``ok|warn|fail|skip|error``; the top-level ``status`` is the worst check; the exit code is 1
exactly when a check fails (``--strict``: also on warn/error); a machine without a driver is
never a ``fail`` of ``driver`` / ``gpus``. The top-level keys are pinned in
fixtures/doctor.json.

Pinned for controlled setups on a machine like the development ones (CUDA 13.0 toolkit at
/usr/local/cuda, gcc 12, ninja, a CPU build of torch; skipped elsewhere): the status of each
check, in fixtures/doctor.json, recorded from the code before the package moves. The environment
is built from nothing (PATH, CUDA_HOME, LD_LIBRARY_PATH set explicitly); the driver is the
simulated one (tests/support/simnvml.py), "no driver" being nvmlInit failing with
library_not_found. `shm` depends on the machine's /dev/shm and is left out of the statuses.

Re-record the fixture on purpose (a contract change) with ``XL_CONTRACTS_RECORD=1``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import simnvml as _sim
from golden import golden_entry

pytestmark = pytest.mark.e2e

XL = [sys.executable, "-m", "xl"]

# docs/contracts.md's list, in its order (`build` runs only with --build).
CHECK_IDS = [
    "driver",
    "gpus",
    "cuda_home",
    "nvcc",
    "toolkits",
    "torch",
    "torch_cuda_match",
    "driver_cuda",
    "host_compiler",
    "ld_library_path",
    "cuda_visible_devices",
    "cuda_device_order",
    "shm",
    "nccl",
    "ninja",
    "arch_list",
    "cuda_libraries",
    "cuda_init",
    "cgroup",
]
STATUSES = ("ok", "skip", "warn", "error", "fail")  # mildest first
CHECK_KEYS = {"id", "status", "title", "detail", "fix"}
# /dev/shm's size and whether this user may make a cgroup are the machine's, not the setup's
MACHINE_DEPENDENT = {"shm", "cgroup"}

CUDA = Path("/usr/local/cuda")
PATH_WITH_CUDA = f"{CUDA}/bin:/usr/bin:/bin"
PATH_WITHOUT_CUDA = "/usr/bin:/bin"

# name -> (driver setup, environment beside HOME and the driver's variables)
SETUPS: dict[str, tuple[str, dict[str, str]]] = {
    "no_driver": ("none", {"PATH": PATH_WITH_CUDA, "CUDA_HOME": str(CUDA)}),
    "no_driver_no_cuda_home": ("none", {"PATH": PATH_WITH_CUDA}),
    "no_driver_nvcc_not_on_path": ("none", {"PATH": PATH_WITHOUT_CUDA}),
    "driver_not_loaded": ("driver_not_loaded", {"PATH": PATH_WITH_CUDA, "CUDA_HOME": str(CUDA)}),
    "sim_8_a100": ("8", {"PATH": PATH_WITH_CUDA, "CUDA_HOME": str(CUDA)}),
    "sim_8_a100_bad_visible_devices": (
        "8",
        {"PATH": PATH_WITH_CUDA, "CUDA_HOME": str(CUDA), "CUDA_VISIBLE_DEVICES": "0,0"},
    ),
    "sim_mixed_models": (
        "mixed",
        {"PATH": PATH_WITH_CUDA, "CUDA_HOME": str(CUDA), "CUDA_DEVICE_ORDER": "FASTEST_FIRST"},
    ),
}



def _driver_env(simnvml: Callable[..., Any], setup: str) -> dict[str, str]:
    if setup == "none":
        sim = simnvml(gpus=0, init_error="library_not_found")
    elif setup == "driver_not_loaded":
        sim = simnvml(gpus=2, init_error="driver_not_loaded")
    elif setup == "mixed":
        sim = simnvml(gpus=[_sim.SimGPU(model="A100"), _sim.SimGPU(model="H100")])
    else:
        sim = simnvml(gpus=int(setup))
    # Only the simulated driver's directory: nothing inherited from this environment.
    return {"LD_LIBRARY_PATH": str(sim.library_dir), _sim.CONFIG_ENV: str(sim.config_path)}


def _doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*XL, "doctor", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def _env(simnvml: Callable[..., Any], tmp_path: Path, setup: str) -> dict[str, str]:
    driver, extra = SETUPS[setup]
    return {"HOME": str(tmp_path), **_driver_env(simnvml, driver), **extra}


def _like_the_development_machines() -> str | None:
    """Why the recorded statuses can't hold here, or None."""
    nvcc = CUDA / "bin" / "nvcc"
    if not nvcc.exists():
        return f"no {nvcc}"
    out = subprocess.run(
        [str(nvcc), "--version"], capture_output=True, text=True, timeout=30
    ).stdout
    if "release 13.0" not in out:
        return "the toolkit at /usr/local/cuda is not CUDA 13.0"
    gcc = Path("/usr/bin/gcc")
    if not gcc.exists():
        return "no /usr/bin/gcc"
    version = subprocess.run(
        [str(gcc), "-dumpversion"], capture_output=True, text=True, timeout=30
    ).stdout
    if not version.startswith("12"):
        return f"gcc {version.strip()} (the statuses were recorded with gcc 12)"
    if not Path("/usr/bin/ninja").exists():
        return "no /usr/bin/ninja"
    return None


@pytest.mark.parametrize("setup", list(SETUPS))
def test_doctor_json(setup: str, simnvml: Callable[..., Any], tmp_path: Path) -> None:
    env = _env(simnvml, tmp_path, setup)
    proc = _doctor(env, "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    assert isinstance(doc, dict)
    checks = doc["checks"]
    assert [c["id"] for c in checks] == CHECK_IDS
    statuses = {c["id"]: c["status"] for c in checks}
    for c in checks:
        assert CHECK_KEYS <= set(c) <= CHECK_KEYS | {"data"}, c
        assert c["status"] in STATUSES
        assert isinstance(c["title"], str) and c["title"]
        assert isinstance(c["detail"], str)
        assert c["fix"] is None or isinstance(c["fix"], str)
    assert doc["status"] == max(statuses.values(), key=STATUSES.index)
    assert isinstance(doc["gpus"], list)
    # Exit codes: 1 exactly when a check fails; --strict also on warn and error.
    failed = "fail" in statuses.values()
    assert proc.returncode == (1 if failed else 0), (proc.returncode, statuses)
    strict = _doctor(env, "--json", "--strict")
    assert strict.returncode == (1 if set(statuses.values()) & {"fail", "warn", "error"} else 0)
    if SETUPS[setup][0] == "none":
        # No driver is a valid (CPU) setup: never a failure of driver or gpus.
        assert statuses["driver"] in ("skip", "warn") and statuses["gpus"] in ("skip", "warn")
    if SETUPS[setup][0] in ("none", "driver_not_loaded"):
        assert doc["gpus"] == [] and doc["driver"]["error"]
    golden_entry("doctor.json", "top_level_keys", sorted(doc))
    why_not = _like_the_development_machines()
    if why_not is None and doc["torch"].get("cuda") is not None:
        why_not = "torch here is a CUDA build (the statuses were recorded with a CPU build)"
    if why_not:
        pytest.skip(f"statuses recorded on another kind of machine: {why_not}")
    pinned = {k: v for k, v in statuses.items() if k not in MACHINE_DEPENDENT}
    golden_entry("doctor.json", f"statuses_{setup}", {"checks": pinned, "exit": proc.returncode})


def test_doctor_human_output_has_no_traceback(simnvml: Callable[..., Any], tmp_path: Path) -> None:
    env = _env(simnvml, tmp_path, "no_driver")
    proc = _doctor(env)
    assert proc.returncode in (0, 1)
    assert "Traceback" not in proc.stdout + proc.stderr
    # Plain text into a pipe: no terminal escapes.
    assert not re.search(r"\x1b\[", proc.stdout)


def test_doctor_python_option(simnvml: Callable[..., Any], tmp_path: Path) -> None:
    env = _env(simnvml, tmp_path, "no_driver")
    proc = _doctor(env, "--json", "--python", sys.executable)
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["python"] == sys.executable
    bad = _doctor(env, "--json", "--python", str(tmp_path / "no-such-python"))
    assert bad.returncode == 2 and bad.stdout == ""
    assert len(bad.stderr.splitlines()) == 1 and "Traceback" not in bad.stderr


def test_doctor_bad_usage(tmp_path: Path) -> None:
    proc = _doctor({"HOME": str(tmp_path), "PATH": PATH_WITHOUT_CUDA}, "--no-such-flag")
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr
