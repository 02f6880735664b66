"""The command that upgrades the NVIDIA driver to a branch, for the distribution that installs
it (docs/doctor.md, "A driver upgrade"): Ubuntu's own packages, NVIDIA's CUDA repository on
Debian, its module streams on RHEL 8/9 and its packages under a version lock on RHEL 10 and
Fedora; NVIDIA's .run installer only where none of these applies. Blackwell GPUs (sm_100 and
newer) run only on NVIDIA's open kernel modules, so they get the open flavour. In a container the
driver is the host's, and so is the command (the host's distribution is read off its kernel)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from xl.doctor.checks.derived import working_gpus
from xl.doctor.facts import Facts, vtuple
from xl.doctor.report import Fix
from xl.doctor.tables import DRIVER_FOR_CUDA

RUNFILE = "https://www.nvidia.com/en-us/drivers/unix/"
WINDOWS_DRIVERS = "https://www.nvidia.com/en-us/drivers/"
_KEYRING = "https://developer.download.nvidia.com/compute/cuda/repos/debian{v}/{arch}/cuda-keyring_1.1-1_all.deb"


def in_container(f: Facts) -> bool:
    """Whether the driver is another machine's: a container (its marker, or the NVIDIA runtime's
    NVIDIA_VISIBLE_DEVICES)."""
    visible = (f.env.get("NVIDIA_VISIBLE_DEVICES") or "").strip() not in ("", "void", "none")
    return bool(f.container) or visible


def branch_for(cuda: str | None) -> int | None:
    """The oldest driver branch that runs this CUDA (570 for 12.8)."""
    need = DRIVER_FOR_CUDA.get(".".join(str(p) for p in vtuple(cuda)[:2]))
    return vtuple(need)[0] if need else None


@dataclass(frozen=True)
class DriverHost:
    """The few facts a driver upgrade's command depends on: the system that installs the driver
    (Facts.driver_os: "ubuntu 24.04", "rhel 9", "wsl", ...; None when unknown), whether the
    driver is another machine's (a container's host), and whether a GPU here runs only on
    NVIDIA's open kernel modules (Blackwell, sm_100 and newer)."""

    driver_os: str | None = None
    in_container: bool = False
    open_only: bool = False

    @classmethod
    def of(cls, f: Facts) -> DriverHost:
        caps = [g.compute_capability for g in working_gpus(f) if g.compute_capability]
        return cls(
            driver_os=f.driver_os,
            in_container=in_container(f),
            open_only=any(vtuple(c)[:1] >= (10,) for c in caps),
        )


def _install(host: DriverHost, branch: int) -> str | None:
    """The commands that install driver `branch` here (before the reboot that loads it); None
    where no package manager applies."""
    family, _, major = (host.driver_os or "").partition(" ")
    ver = int(major) if major.isdigit() else None
    opn = host.open_only
    if family == "ubuntu":
        return f"sudo apt-get install -y nvidia-driver-{branch}{'-open' if opn else ''}"
    if family == "debian" and ver is not None:
        arch = "sbsa" if os.uname().machine in ("aarch64", "arm64") else "x86_64"
        keyring = _KEYRING.format(v=ver, arch=arch)
        pkg = f"nvidia-open-{branch}" if opn else f"cuda-drivers-{branch}"
        return (
            f"wget -qO /tmp/cuda-keyring.deb {keyring} && sudo dpkg -i /tmp/cuda-keyring.deb && "
            f"sudo apt-get update && sudo apt-get install -y {pkg}"
        )
    if family == "rhel" and ver is not None and ver < 10:
        if opn:
            return (
                f"sudo dnf module enable -y nvidia-driver:{branch}-open && sudo dnf install -y "
                "nvidia-open"
            )
        return f"sudo dnf module install -y nvidia-driver:{branch}-dkms"
    if family in ("rhel", "fedora") and ver is not None:
        # No module streams: a version lock holds the branch, then the driver is installed.
        return (
            "sudo dnf install -y python3-dnf-plugin-versionlock && "
            f"sudo dnf versionlock add '*nvidia*{branch}*' && sudo dnf install -y nvidia-open"
        )
    return None


def driver_upgrade(f: Facts, branch: int, then: str | None = None) -> Fix:
    """upgrade_command for this machine (DriverHost.of the facts)."""
    return upgrade_command(DriverHost.of(f), branch, then)


def runfile_command(branch: int | None) -> str:
    """NVIDIA's .run installer of a branch (any branch when None), run from the folder it was
    downloaded to, then the reboot that loads its module."""
    name = f"NVIDIA-Linux-*-{branch}.*.run" if branch else "NVIDIA-Linux-*.run"
    return f"sudo sh ./{name} && sudo reboot"


def upgrade_command(host: DriverHost, branch: int, then: str | None = None) -> Fix:
    """The command that installs driver `branch` (the open flavour where Blackwell needs it) and
    reboots to load it; `then`, a command to run in this environment too (a torch wheel), goes
    before the reboot. What the command cannot say is the note: the Windows driver under WSL2,
    the .run installer's download, and in a container the driver's part, which is the host's
    (the fix is then what runs here)."""
    notes = [getattr(then, "note", "")] if then else []
    if host.driver_os == "wsl":
        # WSL2 runs on the Windows driver (/usr/lib/wsl/lib): nothing installed in Linux replaces
        # it, and a Linux driver package there breaks it. The fix is Windows', then a restart of
        # WSL (wsl.exe is reachable from inside it).
        notes.append(
            f"the GPU driver is Windows': install NVIDIA's Windows driver, branch {branch} or "
            f"newer, from {WINDOWS_DRIVERS} first (the command then restarts WSL)"
        )
        restart = "wsl.exe --shutdown"
        return _fix(f"{then} && {restart}" if then else restart, notes)
    install = _install(host, branch)
    if install is None:
        notes.append(
            f"download driver branch {branch}'s newest .run installer from {RUNFILE} into this "
            "folder first"
        )
        install = runfile_command(branch).removesuffix(" && sudo reboot")
    if host.in_container:
        driver = f"{install} && sudo reboot"
        if then:
            notes.append(f"the driver is the host's: on the host, not in this container, {driver}")
            return _fix(str(then), notes)
        notes.append("the driver is the host's: run this on the host, not in this container")
        return _fix(driver, notes)
    steps = [install, str(then)] if then else [install]
    return _fix(" && ".join([*steps, "sudo reboot"]), notes)


def _fix(command: str, notes: list[str]) -> Fix:
    return Fix(command, "; ".join(n for n in notes if n))
