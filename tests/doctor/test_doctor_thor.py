"""Thor's architecture, which CUDA 13 renamed from 10.1 to 11.0: a TORCH_CUDA_ARCH_LIST naming
the other CUDA major's name is renamed by the fix, never dropped; the names each toolkit and
torch release know are left alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakecuda import Sandbox, apply_fix, by_id, run_doctor_json, statuses

pytestmark = pytest.mark.e2e


def _env(box: Sandbox, nvcc: str, torch: tuple[str, str], arch: str) -> dict[str, str]:
    tk = box.toolkit(f"cuda-{nvcc}", nvcc, gcc_max=14)
    box.compiler("gcc", "gcc", "12.3.0")
    site = box.torch(torch[0], cuda=torch[1])
    return box.env(PATH=[tk / "bin"], CUDA_HOME=tk, PYTHONPATH=site, TORCH_CUDA_ARCH_LIST=arch)


@pytest.mark.parametrize(
    ("nvcc", "torch", "arch", "fix"),
    [
        # torch 2.9+ knows only 11.0: "10.1" is unknown to it, and renamed, not cut.
        ("13.0.88", ("2.9.0+cu130", "13.0"), "8.7;10.1", "8.7;11.0"),
        ("13.0.88", ("2.9.0+cu130", "13.0"), "10.1a+PTX", "11.0a+PTX"),
        # nvcc 12.9 knows no compute_110; torch 2.8 knows Thor as 10.1.
        ("12.9.41", ("2.8.0+cu129", "12.9"), "9.0;11.0", None),
    ],
)
def test_thor_by_the_other_majors_name_is_renamed(tmp_path: Path, nvcc, torch, arch, fix) -> None:
    box = Sandbox(tmp_path)
    env = _env(box, nvcc, torch, arch)
    report, _ = run_doctor_json(env)
    c = by_id(report)["arch_list"]
    assert c["status"] == "fail", c
    if fix is None:
        # torch 2.8 does not know 11.0 at all: its own error, and the rename to 10.1.
        assert c["fix"] == 'export TORCH_CUDA_ARCH_LIST="9.0;10.1"', c
    else:
        assert c["fix"] == f'export TORCH_CUDA_ARCH_LIST="{fix}"', c
    after, _ = run_doctor_json(apply_fix(box, env, c["fix"]))
    assert statuses(after)["arch_list"] == "ok", by_id(after)["arch_list"]


def test_nvcc_13_refuses_10_1_which_torch_2_8_accepts(tmp_path: Path) -> None:
    """torch 2.8 accepts 10.1 but nvcc 13 stops on compute_101, and torch 2.8 knows no 11.0: the
    fix is a CUDA 12.9 toolkit, which still builds it (none is installed here: its package)."""
    box = Sandbox(tmp_path)
    env = _env(box, "13.0.88", ("2.8.0+cu129", "12.9"), "9.0;10.1")
    report, _ = run_doctor_json(env)
    c = by_id(report)["arch_list"]
    assert (
        c["status"] == "fail"
        and "compute_101" in c["detail"]
        and "renamed 10.1 to 11.0" in c["detail"]
    ), c
    assert "knows Thor only as 10.1" in c["detail"]
    assert c["fix"] == (
        "sudo apt-get install -y cuda-toolkit-12-9 && "
        "export CUDA_HOME=/usr/local/cuda-12.9 PATH=/usr/local/cuda-12.9/bin:$PATH"
    )
    # What that fix makes: a 12.9 toolkit in use builds the list as written.
    tk = box.toolkit("cuda-12.9", "12.9.41", gcc_max=14)
    after, _ = run_doctor_json({**env, "CUDA_HOME": str(tk), "PATH": f"{tk}/bin:{env['PATH']}"})
    assert statuses(after)["arch_list"] == "ok", by_id(after)["arch_list"]


@pytest.mark.parametrize(
    ("nvcc", "torch", "arch"),
    [
        ("13.0.88", ("2.9.0+cu130", "13.0"), "8.7;11.0"),
        ("13.0.88", ("2.9.0+cu130", "13.0"), "Blackwell+Tegra"),
        ("12.9.41", ("2.8.0+cu129", "12.9"), "8.7;10.1"),
    ],
)
def test_each_toolkit_s_own_name_for_thor_is_fine(tmp_path: Path, nvcc, torch, arch) -> None:
    report, _ = run_doctor_json(_env(Sandbox(tmp_path), nvcc, torch, arch))
    assert statuses(report)["arch_list"] == "ok", by_id(report)["arch_list"]
