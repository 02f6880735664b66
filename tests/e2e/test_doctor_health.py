"""The GPU's own health from NVML (docs/doctor.md, "The GPU's own health") and the launch that
acts on it: compute mode, processes holding a GPU, uncorrectable ECC errors, pending row remaps and
retired pages, read by the real nvidia-ml-py from the simulated driver (tests/support/simnvml.c
carries these fields), judged by the real `xl doctor` and said or stopped by the real
`xl launch`. Each problem is flagged; each healthy-but-unusual GPU is left alone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fakecuda import Sandbox, by_id, run_doctor_json, statuses
from procs import xl, xl_env
from simnvml import CONFIG_ENV, SimGPU, SimProcess

from xl.gpu import health

pytestmark = pytest.mark.e2e


@pytest.fixture
def sleeper():
    """A real process to hold a GPU: the doctor names it by its pid and its name."""
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=10)
    assert all(p.poll() is not None for p in procs)


def _doctor(tmp_path: Path, sim) -> dict:
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.4", "12.4.131", gcc_max=13)
    env = box.env(
        PATH=[tk / "bin"],
        CUDA_HOME=tk,
        PYTHONPATH=box.torch("2.4.0+cu124", cuda="12.4"),
        LD_LIBRARY_PATH=str(sim.library_dir),
        XL_SIMNVML_CONFIG=sim.env[CONFIG_ENV],
    )
    report, _ = run_doctor_json(env)
    return report


def test_nvml_health_is_read_through_the_real_pynvml(simnvml) -> None:
    sim = simnvml(
        gpus=[
            SimGPU(
                compute_mode=3,
                ecc_unc_volatile=2,
                ecc_unc_aggregate=5,
                remap_corr=1,
                remap_unc=2,
                remap_pending=1,
            ),
            SimGPU(
                model="RTX4090",
                errors={f: 3 for f in ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows")},
            ),
            SimGPU(model="V100", retired_sbe=1, retired_dbe=2, retired_pending=1),
        ]
    )
    with sim.in_process():
        got = health.health([0, 1, 2])
    assert got[0] == health.Health(0, "exclusive_process", 2, 5, 3, True, False, 0, False)
    # GeForce: no ECC, no row remapping: unknown, not zero.
    assert (got[1].ecc_uncorrected, got[1].remap_pending, got[1].compute_mode) == (
        None,
        None,
        "default",
    )
    assert (got[2].retired_pages, got[2].retired_pending) == (3, True)


@pytest.mark.parametrize(
    ("gpu", "status", "detail", "fix"),
    [
        ({"compute_mode": 2}, "fail", "Prohibited", "sudo nvidia-smi -i 0 -c DEFAULT"),
        ({"ecc_unc_volatile": 3}, "fail", "3 uncorrectable ECC", "sudo nvidia-smi -r -i 0"),
        ({"remap_pending": 1, "remap_unc": 1}, "fail", "row remap pending",
         "sudo nvidia-smi -r -i 0"),
        ({"remap_failure": 1}, "fail", "no spare rows", "xl launch --gpus 1 ..."),
        ({"model": "V100", "retired_pending": 1, "retired_dbe": 1}, "fail",
         "page retirement pending", "sudo nvidia-smi -r -i 0"),
        # Healthy but unusual: history already dealt with, or counters the GPU does not have.
        ({"ecc_unc_aggregate": 7}, "ok", None, None),
        ({"remap_corr": 4, "remap_unc": 1}, "ok", None, None),
        ({"model": "V100", "retired_dbe": 2}, "ok", None, None),
        ({"compute_mode": 3}, "ok", "exclusive-process mode, free", None),
        ({"errors": {"nvmlDeviceGetTotalEccErrors": 3, "nvmlDeviceGetRemappedRows": 3,
                     "nvmlDeviceGetRetiredPages": 3}}, "ok", None, None),
    ],
)  # fmt: skip
def test_gpu_health_verdicts(tmp_path: Path, simnvml, gpu: dict, status: str, detail, fix) -> None:
    gpu = dict(gpu)
    model = gpu.pop("model", "A100")
    sim = simnvml(gpus=[SimGPU(model=model, **gpu), SimGPU(model=model)])
    c = by_id(_doctor(tmp_path, sim))["gpus"]
    assert c["status"] == status, c
    if detail:
        assert detail in c["detail"], c
    if fix:
        assert c["fix"].startswith(fix), c
    assert "health" in c["data"] and set(c["data"]["health"]) == {"0", "1"}


def test_a_stale_process_on_an_exclusive_gpu_is_named_with_its_pid(
    tmp_path: Path, simnvml, sleeper
) -> None:
    p = sleeper()
    sim = simnvml(
        gpus=[
            SimGPU(compute_mode=3, processes=[SimProcess(p.pid, 2048)]),
            SimGPU(),
            SimGPU(compute_mode=3),
        ]
    )
    c = by_id(_doctor(tmp_path, sim))["gpus"]
    assert c["status"] == "fail", c
    assert f"GPU 0 is in exclusive-process mode and held by pid {p.pid} (python" in c["detail"]
    assert "busy or unavailable" in c["detail"] and "2.0 GiB" in c["detail"]
    # GPU 2 is exclusive too but free: it is where a rank can go.
    assert c["fix"] == f"kill {p.pid}"
    assert "or leave GPU 0 out: xl launch --gpus 1,2 ..." in c["detail"]
    # The command is real: it ends the process.
    subprocess.run(c["fix"].split(" (")[0].split(), check=True, timeout=10)
    assert p.wait(timeout=10) is not None


def test_processes_on_a_shared_gpu_are_named_and_warned(tmp_path: Path, simnvml, sleeper) -> None:
    p = sleeper()
    sim = simnvml(gpus=[SimGPU(processes=[SimProcess(p.pid, 1024)]), SimGPU()])
    report = _doctor(tmp_path, sim)
    c = by_id(report)["gpus"]
    assert c["status"] == "warn" and f"pid {p.pid} (python" in c["detail"], c
    assert c["data"]["processes"]["0"][0]["pid"] == p.pid
    assert statuses(report)["gpus"] == "warn" and report["status"] != "fail"


# -- xl launch: warned before starting on busy or unhealthy GPUs; stopped without a CUDA torch --


def _launch_env(tmp_path: Path, sim, *, simulated: bool = True, **extra: str) -> dict[str, str]:
    env = xl_env(tmp_path / "home", **sim.env, **extra)
    if not simulated:
        env.pop("XL_SIMULATED_GPUS")
    return env


def test_launch_warns_before_starting_on_busy_or_unhealthy_gpus(
    tmp_path: Path, simnvml, sleeper
) -> None:
    p = sleeper()
    sim = simnvml(
        gpus=[
            SimGPU(processes=[SimProcess(p.pid, 4096)]),
            SimGPU(ecc_unc_volatile=1),
            SimGPU(util_gpu=95),
            SimGPU(),
        ]
    )
    (tmp_path / "t.py").write_text("print('hi')\n")
    env = _launch_env(tmp_path, sim)
    busy = xl(["launch", "--dry-run", "--gpus", "0,1,2", "t.py"], env, cwd=tmp_path)
    assert busy.returncode == 0, busy.stderr
    lines = [ln for ln in busy.stderr.splitlines() if ln.startswith("xl: warning:")]
    assert any(f"GPU 0 is in use by pid {p.pid}" in ln and f"kill {p.pid}" in ln for ln in lines), (
        lines
    )
    assert any(
        "failure: GPU 1 has 1 uncorrectable ECC" in ln and "nvidia-smi -r -i 1" in ln
        for ln in lines
    ), lines
    assert any("GPU 2 is 95% busy" in ln for ln in lines), lines
    # A healthy GPU: not a word.
    quiet = xl(["launch", "--dry-run", "--gpus", "3", "t.py"], env, cwd=tmp_path)
    assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr


def test_launch_with_gpus_and_a_torch_without_cuda_stops_with_the_doctors_fix(
    tmp_path: Path, simnvml
) -> None:
    sim = simnvml(gpus=2)
    box = Sandbox(tmp_path / "box")
    (tmp_path / "t.py").write_text("print('hi')\n")
    home = tmp_path / "home"
    for version, hip in (("2.4.0+cpu", None), ("2.5.1+rocm6.2", "6.2.41133")):
        site = box.torch(version, cuda=None, hip=hip, name=f"site-{version}")
        env = _launch_env(tmp_path, sim, simulated=False, PYTHONPATH=str(site))
        proc = xl(["launch", "--no-tui", "--gpus", "0,1", "t.py"], env, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert line.startswith("xl launch: --gpus 0,1: torch ") and "Traceback" not in proc.stderr
        assert "-m pip install --force-reinstall torch==" in line and "whl/cu124" in line
        assert not (home / "runs").exists() or not os.listdir(home / "runs")  # nothing started
    # The ranks' torch when --env sets their PYTHONPATH: asked of an interpreter that has it.
    via_env = xl(
        [
            "launch", "--no-tui", "--gpus", "0", "--env",
            f"PYTHONPATH={box.root / 'site-2.4.0+cpu'}", "t.py",
        ],
        _launch_env(tmp_path, sim, simulated=False),
        cwd=tmp_path,
    )
    assert via_env.returncode == 2 and "torch 2.4.0+cpu is a CPU-only build" in via_env.stderr, (
        via_env.stderr
    )
    # The healthy sides: a CUDA torch goes on; without --gpus a CPU torch trains on the CPU.
    cuda_site = box.torch("2.4.0+cu124", cuda="12.4", name="site-cuda")
    ok = xl(
        ["launch", "--dry-run", "--gpus", "0,1", "t.py"],
        _launch_env(tmp_path, sim, simulated=False, PYTHONPATH=str(cuda_site)),
        cwd=tmp_path,
    )
    assert ok.returncode == 0, ok.stderr
    cpu = xl(
        ["launch", "--dry-run", "t.py"],
        _launch_env(tmp_path, sim, simulated=False, PYTHONPATH=str(box.root / "site-2.4.0+cpu")),
        cwd=tmp_path,
    )
    assert cpu.returncode == 0, cpu.stderr


def test_mixed_models_and_a_busy_gpu_name_one_list_of_gpus(
    tmp_path: Path, simnvml, sleeper
) -> None:
    """Both fixes say which GPUs to train on: they name the same ones (the majority model's
    GPUs without the busy one), not two different --gpus lists."""
    p = sleeper()
    sim = simnvml(
        gpus=[
            SimGPU(model="H100", processes=[SimProcess(p.pid, 512)]),
            SimGPU(model="A100"),
            SimGPU(model="H100"),
            SimGPU(model="H100"),
        ]
    )
    c = by_id(_doctor(tmp_path, sim))["gpus"]
    assert (
        c["status"] == "warn" and "mixed models" in c["detail"] and f"pid {p.pid}" in c["detail"]
    ), c
    lists = set(re.findall(r"xl launch --gpus (\S+)", c["fix"]))
    assert lists == {"2,3"}, c["fix"]
