"""A driver upgrade is a command for the distribution that installs the driver, at the oldest
branch that runs the installed torch, said once: Ubuntu's own packages, NVIDIA's repository on
Debian, its module streams on RHEL 8/9, a version lock on RHEL 10 and Fedora, the .run installer
only where no package manager applies; the host's in a container (read off its kernel). When the
only wheels the present driver runs would downgrade torch, the fix is the upgrade and the
downgrade is said in the detail, not offered as a second fix; `xl launch --gpus` stops with the
same command. Each command is run (sudo, apt-get, dnf, wget, dpkg and reboot recorded by fakes),
and the branch it installs, given to the simulated driver, makes the check pass."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from fakecuda import Sandbox, apply_fix, by_id, run_doctor_json, statuses
from procs import xl, xl_env
from simnvml import SimGPU

from xl.doctor.facts import vtuple
from xl.doctor.tables import DRIVER_FOR_CUDA
from xl.doctor.wheels import TAG_CUDA

pytestmark = pytest.mark.e2e

B200 = {"model": "H100", "name": "NVIDIA B200", "compute_capability": "10.0"}
KEYRING = "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb"
OS_RELEASE = {
    "ubuntu": 'ID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n',
    "debian": 'ID=debian\nVERSION_ID="12"\n',
    "rocky": 'ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.4"\n',
    "rhel10": 'ID="rhel"\nID_LIKE="fedora"\nVERSION_ID="10.0"\n',
    "fedora": "ID=fedora\nVERSION_ID=42\n",
    "arch": "ID=arch\n",
}
UPGRADE = {
    "ubuntu": "sudo apt-get install -y nvidia-driver-580 && sudo reboot",
    "debian": (
        f"wget -qO /tmp/cuda-keyring.deb {KEYRING} && sudo dpkg -i /tmp/cuda-keyring.deb && "
        "sudo apt-get update && sudo apt-get install -y cuda-drivers-580 && sudo reboot"
    ),
    "rocky": "sudo dnf module install -y nvidia-driver:580-dkms && sudo reboot",
    "rhel10": (
        "sudo dnf install -y python3-dnf-plugin-versionlock && sudo dnf versionlock add "
        "'*nvidia*580*' && "
        "sudo dnf install -y nvidia-open && sudo reboot"
    ),
    "fedora": (
        "sudo dnf install -y python3-dnf-plugin-versionlock && sudo dnf versionlock add "
        "'*nvidia*580*' && "
        "sudo dnf install -y nvidia-open && sudo reboot"
    ),
}


def _root(tmp_path: Path, distro: str, release: str = "6.8.0-49-generic") -> Path:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "os-release").write_text(OS_RELEASE[distro])
    (root / "proc" / "sys" / "kernel").mkdir(parents=True)
    (root / "proc" / "sys" / "kernel" / "osrelease").write_text(release + "\n")
    return root


def _env(
    box: Sandbox, sim, site: Path, root: Path, tk: Path | None = None, **extra: str
) -> dict[str, str]:
    return box.env(
        PATH=[tk / "bin"] if tk else [],
        CUDA_HOME=tk,
        PYTHONPATH=site,
        LD_LIBRARY_PATH=str(sim.library_dir),
        XL_SIMNVML_CONFIG=sim.env["XL_SIMNVML_CONFIG"],
        XL_DOCTOR_ROOT=root,
        extra=extra,
    )


def run_fix(tmp_path: Path, fix: str) -> list[str]:
    """Run a driver fix under bash with sudo, apt-get, dnf, wget, dpkg and reboot faked (each
    records its command line); the commands it ran, in order. A typo'd command fails it."""
    fakes = tmp_path / "fakes"
    fakes.mkdir(exist_ok=True)
    log = tmp_path / "ran.log"
    (fakes / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    for name in ("apt-get", "dnf", "wget", "dpkg", "reboot"):
        (fakes / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n')
    for p in fakes.iterdir():
        p.chmod(0o755)
    proc = subprocess.run(
        ["/bin/bash", "-c", fix],
        env={"PATH": str(fakes)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, (fix, proc.stderr)
    return log.read_text().splitlines()


def branch_installed(ran: list[str]) -> int:
    """The driver branch the recorded commands installed (or locked before installing)."""
    joined = "\n".join(ran)
    m = re.search(
        r"nvidia-driver-(\d{3})\b|cuda-drivers-(\d{3})\b|nvidia-open-(\d{3})\b|nvidia-driver:(\d{3})-|\*nvidia\*(\d{3})\*",
        joined,
    )
    assert m, ran
    assert ran[-1].strip() == "reboot", ran  # the new kernel module loads at the reboot
    return int(next(g for g in m.groups() if g))


def _driver_of(branch: int) -> tuple[str, int]:
    """The simulated driver of that branch: its oldest version that starts a CUDA, and that CUDA."""
    cuda, version = min(
        ((c, v) for c, v in DRIVER_FOR_CUDA.items() if vtuple(v)[0] == branch),
        key=lambda x: vtuple(x[1]),
    )
    major, minor = vtuple(cuda)[:2]
    return version, major * 1000 + minor * 10


@pytest.mark.parametrize("distro", sorted(OS_RELEASE))
def test_a_driver_too_old_for_torch_gets_the_upgrade_for_this_distribution(
    tmp_path: Path, simnvml, distro: str
) -> None:
    """Driver 550 (CUDA 12.4), torch 2.13.0+cu130: the only wheels 550 runs are torch 2.6.0
    (cu124) and 2.7.1 (cu118). The fix keeps torch 2.13 and upgrades the driver to 580; the
    downgrade is said in the detail."""
    sim = simnvml(gpus=[SimGPU(model="A100")], driver_version="550.54.15", cuda_version=12040)
    box = Sandbox(tmp_path / "box")
    site = box.torch("2.13.0+cu130", cuda="13.0")
    env = _env(box, sim, site, _root(tmp_path, distro))
    report, proc = run_doctor_json(env)
    dc = by_id(report)["driver_cuda"]
    assert dc["status"] == "fail" and proc.returncode == 1, dc
    assert "pip install" not in dc["fix"] and " or " not in dc["fix"], dc["fix"]
    assert "Keeping driver 550.54.15 instead means a torch downgrade" in dc["detail"]
    assert "torch==2.6.0 --index-url https://download.pytorch.org/whl/cu124" in dc["detail"]
    if distro == "arch":
        # No package manager that installs NVIDIA's branches: the .run installer, its download
        # said in the detail.
        assert dc["fix"] == "sudo sh ./NVIDIA-Linux-*-580.*.run && sudo reboot"
        assert (
            "download driver branch 580's newest .run installer from "
            "https://www.nvidia.com/en-us/drivers/unix/ into this folder first"
        ) in dc["detail"]
        return
    assert dc["fix"] == UPGRADE[distro]
    # Checked like code: it runs, installs branch 580, and with that driver the check passes.
    branch = branch_installed(run_fix(tmp_path, dc["fix"]))
    assert branch == 580
    version, cuda = _driver_of(branch)
    after = simnvml(gpus=[SimGPU(model="A100")], driver_version=version, cuda_version=cuda)
    fixed, _ = run_doctor_json({**env, "XL_SIMNVML_CONFIG": after.env["XL_SIMNVML_CONFIG"]})
    assert statuses(fixed)["driver_cuda"] == "ok", by_id(fixed)["driver_cuda"]


@pytest.mark.parametrize("distro", ["ubuntu", "rocky", "debian"])
def test_blackwell_gets_the_open_kernel_modules(tmp_path: Path, simnvml, distro: str) -> None:
    """NVIDIA's proprietary modules do not drive Blackwell: its upgrade is the open flavour."""
    sim = simnvml(gpus=[SimGPU(**B200)], driver_version="570.124.06", cuda_version=12080)
    box = Sandbox(tmp_path / "box")
    env = _env(box, sim, box.torch("2.13.0+cu130", cuda="13.0"), _root(tmp_path, distro))
    dc = by_id(run_doctor_json(env)[0])["driver_cuda"]
    assert dc["status"] == "fail", dc
    want = {
        "ubuntu": "nvidia-driver-580-open",
        "rocky": "nvidia-driver:580-open",
        "debian": "nvidia-open-580",
    }[distro]
    assert want in dc["fix"], dc["fix"]
    assert branch_installed(run_fix(tmp_path, dc["fix"])) == 580


def test_in_a_container_the_upgrade_is_the_hosts_for_the_hosts_distribution(
    tmp_path: Path, simnvml
) -> None:
    """An Ubuntu image on a RHEL 9 host: the command is dnf's, for the host (its kernel says
    el9), never apt inside the container."""
    sim = simnvml(gpus=[SimGPU(model="A100")], driver_version="550.54.15", cuda_version=12040)
    box = Sandbox(tmp_path / "box")
    root = _root(tmp_path, "ubuntu", release="5.14.0-427.13.1.el9_4.x86_64")
    (root / ".dockerenv").write_text("")
    env = _env(box, sim, box.torch("2.13.0+cu130", cuda="13.0"), root, NVIDIA_VISIBLE_DEVICES="all")
    dc = by_id(run_doctor_json(env)[0])["driver_cuda"]
    assert dc["fix"] == "sudo dnf module install -y nvidia-driver:580-dkms && sudo reboot"
    assert "run this on the host, not in this container" in dc["detail"]
    # A host kernel that names no distribution: the .run installer, still for the host.
    (root / "proc" / "sys" / "kernel" / "osrelease").write_text("6.18.44-custom\n")
    dc = by_id(run_doctor_json(env)[0])["driver_cuda"]
    assert dc["fix"] == "sudo sh ./NVIDIA-Linux-*-580.*.run && sudo reboot", dc["fix"]
    assert "run this on the host, not in this container" in dc["detail"]


def test_under_wsl2_the_upgrade_is_windows_driver_never_a_linux_package(
    tmp_path: Path, simnvml
) -> None:
    """WSL2 (an Ubuntu image, a kernel that names Microsoft) runs on the Windows driver: an apt
    driver package there cannot help and breaks it, so the fix names the Windows driver's branch
    and the WSL restart; a Linux kernel of the same Ubuntu still gets apt's command."""
    sim = simnvml(gpus=[SimGPU(model="A100")], driver_version="550.54.15", cuda_version=12040)
    box = Sandbox(tmp_path / "box")
    root = _root(tmp_path, "ubuntu", release="6.6.87.2-microsoft-standard-WSL2")
    env = _env(box, sim, box.torch("2.13.0+cu130", cuda="13.0"), root)
    dc = by_id(run_doctor_json(env)[0])["driver_cuda"]
    assert dc["status"] == "fail", dc
    assert "apt-get" not in dc["fix"] and "sudo" not in dc["fix"], dc["fix"]
    assert dc["fix"] == "wsl.exe --shutdown", dc["fix"]
    assert "install NVIDIA's Windows driver, branch 580 or newer" in dc["detail"]
    (root / "proc" / "sys" / "kernel" / "osrelease").write_text("6.8.0-49-generic\n")
    assert by_id(run_doctor_json(env)[0])["driver_cuda"]["fix"] == UPGRADE["ubuntu"]


def test_a_wheel_of_the_same_torch_the_driver_runs_is_the_fix_not_an_upgrade(
    tmp_path: Path, simnvml
) -> None:
    """torch 2.7.0+cu128 on driver 550 (minor-version compatibility, warn): torch 2.7.0 was
    published for cu118, which 550 runs fully and which breaks nothing here: that wheel, no
    driver upgrade. With a CUDA 12.8 toolkit that wheel would break extension builds (another
    major): then the upgrade, which breaks nothing."""
    sim = simnvml(gpus=[SimGPU(model="A100")], driver_version="550.54.15", cuda_version=12040)
    box = Sandbox(tmp_path / "box")
    root = _root(tmp_path, "ubuntu")
    site = box.torch("2.7.0+cu128", cuda="12.8")
    dc = by_id(run_doctor_json(_env(box, sim, site, root))[0])["driver_cuda"]
    assert dc["status"] == "warn", dc
    assert dc["fix"].endswith(
        "-m pip install --force-reinstall torch==2.7.0 --index-url "
        "https://download.pytorch.org/whl/cu118"
    )
    assert "downgrade" not in dc["detail"] and "apt-get" not in dc["fix"]
    tk = box.toolkit("cuda-12.8", "12.8.93", gcc_max=14)
    box.compiler("gcc", "gcc", "12.3.0")
    report, _ = run_doctor_json(_env(box, sim, site, root, tk))
    dc = by_id(report)["driver_cuda"]
    assert dc["fix"] == "sudo apt-get install -y nvidia-driver-570 && sudo reboot", dc
    assert "Keeping driver 550.54.15 instead means a torch downgrade" in dc["detail"]
    assert statuses(report)["torch_cuda_match"] == "ok"


def test_launch_stops_with_the_doctors_driver_fix(tmp_path: Path, simnvml) -> None:
    """`xl launch --gpus` on a torch whose CUDA the driver cannot run stops before the run, with
    the doctor's own command (not a downgrade), and starts nothing."""
    sim = simnvml(gpus=[SimGPU(model="A100")], driver_version="550.54.15", cuda_version=12040)
    box = Sandbox(tmp_path / "box")
    root = _root(tmp_path, "rocky")
    site = box.torch("2.13.0+cu130", cuda="13.0")
    report, _ = run_doctor_json(_env(box, sim, site, root))
    want = by_id(report)["driver_cuda"]["fix"]
    (tmp_path / "t.py").write_text("print('hi')\n")
    env = xl_env(tmp_path / "home", **sim.env, PYTHONPATH=str(site), XL_DOCTOR_ROOT=str(root))
    env.pop("XL_SIMULATED_GPUS")  # a real driver's GPUs
    proc = xl(["launch", "--no-tui", "--gpus", "0", "t.py"], env, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "CUDA driver version is insufficient" in line and line.split("; fix: ", 1)[1] == want
    assert not (tmp_path / "home" / "runs").exists() or not os.listdir(tmp_path / "home" / "runs")
    # A driver that runs it: the launch is not stopped and nothing is collected for it.
    ok = simnvml(gpus=[SimGPU(model="A100")], driver_version="580.65.06", cuda_version=13000)
    env_ok = xl_env(tmp_path / "home", **ok.env, PYTHONPATH=str(site), XL_DOCTOR_ROOT=str(root))
    env_ok.pop("XL_SIMULATED_GPUS")
    proc = xl(["launch", "--dry-run", "--gpus", "0", "t.py"], env_ok, cwd=tmp_path)
    assert proc.returncode == 0 and "driver" not in proc.stderr, proc.stderr


def test_a_cpu_torch_no_wheel_fits_gets_one_command_from_doctor_and_launch(
    tmp_path: Path, simnvml
) -> None:
    """An RTX 5090 (sm_120) on driver 520 (CUDA 11.8) with a CPU torch: every wheel with sm_120
    kernels is cu128 or newer, which a CUDA 11 driver does not run, even through minor-version
    compatibility. One command: the driver (open modules)
    and the wheel, then the reboot; launch says the same."""
    rtx = {"model": "H100", "name": "NVIDIA GeForce RTX 5090", "compute_capability": "12.0"}
    sim = simnvml(gpus=[SimGPU(**rtx)], driver_version="520.61.05", cuda_version=11080)
    box = Sandbox(tmp_path / "box")
    root = _root(tmp_path, "ubuntu")
    site = box.torch("2.13.0+cpu", cuda=None)
    report, _ = run_doctor_json(_env(box, sim, site, root))
    t = by_id(report)["torch"]
    assert t["status"] == "fail", t
    m = re.fullmatch(
        r"sudo apt-get install -y nvidia-driver-(\d{3})-open && (\S+) -m pip install "
        r"--force-reinstall torch "
        r"--index-url https://download\.pytorch\.org/whl/(cu\d+) && sudo reboot",
        t["fix"],
    )
    assert m, t["fix"]
    # The branch is the oldest that runs the wheel it installs; the line parses as shell.
    assert int(m.group(1)) == vtuple(DRIVER_FOR_CUDA[TAG_CUDA[m.group(3)]])[0]
    assert subprocess.run(["/bin/bash", "-n", "-c", t["fix"]], timeout=30).returncode == 0
    # Applied (that driver, that wheel): torch and the driver agree.
    version, cuda = _driver_of(int(m.group(1)))
    after = simnvml(gpus=[SimGPU(**rtx)], driver_version=version, cuda_version=cuda)
    env = apply_fix(
        box, _env(box, after, site, root), m.group(2) + t["fix"].split(m.group(2), 1)[1]
    )
    st = statuses(run_doctor_json(env)[0])
    assert st["torch"] == "ok" and st["driver_cuda"] == "ok", st
    # xl launch --gpus stops with the same command.
    (tmp_path / "t.py").write_text("print('hi')\n")
    lenv = xl_env(tmp_path / "home", **sim.env, PYTHONPATH=str(site), XL_DOCTOR_ROOT=str(root))
    lenv.pop("XL_SIMULATED_GPUS")
    proc = xl(["launch", "--no-tui", "--gpus", "0", "t.py"], lenv, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().split("; fix: ", 1)[1] == t["fix"], (
        proc.stderr
    )
