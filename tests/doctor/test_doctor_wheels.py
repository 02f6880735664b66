"""The table of published torch wheels every `pip install torch` fix is checked against, and the
GPU architectures each wheel carries (xl.doctor.wheels, xl.doctor.archs)."""

from __future__ import annotations

import pytest

from xl.doctor.archs import parse_arch_list, runs_on
from xl.doctor.facts import vtuple
from xl.doctor.wheels import (
    NEWEST_KNOWN,
    PUBLISHED,
    WHEEL_ARCH_ROWS,
    install_command,
    is_published,
    version_for,
    wheel_archs,
)


@pytest.mark.parametrize(
    ("version", "tag", "published"),
    [
        ("2.4.0+cu124", "cu124", True),
        ("2.4.0", "cu126", False),  # cu126 starts at 2.6
        ("2.7.0", "cu121", False),  # cu121 stops at 2.5.1
        ("2.6.0", "cu128", False),  # cu128 starts at 2.7
        ("2.8.0", "cu129", True),
        ("2.9.0", "cu130", True),
        ("2.9.0", "cu118", False),  # cu118 stops at 2.7.1
    ],
)
def test_published_pairs(version: str, tag: str, published: bool) -> None:
    assert is_published(version, tag) is published


@pytest.mark.parametrize(
    ("tag", "current", "pin"),
    [
        ("cu124", "2.4.0+cpu", "2.4.0"),  # published there: keep it
        ("cu128", "2.6.0+cu126", "2.7.0"),  # the oldest release on cu128 newer than it
        ("cu121", "2.13.0+cpu", "2.5.1"),  # a closed index: its last release
        ("cu128", "2.13.0+cpu", None),  # newer than the table, index still open: no pin
        ("cu130", None, "2.9.1"),
    ],
)
def test_the_pin_is_always_a_published_wheel(
    tag: str, current: str | None, pin: str | None
) -> None:
    assert version_for(tag, current) == pin
    fix = install_command("/py", tag, current)
    cmd, note = str(fix), fix.note
    assert cmd.endswith(f"--index-url https://download.pytorch.org/whl/{tag}")
    # A pin older than the installed torch is said to be a downgrade; nothing else is.
    older = bool(pin and current and vtuple(pin) < vtuple(current.split("+")[0]))
    assert ("a downgrade from torch" in note) == older, note
    if pin is None:
        assert " torch --index-url" in cmd
    else:
        assert (pin, tag) in PUBLISHED and f"torch=={pin} " in cmd


def test_every_tag_in_the_table_has_an_architecture_list_torch_accepts() -> None:
    for version, tag in PUBLISHED:
        archs = wheel_archs(tag, version)
        assert archs is not None, (version, tag)
        # The wheel's own list is one its torch's cpp_extension accepts.
        assert parse_arch_list(archs, torch_version=(2, 13)).bad is None, (version, tag)
    assert NEWEST_KNOWN == "2.9.1"
    assert all(parse_arch_list(archs).bad is None for _, _, archs in WHEEL_ARCH_ROWS)


@pytest.mark.parametrize(
    ("version", "tag", "volta"),
    [
        ("2.7.1", "cu128", False),  # 2.7's cu128 wheels left sm_70 out
        ("2.8.0", "cu128", True),  # and 2.8 put it back
        ("2.9.0+cu128", "cu128", True),
        ("2.9.0", "cu130", False),  # CUDA 13 builds nothing below 7.5
        ("2.11.0", "cu128", False),  # out again (pytorch#172352)
        ("2.7.0", "cu126", True),
    ],
)
def test_which_wheels_carry_volta_depends_on_the_torch_version(
    version: str, tag: str, volta: bool
) -> None:
    al = parse_arch_list(wheel_archs(tag, version))
    assert (al.runs_on("7.0") != "none") is volta


def test_arch_specific_targets_run_on_their_own_architecture_only() -> None:
    assert parse_arch_list("9.0a+PTX").runs_on("10.0") == "none"  # not "slower": no kernel
    assert parse_arch_list("9.0a").runs_on("9.0") == "cubin"
    assert parse_arch_list("9.0+PTX").runs_on("10.0") == "ptx"  # plain PTX JITs forward
    assert parse_arch_list("8.0;10.0a").runs_on("12.0") == "none"


def test_each_torch_release_accepts_its_own_arch_list() -> None:
    assert parse_arch_list("12.0", torch_version=(2, 6, 0)).bad == "12.0"
    assert parse_arch_list("12.0", torch_version=(2, 7, 0)).bad is None
    assert parse_arch_list("10.1", torch_version=(2, 7, 0)).bad is None
    assert parse_arch_list("10.1", torch_version=(2, 9, 0)).bad == "10.1"  # 11.0 since CUDA 13
    assert parse_arch_list("Blackwell", torch_version=(2, 6, 0)).bad == "Blackwell"
    assert parse_arch_list("9.0a", torch_version=(2, 0, 1)).bad == "9.0a"


@pytest.mark.parametrize(
    ("cap", "archs", "how"),
    [
        ("8.9", "8.0;8.6", "cubin"),  # same major, lower minor: the binary runs
        ("7.5", "7.0", "cubin"),
        ("12.0", "5.0;9.0", "none"),  # Blackwell on a cu126 wheel
        ("12.1", "10.0;12.0+PTX", "cubin"),
        ("10.0", "9.0+PTX", "ptx"),  # JIT from older PTX
        ("9.0", "9.0a", "cubin"),
        ("7.0", "7.5;8.0;12.0+PTX", "none"),  # Volta on a cu128 wheel
    ],
)
def test_which_compiled_architectures_a_gpu_runs(cap: str, archs: str, how: str) -> None:
    al = parse_arch_list(archs)
    assert runs_on(cap, al.cc(), al.ptx()) == how


def test_unset_arch_list_is_the_gpus_clamped_to_torchs_newest() -> None:
    al = parse_arch_list(None, ["8.0", "12.0", "8.0"], torch_max=(9, 0))
    assert al.items == ["8.0", "9.0+PTX"] and al.from_gpus
    assert parse_arch_list("native", ["8.6"]).items == ["8.6+PTX"]
    assert parse_arch_list("", []).no_gpu
