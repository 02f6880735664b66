"""Devices: which GPUs CUDA will see (CUDA_VISIBLE_DEVICES) and whether its numbering matches
nvidia-smi's (CUDA_DEVICE_ORDER)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xl.doctor.checks.derived import working_gpus
from xl.doctor.checks.finding import Finding, ok, skip, warn
from xl.doctor.facts import Facts
from xl.doctor.report import Fix
from xl.doctor.status import Status
from xl.gpu.models import model_names

if TYPE_CHECKING:
    from xl.gpu.devices import Visibility


def _resolve_visible(f: Facts) -> Visibility:
    # At module level xl.gpu would load on the doctor's startup path, before any probe starts;
    # this way it loads on the NVML probe's thread while the subprocesses run.
    from xl.gpu.devices import resolve_visible_devices  # noqa: PLC0415 - keeps xl.gpu off the startup path

    return resolve_visible_devices(list(f.gpus), f.env)


def check_cuda_visible_devices(f: Facts) -> Finding:
    """The verdict `xl launch` acts on too (xl.gpu.devices.judge_visible_devices): what the
    doctor calls fail stops a launch, warn is said at launch, ok and skip pass silently."""
    from xl.gpu.devices import judge_visible_devices  # noqa: PLC0415 - keeps xl.gpu off the startup path

    have_driver = f.driver is not None and not f.driver.error
    v = judge_visible_devices(list(f.gpus), f.env, have_driver=have_driver)
    # xl.gpu says the same words, below the doctor's layer: one Status from here on.
    return Finding(
        status=Status(v.status), detail=v.detail, fix=Fix.said(v.fix or ""), data=dict(v.data)
    )


def check_cuda_device_order(f: Facts) -> Finding:
    value = f.env.get("CUDA_DEVICE_ORDER")
    gpus = working_gpus(f)
    data = {"value": value}
    if value not in (None, "", "PCI_BUS_ID", "FASTEST_FIRST"):
        return warn(
            f"{value!r} is not a value CUDA knows (PCI_BUS_ID or FASTEST_FIRST)",
            fix="export CUDA_DEVICE_ORDER=PCI_BUS_ID",
            data=data,
        )
    if not gpus:
        return skip(f"{value or 'unset'}; no GPUs to order", data=data)
    if value == "PCI_BUS_ID":
        return ok("PCI_BUS_ID: CUDA's indices match nvidia-smi's", data=data)
    kinds = {(g.name, g.compute_capability) for g in gpus}
    if len(kinds) > 1 or _resolve_visible(f).order_differs:
        models = ", ".join(model_names(gpus))
        return warn(
            f"{value or 'unset'} (FASTEST_FIRST) with different GPUs ({models}): CUDA's device "
            "indices differ from nvidia-smi's",
            fix=Fix("export CUDA_DEVICE_ORDER=PCI_BUS_ID", "xl launch sets it for its runs"),
            data=data,
        )
    return ok(f"{value or 'unset'}; all GPUs are alike, so the orders agree", data=data)
