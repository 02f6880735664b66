"""The checks: pure functions from Facts to a Finding, one module per subject, and the registry.
What several checks share has its own modules: finding (what a check returns), derived (what
they read off the facts alike), toolkit_choice (the toolkit every fix names) and fixes (a fix
tried on the facts before it is printed).

CHECKS is the one table of checks: each one's stable id (docs/contracts.md), its title, the area
it is shown under, and its function, in the order the report lists them (a new check comes last,
so the ids the contract already lists keep their order; the renderers group by area). Everything
else that needs an id, title or area (the JSON, the renderers' grouping, the "could not run"
fallbacks) reads it from here. Areas are shown in the order their first check appears in CHECKS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from xl.doctor.checks import (
    archs,
    build,
    devices,
    fabric,
    gpu,
    libraries,
    proof,
    pytorch,
    system,
    toolkit,
)
from xl.doctor.checks.finding import Finding, error
from xl.doctor.facts import Facts
from xl.doctor.report import Check, Fix
from xl.doctor.status import Status

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
    decides: str = ""  # what the check decides, for `xl doctor --help` and docs/doctor.md

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
BUILD = CheckSpec(
    "build",
    "build proof",
    "Build",
    lambda f: proof.check_build(f, []),
    decides=(
        "only with --build: a tiny CUDA extension compiled the way torch's builder would; fail "
        "quotes the compiler's first error"
    ),
)

CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec(
        "driver",
        "NVIDIA driver",
        DRIVER_GPUS,
        gpu.check_driver,
        decides=(
            "NVML loads and starts; the driver version and the highest CUDA the kernel module "
            "runs. No driver: skip (CPU training), warn when torch wants CUDA; a container "
            "started without GPU access (NVIDIA_VISIBLE_DEVICES set, no driver) gets the "
            "container runtime's fix, never a driver install"
        ),
    ),
    CheckSpec(
        "gpus",
        "GPUs",
        DRIVER_GPUS,
        gpu.check_gpus,
        decides=(
            "GPUs found, lost GPUs, mixed models, and each GPU's own health from NVML: compute "
            "mode (Prohibited, or exclusive-process held by another process: fail), processes "
            "holding memory (named with their pid: warn), uncorrectable ECC errors since the "
            "driver loaded, pending row remaps, failed remaps, pending page retirements (fail)"
        ),
    ),
    CheckSpec(
        "cuda_home",
        "CUDA_HOME",
        TOOLKIT,
        toolkit.check_cuda_home,
        decides=(
            "CUDA_HOME as torch resolves it; its nvcc and headers; PATH's nvcc agrees (every "
            "fix names the toolkit that matches torch)"
        ),
    ),
    CheckSpec(
        "nvcc",
        "nvcc",
        TOOLKIT,
        toolkit.check_nvcc,
        decides="nvcc on PATH and its version",
    ),
    CheckSpec(
        "toolkits",
        "CUDA toolkits",
        TOOLKIT,
        toolkit.check_toolkits,
        decides=(
            "every CUDA toolkit found, and which one PATH, CUDA_HOME and LD_LIBRARY_PATH each "
            "select"
        ),
    ),
    CheckSpec(
        "torch",
        "PyTorch",
        PYTORCH,
        pytorch.check_torch,
        decides=(
            "torch installed; a CUDA build whose wheel (by torch version and CUDA tag) has "
            "kernels for every GPU here; a CPU or ROCm build on an NVIDIA machine fails with "
            "the CUDA wheel that fits the driver"
        ),
    ),
    CheckSpec(
        "torch_cuda_match",
        "torch CUDA vs nvcc",
        PYTORCH,
        pytorch.check_torch_cuda_match,
        decides=(
            "torch's CUDA vs the toolkit that builds extensions: another major fails, another "
            "minor warns (with DeepSpeed's verdict)"
        ),
    ),
    CheckSpec(
        "driver_cuda",
        "driver vs torch CUDA",
        PYTORCH,
        pytorch.check_driver_cuda,
        decides=(
            "the driver runs torch's CUDA: judged by the libcuda that loads (a cuda-compat "
            "forward-compatibility package on LD_LIBRARY_PATH or in ldconfig counts; NVML "
            "reports the kernel module's); minor-version compatibility warns; a libcuda older "
            "than the kernel module (803) or forward compatibility on GeForce (804) fails"
        ),
    ),
    CheckSpec(
        "host_compiler",
        "host compiler",
        TOOLKIT,
        build.check_host_compiler,
        decides=(
            "the host compiler nvcc will use, as a torch build picks it, vs what that nvcc and "
            "torch accept"
        ),
    ),
    CheckSpec(
        "ld_library_path",
        "LD_LIBRARY_PATH",
        TOOLKIT,
        toolkit.check_ld_library_path,
        decides=(
            "missing entries, CUDA libraries of another version than the toolkit or torch's "
            "own, shadowing"
        ),
    ),
    CheckSpec(
        "cuda_visible_devices",
        "CUDA_VISIBLE_DEVICES",
        DEVICES,
        devices.check_cuda_visible_devices,
        decides=(
            "syntax; indices and UUIDs exist; duplicates; hiding every GPU; more than one MIG "
            "instance (a CUDA process enumerates only one) fails"
        ),
    ),
    CheckSpec(
        "cuda_device_order",
        "CUDA_DEVICE_ORDER",
        DEVICES,
        devices.check_cuda_device_order,
        decides=(
            "unset or FASTEST_FIRST with different GPUs: CUDA's indices differ from "
            "nvidia-smi's"
        ),
    ),
    CheckSpec(
        "shm",
        "shared memory",
        SYSTEM,
        system.check_shm,
        decides=(
            "/dev/shm size and free space (under 512 MiB warns); stale NCCL/torch segments "
            "left by dead jobs, named with the rm that removes them"
        ),
    ),
    CheckSpec(
        "nccl",
        "NCCL",
        SYSTEM,
        system.check_nccl,
        decides=(
            "NCCL version; settings that cannot work fail (NCCL_NET=IB without InfiniBand, "
            "NCCL_SOCKET_IFNAME naming no interface, an nvidia-nccl wheel of another CUDA "
            "major over torch's libnccl); known traps warn"
        ),
    ),
    CheckSpec(
        "ninja",
        "ninja",
        TOOLKIT,
        build.check_ninja,
        decides="ninja present (JIT extension builds need it)",
    ),
    CheckSpec(
        "arch_list",
        "TORCH_CUDA_ARCH_LIST",
        PYTORCH,
        archs.check_arch_list,
        decides=(
            "TORCH_CUDA_ARCH_LIST read with the installed torch's own cpp_extension lists; "
            "covers every GPU (arch-specific 9.0a/10.0a count on their own architecture "
            "only); nvcc can build each one, also when unset (torch then builds for the "
            "visible GPUs: sm_120 needs nvcc 12.8+)"
        ),
    ),
    CheckSpec(
        "cuda_libraries",
        "cuDNN, NCCL, cuBLAS",
        PYTORCH,
        libraries.check_cuda_libraries,
        decides=(
            "the cuDNN, NCCL and cuBLAS torch will load (LD_PRELOAD, LD_LIBRARY_PATH, its own "
            "nvidia-* wheels, the ldconfig cache; versions from the files' names and the "
            "wheels' metadata) against the versions its METADATA pins: older fails with the "
            "fix, newer is fine; a torch that pins none (NGC, conda, source builds) is not "
            "compared"
        ),
    ),
    CheckSpec(
        "cuda_init",
        "CUDA init & fabric",
        DRIVER_GPUS,
        fabric.check_cuda_init,
        decides=(
            "cuInit(0) in a subprocess with a timeout, only when NVML reports GPUs, and each "
            "GPU's NVSwitch fabric state from NVML: a fabric not started (cuInit 802) fails "
            "with the Fabric Manager's start (installed at the driver's version when "
            "missing); 803/804 fail with the libcuda fix; a fabric setup that failed fails"
        ),
    ),
    CheckSpec(
        "cgroup",
        "run cgroup",
        SYSTEM,
        system.check_cgroup,
        decides=(
            "where each run's cgroup would be made (v1's memory controller as root, a writable "
            "v2 subtree, XL_CGROUP_ROOT), and whether --memory-limit can work; none warns"
        ),
    ),
)


# What a check that raised, or a doctor that could not collect facts, asks of the person.
REPORT_BUG = Fix(
    "xl doctor --json > xl-doctor.json",
    "please report this as an xl bug, with xl-doctor.json attached",
)


def _statuses(f: Facts) -> dict[str, Status]:
    """Every check's status for these facts: how a fix is tried before it is printed."""
    out: dict[str, Status] = {}
    for spec in CHECKS:
        try:
            out[spec.id] = spec.run(f).status
        except Exception:
            out[spec.id] = Status.ERROR
    return out


def judge(f: Facts, check_id: str) -> Finding:
    """One check's finding, its fixes tried as the report tries them: the one place a finding's
    fix comes from for whoever else says it (`xl launch --gpus`'s preflight), so the launch and
    the doctor never give one finding two fixes."""
    spec = next(s for s in CHECKS if s.id == check_id)
    return spec.run(replace(f, recheck=_statuses))


def run_checks(f: Facts) -> list[Check]:
    """Every check, in CHECKS' order; a check that raises becomes `error`, never a traceback.
    With --build (f.build set) the `build` proof comes last and has the final word. The checks
    see the facts with the registry's recheck, so a fix is tried before it is printed; the
    caller's facts are left as they were."""
    f = replace(f, recheck=_statuses)
    out: list[Check] = []
    for spec in CHECKS:
        try:
            out.append(spec.check(spec.run(f)))
        except Exception as exc:
            why = f"the check itself failed: {type(exc).__name__}: {exc}"
            out.append(spec.check(error(why, fix=REPORT_BUG)))
    if f.build is not None:
        out.append(BUILD.check(proof.check_build(f, out)))
    return out


def all_errored(why: str, fix: str) -> list[Check]:
    """Every check as `error` with one reason: what the report says when no fact could be had."""
    return [spec.check(error(why, fix=fix)) for spec in CHECKS]
