"""Devices: which GPUs CUDA will see (CUDA_VISIBLE_DEVICES) and whether its numbering matches
nvidia-smi's (CUDA_DEVICE_ORDER)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from xl.doctor.checks.common import Finding, ok, skip, warn, working_gpus
from xl.doctor.facts import Facts

if TYPE_CHECKING:
    from xl.gpu.devices import Visibility

_DEVICE_TOKEN = re.compile(r"\s*(\d+|(GPU|MIG)-[0-9A-Za-z-]+)\s*")


def _resolve_visible(f: Facts) -> Visibility:
    # At module level xl.gpu would load on the doctor's startup path, before any probe starts;
    # this way it loads on the NVML probe's thread while the subprocesses run.
    from xl.gpu.devices import resolve_visible_devices  # noqa: PLC0415 - keeps xl.gpu off the startup path

    return resolve_visible_devices(list(f.gpus), f.env)


def _visible_without_driver(value: str, data: dict[str, Any]) -> Finding:
    """Only the syntax of the entries can be judged: there is no GPU list to match them to."""
    bad = [tok for tok in value.split(",") if not _DEVICE_TOKEN.fullmatch(tok)]
    if bad:
        return warn(
            f"{value!r}: {bad[0]!r} is neither an index nor a GPU-/MIG- UUID",
            fix="use indices or UUIDs from `nvidia-smi -L`, e.g. CUDA_VISIBLE_DEVICES=0,1",
            data=data,
        )
    return skip(f"{value!r}; no driver to check the entries against", data=data)


def check_cuda_visible_devices(f: Facts) -> Finding:
    value = f.env.get("CUDA_VISIBLE_DEVICES")
    gpus = list(f.gpus)
    have_driver = f.driver is not None and not f.driver.error
    if value is None:
        if have_driver:
            return ok(f"unset: all {len(gpus)} GPU(s) visible")
        return skip("unset")
    data: dict[str, Any] = {"value": value}
    if value.strip() == "":
        return Finding(
            status="warn" if gpus or not have_driver else "ok",
            detail="set but empty: CUDA sees no GPU at all (torch.cuda.is_available() is False)",
            fix="unset CUDA_VISIBLE_DEVICES (or list the GPUs to use, e.g. 0,1)",
            data=data,
        )
    if not have_driver:
        return _visible_without_driver(value, data)
    vis = _resolve_visible(f)
    devices = list(vis.devices)
    # Visibility also reports CUDA_DEVICE_ORDER problems; those belong to the next check.
    problems = [p for p in vis.problems if p.startswith(("CUDA_VISIBLE_DEVICES", "entry "))]
    # Selecting MIG instances is a valid setup; say so without calling it a problem.
    problems = [p for p in problems if "MIG instances" not in p]
    if vis.mig_ids and not problems:
        return ok(
            f"{value!r}: {len(vis.mig_ids)} MIG instance(s)"
            + (f" and GPU(s) {', '.join(str(g.index) for g in devices)}" if devices else ""),
            data=data,
        )
    data["devices"] = [g.index for g in devices]
    if problems:
        fatal = bool(vis.duplicates) or any("CUDA stops there" in p for p in problems)
        keep = ",".join(str(g.index) for g in devices) or ",".join(str(g.index) for g in gpus)
        return Finding(
            status="fail" if fatal else "warn",
            detail="; ".join(problems),
            fix=f"export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={keep} (indices from `nvidia-smi -L`)"
            if keep
            else "unset CUDA_VISIBLE_DEVICES",
            data=data,
        )
    shown = ", ".join(f"{g.index}" for g in devices)
    return ok(f"{value!r}: CUDA sees nvidia-smi GPU(s) {shown}", data=data)


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
        models = ", ".join(sorted({g.name for g in gpus}))
        return warn(
            f"{value or 'unset'} (FASTEST_FIRST) with different GPUs ({models}): CUDA's device indices differ from nvidia-smi's",
            fix="export CUDA_DEVICE_ORDER=PCI_BUS_ID (xl launch sets it for its runs)",
            data=data,
        )
    return ok(f"{value or 'unset'}; all GPUs are alike, so the orders agree", data=data)
