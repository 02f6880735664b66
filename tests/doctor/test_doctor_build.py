"""`xl doctor --build`: the `build` check compiles a tiny CUDA extension for real, with this
machine's nvcc and gcc, the way torch's extension builder would, and holds the result against
the static checks. Skipped where there is no CUDA toolkit and gcc (the development machines
have nvcc 13.0 and gcc 12)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fakecuda import (
    ALL_IDS,
    Sandbox,
    apply_fix,
    assert_fix_works,
    assert_fixes_sound,
    by_id,
    run_doctor_json,
    statuses,
    survivors,
)
from where import REPO

pytestmark = pytest.mark.e2e

CUDA = Path("/usr/local/cuda")
GCC = shutil.which("gcc")
if not (CUDA / "bin" / "nvcc").is_file() or GCC is None:
    pytest.skip("needs a CUDA toolkit at /usr/local/cuda and gcc", allow_module_level=True)


@pytest.fixture(autouse=True)
def _no_leftovers(tmp_path: Path):
    """No compiler the doctor started outlives the test."""
    yield
    assert survivors(str(tmp_path)) == []
    assert survivors("xl-doctor-build-") == []


def _env(box: Sandbox, cuda_home: Path = CUDA, **extra: str) -> dict[str, str]:
    return box.env(
        PATH=[cuda_home / "bin", "/usr/bin", "/bin"],
        CUDA_HOME=cuda_home,
        XL_DOCTOR_SHM="/dev/shm",
        extra=extra,
    )


def test_healthy_toolkit_builds_and_plain_doctor_does_not_compile(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    env = _env(box)
    plain, _ = run_doctor_json(env)
    assert [c["id"] for c in plain["checks"]] == ALL_IDS  # no `build` without --build
    report, proc = run_doctor_json(env, "--build")
    assert [c["id"] for c in report["checks"]] == [*ALL_IDS, "build"]
    build = by_id(report)["build"]
    assert build["status"] == "ok", build
    assert "built" in build["detail"] and "--build compiles" in build["detail"]
    steps = build["data"]["steps"]
    assert [s["ok"] for s in steps] == [True, True, True]
    nvcc = steps[0]["argv"]
    # torch's flags: its nvcc, -I$CUDA_HOME/include, COMMON_NVCC_FLAGS, -fPIC, its -std.
    assert nvcc[0] == f"{CUDA}/bin/nvcc" and f"-I{CUDA}/include" in nvcc
    assert "--expt-relaxed-constexpr" in nvcc and "-D__CUDA_NO_HALF_OPERATORS__" in nvcc
    assert "-ccbin" not in nvcc  # no CC: nvcc picks gcc itself
    assert any(a.startswith("-std=c++") for a in nvcc)
    assert f"-L{CUDA}/lib64" in steps[2]["argv"] or f"-L{CUDA}/lib" in steps[2]["argv"]
    assert statuses(report)["host_compiler"] == "ok" and proc.returncode == 0
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("xl-doctor-build-*"))


def test_arch_list_becomes_torchs_gencode_flags(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    report, _ = run_doctor_json(_env(box, TORCH_CUDA_ARCH_LIST="Ampere 9.0"), "--build")
    build = by_id(report)["build"]
    assert build["status"] == "ok", build
    assert build["data"]["arch_flags"] == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_86,code=compute_86",
        "-gencode=arch=compute_86,code=sm_86",
        "-gencode=arch=compute_90,code=sm_90",
    ]


def test_an_arch_nvcc_cannot_build_fails_in_both_verdicts(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    report, proc = run_doctor_json(_env(box, TORCH_CUDA_ARCH_LIST="5.0;8.0"), "--build")
    checks = by_id(report)
    assert checks["arch_list"]["status"] == "fail"  # static: nvcc 13 starts at 7.5
    build = checks["build"]
    assert (
        build["status"] == "fail" and "Unsupported gpu architecture 'compute_50'" in build["detail"]
    )
    assert "as the `arch_list` check says" in build["detail"]
    assert build["fix"] == checks["arch_list"]["fix"] == 'export TORCH_CUDA_ARCH_LIST="8.0"'
    assert proc.returncode == 1


def test_a_compiler_that_errors_fails_with_its_first_error(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    bad = box.script(
        tmp_path / "cc" / "gcc",
        'echo "cc1plus: error: this compiler is broken" >&2\necho "second line" >&2\nexit 1\n',
    )
    report, proc = run_doctor_json(_env(box, CC=str(bad)), "--build")
    checks = by_id(report)
    build = checks["build"]
    assert build["status"] == "fail" and proc.returncode == 1
    assert "'cc1plus: error: this compiler is broken'" in build["detail"]
    assert "second line" not in build["detail"]
    assert build["data"]["steps"][0]["argv"][1:3] == ["-ccbin", str(bad)]  # -ccbin $CC, first
    assert checks["host_compiler"]["status"] == "error"  # it can't even say its version
    assert "as the `host_compiler` check says" in build["detail"]
    assert build["fix"] == "unset CC", build
    assert f"`{bad} --version` shows what is wrong with it" in checks["host_compiler"]["detail"]


def test_cc_naming_a_missing_compiler_fails_and_unsetting_it_builds(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    env = _env(box, CC=str(tmp_path / "nope" / "gcc-99"))
    report, _ = run_doctor_json(env, "--build")
    checks = by_id(report)
    hc = checks["host_compiler"]
    assert hc["status"] == "fail" and "does not exist" in hc["detail"] and "CC" in hc["detail"]
    assert hc["fix"].startswith("unset CC")
    assert checks["build"]["status"] == "fail"
    assert "No such file or directory" in checks["build"]["detail"]
    assert_fix_works(box, env, "host_compiler", "--build")
    after, _ = run_doctor_json(apply_fix(box, env, hc["fix"]), "--build")
    assert by_id(after)["build"]["status"] == "ok"


def test_a_toolkit_without_headers_fails_and_the_fix_builds(tmp_path: Path) -> None:
    """CUDA_HOME with an nvcc but no include/cuda_runtime.h (like /usr/local above a wrapper
    nvcc): nvcc, reached through the symlink, looks for the headers beside it and stops."""
    box = Sandbox(tmp_path)
    tk = tmp_path / "cuda-no-headers"
    (tk / "bin").mkdir(parents=True)
    (tk / "include").mkdir()
    (tk / "bin" / "nvcc").symlink_to(CUDA / "bin" / "nvcc")
    lib = "lib64" if (CUDA / "lib64").is_dir() else "lib"
    (tk / lib).symlink_to(CUDA / lib)
    env = _env(box, tk)
    report, _ = run_doctor_json(env, "--build")
    checks = by_id(report)
    assert checks["cuda_home"]["status"] == "warn"
    build = checks["build"]
    assert build["status"] == "fail"
    assert "fatal error: cuda_runtime.h: No such file or directory" in build["detail"]
    assert "as the `cuda_home` check says" in build["detail"]
    assert_fixes_sound(report)
    after, _ = run_doctor_json(apply_fix(box, env, build["fix"]), "--build")
    assert by_id(after)["build"]["status"] == "ok", by_id(after)["build"]


def test_the_proof_overrules_a_static_failure_and_says_so(tmp_path: Path) -> None:
    """A gcc that says it is 16 (past nvcc 13.0's 15) but is gcc 12 underneath: the static check
    fails it, the compile goes through, the proof wins."""
    box = Sandbox(tmp_path)
    wrapper = box.script(
        tmp_path / "cc" / "gcc",
        'case "$1" in\n'
        "  -dumpfullversion) echo 16.1.0; exit 0;;\n"
        "  --version) echo 'gcc (GCC) 16.1.0'; echo 'Free Software Foundation'; exit 0;;\n"
        "esac\n"
        f'exec {GCC} "$@"\n',
    )
    env = _env(box, CC=str(wrapper))
    plain, _ = run_doctor_json(env)
    assert statuses(plain)["host_compiler"] == "fail"
    report, proc = run_doctor_json(env, "--build")
    checks = by_id(report)
    assert checks["build"]["status"] == "ok", checks["build"]
    assert "overrules the static `host_compiler` failure" in checks["build"]["detail"]
    assert checks["host_compiler"]["status"] == "warn"
    assert "--build proof compiled" in checks["host_compiler"]["detail"]
    assert proc.returncode == 0


def _cuda_torch(box: Sandbox, header: str) -> Path:
    """A CUDA 13 torch install with the pieces a torch extension build reads: its include
    folders (c10/cuda/CUDAException.h) and cpp_extension.py (which -std it passes)."""
    site = box.torch("2.9.0+cu130", cuda="13.0")
    inc = site / "torch" / "include"
    (inc / "c10" / "cuda").mkdir(parents=True)
    (inc / "c10" / "cuda" / "CUDAException.h").write_text(header)
    (inc / "torch" / "csrc" / "api" / "include").mkdir(parents=True)
    (site / "torch" / "utils").mkdir()
    (site / "torch" / "utils" / "cpp_extension.py").write_text("flags = ['-std=c++20']\n")
    return site


def test_a_cuda_torch_adds_a_torch_extension_step(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    good = "#pragma once\n#define C10_CUDA_KERNEL_LAUNCH_CHECK() ((void)0)\n"
    site = _cuda_torch(box, good)
    env = _env(box, PYTHONPATH=str(site), TORCH_CUDA_ARCH_LIST="9.0")
    report, _ = run_doctor_json(env, "--build")
    build = by_id(report)["build"]
    assert build["status"] == "ok", build
    steps = build["data"]["steps"]
    assert len(steps) == 4 and "torch extension" in steps[3]["name"]
    argv = steps[3]["argv"]
    assert f"-I{site}/torch/include" in argv and "-DTORCH_EXTENSION_NAME=xl_probe" in argv
    assert "-std=c++20" in argv and "-gencode=arch=compute_90,code=sm_90" in argv
    # Unset with no GPU visible: torch's builder stops with IndexError before compiling.
    env.pop("TORCH_CUDA_ARCH_LIST")
    report, _ = run_doctor_json(env, "--build")
    checks = by_id(report)
    assert checks["arch_list"]["status"] == "warn" and "IndexError" in checks["arch_list"]["detail"]
    assert checks["build"]["status"] == "fail" and "IndexError" in checks["build"]["detail"]
    assert checks["build"]["fix"] == checks["arch_list"]["fix"]
    # A torch whose CUDA headers do not compile: the first error, quoted.
    bad = _cuda_torch(Sandbox(tmp_path / "bad"), '#error "torch headers from another CUDA"\n')
    report, _ = run_doctor_json(
        {**env, "PYTHONPATH": str(bad), "TORCH_CUDA_ARCH_LIST": "9.0"}, "--build"
    )
    build = by_id(report)["build"]
    assert build["status"] == "fail" and "torch headers from another CUDA" in build["detail"]
    assert "the static checks saw no problem" in build["detail"]


def test_help_explains_the_json_and_build_and_points_at_docs_the_repo_holds(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "xl", "doctor", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=Sandbox(tmp_path).env(PATH=["/usr/bin", "/bin"], COLUMNS="200"),
    )
    assert proc.returncode == 0
    # A page the help names is one a person can open: the repo's own docs, never a file beside it.
    pages = set(re.findall(r"[\w./-]+\.md\b", proc.stdout))
    assert "docs/doctor.md" in pages
    assert all((REPO / page).is_file() for page in pages), pages
    for words in ('"checks"', '"fix"', "--build", "compile", "exit status"):
        assert words in proc.stdout, words
