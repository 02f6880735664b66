"""The table of published torch wheels every `pip install torch` fix is checked against, and the
GPU architectures each wheel carries (xl.doctor.wheels, xl.doctor.archs)."""

from __future__ import annotations

import pytest

from xl.doctor.archs import parse_arch_list, runs_on
from xl.doctor.wheels import (
    NEWEST_KNOWN,
    PUBLISHED,
    WHEEL_ARCHS,
    install_command,
    is_published,
    version_for,
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
    cmd = install_command("/py", tag, current)
    assert cmd.endswith(f"--index-url https://download.pytorch.org/whl/{tag}")
    if pin is None:
        assert " torch --index-url" in cmd
    else:
        assert (pin, tag) in PUBLISHED and f"torch=={pin} " in cmd


def test_every_tag_in_the_table_has_an_architecture_list_torch_accepts() -> None:
    tags = {tag for _, tag in PUBLISHED}
    assert tags <= set(WHEEL_ARCHS) and NEWEST_KNOWN == "2.9.1"
    for tag, archs in WHEEL_ARCHS.items():
        assert parse_arch_list(archs).bad is None, tag


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
