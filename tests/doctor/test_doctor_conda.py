"""A conda environment whose toolkit is cuda-nvcc without the headers gets conda's command (from
the channel its nvcc came from, at its version), never "point CUDA_HOME at a complete toolkit";
conda-forge's complete layout (headers in targets/<arch>/include) stays the CPATH rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakecuda import Sandbox, by_id, run_doctor_json, statuses

pytestmark = pytest.mark.e2e


def _conda_env(box: Sandbox, channel: str | None) -> tuple[Path, dict[str, str]]:
    prefix = box.toolkit("envs/train", "12.4.131", gcc_max=13, headers=False, cudart=None)
    (prefix / "targets" / "x86_64-linux" / "include" / "crt").mkdir(parents=True)
    meta = prefix / "conda-meta"
    meta.mkdir()
    record = {"name": "cuda-nvcc", "version": "12.4.131", "build": "0"}
    if channel:
        record["channel"] = channel
    (meta / "cuda-nvcc-12.4.131-0.json").write_text(json.dumps(record))
    (meta / "python-3.11.9-h955ad1f_0.json").write_text(json.dumps({"name": "python"}))
    box.compiler("gcc", "gcc", "12.3.0")
    site = box.torch("2.4.0+cu124", cuda="12.4")
    env = box.env(PATH=[prefix / "bin"], CUDA_HOME=prefix, CONDA_PREFIX=prefix, PYTHONPATH=site)
    return prefix, env


@pytest.mark.parametrize(
    ("channel", "want"),
    [
        ("https://conda.anaconda.org/nvidia/label/cuda-12.4.1", "nvidia/label/cuda-12.4.1"),
        ("https://conda.anaconda.org/conda-forge", "conda-forge"),
        (None, "conda-forge"),
    ],
)
def test_a_conda_env_with_cuda_nvcc_but_no_headers_gets_a_conda_command(
    tmp_path: Path, channel, want
) -> None:
    box = Sandbox(tmp_path)
    prefix, env = _conda_env(box, channel)
    report, _ = run_doctor_json(env)
    c = by_id(report)["cuda_home"]
    assert c["status"] == "warn" and "no include/cuda_runtime.h" in c["detail"], c
    inc = prefix / "targets" / "x86_64-linux" / "include"
    assert c["fix"] == (
        f"conda install -y -p {prefix} -c {want} cuda-cudart-dev cuda-libraries-dev "
        "cuda-version=12.4"
        f" && export CPATH={inc}${{CPATH:+:$CPATH}}"
    )
    assert "complete toolkit" not in c["fix"]
    # What the packages install (conda's layout), with the CPATH the fix sets: fine.
    (inc / "cuda_runtime.h").write_text("/* fake */\n")
    after, _ = run_doctor_json({**env, "CPATH": str(inc)})
    assert statuses(after)["cuda_home"] == "ok", by_id(after)["cuda_home"]


def test_a_plain_toolkit_without_headers_and_no_other_gets_nvidias_package(tmp_path: Path) -> None:
    """Not conda, nothing complete installed: the toolkit's package, not a sentence."""
    box = Sandbox(tmp_path)
    tk = box.toolkit("opt/nvcc-only", "12.4.131", gcc_max=13, headers=False)
    box.compiler("gcc", "gcc", "12.3.0")
    env = box.env(PATH=[tk / "bin"], CUDA_HOME=tk, PYTHONPATH=box.torch("2.4.0+cu124", cuda="12.4"))
    c = by_id(run_doctor_json(env)[0])["cuda_home"]
    assert c["status"] == "warn", c
    if not c["fix"].startswith("export CUDA_HOME="):  # a complete toolkit on this machine wins
        assert c["fix"].startswith(
            "sudo apt-get install -y cuda-toolkit-12-4 && export CUDA_HOME=/usr/local/cuda-12.4 "
        )
