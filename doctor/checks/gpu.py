"""Driver & GPUs: does the NVIDIA driver answer, and are the GPUs it lists usable together?"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from xl.doctor.checks.derived import torch_cuda
from xl.doctor.checks.finding import Finding, error, fail, ok, skip, warn
from xl.doctor.checks.kmod import RELOAD, not_loaded
from xl.doctor.checks.upgrade import branch_for, driver_upgrade
from xl.doctor.facts import Facts, vtuple
from xl.doctor.report import Fix
from xl.doctor.status import Status
from xl.doctor.tables import DRIVER_FOR_CUDA
from xl.gpu.models import mixed_models, model_counts, models_text

if TYPE_CHECKING:
    from xl.gpu.health import Problem
    from xl.gpu.inventory import GPU

_DRIVER_FIXES = {
    "version_mismatch": RELOAD,
    "no_permission": Fix(
        "sudo usermod -aG video $USER",
        "the group that owns /dev/nvidia* is most often video; log in again after joining it",
    ),
}


def check_driver(f: Facts) -> Finding:
    d = f.driver
    if d is None:
        return error(
            f"could not query NVML: {f.nvml_problem or 'no answer'}",
            fix=Fix("nvidia-smi", "nvidia-smi says whether the driver answers"),
        )
    if d.error:
        kind = d.error_kind or "other"
        data: dict[str, Any] = {"error_kind": kind}
        if kind == "library_not_found":
            return _no_driver(f, d.error, data)
        if kind == "driver_not_loaded":
            why, fix = not_loaded(f)
            if f.kernel is not None:
                data["kernel_module"] = f.kernel.to_json()
            # NVML's own words end with "load it with modprobe", which is wrong when no module
            # is built for this kernel: only the part before them is kept.
            said = d.error.split("; load it with", 1)[0] if why else d.error
            return fail(f"{said}; {why}" if why else said, fix=fix, data=data)
        return Finding(
            status=Status.ERROR if kind == "other" else Status.FAIL,
            detail=d.error,
            fix=_DRIVER_FIXES.get(
                kind, Fix("nvidia-smi", "if nvidia-smi fails too, reinstall the driver")
            ),
            data=data,
        )
    cuda = f" supports CUDA up to {d.cuda_version}" if d.cuda_version else ""
    return ok(
        f"driver {d.version or '?'}{cuda}",
        data={"version": d.version, "cuda_version": d.cuda_version},
    )


# The container runtime's fix: GPUs are passed in by the host, never installed inside (a driver
# installed in a container does not match the host's kernel module and breaks it).
CONTAINER_FIX = Fix(
    "sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker && "
    "docker run --gpus all ...",
    "on the host, not in this container: the NVIDIA Container Toolkit's runtime, then the "
    "container started again with GPU access (podman: --device nvidia.com/gpu=all; Kubernetes: "
    "resources.limits nvidia.com/gpu)",
)


def _no_driver(f: Facts, why: str, data: dict[str, Any]) -> Finding:
    """No libnvidia-ml: a valid CPU setup, unless this is a container meant to have GPUs
    (NVIDIA_VISIBLE_DEVICES names some) that was started without them."""
    wanted = (f.env.get("NVIDIA_VISIBLE_DEVICES") or "").strip()
    data["container"] = f.container
    if wanted and wanted not in ("void", "none"):
        data["nvidia_visible_devices"] = wanted
        return warn(
            f"NVIDIA_VISIBLE_DEVICES={wanted} but no driver is visible: this container was started "
            "without GPU access (the NVIDIA runtime mounts the host's driver in)",
            fix=CONTAINER_FIX,
            data=data,
        )
    fix: str = ""
    if torch_cuda(f) and f.container:
        fix = CONTAINER_FIX
    elif torch_cuda(f):
        newest = max(vtuple(v)[0] for v in DRIVER_FOR_CUDA.values())
        fix = driver_upgrade(f, branch_for(torch_cuda(f)) or newest)
        why += "; CPU training with gloo works without one"
    # No driver is a valid CPU setup; it only matters when torch wants CUDA.
    return Finding(
        status=Status.WARN if torch_cuda(f) else Status.SKIP, detail=why, fix=fix, data=data
    )


def _majority(gpus: Sequence[GPU], names: Counter[str]) -> tuple[str, list[int]]:
    """The most numerous model (the first one listed on a tie) and its GPUs."""
    model = max(names, key=lambda n: names[n])
    return model, [g.index for g in gpus if g.name == model]


def _one_model_fix(f: Facts, names: Counter[str]) -> str:
    """The exact --gpus of the most numerous model, without its GPUs that have a problem (the
    same list the health fixes' "leave it out" names); called only when no GPU is lost."""
    from xl.gpu.health import healthy  # noqa: PLC0415 - keeps xl.gpu off the startup path (see devices.py)

    model, indices = _majority(f.gpus, names)
    good = [i for i in healthy(f.gpus, f.health) if i in indices] or indices
    return Fix(
        f"xl launch --gpus {','.join(map(str, good))} ...", f"train on the {len(good)}x {model}"
    )


def check_gpus(f: Facts) -> Finding:
    d = f.driver
    if d is None or d.error:
        see = "; the driver check says why" if d is not None and d.error_kind else ""
        return skip(f"no GPUs can be listed without a working NVIDIA driver{see}")
    if not f.gpus:
        return warn(
            "the driver is loaded but reports no GPUs",
            fix=Fix(
                "nvidia-smi -L",
                "in a container, the GPUs are passed in when it starts: docker run --gpus all",
            ),
        )
    lost = [g for g in f.gpus if g.lost]
    names = model_counts(g for g in f.gpus if not g.lost)
    models = models_text(names)
    data: dict[str, Any] = {
        "count": len(f.gpus),
        "models": dict(names),
        "lost": [g.index for g in lost],
    }
    if lost:
        which = ", ".join(
            f"GPU {g.index}" + (f" ({g.pci_bus_id})" if g.pci_bus_id else "") for g in lost
        )
        return fail(
            f"{which} lost (stopped answering the driver); working: {models or 'none'}",
            fix=Fix(
                " && ".join(f"sudo nvidia-smi -r -i {g.index}" for g in lost),
                "the kernel log says why (sudo dmesg | grep -i xid); a reboot, when the reset "
                "fails",
            ),
            data=data,
        )
    among = _majority(f.gpus, names)[1] if len(names) > 1 else None
    health = _health(f, data, among)
    if any(p.status == "fail" for p in health):
        return _said(fail, models, health, data)
    errors = [g for g in f.gpus if g.error]
    mixed = mixed_models(g for g in f.gpus if not g.lost)
    if mixed:
        return warn(
            "; ".join([mixed] + [p.detail for p in health]),
            fix=Fix.joined([_one_model_fix(f, names)] + [p.fix for p in health]),
            data=data,
        )
    if health:
        return _said(warn, models, health, data)
    if errors:
        g = errors[0]
        return warn(
            f"{models}; GPU {g.index}: {g.error}",
            fix=Fix(f"nvidia-smi -q -i {g.index}", "nvidia-smi -q shows all it knows of the GPU"),
            data=data,
        )
    exclusive = [i for i, h in sorted(f.health.items()) if h.compute_mode == "exclusive_process"]
    if exclusive:
        return ok(
            f"{models}; GPU(s) {', '.join(map(str, exclusive))} in exclusive-process mode, free "
            "(one process per GPU, as DDP runs)",
            data=data,
        )
    return ok(models, data=data)


def _said(
    verdict: Callable[..., Finding], models: str, health: list[Problem], data: dict[str, Any]
) -> Finding:
    """The GPUs' health problems, after the models, as one finding (fails first)."""
    return verdict(
        f"{models}; " + "; ".join(p.detail for p in health),
        fix=Fix.joined(p.fix for p in health),
        data=data,
    )


def _health(f: Facts, data: dict[str, Any], among: list[int] | None) -> list[Problem]:
    """Each GPU's problems from NVML (compute mode, processes, ECC, row remaps, retired pages),
    as xl.gpu.health judges them for `xl launch` too; the figures go into `data`."""
    from xl.gpu.health import judge_all  # noqa: PLC0415 - keeps xl.gpu off the startup path (see devices.py)

    data["health"] = {str(i): h.to_json() for i, h in sorted(f.health.items())}
    data["processes"] = {
        str(g.index): [{"pid": p.pid, "name": p.name, "used_mib": p.used_mib} for p in g.processes]
        for g in f.gpus
        if g.processes
    }
    problems = [p for ps in judge_all(f.gpus, f.health, among).values() for p in ps]
    return sorted(problems, key=lambda p: p.status != "fail")
