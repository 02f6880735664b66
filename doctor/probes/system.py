"""The machine around the toolkit: shared memory, network and InfiniBand devices, the
environment as text, and the NVML inventory."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from xl.doctor.probes.files import listdir

if TYPE_CHECKING:
    from xl.gpu.health import Health
    from xl.gpu.nvml import Inventory


def shm_size(path: str = "/dev/shm") -> tuple[int | None, int | None, str | None]:
    """(total bytes, free bytes, problem) of the shared-memory mount NCCL and DataLoader use."""
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return None, None, f"{path}: {exc.strerror or exc}"
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, None


def container_kind() -> str | None:
    """docker | podman when this process runs in a container (the runtime's marker file)."""
    for marker, kind in (("/.dockerenv", "docker"), ("/run/.containerenv", "podman")):
        if os.path.exists(marker):
            return kind
    return None


def net_interfaces() -> list[str]:
    """The network interfaces NCCL_SOCKET_IFNAME may name (empty when /sys can't be read)."""
    return listdir("/sys/class/net")


def infiniband_devices() -> list[str]:
    return listdir("/sys/class/infiniband")


def probe_inventory() -> tuple[Inventory, dict[int, Health]]:
    """The driver, its GPUs with the processes on them, and each GPU's health (compute mode,
    ECC, row remapping, page retirement): what the `gpus` check judges."""
    from xl.gpu import health, nvml  # noqa: PLC0415 - loads on the NVML probe's thread, overlapping the subprocesses

    inv = nvml.inventory(processes=True)
    ok = [g.index for g in inv.gpus if not g.lost]
    return inv, (health.health(ok) if ok and not inv.driver.error else {})


def env_snapshot() -> dict[str, str]:
    """The environment as text: bytes that aren't UTF-8 become U+FFFD instead of breaking output."""
    try:
        return {
            k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
            for k, v in os.environb.items()
        }
    except AttributeError:  # pragma: no cover - platforms without environb
        return dict(os.environ)
