"""CUDA's own start, and the NVSwitch fabric under it: cuInit(0) in a subprocess with a timeout
(only when NVML reports GPUs; doctor/probes/system.py) and each GPU's fabric state from NVML.
On an HGX/DGX box the GPUs reach each other through NVSwitches that NVIDIA's Fabric Manager
sets up; until it has, NVML says the fabric is not started and cuInit returns 802
(CUDA_ERROR_SYSTEM_NOT_READY), while everything else looks healthy."""

from __future__ import annotations

from typing import Any

from xl.doctor.checks.compat import unusable
from xl.doctor.checks.derived import on_host, working_gpus
from xl.doctor.checks.finding import Finding, fail, ok, skip, warn
from xl.doctor.checks.kmod import RELOAD
from xl.doctor.facts import Facts, vtuple
from xl.doctor.report import Fix

_CU = {
    802: "CUDA_ERROR_SYSTEM_NOT_READY",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    100: "CUDA_ERROR_NO_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}


def fabric_manager_fix(f: Facts) -> str:
    """Start NVIDIA's Fabric Manager, installing it first at exactly the driver's version (it
    refuses to run beside another): when it is missing, or when the installed one's version is
    not the driver's. NVIDIA's packages are nvidia-fabricmanager-<branch> up to R575 and
    nvidia-fabricmanager from R580 (apt), nvidia-fabric-manager (dnf)."""
    start = "sudo systemctl enable --now nvidia-fabricmanager"
    d = f.driver
    version = d.version if d is not None and d.version else None
    if version is None or (f.fabric_manager and fabric_manager_matches(f)):
        return on_host(f, start)
    branch = vtuple(version)[0]
    if any(
        w in (f.distro or "").split() for w in ("rhel", "fedora", "centos", "rocky", "almalinux")
    ):
        install = f"sudo dnf install -y nvidia-fabric-manager-{version}-1"
    else:
        name = "nvidia-fabricmanager" if branch >= 580 else f"nvidia-fabricmanager-{branch}"
        install = f"sudo apt-get install -y --allow-downgrades {name}={version}-1"
        if not f.fabric_manager:
            install = install.replace(" --allow-downgrades", "")
    return on_host(f, f"{install} && {start}")


def fabric_manager_matches(f: Facts) -> bool:
    """Whether the installed Fabric Manager is the driver's version (True when either is not
    known: nothing says otherwise)."""
    d = f.driver
    have = f.fabric_manager_version
    return not (have and d is not None and d.version) or have == d.version


def _said(code: int) -> str:
    return f"cuInit returns {code} ({_CU.get(code, 'a CUDA error')})"


def check_cuda_init(f: Facts) -> Finding:
    gpus = working_gpus(f)
    data: dict[str, Any] = {
        "cuinit": f.cuinit,
        "fabric": {str(i): {"state": s, "status": st} for i, (s, st) in sorted(f.fabric.items())},
    }
    if f.cuinit_problem:
        data["cuinit_problem"] = f.cuinit_problem
    if not gpus:
        return skip("NVML reports no GPUs: CUDA's start is not tried", data=data)
    code = f.cuinit
    waiting = sorted(i for i, (s, _) in f.fabric.items() if s in ("not_started", "in_progress"))
    broken = sorted((i, st) for i, (s, st) in f.fabric.items() if s == "completed" and st)
    if waiting or code == 802:
        states = sorted({f.fabric[i][0].replace("_", " ") for i in waiting})
        where = (
            f"the NVSwitch fabric is {' / '.join(states)} on GPU {', '.join(map(str, waiting))}"
            if waiting
            else "CUDA is not ready"
        )
        what = (
            _said(code)
            if code == 802
            else "cuInit fails with 802 (CUDA_ERROR_SYSTEM_NOT_READY) until it is"
        )
        installed = "" if f.fabric_manager else " (it is not installed)"
        if f.fabric_manager and not fabric_manager_matches(f) and f.driver is not None:
            installed = (
                f" (the installed one is {f.fabric_manager_version}, the driver "
                f"{f.driver.version}: it does not start beside another version)"
            )
        verdict = warn if code == 0 and states == ["in progress"] else fail
        return verdict(
            f"{where}: NVIDIA's Fabric Manager has not set it up{installed}; {what}",
            fix=fabric_manager_fix(f),
            data=data,
        )
    if broken:
        i, status = broken[0]
        return fail(
            f"the NVSwitch fabric setup failed on GPU {i} ({status}): CUDA can't use NVLink "
            "between the GPUs",
            fix=on_host(
                f,
                Fix(
                    "sudo systemctl restart nvidia-fabricmanager",
                    "journalctl -u nvidia-fabricmanager says why it failed",
                ),
            ),
            data=data,
        )
    if code in (803, 804):
        bad = unusable(f)
        why = (
            "the libcuda that loads is not the kernel module's version"
            if code == 803
            else "forward compatibility (cuda-compat) is not supported on these GPUs"
        )
        if bad:  # driver_cuda names that libcuda and its fix: said once, there
            return fail(
                f"{_said(code)}: {why} ({bad.path}; driver_cuda gives the fix)", fix="", data=data
            )
        return fail(f"{_said(code)}: {why}", fix=on_host(f, RELOAD), data=data)
    if code not in (0, None):
        return warn(
            f"{_said(code)} although NVML lists {len(gpus)} GPU(s)",
            fix=Fix(
                "sudo dmesg | grep -i -E 'nvidia|xid'", "the kernel log says why CUDA can't start"
            ),
            data=data,
        )
    if code is None:
        return skip(f"cuInit not tried: {f.cuinit_problem or 'no answer'}", data=data)
    fab = f" ; NVSwitch fabric set up on {len(f.fabric)} GPU(s)" if f.fabric else ""
    return ok(f"cuInit succeeds{fab}".replace(" ;", ";"), data=data)
