"""The libraries torch will load (cuDNN, NCCL, cuBLAS through LD_PRELOAD, LD_LIBRARY_PATH, its own
wheels and the ldconfig cache) against the versions its METADATA pins, each rule on a real
`xl doctor` run over a built world: the broken one it must name with a fix that works, and the
healthy-but-unusual ones it must leave alone (a newer NCCL, torch's own wheels on the path,
NGC's builds, WSL2's driver folder)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fakecuda import Sandbox, assert_fix_works, by_id, run_doctor_json, statuses
from simnvml import SimGPU

pytestmark = pytest.mark.e2e

# torch 2.7.0+cu128's own pins (its METADATA on PyPI).
PINS = {
    "nvidia-cudnn-cu12": "9.7.1.26",
    "nvidia-nccl-cu12": "2.26.2",
    "nvidia-cublas-cu12": "12.8.3.14",
}


def _world(
    box: Sandbox, sim, *, ld: list[Path] = (), wheels: dict[str, str] | None = None, **extra: str
):
    tk = box.toolkit("cuda-12.8", "12.8.93", gcc_max=14)
    box.compiler("gcc", "gcc", "12.3.0")
    box.tool("ninja", "1.11.1\n")
    site = box.torch(
        "2.7.0+cu128",
        cuda="12.8",
        requires=PINS,
        wheels=PINS if wheels is None else wheels,
        pip_libs={"libcudart.so.12": "12.8.90"},
    )
    env = box.env(
        PATH=[tk / "bin"],
        CUDA_HOME=tk,
        PYTHONPATH=site,
        LD_LIBRARY_PATH=":".join([*(str(p) for p in ld), str(sim.library_dir)]),
        XL_SIMNVML_CONFIG=sim.env["XL_SIMNVML_CONFIG"],
        extra=extra,
    )
    return env, site, tk


def _sim(simnvml):
    return simnvml(gpus=[SimGPU(model="H100")], driver_version="570.124.06", cuda_version=12080)


def test_an_older_cudnn_first_on_ld_library_path_fails_and_the_fix_works(
    tmp_path: Path, simnvml
) -> None:
    sim = _sim(simnvml)
    box = Sandbox(tmp_path)
    old = box.lib_dir("opt/cudnn-9.1/lib", libs={"libcudnn.so.9": "9.1.0"})
    env, _, tk = _world(box, sim, ld=[old])
    report, proc = run_doctor_json(env)
    c = by_id(report)["cuda_libraries"]
    assert c["status"] == "fail" and proc.returncode == 1, c
    assert f"{old}/libcudnn.so.9 (9.1.0)" in c["detail"] and "cuDNN 9.7.1.26" in c["detail"]
    assert "cuDNN version incompatibility" in c["detail"]
    # The one LD_LIBRARY_PATH every fix sets: without the old cuDNN, with the toolkit's lib64.
    assert c["fix"] == f"export LD_LIBRARY_PATH={tk / 'lib64'}:{sim.library_dir}"
    # Said once: the LD_LIBRARY_PATH check refers to it (not "no conflicting CUDA libraries")
    # and gives no second fix.
    ld = by_id(report)["ld_library_path"]
    assert ld["status"] == "ok" and not ld["fix"], ld
    assert "no conflicting" not in ld["detail"] and f"{old}/libcudnn.so.9 (9.1.0)" in ld["detail"]
    assert "see cuda_libraries" in ld["detail"]
    assert [x["id"] for x in report["checks"] if c["fix"] in (x["fix"] or "")] == ["cuda_libraries"]
    assert_fix_works(box, env, "cuda_libraries")


def test_an_older_nccl_in_ld_preload_fails_with_the_preload_taken_out(
    tmp_path: Path, simnvml
) -> None:
    sim = _sim(simnvml)
    box = Sandbox(tmp_path)
    nccl = box.lib_dir("nccl-2.18/lib", libs={"libnccl.so.2": "2.18.3"})
    keep = box.lib_dir("jemalloc") / "libjemalloc.so.2"
    keep.write_bytes(b"\x7fELF fake")
    env, _, _ = _world(box, sim, LD_PRELOAD=f"{keep} {nccl}/libnccl.so.2")
    report, _ = run_doctor_json(env)
    c = by_id(report)["cuda_libraries"]
    assert c["status"] == "fail" and "LD_PRELOAD's" in c["detail"] and "(2.18.3)" in c["detail"], c
    assert "NCCL 2.26.2" in c["detail"] and "undefined symbol" in c["detail"]
    assert c["fix"] == f"export LD_PRELOAD={keep}"
    assert_fix_works(box, env, "cuda_libraries")
    # Alone in LD_PRELOAD, the fix unsets it.
    alone, _ = run_doctor_json({**env, "LD_PRELOAD": f"{nccl}/libnccl.so.2"})
    assert by_id(alone)["cuda_libraries"]["fix"] == "unset LD_PRELOAD"


@pytest.mark.parametrize("version", ["2.18.3", "2.27.7"], ids=["older", "newer"])
def test_an_nccl_preloaded_by_its_soname_is_the_one_ld_library_path_finds(
    tmp_path: Path, simnvml, version: str
) -> None:
    """`LD_PRELOAD=libnccl.so.2` names no folder: the loader finds it on LD_LIBRARY_PATH. An
    older one fails, and the fix takes out the preload and the folder (else the same old NCCL
    loads through LD_LIBRARY_PATH next); a newer one, the usual early NCCL fix, is fine."""
    sim = _sim(simnvml)
    box = Sandbox(tmp_path)
    nccl = box.lib_dir(f"nccl-{version}/lib", libs={"libnccl.so.2": version})
    env, _, tk = _world(box, sim, ld=[nccl], LD_PRELOAD="libnccl.so.2")
    report, proc = run_doctor_json(env)
    c = by_id(report)["cuda_libraries"]
    if version == "2.27.7":
        assert c["status"] == "ok" and "newer than torch's 2.26.2" in c["detail"], c
        assert proc.returncode == 0
        return
    assert c["status"] == "fail" and "LD_PRELOAD's libnccl.so.2 (2.18.3)" in c["detail"], c
    assert f"LD_LIBRARY_PATH's {nccl}/libnccl.so.2 (2.18.3)" in c["detail"]
    assert c["fix"] == f"unset LD_PRELOAD; export LD_LIBRARY_PATH={tk / 'lib64'}:{sim.library_dir}"
    assert_fix_works(box, env, "cuda_libraries")


def test_a_newer_nccl_preloaded_over_an_older_one_on_the_path_is_fine(
    tmp_path: Path, simnvml
) -> None:
    """The preload is what loads: the older NCCL behind it on LD_LIBRARY_PATH never does, so
    nothing fails and nothing calls it older than torch's pin."""
    sim = _sim(simnvml)
    box = Sandbox(tmp_path)
    old = box.lib_dir("nccl-2.18/lib", libs={"libnccl.so.2": "2.18.3"})
    new = box.lib_dir("nccl-2.27/lib", libs={"libnccl.so.2": "2.27.7"})
    env, _, _ = _world(box, sim, ld=[old], LD_PRELOAD=f"{new}/libnccl.so.2")
    report, proc = run_doctor_json(env)
    c, ld = by_id(report)["cuda_libraries"], by_id(report)["ld_library_path"]
    assert c["status"] == "ok" and "NCCL 2.27.7" in c["detail"], c
    assert ld["status"] == "ok" and "older than torch's pin" not in ld["detail"], ld
    assert proc.returncode == 0


def test_an_installed_nccl_wheel_older_than_torchs_pin_fails_with_the_pin(
    tmp_path: Path, simnvml
) -> None:
    sim = _sim(simnvml)
    box = Sandbox(tmp_path)
    env, _site, _ = _world(box, sim, wheels={**PINS, "nvidia-nccl-cu12": "2.21.5"})
    report, _ = run_doctor_json(env)
    c = by_id(report)["cuda_libraries"]
    assert c["status"] == "fail" and "the installed nvidia-nccl-cu12 2.21.5" in c["detail"], c
    assert c["fix"].endswith(" -m pip install nvidia-nccl-cu12==2.26.2")
    # The fix applied (the pinned wheel installed): nothing left to say.
    fixed = box.torch("2.7.0+cu128", cuda="12.8", requires=PINS, wheels=PINS, name="site-fixed")
    after, _ = run_doctor_json({**env, "PYTHONPATH": str(fixed)})
    assert statuses(after)["cuda_libraries"] == "ok"


@pytest.mark.parametrize("installed", ["2.18.1", "2.26.2"], ids=["below-the-pin", "the-pin"])
def test_torchs_pin_in_the_older_metadata_form_is_read_too(
    tmp_path: Path, simnvml, installed: str
) -> None:
    """Wheels built before 2023 write `Requires-Dist: nvidia-nccl-cu12 (==2.26.2) ; ...`: the
    pin is the same, and an NCCL wheel pinned below it fails with pip's exact pin; the pinned
    version itself is fine."""
    sim = _sim(simnvml)
    box = Sandbox(tmp_path)
    env, site, _ = _world(box, sim, wheels={**PINS, "nvidia-nccl-cu12": installed})
    meta = site / "torch-2.7.0+cu128.dist-info" / "METADATA"
    meta.write_text(meta.read_text().replace("==", " (==").replace("; platform", ") ; platform"))
    assert "Requires-Dist: nvidia-nccl-cu12 (==2.26.2) ; platform_system" in meta.read_text()
    report, proc = run_doctor_json(env)
    c = by_id(report)["cuda_libraries"]
    if installed == "2.26.2":
        assert c["status"] == "ok" and proc.returncode == 0, c
        return
    assert c["status"] == "fail" and "the installed nvidia-nccl-cu12 2.18.1" in c["detail"], c
    assert "NCCL 2.26.2" in c["detail"] and "undefined symbol" in c["detail"]
    assert c["fix"] == f"{sys.executable} -m pip install nvidia-nccl-cu12==2.26.2"


def test_a_newer_nccl_first_on_ld_library_path_is_fine(tmp_path: Path, simnvml) -> None:
    """The usual way to take an NCCL fix early: NCCL keeps its ABI, so nothing warns."""
    sim = _sim(simnvml)
    box = Sandbox(tmp_path)
    new = box.lib_dir("nccl-2.27/lib", libs={"libnccl.so.2": "2.27.7"})
    env, _, _ = _world(box, sim, ld=[new])
    report, proc = run_doctor_json(env)
    st = statuses(report)
    c = by_id(report)["cuda_libraries"]
    assert (
        c["status"] == "ok"
        and "NCCL 2.27.7" in c["detail"]
        and "newer than torch's 2.26.2" in c["detail"]
    ), c
    assert st["nccl"] == "ok" and st["ld_library_path"] == "ok", (
        by_id(report)["nccl"],
        by_id(report)["ld_library_path"],
    )
    assert proc.returncode == 0


def test_torchs_own_wheels_on_ld_library_path_shadow_nothing(tmp_path: Path, simnvml) -> None:
    """Launch scripts that name torch's nvidia/*/lib folders on LD_LIBRARY_PATH: the runtime
    there is the toolkit's CUDA 12.8, and the cuDNN and NCCL are torch's own."""
    sim = _sim(simnvml)
    box = Sandbox(tmp_path)
    env, site, tk = _world(box, sim)
    nv = site / "nvidia"
    own = [nv / "cuda_runtime" / "lib", nv / "cudnn" / "lib", nv / "nccl" / "lib"]
    env["LD_LIBRARY_PATH"] = ":".join(
        [*(str(p) for p in own), str(tk / "lib64"), env["LD_LIBRARY_PATH"]]
    )
    report, proc = run_doctor_json(env)
    st = statuses(report)
    assert st["ld_library_path"] == "ok", by_id(report)["ld_library_path"]
    assert st["cuda_libraries"] == "ok" and st["toolkits"] == "ok", report["checks"]
    assert proc.returncode == 0
    # Another runtime than the toolkit's in an unrelated folder ahead of it is still said.
    other = box.lib_dir("cuda-12.4/lib64", cudart=[12])
    env2 = {**env, "LD_LIBRARY_PATH": f"{other}:{tk / 'lib64'}:{env['LD_LIBRARY_PATH']}"}
    assert statuses(run_doctor_json(env2)[0])["ld_library_path"] == "warn"


def test_ngc_builds_pin_nothing_and_are_not_compared(tmp_path: Path, simnvml) -> None:
    """NGC's torch links the container's own cuDNN and NCCL (no nvidia-* pins): fine."""
    sim = _sim(simnvml)
    box = Sandbox(tmp_path)
    tk = box.toolkit("usr/local/cuda-12.8", "12.8.93", gcc_max=14)
    libs = box.lib_dir(
        "usr/lib/x86_64-linux-gnu", libs={"libnccl.so.2": "2.25.1", "libcudnn.so.9": "9.7.0"}
    )
    box.ldconfig({"libnccl.so.2": libs / "libnccl.so.2", "libcudnn.so.9": libs / "libcudnn.so.9"})
    box.compiler("gcc", "gcc", "12.3.0")
    box.tool("ninja", "1.11.1\n")
    site = box.torch("2.7.0a0+7c8ec84dab.nv25.03", cuda="12.8")
    env = box.env(
        PATH=[tk / "bin"],
        CUDA_HOME=tk,
        PYTHONPATH=site,
        LD_LIBRARY_PATH=f"{tk / 'lib64'}:{sim.library_dir}",
        XL_SIMNVML_CONFIG=sim.env["XL_SIMNVML_CONFIG"],
    )
    report, proc = run_doctor_json(env)
    st = statuses(report)
    assert (
        st["cuda_libraries"] == "ok"
        and "pins no nvidia-* wheels" in by_id(report)["cuda_libraries"]["detail"]
    )
    assert not [k for k, s in st.items() if s in ("fail", "warn")], report["checks"]
    assert proc.returncode == 0


@pytest.mark.parametrize("linked", [False, True])
def test_wsl2s_driver_folder_on_the_path_is_fine(tmp_path: Path, simnvml, linked: bool) -> None:
    """WSL2 puts the Windows driver's libcuda in /usr/lib/wsl/lib as libcuda.so.1.1 (a plain
    file, or a link some setups make): no driver version, nothing to compare."""
    sim = _sim(simnvml)
    box = Sandbox(tmp_path)
    wsl = box.root / "usr" / "lib" / "wsl" / "lib"
    wsl.mkdir(parents=True)
    (wsl / "libcuda.so.1.1").write_bytes(b"\x7fELF fake")
    if linked:
        (wsl / "libcuda.so.1").symlink_to("libcuda.so.1.1")
    else:
        (wsl / "libcuda.so.1").write_bytes(b"\x7fELF fake")
    (wsl / "libdxcore.so").write_bytes(b"\x7fELF fake")
    env, _, _ = _world(box, sim, ld=[wsl])
    report, proc = run_doctor_json(env)
    assert not [k for k, s in statuses(report).items() if s in ("fail", "warn")], report["checks"]
    assert proc.returncode == 0


def test_the_ldconfig_cache_is_what_loads_when_torchs_wheel_is_missing(
    tmp_path: Path, simnvml
) -> None:
    sim = _sim(simnvml)
    box = Sandbox(tmp_path)
    libs = box.lib_dir("usr/lib/x86_64-linux-gnu", libs={"libcudnn.so.9": "9.0.0"})
    box.ldconfig({"libcudnn.so.9": libs / "libcudnn.so.9"})
    env, _, _ = _world(box, sim, wheels={k: v for k, v in PINS.items() if "cudnn" not in k})
    c = by_id(run_doctor_json(env)[0])["cuda_libraries"]
    assert (
        c["status"] == "fail" and "ldconfig cache's" in c["detail"] and "(9.0.0)" in c["detail"]
    ), c
    assert c["fix"].endswith("-m pip install nvidia-cudnn-cu12==9.7.1.26")
    # With torch's own wheel installed, its RUNPATH finds that one before the cache.
    fine, _ = run_doctor_json(_world(Sandbox(tmp_path / "b"), sim)[0] | {"PATH": env["PATH"]})
    assert statuses(fine)["cuda_libraries"] == "ok"


def test_an_older_cublas_on_the_path_is_said_once_and_an_older_cusparse_still_by_ld_library_path(
    tmp_path: Path, simnvml
) -> None:
    """torch's own cuBLAS wheel is both a library LD_LIBRARY_PATH can shadow and one its METADATA
    pins: the cuda_libraries check owns it (one finding, one fix); a cuSPARSE it does not judge
    stays the LD_LIBRARY_PATH check's."""
    sim = _sim(simnvml)
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.8", "12.8.93", gcc_max=14)
    box.compiler("gcc", "gcc", "12.3.0")
    box.tool("ninja", "1.11.1\n")
    site = box.torch(
        "2.7.0+cu128",
        cuda="12.8",
        requires=PINS,
        wheels={**PINS, "nvidia-cusparse-cu12": "12.5.7.53"},
        pip_libs={
            "libcudart.so.12": "12.8.90",
            "libcublas.so.12": "12.8.3.14",
            "libcusparse.so.12": "12.5.7.53",
        },
    )
    old = box.lib_dir("opt/cublas-12.1/lib", libs={"libcublas.so.12": "12.1.3.1"})
    env = box.env(
        PATH=[tk / "bin"],
        CUDA_HOME=tk,
        PYTHONPATH=site,
        LD_LIBRARY_PATH=f"{old}:{tk / 'lib64'}:{sim.library_dir}",
        XL_SIMNVML_CONFIG=sim.env["XL_SIMNVML_CONFIG"],
    )
    report, _ = run_doctor_json(env)
    c, ld = by_id(report)["cuda_libraries"], by_id(report)["ld_library_path"]
    assert c["status"] == "fail" and f"{old}/libcublas.so.12 (12.1.3.1)" in c["detail"], c
    assert ld["status"] == "ok" and not ld["fix"] and "see cuda_libraries" in ld["detail"], ld
    assert_fix_works(box, env, "cuda_libraries")
    # An older cuSPARSE (no pin judged by cuda_libraries): the LD_LIBRARY_PATH check's own finding.
    sparse = box.lib_dir("opt/cusparse-12.1/lib", libs={"libcusparse.so.12": "12.1.0.106"})
    env2 = {**env, "LD_LIBRARY_PATH": f"{sparse}:{tk / 'lib64'}:{sim.library_dir}"}
    report2, _ = run_doctor_json(env2)
    ld2 = by_id(report2)["ld_library_path"]
    assert (
        ld2["status"] == "fail" and f"{sparse}/libcusparse.so.12 (12.1.0.106)" in ld2["detail"]
    ), ld2
    assert statuses(report2)["cuda_libraries"] == "ok"
