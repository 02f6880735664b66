"""A driver upgrade's command is a plain function of the few facts it needs (DriverHost): the
system that installs the driver, whether the driver is a container's host's, and whether a GPU
needs the open kernel modules. Each case is checked both ways; the commands themselves are run
against fakes in tests/doctor/test_doctor_driver_upgrade.py."""

from __future__ import annotations

import sys

import pytest

from xl.doctor.checks.upgrade import RUNFILE, DriverHost, driver_upgrade, upgrade_command
from xl.doctor.facts import Facts
from xl.doctor.report import Fix
from xl.gpu.inventory import empty_gpu

UBUNTU = DriverHost(driver_os="ubuntu 24.04")


@pytest.mark.parametrize(
    ("host", "expected", "note"),
    [
        (UBUNTU, "sudo apt-get install -y nvidia-driver-580 && sudo reboot", ""),
        (
            DriverHost(driver_os="ubuntu 24.04", open_only=True),
            "sudo apt-get install -y nvidia-driver-580-open && sudo reboot",
            "",
        ),
        (
            DriverHost(driver_os="ubuntu 24.04", in_container=True),
            "sudo apt-get install -y nvidia-driver-580 && sudo reboot",
            "the driver is the host's: run this on the host, not in this container",
        ),
        (
            DriverHost(driver_os="rhel 9"),
            "sudo dnf module install -y nvidia-driver:580-dkms && sudo reboot",
            "",
        ),
        (
            DriverHost(),
            "sudo sh ./NVIDIA-Linux-*-580.*.run && sudo reboot",
            f"download driver branch 580's newest .run installer from {RUNFILE} into this folder "
            "first",
        ),
    ],
    ids=["ubuntu", "ubuntu-open", "container", "rhel9", "unknown-os"],
)
def test_the_command_follows_the_host(host: DriverHost, expected: str, note: str) -> None:
    """The fix is the command alone; where it runs and what it needs first is its note (the
    finding's detail)."""
    fix = upgrade_command(host, 580)
    assert fix == expected and fix.note == note


def test_a_wheel_goes_before_the_reboot_and_its_note_stays_a_note() -> None:
    wheel = Fix("python -m pip install torch==2.7.0 --index-url https://x/cu128", "downgrades")
    fix = upgrade_command(UBUNTU, 570, wheel)
    assert fix == (
        "sudo apt-get install -y nvidia-driver-570 && "
        "python -m pip install torch==2.7.0 --index-url https://x/cu128 && sudo reboot"
    )
    assert fix.note == "downgrades"
    # In a container the driver is the host's: the fix is what runs here, the host's part said.
    inside = upgrade_command(DriverHost(driver_os="ubuntu 24.04", in_container=True), 570, wheel)
    assert inside == "python -m pip install torch==2.7.0 --index-url https://x/cu128"
    assert "on the host, not in this container, sudo apt-get install -y nvidia-driver-570" in (
        inside.note
    )


def test_under_wsl_the_driver_is_windows_and_never_an_apt_package() -> None:
    fix = upgrade_command(DriverHost(driver_os="wsl", open_only=True), 580)
    assert fix == "wsl.exe --shutdown"
    assert "install NVIDIA's Windows driver, branch 580 or newer" in fix.note
    assert "apt-get" not in fix + fix.note


def _facts(**kw: object) -> Facts:
    return Facts(**{"env": {}, "python": sys.executable, **kw})  # type: ignore[arg-type]


def test_the_host_is_read_off_the_facts() -> None:
    blackwell = empty_gpu(0, error="", name="NVIDIA B200", compute_capability="10.0")
    hopper = empty_gpu(1, error="", name="NVIDIA H100", compute_capability="9.0")
    lost_blackwell = empty_gpu(2, error="gone", compute_capability="12.0", lost=True)
    assert DriverHost.of(_facts(gpus=(hopper, blackwell))).open_only
    # A lost GPU has no say, and a Hopper runs on either flavour.
    assert not DriverHost.of(_facts(gpus=(hopper, lost_blackwell))).open_only
    runtime = _facts(env={"NVIDIA_VISIBLE_DEVICES": "all"}, driver_os="ubuntu 22.04")
    assert DriverHost.of(runtime) == DriverHost(driver_os="ubuntu 22.04", in_container=True)
    for hidden in ("", "void", "none"):
        assert not DriverHost.of(_facts(env={"NVIDIA_VISIBLE_DEVICES": hidden})).in_container
    assert DriverHost.of(_facts(container="podman")).in_container
    # The Facts form is the same command.
    assert driver_upgrade(runtime, 580) == upgrade_command(DriverHost.of(runtime), 580)
