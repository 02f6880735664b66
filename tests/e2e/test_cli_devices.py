"""Device variables are judged one way: what `xl doctor` calls CUDA_VISIBLE_DEVICES is what
`xl launch` / `xl demo` do with it (fail stops the launch, warn is said, skip and ok pass), and
a launch says when its GPUs are of different models. All through the real `xl` command."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from procs import kill_run, only_run, run_json, wait_no_processes, xl, xl_env
from simnvml import SimGPU

pytestmark = pytest.mark.e2e


def _doctor_verdict(env: dict[str, str], cwd: Path) -> dict[str, str]:
    proc = xl(["doctor", "--json"], env, cwd=cwd, timeout=60)
    check = next(c for c in json.loads(proc.stdout)["checks"] if c["id"] == "cuda_visible_devices")
    return check


def _launch(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return xl(["launch", "--dry-run", "--json", *args, "train.py"], env, cwd=cwd)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def test_no_driver_a_gpu_index_is_a_skip_and_the_demo_runs_on_cpu(work: Path) -> None:
    """No NVIDIA driver here: CUDA_VISIBLE_DEVICES=0 cannot be checked, so the doctor skips it and
    the demo (which has no --gpus to pass) trains on CPU instead of exiting 2."""
    home = work / "home"
    env = xl_env(home, CUDA_VISIBLE_DEVICES="0", LD_LIBRARY_PATH=str(work))  # no libnvidia-ml here
    assert _doctor_verdict(env, work)["status"] == "skip"
    proc = xl(["demo", "--no-tui", "--seconds", "1", "--nproc", "1"], env, cwd=work, timeout=180)
    run_dir = only_run(home)
    try:
        assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr
        assert "--gpus" not in proc.stderr
        run = run_json(run_dir)
        assert run["status"] == "succeeded" and run["devices"] == []
        assert run["rank_env"]["CUDA_VISIBLE_DEVICES"] == ""
        wait_no_processes(run_dir, timeout=3)
    finally:
        kill_run(run_dir)


@pytest.mark.parametrize("hide", ["-1", ""])
def test_hiding_every_gpu_is_a_warning_in_both(work: Path, simnvml, hide: str) -> None:
    env = xl_env(work / "home", CUDA_VISIBLE_DEVICES=hide, **simnvml(gpus=2).env)
    doctor = _doctor_verdict(env, work)
    assert doctor["status"] == "warn" and "no GPU at all" in doctor["detail"]
    proc = _launch([], env, work)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["env"]["CUDA_VISIBLE_DEVICES"] == ""  # a CPU run, as asked
    assert "warning: CUDA_VISIBLE_DEVICES" in proc.stderr and doctor["detail"] in proc.stderr


def test_a_wrong_index_fails_both_with_the_same_fix(work: Path, simnvml) -> None:
    env = xl_env(
        work / "home",
        CUDA_VISIBLE_DEVICES="0,9",
        CUDA_DEVICE_ORDER="PCI_BUS_ID",
        **simnvml(gpus=2).env,
    )
    doctor = _doctor_verdict(env, work)
    assert doctor["status"] == "fail"
    proc = _launch([], env, work)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert doctor["fix"] in proc.stderr and "or pass --gpus" in proc.stderr
    demo = xl(["demo"], env, cwd=work)
    assert demo.returncode == 2 and doctor["fix"] in demo.stderr and "--gpus" not in demo.stderr
    assert not (work / "home" / "runs").exists()


def test_a_run_over_different_gpu_models_is_warned_about(work: Path, simnvml) -> None:
    sim = simnvml(gpus=[SimGPU(model="H100"), SimGPU(model="A100"), SimGPU(model="H100")])
    env = xl_env(work / "home", **sim.env)
    mixed = _launch(["--gpus", "0,1"], env, work)
    assert mixed.returncode == 0 and "different models" in mixed.stderr and "H100" in mixed.stderr
    alike = _launch(["--gpus", "0,2"], env, work)
    assert alike.returncode == 0 and alike.stderr == ""
