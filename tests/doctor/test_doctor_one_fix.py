"""One finding, one fix: the doctor and `xl launch --gpus`'s preflight give the same command from
one place; a wheel the present driver runs is named without a driver upgrade; a downgrade is
said out loud; a build-time concern never turns a torch wheel fix into a driver upgrade."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from fakecuda import Sandbox, apply_fix, by_id, run_doctor_json, statuses
from procs import xl, xl_env
from simnvml import SimGPU

pytestmark = pytest.mark.e2e

RTX5090 = {"model": "H100", "name": "NVIDIA GeForce RTX 5090", "compute_capability": "12.0"}
PIP = re.compile(
    r"-m pip install --force-reinstall torch(==(\S+))? --index-url "
    r"https://download\.pytorch\.org/whl/(cu\d+)"
)


def _doctor_env(box: Sandbox, sim, tk: Path | None, site: Path) -> dict[str, str]:
    return box.env(
        PATH=[tk / "bin"] if tk else [],
        CUDA_HOME=tk,
        PYTHONPATH=site,
        LD_LIBRARY_PATH=str(sim.library_dir),
        XL_SIMNVML_CONFIG=sim.env["XL_SIMNVML_CONFIG"],
    )


def _launch_line(tmp_path: Path, sim, site: Path) -> str:
    """What `xl launch --gpus 0` stops with: one line, the finding's detail then its fix."""
    (tmp_path / "t.py").write_text("print('hi')\n")
    env = xl_env(tmp_path / "home", **sim.env, PYTHONPATH=str(site))
    env.pop("XL_SIMULATED_GPUS")  # a real driver's GPUs: the CPU torch can't run them
    proc = xl(["launch", "--no-tui", "--gpus", "0", "t.py"], env, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert not (tmp_path / "home" / "runs").exists() or not os.listdir(tmp_path / "home" / "runs")
    return line


def _launch_fix(tmp_path: Path, sim, site: Path) -> str:
    """What `xl launch --gpus 0` stops with, its fix part."""
    return _launch_line(tmp_path, sim, site).split("; fix: ", 1)[1]


def test_a_cpu_torch_on_a_575_driver_gets_one_fix_from_launch_and_doctor(
    tmp_path: Path, simnvml
) -> None:
    """torch 2.13 CPU, driver 575 (CUDA 12.9), a CUDA 13.0 toolkit: the driver runs the cu128
    index's torch (the table's newest there, so no pin and no downgrade); both say exactly that."""
    sim = simnvml(gpus=[SimGPU(model="H100")], driver_version="575.51.03", cuda_version=12090)
    box = Sandbox(tmp_path / "box")
    tk = box.toolkit("cuda-13.0", "13.0.88", gcc_max=15)
    box.compiler("gcc", "gcc", "12.3.0")
    site = box.torch("2.13.0+cpu", cuda=None)
    report, proc = run_doctor_json(_doctor_env(box, sim, tk, site))
    t = by_id(report)["torch"]
    assert t["status"] == "fail" and proc.returncode == 1
    assert t["fix"] == (
        f"{sys.executable} -m pip install --force-reinstall torch --index-url "
        "https://download.pytorch.org/whl/cu128"
    )
    assert "driver" not in t["fix"] and "downgrade" not in t["fix"]
    assert _launch_fix(tmp_path, sim, site) == t["fix"]
    # Applied: torch runs on this driver; only the extension toolkit (13.0 vs 12.8) is left to
    # say, by its own checks, with their own fix.
    after, _ = run_doctor_json(apply_fix(box, _doctor_env(box, sim, tk, site), t["fix"]))
    st = statuses(after)
    assert st["torch"] == "ok" and st["driver_cuda"] == "ok", after["checks"]
    assert st["torch_cuda_match"] == "fail" and "13.0" in by_id(after)["torch_cuda_match"]["detail"]


def test_a_downgrade_is_said_out_loud_by_both(tmp_path: Path, simnvml) -> None:
    """Driver 470 (CUDA 11.4) runs only CUDA 11 wheels, the newest of which is torch 2.7.1
    (cu118): a downgrade from 2.13, said as one; the least one, not torch 2.0 from cu117."""
    sim = simnvml(gpus=[SimGPU(model="V100")], driver_version="470.82.01", cuda_version=11040)
    box = Sandbox(tmp_path / "box")
    site = box.torch("2.13.0+cpu", cuda=None)
    report, _ = run_doctor_json(_doctor_env(box, sim, None, site))
    fix = by_id(report)["torch"]["fix"]
    m = PIP.search(fix)
    assert m and m.group(2) == "2.7.1" and m.group(3) == "cu118", fix
    # The fix is the command; the downgrade is said beside it, in the detail, by both.
    assert fix.endswith("/whl/cu118"), fix
    said = (
        "the wheel is a downgrade from torch 2.13.0: 2.7.1 is the newest torch published for cu118"
    )
    assert said in by_id(report)["torch"]["detail"]
    line = _launch_line(tmp_path, sim, site)
    assert said in line and line.endswith(f"; fix: {fix}"), line


@pytest.mark.parametrize("torch", ["2.9.0+cu126", "2.13.0+cu126"])
def test_rtx_5090_with_a_cu126_torch_on_570_gets_the_cu128_wheel(
    tmp_path: Path, simnvml, torch: str
) -> None:
    """570 already runs cu128; the CUDA 12.6 toolkit that can't build sm_120 is the build
    checks' business, not a reason to ask for a driver upgrade."""
    sim = simnvml(gpus=[SimGPU(**RTX5090)], driver_version="570.124.06", cuda_version=12080)
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.6", "12.6.77", gcc_max=13)
    box.compiler("gcc", "gcc", "12.3.0")
    env = _doctor_env(box, sim, tk, box.torch(torch, cuda="12.6"))
    report, _ = run_doctor_json(env)
    t = by_id(report)["torch"]
    assert t["status"] == "fail" and "sm_120" in t["detail"], t
    m = PIP.search(t["fix"])
    assert (
        m and m.group(3) == "cu128" and "driver" not in t["fix"] and "downgrade" not in t["fix"]
    ), t["fix"]
    assert m.group(2) == ("2.9.0" if torch.startswith("2.9") else None)
    after, _ = run_doctor_json(apply_fix(box, env, t["fix"]))
    st = statuses(after)
    assert st["torch"] == "ok" and st["driver_cuda"] == "ok", after["checks"]
    # The toolkit that cannot build sm_120 is named by the arch check, with a toolkit fix.
    assert st["arch_list"] == "fail" and "nvcc 12.6" in by_id(after)["arch_list"]["detail"]


def test_a_cuda_torch_the_driver_runs_is_left_alone_by_launch(tmp_path: Path, simnvml) -> None:
    sim = simnvml(gpus=[SimGPU(model="H100")], driver_version="575.51.03", cuda_version=12090)
    box = Sandbox(tmp_path / "box")
    site = box.torch("2.8.0+cu128", cuda="12.8")
    (tmp_path / "t.py").write_text("print('hi')\n")
    env = xl_env(tmp_path / "home", **sim.env, PYTHONPATH=str(site))
    env.pop("XL_SIMULATED_GPUS")
    proc = xl(["launch", "--dry-run", "--gpus", "0", "t.py"], env, cwd=tmp_path)
    assert proc.returncode == 0 and "pip install" not in proc.stderr, proc.stderr
    assert statuses(run_doctor_json(_doctor_env(box, sim, None, site))[0])["torch"] == "ok"
