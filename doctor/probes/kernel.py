"""The machine under the driver: the NVIDIA kernel module for the running kernel, InfiniBand
ports, the distribution, Secure Boot and the Fabric Manager's install. Files only, except
`dkms status` (with a timeout), which runs only when the driver is not loaded.

XL_DOCTOR_ROOT names a folder that stands for / in these reads (tests build fake machines
there); unset, the real files are read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from xl.doctor.facts import KernelModule
from xl.doctor.probes.commands import run_cmd
from xl.doctor.probes.files import is_dir, is_file, listdir, read_text, which

ROOT_ENV = "XL_DOCTOR_ROOT"
_SECURE_BOOT = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def at(path: str) -> str:
    """`path` under XL_DOCTOR_ROOT when that is set."""
    root = os.environ.get(ROOT_ENV)
    return os.path.join(root, path.lstrip("/")) if root else path


def kernel_release() -> str:
    text = (
        read_text(at("/proc/sys/kernel/osrelease"), limit=256) if os.environ.get(ROOT_ENV) else None
    )
    return (text or "").strip() or os.uname().release


def _has_nvidia(release: str) -> str | None:
    """The nvidia module file modprobe would load for this kernel (modules.dep names it), or
    one in the folders drivers install it to when depmod has not run; None when there is none."""
    base = at(f"/lib/modules/{release}")
    dep = read_text(os.path.join(base, "modules.dep"), limit=16 << 20) or ""
    m = re.search(r"^(\S*/nvidia\.ko(?:\.\w+)?):", dep, re.MULTILINE)
    if m:
        return os.path.join(f"/lib/modules/{release}", m.group(1))
    # Ubuntu's signed modules (linux-modules-nvidia-<branch>-<release>) live in
    # kernel/nvidia-<branch>[srv]/.
    kernel = listdir(os.path.join(base, "kernel"))
    ubuntu = [f"kernel/{d}" for d in kernel if d.startswith("nvidia")]
    for sub in ("updates/dkms", "extra", "kernel/drivers/video", "updates", "misc", *ubuntu):
        for name in listdir(os.path.join(base, sub)):
            if re.fullmatch(r"nvidia\.ko(?:\.\w+)?", name):
                return f"/lib/modules/{release}/{sub}/{name}"
    return None


def distro() -> str | None:
    """ID (and ID_LIKE) of /etc/os-release: "ubuntu", "rhel fedora", ..."""
    text = read_text(at("/etc/os-release"), limit=64 << 10) or ""
    ids = re.findall(r'^(?:ID|ID_LIKE)="?([^"\n]*)"?$', text, re.MULTILINE)
    return " ".join(ids).strip() or None


_RHEL_LIKE = ("rhel", "centos", "rocky", "almalinux", "ol", "amzn")


def os_family(ids: str, version: str | None) -> str | None:
    """ "<family> <major>" of /etc/os-release's ID/ID_LIKE and VERSION_ID: ubuntu, debian, rhel
    (its rebuilds: Rocky, Alma, Oracle, Amazon), fedora; None for others."""
    words = ids.split()
    major = (version or "").split(".")[0]
    major = major if major.isdigit() else ""
    if not words:
        return None
    if words[0] == "amzn":
        # Amazon Linux 2023 installs the driver as RHEL 9 does (module streams); 2 has no dnf.
        return "rhel 9" if major == "2023" else None
    if "ubuntu" in words:
        family = "ubuntu"
    elif words[0] == "fedora":
        family = "fedora"
    elif any(w in words for w in _RHEL_LIKE):
        family = "rhel"
    elif "debian" in words:
        family = "debian"
    else:
        return None
    return f"{family} {major}".strip()


_DEBIAN_KERNELS = {"4.19": "10", "5.10": "11", "6.1": "12"}


def host_os(release: str) -> str | None:
    """The host's distribution from its kernel's release (what a container sees of it):
    5.14.0-427.el9 is RHEL 9's, 6.1.0-28+deb12-amd64 Debian 12's, 6.8.0-49-generic Ubuntu's."""
    m = re.search(r"\.el(\d+)", release)
    if m:
        return f"rhel {m.group(1)}"
    m = re.search(r"\.fc(\d+)", release)
    if m:
        return f"fedora {m.group(1)}"
    m = re.search(r"\+deb(\d+)", release)
    if m:
        return f"debian {m.group(1)}"
    m = re.fullmatch(r"(\d+\.\d+)\.\d+-\d+-(?:cloud-|rt-)?(?:amd64|arm64)", release)
    if m:
        # Before trixie Debian's release names no version; its kernel series does.
        return f"debian {_DEBIAN_KERNELS.get(m.group(1), '')}".strip()
    if re.search(
        r"-(generic|aws|azure|gcp|gke|oracle|nvidia|lowlatency|kvm|ibm)(-[\w.]+)?$", release
    ):
        return "ubuntu"
    return None


def driver_os(container: bool) -> str | None:
    """The distribution that installs the driver: the host's in a container, else this one's;
    ``wsl`` under WSL2, whose GPU driver is Windows' (its kernel names Microsoft)."""
    if "microsoft" in kernel_release().lower():
        return "wsl"
    if container:
        return host_os(kernel_release())
    text = read_text(at("/etc/os-release"), limit=64 << 10) or ""
    ids = " ".join(re.findall(r'^(?:ID|ID_LIKE)="?([^"\n]*)"?$', text, re.MULTILINE))
    ver = re.search(r'^VERSION_ID="?([^"\n]*)"?$', text, re.MULTILINE)
    return os_family(ids, ver.group(1) if ver else None)


def secure_boot() -> bool | None:
    """Whether UEFI Secure Boot is on (its EFI variable's last byte), None when unknown."""
    path = at(f"/sys/firmware/efi/efivars/{_SECURE_BOOT}")
    try:
        with open(path, "rb") as fh:
            data = fh.read(64)
    except OSError:
        return None
    return bool(data[-1]) if data else None


def kernel_module(env: Mapping[str, str], libcuda_version: str | None) -> KernelModule:
    """What the kernel-module rule needs, read when NVML says the driver is not loaded."""
    release = kernel_release()
    modules = read_text(at("/proc/modules"), limit=4 << 20) or ""
    km = KernelModule(release=release)
    km.loaded = bool(re.search(r"^nvidia ", modules, re.MULTILINE)) or is_dir(
        at("/sys/module/nvidia")
    )
    km.built = _has_nvidia(release)
    km.other_kernels = sorted(
        r for r in listdir(at("/lib/modules")) if r != release and _has_nvidia(r)
    )[:8]
    km.distro = distro()
    km.secure_boot = secure_boot()
    km.mok_key = next((p for p in ("/var/lib/dkms/mok.pub",) if is_file(at(p))), None)
    dkms = which("dkms", env.get("PATH"))
    if dkms:
        run = run_cmd([dkms, "status"])
        km.dkms = (
            [ln.strip() for ln in run.stdout.splitlines() if "nvidia" in ln][:16] if run.ok else []
        )
    branch = re.match(r"(\d{3,})\.", libcuda_version or "")
    for line in km.dkms or []:
        m = re.search(r"nvidia[/,]\s*(\d{3,})\.", line)
        if m and not branch:
            branch = m
    km.branch = branch.group(1) if branch else None
    return km


def infiniband_ports(devices: list[str]) -> dict[str, dict[str, str]]:
    """{device: {port: state}} from /sys/class/infiniband/<dev>/ports/<n>/state ("4: ACTIVE")."""
    out: dict[str, dict[str, str]] = {}
    for dev in devices[:64]:
        ports = {}
        for port in listdir(at(f"/sys/class/infiniband/{dev}/ports"))[:16]:
            text = read_text(at(f"/sys/class/infiniband/{dev}/ports/{port}/state"), limit=64) or ""
            ports[port] = text.strip().split(":")[-1].strip() or "?"
        out[dev] = ports
    return out


def fabric_manager_installed() -> bool:
    """Whether NVIDIA's Fabric Manager is installed (its daemon or its systemd unit)."""
    return any(
        is_file(at(p))
        for p in (
            "/usr/bin/nv-fabricmanager",
            "/usr/lib/systemd/system/nvidia-fabricmanager.service",
            "/lib/systemd/system/nvidia-fabricmanager.service",
        )
    )


def fabric_manager_version() -> str | None:
    """The installed Fabric Manager package's version (570.124.06 of 570.124.06-1), read from
    dpkg's status file: NVIDIA's packages are nvidia-fabricmanager-<branch> up to R575 and
    nvidia-fabricmanager from R580. None when dpkg lists none (or on an RPM system)."""
    text = read_text(at("/var/lib/dpkg/status"), limit=64 << 20) or ""
    for block in text.split("\n\n"):
        if not re.search(r"^Package: nvidia-fabricmanager(?:-\d+)?$", block, re.MULTILINE):
            continue
        if not re.search(r"^Status: install ok installed$", block, re.MULTILINE):
            continue
        m = re.search(r"^Version: (?:\d+:)?([\d.]+)", block, re.MULTILINE)
        if m:
            return m.group(1)
    return None
