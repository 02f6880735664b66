"""The rules a CUDA expert applies, each on a setup built for real (fake toolkits, fake torch
installs, the simulated NVML) and run through the real `xl doctor`; healthy-but-unusual setups
next to each rule must not be flagged. Every fix is checked for being a published wheel or a
real path (run_doctor_json does that for every report) and, where a test applies it, for
clearing its check without making another one fail."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fakecuda import Sandbox, apply_fix, assert_fix_works, by_id, run_doctor_json, statuses
from simnvml import SimGPU

from xl.doctor.archs import parse_arch_list

pytestmark = pytest.mark.e2e

RTX5090 = {"model": "H100", "name": "NVIDIA GeForce RTX 5090", "compute_capability": "12.0"}


def _gpu_env(box: Sandbox, sim, tk: Path | None, site: Path, **extra: str) -> dict[str, str]:
    return box.env(
        PATH=[tk / "bin"] if tk else [],
        CUDA_HOME=tk,
        PYTHONPATH=site,
        LD_LIBRARY_PATH=str(sim.library_dir),
        XL_SIMNVML_CONFIG=sim.env["XL_SIMNVML_CONFIG"],
        extra=extra,
    )


# -- driver vs torch's CUDA: NVIDIA's minor-version compatibility ------------------------------


def test_same_major_newer_minor_warns_and_the_fix_works(tmp_path: Path, simnvml) -> None:
    sim = simnvml(gpus=[SimGPU(model="A100")], driver_version="550.54.15", cuda_version=12040)
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.8", "12.8.93", gcc_max=14)
    box.compiler("gcc", "gcc", "12.3.0")
    env = _gpu_env(box, sim, tk, box.torch("2.7.0+cu128", cuda="12.8"))
    report, proc = run_doctor_json(env)
    dc = by_id(report)["driver_cuda"]
    assert dc["status"] == "warn" and "minor-version compatibility" in dc["detail"]
    assert "from driver 525" in dc["detail"] and "torch.compile" in dc["detail"]
    # One direction: 2.7 was never on cu124 (its last release there is 2.6.0, a downgrade) and
    # its cu118 wheel would break extension builds against the 12.8 toolkit, so the fix is the
    # driver upgrade that keeps torch 2.7.0; the downgrade is said in the detail.
    assert "-m pip install" not in dc["fix"] and "nvidia" in dc["fix"].lower(), dc["fix"]
    assert "torch==2.6.0 --index-url https://download.pytorch.org/whl/cu124" in dc["detail"]
    assert proc.returncode == 0
    # The alternative said in the detail, applied: the warning goes and nothing else starts failing.
    downgrade = dc["detail"].split("a torch downgrade: ", 1)[1].split("; ")[0]
    after, _ = run_doctor_json(apply_fix(box, env, downgrade))
    assert statuses(after)["driver_cuda"] == "ok"
    assert not [k for k, s in statuses(after).items() if s == "fail"]


@pytest.mark.parametrize(
    ("driver", "cuda", "torch", "status"),
    [
        ("580.65.06", 13000, ("2.9.0+cu130", "13.0"), "ok"),
        ("575.51.03", 12090, ("2.9.0+cu130", "13.0"), "fail"),  # another major
        ("580.65.06", 13000, ("2.8.0+cu128", "12.8"), "ok"),  # a newer driver runs older CUDA
    ],
)
def test_cuda_13_driver_rules(tmp_path: Path, simnvml, driver, cuda, torch, status) -> None:
    sim = simnvml(gpus=[SimGPU(model="H100")], driver_version=driver, cuda_version=cuda)
    box = Sandbox(tmp_path)
    report, _ = run_doctor_json(_gpu_env(box, sim, None, box.torch(torch[0], cuda=torch[1])))
    assert statuses(report)["driver_cuda"] == status, by_id(report)["driver_cuda"]


# -- GPU architectures torch's wheel carries ---------------------------------------------------


def test_blackwell_with_a_wheel_before_sm_120_fails_with_the_wheel_that_fixes_it(
    tmp_path: Path, simnvml
) -> None:
    sim = simnvml(gpus=[SimGPU(**RTX5090)], driver_version="570.124.06", cuda_version=12080)
    box = Sandbox(tmp_path)
    env = _gpu_env(box, sim, None, box.torch("2.6.0+cu126", cuda="12.6"))
    report, proc = run_doctor_json(env)
    t = by_id(report)["torch"]
    assert t["status"] == "fail" and proc.returncode == 1
    assert "RTX 5090 (sm_120)" in t["detail"] and "no kernel image" in t["detail"]
    assert t["fix"].endswith("torch==2.7.0 --index-url https://download.pytorch.org/whl/cu128")
    assert_fix_works(box, env, "torch")


@pytest.mark.parametrize(
    ("gpu", "wheel", "status", "fix"),
    [
        (RTX5090, ("2.7.0+cu128", "12.8"), "ok", None),
        ({"model": "L4"}, ("2.6.0+cu126", "12.6"), "ok", None),  # 8.9 runs the 8.6 cubin
        ({"model": "V100"}, ("2.7.0+cu128", "12.8"), "fail", "torch==2.7.0 --index-url "
                                                             "https://download.pytorch.org/whl/cu126"),
        ({"model": "V100"}, ("2.5.1", "12.4"), "ok", None),  # no +cu tag, no pip libs: not judged
    ],
)  # fmt: skip
def test_gpu_architecture_in_torchs_wheel(tmp_path: Path, simnvml, gpu, wheel, status, fix) -> None:
    sim = simnvml(gpus=[SimGPU(**gpu)], driver_version="570.124.06", cuda_version=12080)
    box = Sandbox(tmp_path)
    report, _ = run_doctor_json(_gpu_env(box, sim, None, box.torch(wheel[0], cuda=wheel[1])))
    t = by_id(report)["torch"]
    assert t["status"] == status, t
    if fix:
        assert t["fix"].endswith(fix)


# -- TORCH_CUDA_ARCH_LIST, read exactly as torch reads it ----------------------------------------

ARCH_VALUES = [
    "8.0", "8.0;8.6+PTX", "8.0 8.6", "Ampere", "Ampere+Tegra;Hopper", "Blackwell", "9.0a;10.0",
    "Kepler+Tesla", "12.0+PTX", "ampere", "8.0,8.6", "8.0;", "sm_80", "8.0+ptx", "7.5 ;8.0",
]  # fmt: skip

_TORCH_SCRIPT = """
import json, os, sys
from torch.utils.cpp_extension import _get_cuda_arch_flags
out = {}
for v in json.loads(sys.argv[1]):
    os.environ["TORCH_CUDA_ARCH_LIST"] = v
    try:
        out[v] = _get_cuda_arch_flags()
    except ValueError as e:
        out[v] = "ValueError"
print(json.dumps(out))
"""


def test_arch_list_parsing_matches_torchs_own_function() -> None:
    """Held against the real torch.utils.cpp_extension._get_cuda_arch_flags of this venv."""
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, "-c", _TORCH_SCRIPT, json.dumps(ARCH_VALUES)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    for value in ARCH_VALUES:
        ours = parse_arch_list(value)
        assert (ours.flags() if ours.bad is None else "ValueError") == theirs[value], value


@pytest.mark.parametrize(
    ("value", "status", "fix"),
    [
        ("ampere", "fail", "Ampere"),  # names are case-sensitive
        ("8.0,9.0", "fail", "8.0;9.0"),  # a comma is not a separator
        ("8.0;9.0;", "fail", "8.0;9.0"),  # a stray ';' is an empty item
        ("Ampere Hopper", "ok", None),  # spaces are
        ("native", "ok", None),
    ],
)
def test_arch_list_e2e(tmp_path: Path, simnvml, value: str, status: str, fix: str | None) -> None:
    sim = simnvml(gpus=[SimGPU(model="A100"), SimGPU(model="H100")])
    box = Sandbox(tmp_path)
    env = _gpu_env(
        box, sim, None, box.torch("2.4.0+cu124", cuda="12.4"), TORCH_CUDA_ARCH_LIST=value
    )
    report, _ = run_doctor_json(env)
    c = by_id(report)["arch_list"]
    assert c["status"] == status, c
    if fix:
        assert c["fix"] == f'export TORCH_CUDA_ARCH_LIST="{fix}"'
        assert "ValueError: Unknown CUDA arch" in c["detail"]
        assert_fix_works(box, env, "arch_list")


# -- the host compiler ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("toolkit", "gcc_max", "torch", "extra", "status", "words"),
    [
        # nvcc's check off, torch's table (12.4: gcc < 14) still refuses gcc 14
        (("cuda-12.4", "12.4.131"), 13, ("2.4.0+cu124", "12.4"), {}, "fail",
         "TORCH_DONT_CHECK_COMPILER_ABI=1"),
        # ... unless TORCH_DONT_CHECK_COMPILER_ABI switches torch's table off too
        (("cuda-12.4", "12.4.131"), 13, ("2.4.0+cu124", "12.4"),
         {"TORCH_DONT_CHECK_COMPILER_ABI": "1"}, "warn", "-allow-unsupported-compiler"),
        # torch's table takes gcc 14 for 12.8; host_config.h says 13 here: nvcc's check is off
        (("cuda-12.8", "12.8.93"), 13, ("2.7.0+cu128", "12.8"), {}, "warn",
         "unsupported by NVIDIA"),
    ],
)  # fmt: skip
def test_allow_unsupported_compiler(
    tmp_path: Path, toolkit, gcc_max, torch, extra, status, words
) -> None:
    box = Sandbox(tmp_path)
    tk = box.toolkit(*toolkit, gcc_max=gcc_max)
    box.compiler("gcc", "gcc", "14.2.0")
    for var in ("NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS"):
        env = box.env(
            PATH=[tk / "bin"],
            CUDA_HOME=tk,
            PYTHONPATH=box.torch(torch[0], cuda=torch[1]),
            extra={var: "-allow-unsupported-compiler --threads 4", **extra},
        )
        report, _ = run_doctor_json(env)
        hc = by_id(report)["host_compiler"]
        assert hc["status"] == status and words in hc["detail"] + hc["fix"], hc
        assert hc["data"]["allow_unsupported_compiler"] == var
    # Without the flag, nvcc itself refuses: a failure.
    env.pop("NVCC_PREPEND_FLAGS")
    assert statuses(run_doctor_json(env)[0])["host_compiler"] == "fail"


def test_cc_naming_a_missing_compiler_is_a_failure_about_cc(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.4", "12.4.131", gcc_max=13)
    box.compiler("gcc", "gcc", "12.3.0")
    box.compiler("gcc-12", "gcc", "12.3.0")
    env = box.env(PATH=[tk / "bin"], CUDA_HOME=tk, CC="/opt/nowhere/bin/gcc-13")
    report, proc = run_doctor_json(env)
    hc = by_id(report)["host_compiler"]
    assert hc["status"] == "fail" and "CC names /opt/nowhere/bin/gcc-13" in hc["detail"]
    assert hc["fix"] == "unset CC"
    assert f"or point CC at an installed gcc: export CC={box.bin / 'gcc-12'}" in hc["detail"]
    assert proc.returncode == 1
    assert_fix_works(box, env, "host_compiler")


# -- toolkit layouts -------------------------------------------------------------------------------


def test_conda_forge_layout_is_about_where_headers_are(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    prefix = box.toolkit("conda-env", "12.4.131", gcc_max=13, headers="conda")
    box.compiler("gcc", "gcc", "12.3.0")
    site = box.torch("2.4.0+cu124", cuda="12.4")
    env = box.env(PATH=[prefix / "bin"], CUDA_HOME=prefix, CONDA_PREFIX=prefix, PYTHONPATH=site)
    report, _ = run_doctor_json(env)
    home = by_id(report)["cuda_home"]
    inc = prefix / "targets" / "x86_64-linux" / "include"
    assert (
        home["status"] == "warn" and "conda-forge" in home["detail"] and str(inc) in home["detail"]
    )
    assert home["fix"] == f"export CPATH={inc}${{CPATH:+:$CPATH}}"
    assert "complete toolkit" not in home["fix"]
    assert_fix_works(box, env, "cuda_home")
    ok_env = {**env, "CPATH": str(inc)}
    assert statuses(run_doctor_json(ok_env)[0])["cuda_home"] == "ok"


def test_pip_nvcc_wheel_with_ptxas_only_and_cuda_13_wheels(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.4", "12.4.131", gcc_max=13)
    box.compiler("gcc", "gcc", "12.3.0")
    # Triton's nvidia-cuda-nvcc-cu12: ptxas, no nvcc. Not a toolkit, and not a problem.
    site = box.torch("2.4.0+cu124", cuda="12.4", pip_ptxas="12.4.127")
    report, _ = run_doctor_json(box.env(PATH=[tk / "bin"], CUDA_HOME=tk, PYTHONPATH=site))
    st = statuses(report)
    assert all(st[k] == "ok" for k in ("cuda_home", "nvcc", "toolkits", "torch_cuda_match"))
    assert str(tk) in [t["root"] for t in report["toolkits"]]
    assert not any("nvidia" in t["root"] for t in report["toolkits"])
    assert not any("cuda_nvcc" in c["fix"] for c in report["checks"])
    # CUDA 13 wheels keep everything in nvidia/cu13.
    site13 = box.torch("2.9.0+cu130", cuda="13.0", pip_nvcc="13.0.88", name="site13")
    report, _ = run_doctor_json(box.env(PYTHONPATH=site13))
    pip = [t for t in report["toolkits"] if "pip (nvidia-cuda-nvcc)" in t["found_by"]]
    assert [(t["root"], t["version"]) for t in pip] == [
        (str(site13 / "nvidia" / "cu13"), "13.0.88")
    ]


# -- libraries torch brings ------------------------------------------------------------------------

CU128_LIBS = {
    "libnvJitLink.so.12": "12.8.93",
    "libcusparse.so.12": "12.5.8.93",
    "libcudart.so.12": "12.8.90",
}


def test_older_toolkit_libs_ahead_of_torchs_own_fail_and_the_fix_works(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.8", "12.8.93", gcc_max=14)
    old = box.lib_dir(
        "cuda-12.1/lib64",
        libs={"libnvJitLink.so.12": "12.1.105", "libcusparse.so.12": "12.1.0.106"},
    )
    site = box.torch("2.7.0+cu128", cuda="12.8", pip_libs=CU128_LIBS)
    env = box.env(
        PATH=[tk / "bin"], CUDA_HOME=tk, PYTHONPATH=site, LD_LIBRARY_PATH=f"{old}:{tk / 'lib64'}"
    )
    report, proc = run_doctor_json(env)
    ld = by_id(report)["ld_library_path"]
    assert ld["status"] == "fail" and proc.returncode == 1
    assert (
        f"{old}/libcusparse.so.12 (12.1.0.106)" in ld["detail"]
        or f"{old}/libnvJitLink.so.12" in ld["detail"]
    )
    assert "undefined symbol" in ld["detail"]
    assert ld["fix"] == f"export LD_LIBRARY_PATH={tk / 'lib64'}"
    assert_fix_works(box, env, "ld_library_path")


def test_newer_or_equal_libs_ahead_of_torchs_are_fine(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.9", "12.9.41", gcc_max=14)
    newer = box.lib_dir("cuda-12.9-libs", libs={"libnvJitLink.so.12": "12.9.41"})
    site = box.torch("2.7.0+cu128", cuda="12.8", pip_libs=CU128_LIBS)
    env = box.env(PATH=[tk / "bin"], CUDA_HOME=tk, PYTHONPATH=site, LD_LIBRARY_PATH=str(newer))
    report, _ = run_doctor_json(env)
    assert statuses(report)["ld_library_path"] != "fail", by_id(report)["ld_library_path"]


def test_a_toolkit_fix_never_trades_one_failure_for_another(tmp_path: Path) -> None:
    """CUDA_HOME names nothing; PATH's toolkit is CUDA 11 but torch is built for 12.4: pointing
    CUDA_HOME at the toolkit in use would make torch's builder refuse (major mismatch), so the fix
    names the 12.4 toolkit LD_LIBRARY_PATH reveals."""
    box = Sandbox(tmp_path)
    old = box.toolkit("cuda-11.8", "11.8.89", gcc_max=11)
    new = box.toolkit("cuda-12.4", "12.4.131", gcc_max=13)
    box.compiler("gcc", "gcc", "11.4.0")
    env = box.env(
        PATH=[old / "bin"],
        CUDA_HOME=tmp_path / "gone",
        LD_LIBRARY_PATH=str(new / "lib64"),
        PYTHONPATH=box.torch("2.4.0+cu124", cuda="12.4"),
    )
    report, _ = run_doctor_json(env)
    home = by_id(report)["cuda_home"]
    assert home["status"] == "fail" and home["fix"].startswith(f"export CUDA_HOME={new} ")
    assert_fix_works(box, env, "cuda_home")
