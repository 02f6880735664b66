"""Rules that depend on which torch, which toolkit and which libcuda are installed, each on a world
built for real: fake toolkits, fake torch installs read through the interpreter's path, the
simulated NVML, run through the real `xl doctor`. Each rule has its broken setups flagged and its
healthy-but-unusual ones left alone. Every report also passes fakecuda.assert_one_direction
(run_doctor_json): no two fixes in it pull apart."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakecuda import Sandbox, apply_fix, assert_fix_works, by_id, run_doctor_json, statuses
from procs import xl, xl_env
from simnvml import SimGPU

pytestmark = pytest.mark.e2e

V100 = {"model": "V100"}
RTX5090 = {"model": "H100", "name": "NVIDIA GeForce RTX 5090", "compute_capability": "12.0"}
B200 = {"model": "H100", "name": "NVIDIA B200", "compute_capability": "10.0"}


def _env(
    box: Sandbox,
    sim,
    site: Path,
    tk: Path | None = None,
    ld: str = "",
    also: Path | None = None,
    **extra: str,
) -> dict[str, str]:
    """`tk` selected (CUDA_HOME and PATH); `also` another toolkit later on PATH (found, unused)."""
    ld_path = ":".join(p for p in (ld, str(sim.library_dir)) if p)
    return box.env(
        PATH=[t / "bin" for t in (tk, also) if t],
        CUDA_HOME=tk,
        PYTHONPATH=site,
        LD_LIBRARY_PATH=ld_path,
        XL_SIMNVML_CONFIG=sim.env["XL_SIMNVML_CONFIG"],
        extra=extra,
    )


# -- 1. what a wheel carries depends on the torch version, not only on its CUDA tag -------------


@pytest.mark.parametrize(
    ("torch", "status"),
    [
        ("2.9.0+cu128", "ok"),  # 2.8 and later put sm_70 back into cu128
        ("2.8.0+cu128", "ok"),
        ("2.7.1+cu128", "fail"),  # only 2.7's cu128 wheels left it out
        ("2.7.1+cu126", "ok"),
    ],
)
def test_volta_on_cu128_depends_on_the_torch_version(
    tmp_path: Path, simnvml, torch: str, status: str
) -> None:
    sim = simnvml(gpus=[SimGPU(**V100)], driver_version="570.124.06", cuda_version=12080)
    box = Sandbox(tmp_path)
    env = _env(box, sim, box.torch(torch, cuda="12.8" if "cu128" in torch else "12.6"))
    report, _ = run_doctor_json(env)
    t = by_id(report)["torch"]
    assert t["status"] == status, t
    if status == "fail":
        assert "Tesla V100-SXM2-32GB (sm_70)" in t["detail"] and "7.5;8.0" in t["detail"]
        assert t["fix"].endswith("torch==2.7.1 --index-url https://download.pytorch.org/whl/cu126")
        assert_fix_works(box, env, "torch")
    else:
        assert "cu128 has 7.5+ only" not in t["detail"]


@pytest.mark.parametrize(
    ("torch", "cuda", "status"),
    [("2.6.0+cu126", "12.6", "fail"), ("2.7.0+cu128", "12.8", "ok")],
)
def test_arch_list_is_read_with_the_installed_torchs_own_list(
    tmp_path: Path, simnvml, torch: str, cuda: str, status: str
) -> None:
    """12.0 is an architecture torch 2.13 knows; torch 2.6's cpp_extension raises on it."""
    sim = simnvml(gpus=[SimGPU(**RTX5090)], driver_version="570.124.06", cuda_version=12080)
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.8", "12.8.93", gcc_max=14)
    report, _ = run_doctor_json(
        _env(box, sim, box.torch(torch, cuda=cuda), tk, TORCH_CUDA_ARCH_LIST="12.0")
    )
    a = by_id(report)["arch_list"]
    assert a["status"] == status, a
    if status == "fail":
        assert "Unknown CUDA arch (12.0)" in a["detail"] and "torch 2.6.0+cu126" in a["detail"]


def test_unset_arch_list_on_a_5090_needs_nvcc_12_8(tmp_path: Path, simnvml) -> None:
    sim = simnvml(gpus=[SimGPU(**RTX5090)], driver_version="570.124.06", cuda_version=12080)
    box = Sandbox(tmp_path)
    old = box.toolkit("cuda-12.6", "12.6.77", gcc_max=13)
    new = box.toolkit("cuda-12.8", "12.8.93", gcc_max=14)
    box.compiler("gcc", "gcc", "12.3.0")
    site = box.torch("2.7.0+cu128", cuda="12.8")
    env = _env(box, sim, site, old, also=new)
    report, proc = run_doctor_json(env)
    a = by_id(report)["arch_list"]
    assert a["status"] == "fail" and proc.returncode == 1, a
    assert "compute_120" in a["detail"] and "nvcc 12.6" in a["detail"]
    assert a["fix"] == f"export CUDA_HOME={new} PATH={new}/bin:$PATH"
    assert_fix_works(box, env, "arch_list")
    # The healthy side: nvcc 12.8 builds sm_120; an A100 with nvcc 12.6 needs nothing newer.
    fine, _ = run_doctor_json(_env(box, sim, site, new))
    assert statuses(fine)["arch_list"] == "ok"
    sim.update(gpus=[SimGPU(model="A100")])
    a100, _ = run_doctor_json(env)
    assert statuses(a100)["arch_list"] == "ok"


def test_without_a_newer_toolkit_the_fix_is_ptx_the_old_nvcc_can_build(
    tmp_path: Path, simnvml
) -> None:
    sim = simnvml(gpus=[SimGPU(**RTX5090)], driver_version="570.124.06", cuda_version=12080)
    box = Sandbox(tmp_path)
    old = box.toolkit("cuda-12.6", "12.6.77", gcc_max=13)
    env = _env(box, sim, box.torch("2.7.0+cu128", cuda="12.8"), old)
    report, _ = run_doctor_json(env)
    a = by_id(report)["arch_list"]
    assert a["status"] == "fail" and a["fix"].startswith('export TORCH_CUDA_ARCH_LIST="9.0+PTX"')
    after, _ = run_doctor_json(apply_fix(box, env, a["fix"]))
    assert statuses(after)["arch_list"] == "warn"  # runs, through PTX: said, not failed


# -- 2. arch-specific targets run on their own architecture only -------------------------------


@pytest.mark.parametrize(
    ("gpu", "value", "status"),
    [
        (B200, "9.0a+PTX", "fail"),  # not "slower": 9.0a's PTX runs on sm_90 only
        (B200, "9.0+PTX", "warn"),  # plain PTX JITs forward
        ({"model": "H100"}, "9.0a", "ok"),  # Hopper's own target on a Hopper
        (B200, "9.0a;10.0a", "ok"),
    ],
)
def test_arch_specific_targets(tmp_path: Path, simnvml, gpu, value: str, status: str) -> None:
    sim = simnvml(gpus=[SimGPU(**gpu)], driver_version="570.124.06", cuda_version=12080)
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.8", "12.8.93", gcc_max=14)
    env = _env(box, sim, box.torch("2.7.0+cu128", cuda="12.8"), tk, TORCH_CUDA_ARCH_LIST=value)
    report, _ = run_doctor_json(env)
    a = by_id(report)["arch_list"]
    assert a["status"] == status, a
    if status == "fail":
        assert "arch-specific" in a["detail"] and "no kernel image" in a["detail"]
        assert_fix_works(box, env, "arch_list")


# -- 3. forward compatibility: the libcuda that loads decides, not NVML --------------------------


def test_cuda_compat_on_ld_library_path_runs_newer_cuda(tmp_path: Path, simnvml) -> None:
    sim = simnvml(gpus=[SimGPU(model="A100")], driver_version="535.104.05", cuda_version=12020)
    box = Sandbox(tmp_path)
    site = box.torch("2.7.0+cu128", cuda="12.8")
    compat = box.lib_dir("cuda-12.8/compat", libcuda="570.86.10")
    report, _ = run_doctor_json(_env(box, sim, site, ld=str(compat)))
    dc = by_id(report)["driver_cuda"]
    assert dc["status"] == "ok", dc
    assert "forward-compatibility libcuda 570.86.10" in dc["detail"] and "12.2" in dc["detail"]
    assert by_id(report)["driver"]["data"]["cuda_version"] == "12.2"  # NVML: the kernel module's
    # The same machine without the package: 12.8 on a 12.2 driver is minor-version compatibility.
    plain, _ = run_doctor_json(_env(box, sim, site))
    assert statuses(plain)["driver_cuda"] == "warn"


def test_cuda_compat_from_the_ldconfig_cache(tmp_path: Path, simnvml) -> None:
    sim = simnvml(gpus=[SimGPU(model="H100")], driver_version="535.104.05", cuda_version=12020)
    box = Sandbox(tmp_path)
    compat = box.lib_dir("cuda-12.8/compat", libcuda="570.86.10")
    box.ldconfig({"libcuda.so.1": compat / "libcuda.so.1"})
    report, _ = run_doctor_json(_env(box, sim, box.torch("2.7.0+cu128", cuda="12.8")))
    assert statuses(report)["driver_cuda"] == "ok", by_id(report)["driver_cuda"]


@pytest.mark.parametrize(
    ("gpu", "libcuda", "code"),
    [
        ({"model": "RTX4090"}, "570.86.10", "804"),  # forward compatibility: data-center GPUs only
        ({"model": "A100"}, "525.60.13", "803"),  # a libcuda older than the kernel module
    ],
)
def test_a_libcuda_that_cannot_work_fails_and_the_fix_removes_it(
    tmp_path: Path, simnvml, gpu, libcuda: str, code: str
) -> None:
    sim = simnvml(gpus=[SimGPU(**gpu)], driver_version="535.104.05", cuda_version=12020)
    box = Sandbox(tmp_path)
    compat = box.lib_dir("compat", libcuda=libcuda)
    env = _env(box, sim, box.torch("2.4.0+cu124", cuda="12.4"), ld=str(compat))
    report, _ = run_doctor_json(env)
    dc = by_id(report)["driver_cuda"]
    assert dc["status"] == "fail" and f"({code})" in dc["detail"], dc
    assert dc["fix"].startswith("export LD_LIBRARY_PATH=") and dc["fix"].endswith(
        f"{sim.library_dir}"
    )
    assert str(compat) not in dc["fix"]
    assert_fix_works(box, env, "driver_cuda")
    # With LD_LIBRARY_PATH wrong in other ways too, both checks export one and the same value.
    messy = {**env, "LD_LIBRARY_PATH": f"{compat}:/nonexistent/lib:{sim.library_dir}"}
    report, _ = run_doctor_json(messy)
    fixes = {by_id(report)[k]["fix"] for k in ("driver_cuda", "ld_library_path")}
    assert len(fixes) == 1 and "/nonexistent" not in fixes.pop(), fixes


# -- 4. other builds of torch ---------------------------------------------------------------------


def test_a_rocm_torch_on_nvidia_gpus_fails_with_the_cuda_wheel(tmp_path: Path, simnvml) -> None:
    sim = simnvml(gpus=[SimGPU(model="A100")], driver_version="550.54.15", cuda_version=12040)
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.4", "12.4.131", gcc_max=13)
    env = _env(box, sim, box.torch("2.5.1+rocm6.2", cuda=None, hip="6.2.41133"), tk)
    report, proc = run_doctor_json(env)
    t = by_id(report)["torch"]
    assert t["status"] == "fail" and proc.returncode == 1
    assert "ROCm (HIP 6.2.41133)" in t["detail"] and "NVIDIA" in t["detail"]
    assert t["fix"].endswith("torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124")
    assert_fix_works(box, env, "torch")


def test_a_rocm_torch_without_nvidia_gpus_is_fine(tmp_path: Path, simnvml) -> None:
    sim = simnvml(gpus=0, init_error="library_not_found")
    box = Sandbox(tmp_path)
    report, _ = run_doctor_json(
        _env(box, sim, box.torch("2.5.1+rocm6.2", cuda=None, hip="6.2.41133"))
    )
    assert statuses(report)["torch"] == "ok"


# -- 5. one direction for every fix ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("torch", "cuda", "want"),
    [("2.7.0+cu128", "12.8", "cuda-12.8"), ("2.4.0+cu124", "12.4", "cuda-12.4")],
)
def test_cuda_home_and_path_disagreeing_every_fix_points_at_torchs_toolkit(
    tmp_path: Path, simnvml, torch: str, cuda: str, want: str
) -> None:
    sim = simnvml(gpus=[SimGPU(model="A100")], driver_version="570.124.06", cuda_version=12080)
    box = Sandbox(tmp_path)
    tk124 = box.toolkit("cuda-12.4", "12.4.131", gcc_max=13)
    tk128 = box.toolkit("cuda-12.8", "12.8.93", gcc_max=14)
    box.compiler("gcc", "gcc", "12.3.0")
    env = box.env(
        PATH=[tk128 / "bin"],
        CUDA_HOME=tk124,
        PYTHONPATH=box.torch(torch, cuda=cuda),
        LD_LIBRARY_PATH=str(sim.library_dir),
        XL_SIMNVML_CONFIG=sim.env["XL_SIMNVML_CONFIG"],
    )
    report, _ = run_doctor_json(env)  # assert_one_direction: one toolkit in every fix
    checks = by_id(report)
    assert checks["cuda_home"]["status"] == "warn"
    named = [c["fix"] for c in report["checks"] if "CUDA_HOME=" in (c["fix"] or "")]
    assert named and all(f"CUDA_HOME={tmp_path / want} " in fix for fix in named), named
    assert_fix_works(box, env, "cuda_home")


# -- 6. MIG: one CUDA process enumerates one MIG instance ------------------------------------------


def test_more_than_one_mig_instance_is_refused(tmp_path: Path, simnvml) -> None:
    sim = simnvml(gpus=[SimGPU(model="A100", mig=1)])
    box = Sandbox(tmp_path)
    a, b = "MIG-3b9f2d1e-0000-5000-8000-000000000001", "MIG-3b9f2d1e-0000-5000-8000-000000000002"
    env = _env(box, sim, box.torch("2.4.0+cu124", cuda="12.4"), CUDA_VISIBLE_DEVICES=f"{a},{b}")
    report, proc = run_doctor_json(env)
    c = by_id(report)["cuda_visible_devices"]
    assert c["status"] == "fail" and proc.returncode == 1
    assert "2 MIG instances" in c["detail"] and "only one" in c["detail"]
    assert c["fix"] == f"export CUDA_VISIBLE_DEVICES={a}"
    assert_fix_works(box, env, "cuda_visible_devices")
    one, _ = run_doctor_json({**env, "CUDA_VISIBLE_DEVICES": b})
    assert statuses(one)["cuda_visible_devices"] == "ok"


def test_xl_launch_refuses_two_mig_instances_as_the_doctor_does(tmp_path: Path, simnvml) -> None:
    sim = simnvml(gpus=[SimGPU(model="A100", mig=1)])
    a, b = "MIG-3b9f2d1e-0000-5000-8000-000000000001", "MIG-3b9f2d1e-0000-5000-8000-000000000002"
    (tmp_path / "t.py").write_text("print('hi')\n")
    env = xl_env(tmp_path / "home", **sim.env, CUDA_VISIBLE_DEVICES=f"{a},{b}")
    proc = xl(["launch", "--dry-run", "t.py"], env, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "2 MIG instances" in proc.stderr and f"export CUDA_VISIBLE_DEVICES={a}" in proc.stderr


def test_a_wheel_the_driver_runs_comes_before_a_driver_upgrade_even_against_the_toolkit(
    tmp_path: Path, simnvml
) -> None:
    """A CPU torch, a CUDA 12.4 driver and only a CUDA 13.0 toolkit: any cu12 wheel makes
    torch_cuda_match fail (another major, a build-time concern its own check then fixes), cu130
    needs a newer driver. The wheel the present driver runs is the fix, not a driver upgrade;
    it is a downgrade (2.8 was never on cu124), said as one."""
    sim = simnvml(gpus=[SimGPU(model="A100")], driver_version="550.54.15", cuda_version=12040)
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-13.0", "13.0.88", gcc_max=15)
    report, _ = run_doctor_json(_env(box, sim, box.torch("2.8.0+cpu", cuda=None), tk))
    t = by_id(report)["torch"]
    assert t["status"] == "fail" and "upgrade" not in t["fix"]
    assert "torch==2.6.0 --index-url https://download.pytorch.org/whl/cu124" in t["fix"]
    assert t["fix"].endswith("/whl/cu124")
    assert (
        "the wheel is a downgrade from torch 2.8.0: 2.6.0 is the newest torch published for cu124"
    ) in t["detail"]
    # With a 12.x toolkit a wheel the driver runs exists: no upgrade asked for.
    tk12 = box.toolkit("cuda-12.4", "12.4.131", gcc_max=13)
    plain, _ = run_doctor_json(
        _env(box, sim, box.torch("2.8.0+cpu", cuda=None, name="site2"), tk12)
    )
    assert (
        "upgrade" not in by_id(plain)["torch"]["fix"] and "whl/cu12" in by_id(plain)["torch"]["fix"]
    )
