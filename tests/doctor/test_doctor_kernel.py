"""A driver that is not loaded: the fix depends on why. No module built for the running kernel
(DKMS did not build for a new kernel, the distribution's module package is missing) gets the
build or the package, never `modprobe nvidia`, which cannot load what is not there; a module
Secure Boot refuses gets its key enrolled; a module that is there and allowed gets modprobe.
The machine is a fake root (XL_DOCTOR_ROOT) under the real `xl doctor`, the driver the
simulated NVML saying "driver not loaded"."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakecuda import Sandbox, by_id, run_doctor_json
from simnvml import SimGPU

pytestmark = pytest.mark.e2e

RUNNING = "6.8.0-49-generic"
OLD = "6.8.0-45-generic"


def _machine(
    root: Path,
    distro: str = "ubuntu",
    *,
    built_for: tuple[str, ...] = (OLD,),
    loaded: bool = False,
    secure_boot: bool | None = None,
    signed: bool = False,
) -> None:
    """`signed`: the module is Ubuntu's signed one (linux-modules-nvidia-570-server), a file in
    kernel/nvidia-570srv/ that modules.dep does not list, instead of DKMS's listed build."""
    (root / "proc" / "sys" / "kernel").mkdir(parents=True)
    (root / "proc" / "sys" / "kernel" / "osrelease").write_text(RUNNING + "\n")
    mods = "nvidia 54341632 0 - Live 0x0000000000000000 (POE)\n" if loaded else ""
    (root / "proc" / "modules").write_text(mods + "ext4 1003520 2 - Live 0x0000000000000000\n")
    for rel in (RUNNING, OLD):
        d = root / "lib" / "modules" / rel
        d.mkdir(parents=True)
        dep = "kernel/fs/ext4/ext4.ko.zst: kernel/fs/jbd2/jbd2.ko.zst\n"
        if rel in built_for and signed:
            (d / "kernel" / "nvidia-570srv").mkdir(parents=True)
            (d / "kernel" / "nvidia-570srv" / "nvidia.ko").write_bytes(b"\x7fELF fake")
        elif rel in built_for:
            dep += "updates/dkms/nvidia.ko.zst:\n"
        (d / "modules.dep").write_text(dep)
    like = {
        "ubuntu": "ID=ubuntu\nID_LIKE=debian\n",
        "debian": "ID=debian\n",
        "rocky": 'ID="rocky"\nID_LIKE="rhel centos fedora"\n',
    }
    (root / "etc").mkdir()
    (root / "etc" / "os-release").write_text(like[distro])
    if secure_boot is not None:
        efi = root / "sys" / "firmware" / "efi" / "efivars"
        efi.mkdir(parents=True)
        (efi / "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c").write_bytes(
            b"\x06\x00\x00\x00" + bytes([secure_boot])
        )


def _driver(
    tmp_path: Path,
    simnvml,
    dkms: str | None = None,
    libcuda: str | None = "570.124.06",
    env_extra: dict | None = None,
    **kw,
) -> dict:
    sim = simnvml(gpus=[SimGPU()], init_error="driver_not_loaded")
    box = Sandbox(tmp_path / "box")
    root = tmp_path / "root"
    _machine(root, **kw)
    if dkms is not None:
        box.tool("dkms", dkms)
    if libcuda:
        lib = box.lib_dir("usr/lib/x86_64-linux-gnu", libcuda=libcuda)
        box.ldconfig({"libcuda.so.1": lib / "libcuda.so.1"})
    env = box.env(
        PYTHONPATH=box.torch("2.7.0+cu128", cuda="12.8"),
        LD_LIBRARY_PATH=str(sim.library_dir),
        XL_SIMNVML_CONFIG=sim.env["XL_SIMNVML_CONFIG"],
        XL_DOCTOR_ROOT=root,
        extra=env_extra,
    )
    report, proc = run_doctor_json(env)
    c = by_id(report)["driver"]
    assert c["status"] == "fail" and proc.returncode == 1, c
    return c


def test_a_new_kernel_dkms_did_not_build_for_gets_the_dkms_build(tmp_path: Path, simnvml) -> None:
    c = _driver(tmp_path, simnvml, dkms=f"nvidia/570.124.06, {OLD}, x86_64: installed\n")
    assert f"no nvidia kernel module is built for the running kernel {RUNNING}" in c["detail"], c
    assert f"built for {OLD} only" in c["detail"]
    assert c["fix"] == (
        f"sudo apt-get install -y linux-headers-{RUNNING} && sudo dkms autoinstall -k {RUNNING} && "
        "sudo modprobe nvidia"
    )
    assert not c["fix"].startswith("sudo modprobe")
    assert c["data"]["kernel_module"]["release"] == RUNNING


@pytest.mark.parametrize("signed", [False, True], ids=["dkms-build", "ubuntu-signed"])
def test_after_a_kernel_upgrade_the_fix_builds_the_module_and_nothing_says_modprobe_alone(
    tmp_path: Path, simnvml, signed: bool
) -> None:
    """The module is there for the old kernel only (DKMS's build, or Ubuntu's signed package in
    kernel/nvidia-570srv/), `dkms status` names that kernel: NVML's own "load it with modprobe"
    is not repeated, and the fix builds the module for the running kernel first."""
    c = _driver(
        tmp_path, simnvml, dkms=f"nvidia/570.124.06, {OLD}, x86_64: installed\n", signed=signed
    )
    assert f"built for {OLD} only" in c["detail"], c
    assert "load it with" not in c["detail"], c
    assert c["fix"].startswith(f"sudo apt-get install -y linux-headers-{RUNNING} && "), c
    assert f"sudo dkms autoinstall -k {RUNNING}" in c["fix"]


def test_ubuntus_signed_module_built_for_the_running_kernel_is_only_modprobed(
    tmp_path: Path, simnvml
) -> None:
    """The healthy side: the signed module is there for this kernel, only not loaded."""
    c = _driver(tmp_path, simnvml, built_for=(RUNNING, OLD), signed=True)
    assert c["fix"] == "sudo modprobe nvidia", c
    assert f"/lib/modules/{RUNNING}/kernel/nvidia-570srv/nvidia.ko is built for kernel" in (
        c["detail"]
    )


def test_rhel_likes_get_dnf_and_ubuntu_without_dkms_gets_its_module_package(
    tmp_path: Path, simnvml
) -> None:
    c = _driver(
        tmp_path / "rocky",
        simnvml,
        dkms=f"nvidia/570.124.06, {OLD}, x86_64: installed\n",
        distro="rocky",
    )
    assert c["fix"].startswith(
        f"sudo dnf install -y kernel-devel-{RUNNING} "
        f"kernel-headers-{RUNNING} && sudo dkms autoinstall -k {RUNNING}"
    )
    # Ubuntu's signed precompiled modules, for the driver's branch (from its libcuda).
    c = _driver(tmp_path / "ubuntu", simnvml)
    assert (
        c["fix"]
        == f"sudo apt-get install -y linux-modules-nvidia-570-{RUNNING} && sudo modprobe nvidia"
    )
    c = _driver(tmp_path / "debian", simnvml, distro="debian")
    assert c["fix"] == (
        f"sudo apt-get install -y linux-headers-{RUNNING} nvidia-kernel-dkms && sudo modprobe "
        "nvidia"
    )


def test_a_module_secure_boot_refuses_gets_its_key_enrolled(tmp_path: Path, simnvml) -> None:
    c = _driver(tmp_path, simnvml, built_for=(RUNNING,), secure_boot=True)
    assert "Secure Boot is on" in c["detail"] and "Key was rejected" in c["detail"], c
    assert c["fix"].startswith("sudo mokutil --import /var/lib/dkms/mok.pub && sudo reboot")


@pytest.mark.parametrize("secure_boot", [None, False])
def test_a_module_that_is_there_and_allowed_gets_modprobe(
    tmp_path: Path, simnvml, secure_boot
) -> None:
    """The healthy side of the rule: modprobe is the fix that works here, and stays."""
    c = _driver(tmp_path, simnvml, built_for=(RUNNING, OLD), secure_boot=secure_boot)
    assert c["fix"].startswith("sudo modprobe nvidia"), c
    assert (
        f"/lib/modules/{RUNNING}/updates/dkms/nvidia.ko.zst is built for kernel {RUNNING}"
        in c["detail"]
    )


def test_in_a_gpu_container_the_module_is_the_hosts(tmp_path: Path, simnvml) -> None:
    """A container's /lib/modules is not the host's: no package is installed in it for the host."""
    c = _driver(tmp_path, simnvml, env_extra={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert c["fix"] == "sudo modprobe nvidia", c
    assert "run it on the host, not in this container" in c["detail"]
