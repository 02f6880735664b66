"""The checks: pure functions from Facts to a Finding, one module per subject, and the registry.

CHECKS is the one table of checks: each one's stable id (DESIGN.md), its title, the area it is
shown under, and its function, in the order the report lists them. Everything else that needs an
id, title or area (the JSON, the renderers' grouping, the "could not run" fallbacks) reads it
from here. Areas are shown in the order their first check appears in CHECKS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xl.doctor.checks import archs, build, devices, gpu, proof, pytorch, system, toolkit
from xl.doctor.checks.common import Finding, error
from xl.doctor.facts import Facts
from xl.doctor.report import Check

DRIVER_GPUS = "Driver & GPUs"
TOOLKIT = "CUDA toolkit"
PYTORCH = "PyTorch"
DEVICES = "Devices"
SYSTEM = "System"


@dataclass(frozen=True)
class CheckSpec:
    """One row of the registry: who a check is (id, title, area) and the function that decides."""

    id: str
    title: str
    area: str
    run: Callable[[Facts], Finding]

    def check(self, finding: Finding) -> Check:
        """The finding under this check's id, title and area: what the report holds."""
        return Check(
            id=self.id,
            status=finding.status,
            title=self.title,
            detail=finding.detail,
            fix=finding.fix,
            area=self.area,
            data=finding.data,
        )


# Only with `xl doctor --build`: it compiles, so it is not in the fast default set.
BUILD = CheckSpec("build", "build proof", "Build", lambda f: proof.check_build(f, []))

CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec("driver", "NVIDIA driver", DRIVER_GPUS, gpu.check_driver),
    CheckSpec("gpus", "GPUs", DRIVER_GPUS, gpu.check_gpus),
    CheckSpec("cuda_home", "CUDA_HOME", TOOLKIT, toolkit.check_cuda_home),
    CheckSpec("nvcc", "nvcc", TOOLKIT, toolkit.check_nvcc),
    CheckSpec("toolkits", "CUDA toolkits", TOOLKIT, toolkit.check_toolkits),
    CheckSpec("torch", "PyTorch", PYTORCH, pytorch.check_torch),
    CheckSpec("torch_cuda_match", "torch CUDA vs nvcc", PYTORCH, pytorch.check_torch_cuda_match),
    CheckSpec("driver_cuda", "driver vs torch CUDA", PYTORCH, pytorch.check_driver_cuda),
    CheckSpec("host_compiler", "host compiler", TOOLKIT, build.check_host_compiler),
    CheckSpec("ld_library_path", "LD_LIBRARY_PATH", TOOLKIT, toolkit.check_ld_library_path),
    CheckSpec(
        "cuda_visible_devices", "CUDA_VISIBLE_DEVICES", DEVICES, devices.check_cuda_visible_devices
    ),
    CheckSpec("cuda_device_order", "CUDA_DEVICE_ORDER", DEVICES, devices.check_cuda_device_order),
    CheckSpec("shm", "shared memory", SYSTEM, system.check_shm),
    CheckSpec("nccl", "NCCL", SYSTEM, system.check_nccl),
    CheckSpec("ninja", "ninja", TOOLKIT, build.check_ninja),
    CheckSpec("arch_list", "TORCH_CUDA_ARCH_LIST", PYTORCH, archs.check_arch_list),
)


def _statuses(f: Facts) -> dict[str, str]:
    """Every check's status for these facts: how a fix is tried before it is printed."""
    out: dict[str, str] = {}
    for spec in CHECKS:
        try:
            out[spec.id] = spec.run(f).status
        except Exception:
            out[spec.id] = "error"
    return out


def run_checks(f: Facts) -> list[Check]:
    """Every check, in CHECKS' order; a check that raises becomes `error`, never a traceback.
    With --build (f.build set) the `build` proof comes last and has the final word."""
    f.recheck = _statuses
    out: list[Check] = []
    for spec in CHECKS:
        try:
            out.append(spec.check(spec.run(f)))
        except Exception as exc:
            why = f"the check itself failed: {type(exc).__name__}: {exc}"
            fix = "please report this as an xl bug (run `xl doctor --json` and attach the output)"
            out.append(spec.check(error(why, fix=fix)))
    if f.build is not None:
        out.append(BUILD.check(proof.check_build(f, out)))
    return out


def all_errored(why: str, fix: str) -> list[Check]:
    """Every check as `error` with one reason: what the report says when no fact could be had."""
    return [spec.check(error(why, fix=fix)) for spec in CHECKS]
