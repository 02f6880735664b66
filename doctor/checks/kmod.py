"""Why the NVIDIA driver is not loaded, and the fix that works: no module built for the running
kernel (a kernel update DKMS did not build for, or the distribution's module package missing)
cannot be cured by `modprobe`; a module that Secure Boot refuses needs its key enrolled; only a
module that is there and allowed is `modprobe`d."""

from __future__ import annotations

from xl.doctor.facts import Facts, KernelModule
from xl.doctor.report import Fix

MODPROBE = "sudo modprobe nvidia"
# A module of another version than the user-space driver's (or one that is stuck): unloaded and
# loaded again.
RELOAD = Fix(
    "sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia",
    "a reboot reloads the kernel module too",
)
# What a modprobe that fails means, said beside it.
_WHY = "if it fails, sudo dmesg | grep -i nvidia says why"


def _debian(km: KernelModule) -> bool:
    return any(w in (km.distro or "").split() for w in ("ubuntu", "debian"))


def _headers(km: KernelModule) -> str:
    """The package of this kernel's headers, which DKMS builds against."""
    if _debian(km):
        return f"sudo apt-get install -y linux-headers-{km.release}"
    return f"sudo dnf install -y kernel-devel-{km.release} kernel-headers-{km.release}"


def not_loaded(f: Facts) -> tuple[str, Fix]:
    """(why, fix) for a driver NVML calls not loaded."""
    km = f.kernel
    if f.container or (f.env.get("NVIDIA_VISIBLE_DEVICES") or "").strip() not in (
        "",
        "void",
        "none",
    ):
        # The module is the host's: this container's /lib/modules says nothing about it.
        return (
            "the kernel module is the host's, not this container's",
            Fix(MODPROBE, f"run it on the host, not in this container; {_WHY}"),
        )
    if km is None or km.loaded:
        return "", Fix(MODPROBE, _WHY)
    if km.built:
        if km.secure_boot:
            key = km.mok_key or "/var/lib/dkms/mok.pub"
            return (
                f"{km.built} is built for kernel {km.release}, but Secure Boot is on and refuses a "
                "module "
                'not signed with an enrolled key ("Key was rejected by service")',
                Fix(
                    f"sudo mokutil --import {key} && sudo reboot",
                    "enroll the key in the blue MOK screen at boot",
                ),
            )
        return f"{km.built} is built for kernel {km.release} but not loaded", Fix(MODPROBE, _WHY)
    others = f" (built for {', '.join(km.other_kernels)} only)" if km.other_kernels else ""
    why = (
        f"no nvidia kernel module is built for the running kernel {km.release}{others}: "
        "`modprobe nvidia` cannot load what is not there"
    )
    if km.dkms:
        # DKMS knows the driver: build it for this kernel, against its headers.
        return why + "; DKMS has the driver's source", Fix(
            f"{_headers(km)} && sudo dkms autoinstall -k {km.release} && sudo modprobe nvidia"
        )
    if "ubuntu" in (km.distro or "").split():
        if km.branch:
            return why, Fix(
                f"sudo apt-get install -y linux-modules-nvidia-{km.branch}-{km.release} && sudo "
                "modprobe nvidia"
            )
        return why, Fix("sudo ubuntu-drivers install && sudo reboot")
    if _debian(km):
        # Debian builds its driver's module with DKMS (nvidia-kernel-dkms).
        return why, Fix(f"{_headers(km)} nvidia-kernel-dkms && sudo modprobe nvidia")
    stream = f"{km.branch}-dkms" if km.branch else "latest-dkms"
    return why, Fix(
        f"{_headers(km)} && sudo dnf module install -y nvidia-driver:{stream} && sudo modprobe "
        "nvidia"
    )
