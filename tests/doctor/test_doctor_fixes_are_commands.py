"""Every fix the doctor prints is a command a shell takes pasted as it is. The rule itself
(fakecuda.fix_problem: `bash -n`, no note in parentheses, no prose) is held to every fix of every
real `xl doctor` report the tests see (fakecuda.run_doctor_json) and of every check run in these
tests' own process (conftest.py); here it is checked both ways, and a note reaches the detail."""

from __future__ import annotations

import pytest
from fakecuda import fix_problem

from xl.doctor.checks.finding import fail
from xl.doctor.report import Fix


@pytest.mark.parametrize(
    "fix",
    [
        "sudo modprobe nvidia (or reboot); `dmesg | grep -i nvidia` says why it did not load",
        "kill 4242 (or leave GPU 0 out: xl launch --gpus 1 ...)",
        "install CUDA toolkit 12.8 and export CUDA_HOME to it",
        "on the host, not in this container: sudo modprobe nvidia",
        "please report this as an xl bug",
        "check `nvidia-smi`",
        "export NCCL_DEBUG=WARN (or INFO while debugging)",
        "export FOO='unclosed",
    ],
)
def test_a_note_or_prose_in_a_fix_is_refused(fix: str) -> None:
    assert fix_problem(fix) is not None


@pytest.mark.parametrize(
    "fix",
    [
        "sudo apt-get install -y linux-headers-6.8.0-49-generic && sudo dkms autoinstall -k "
        "6.8.0-49-generic && sudo modprobe nvidia",
        'export TORCH_CUDA_ARCH_LIST="8.0;9.0+PTX"',
        "export LD_LIBRARY_PATH=/opt/a:/opt/b; unset LD_PRELOAD",
        "sudo dmesg | grep -i -E 'nvidia|xid'",
        "xl doctor --json > xl-doctor.json",
        "/usr/bin/python3 -m pip install nvidia-nccl-cu12==2.26.2",
        "export CPATH=/opt/conda/targets/x86_64-linux/include${CPATH:+:$CPATH}",
        "",
    ],
)
def test_a_command_is_taken(fix: str) -> None:
    assert fix_problem(fix) is None


def test_a_fixs_note_goes_to_the_detail() -> None:
    found = fail(
        "GPU 0 has a page retirement pending",
        fix=Fix("sudo nvidia-smi -r -i 0", "a reboot resets it too"),
    )
    assert found.fix == "sudo nvidia-smi -r -i 0" and type(found.fix) is str
    assert found.detail == "GPU 0 has a page retirement pending; a reboot resets it too"
    # xl.gpu's "command (note)" wording, shared with the launch and the app, is split the same way.
    said = Fix.said("kill 4242 (or leave GPU 0 out: xl launch --gpus 1 ...)")
    assert (said, said.note) == ("kill 4242", "or leave GPU 0 out: xl launch --gpus 1 ...")
    assert Fix.said("export CUDA_VISIBLE_DEVICES=0") == "export CUDA_VISIBLE_DEVICES=0"
