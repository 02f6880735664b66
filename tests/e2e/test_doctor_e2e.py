"""`xl doctor --json` as a real process in scenario sandboxes (fake toolkits, compilers, torch
installs) with the simulated NVML driver; plus this real machine. Each scenario batches several
checks into one process to keep the suite fast."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fakecuda import (
    ALL_IDS,
    Sandbox,
    by_id,
    run_doctor,
    run_doctor_json,
    statuses,
    survivors,
)
from fakecuda import assert_complete as _complete
from simnvml import SimGPU

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def _no_leftovers(tmp_path: Path):
    """Nothing the doctor started from a sandbox outlives the test (scanned, not trusted)."""
    yield
    assert survivors(str(tmp_path)) == []


def _cgroup_folder(tmp_path: Path) -> Path:
    """A folder as a delegated cgroup v2 subtree shows itself (the memory controller offered)."""
    folder = tmp_path / "cgroup"
    folder.mkdir()
    (folder / "cgroup.procs").touch()
    (folder / "cgroup.controllers").write_text("cpu memory pids\n")
    return folder


def test_healthy_gpu_box_every_check_ok(tmp_path: Path, simnvml) -> None:
    sim = simnvml(
        gpus=[SimGPU(model="A100"), SimGPU(model="A100")],
        driver_version="550.54.15",
        cuda_version=12040,
    )
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.4", "12.4.131", gcc_max=13, clang_max=17)
    box.compiler("gcc", "gcc", "12.3.0")
    box.tool("ninja", "1.11.1\n")
    site = box.torch("2.4.0+cu124", cuda="12.4", nccl="2.20.5", pip_nvcc="12.4.131")
    env = box.env(
        PATH=[tk / "bin"],
        CUDA_HOME=tk,
        PYTHONPATH=site,
        LD_LIBRARY_PATH=f"{tk / 'lib64'}:{sim.library_dir}:{box.libcuda()}",
        XL_SIMNVML_CONFIG=sim.env["XL_SIMNVML_CONFIG"],
        CUDA_VISIBLE_DEVICES="1,0",
        CUDA_DEVICE_ORDER="PCI_BUS_ID",
        TORCH_CUDA_ARCH_LIST="8.0",
        HF_TOKEN="hf_topsecretvalue123",
        DB_PASSWORD="hunter2hunter2",
        # a cgroup v2 folder delegated to whoever runs the test (root or not): runs get one
        XL_CGROUP_ROOT=_cgroup_folder(tmp_path),
    )
    report, proc = run_doctor_json(env)
    _complete(report)
    assert statuses(report) == dict.fromkeys(ALL_IDS, "ok"), json.dumps(report["checks"], indent=1)
    assert report["status"] == "ok" and proc.returncode == 0
    checks = by_id(report)
    assert "550.54.15" in checks["driver"]["detail"] and "12.4" in checks["driver"]["detail"]
    assert "2x NVIDIA A100-SXM4-80GB" in checks["gpus"]["detail"]
    assert "12.4" in checks["nvcc"]["detail"]
    assert "NCCL 2.20.5 (nvidia-nccl-cu12)" in checks["nccl"]["detail"]
    assert (
        "gcc 12.3.0" in checks["host_compiler"]["detail"]
        and "<= 13" in checks["host_compiler"]["detail"]
    )
    assert checks["host_compiler"]["data"]["limit_from"].endswith("host_config.h")
    assert checks["cuda_visible_devices"]["data"]["devices"] == [1, 0]
    assert [g["index"] for g in report["gpus"]] == [0, 1]
    pip_tk = [t for t in report["toolkits"] if "pip (nvidia-cuda-nvcc)" in t["found_by"]]
    assert [(t["root"], t["version"]) for t in pip_tk] == [
        (str(site / "nvidia" / "cuda_nvcc"), "12.4.131")
    ]
    # Secret-looking variables never leave the process, in any mode.
    assert "hf_topsecretvalue123" not in proc.stdout and "hunter2hunter2" not in proc.stdout
    text = run_doctor(env)
    assert text.returncode == 0
    assert "hf_topsecretvalue123" not in text.stdout and "hunter2hunter2" not in text.stdout
    assert text.stdout.rstrip().splitlines()[-1].startswith("19 checks: 19 ok")
    assert "\x1b[" not in text.stdout  # not a terminal: plain text


def test_broken_gpu_box_fails_with_fixes(tmp_path: Path, simnvml) -> None:
    sim = simnvml(
        gpus=[SimGPU(model="A100"), SimGPU(model="T4"), SimGPU(model="A100", lost=1)],
        # CUDA 11.8 driver, torch for 12.4: another major, so no minor-version compatibility.
        driver_version="520.61.05",
        cuda_version=11080,
    )
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-11.8", "11.8.89", version_file="txt", gcc_max=11)
    box.compiler("gcc", "gcc", "13.2.0")
    box.compiler("g++-11", "gcc", "11.4.0")
    box.compiler("gcc-11", "gcc", "11.4.0")
    site = box.torch("2.4.0+cu124", cuda="12.4", nccl="2.20.5")
    stray = box.lib_dir("stray-cuda", cudart=[11, 12], nccl=True)
    env = box.env(
        PATH=[tk / "bin"],
        PYTHONPATH=site,
        LD_LIBRARY_PATH=f"{stray}::/nonexistent/lib:{tk / 'lib64'}:{sim.library_dir}",
        XL_SIMNVML_CONFIG=sim.env["XL_SIMNVML_CONFIG"],
        CUDA_VISIBLE_DEVICES="0,0",
        TORCH_CUDA_ARCH_LIST="7.0",
        NCCL_SOCKET_IFNAME="nosuchnic0",
        XL_DOCTOR_SHM=str(tmp_path / "no-shm-here"),
    )
    report, proc = run_doctor_json(env)
    _complete(report)
    st = statuses(report)
    checks = by_id(report)
    assert proc.returncode == 1 and report["status"] == "fail"
    assert st["driver"] == "ok"
    assert st["gpus"] == "fail" and "lost" in checks["gpus"]["detail"]
    # CUDA_HOME unset: torch takes the folder above `which nvcc`.
    assert st["cuda_home"] == "ok" and checks["cuda_home"]["data"]["cuda_home"] == str(tk)
    assert st["torch_cuda_match"] == "fail"
    assert (
        "11.8" in checks["torch_cuda_match"]["detail"]
        and "12.4" in checks["torch_cuda_match"]["detail"]
    )
    assert "DeepSpeed refuses" in checks["torch_cuda_match"]["detail"]
    assert "cu118" in checks["torch_cuda_match"]["fix"]  # no 12.4 toolkit here: the wheel for 11.8
    assert st["driver_cuda"] == "fail" and "11.8" in checks["driver_cuda"]["detail"]
    # The same torch 2.4.0 was published for cu118, which this driver runs (and which the 11.8
    # toolkit builds against): that wheel, the torch_cuda_match check's own, not a driver upgrade.
    assert "insufficient" in checks["driver_cuda"]["detail"]
    assert checks["driver_cuda"]["fix"] == checks["torch_cuda_match"]["fix"].split(": ", 1)[-1]
    assert (
        "torch==2.4.0 --index-url https://download.pytorch.org/whl/cu118"
        in checks["driver_cuda"]["fix"]
    )
    assert st["host_compiler"] == "fail" and "<= 11" in checks["host_compiler"]["detail"]
    assert f"NVCC_CCBIN={box.bin / 'g++-11'}" in checks["host_compiler"]["fix"]
    ld = checks["ld_library_path"]
    assert st["ld_library_path"] == "warn"
    assert "empty entry" in ld["detail"] and "/nonexistent/lib" in ld["detail"]
    assert "libcudart.so.12" in ld["detail"] and "shadows" in ld["detail"]
    assert str(stray) not in ld["fix"] and "/nonexistent/lib" not in ld["fix"]
    assert (
        st["cuda_visible_devices"] == "fail" and "twice" in checks["cuda_visible_devices"]["detail"]
    )
    assert st["cuda_device_order"] == "warn" and "PCI_BUS_ID" in checks["cuda_device_order"]["fix"]
    assert st["arch_list"] == "fail" and "8.0" in checks["arch_list"]["detail"]
    # A 7.0 cubin runs on the T4 (7.5: same major, higher minor); only the A100 is left out.
    assert checks["arch_list"]["fix"] == 'export TORCH_CUDA_ARCH_LIST="7.0;8.0"'
    assert "7.5" not in checks["arch_list"]["detail"]
    # An interface that does not exist stops NCCL at init: a failure, not a slowdown.
    assert st["nccl"] == "fail" and "nosuchnic0" in checks["nccl"]["detail"]
    assert "libnccl.so.2" in checks["nccl"]["detail"]
    # Not on PATH: installed for this interpreter, or put its folder on PATH where it already is.
    beside = os.path.isfile(os.path.join(os.path.dirname(sys.executable), "ninja"))
    want = f"export PATH={os.path.dirname(sys.executable)}:$PATH" if beside else "pip install ninja"
    assert st["ninja"] == "warn" and want in checks["ninja"]["fix"]
    assert st["shm"] == "warn"


def test_minor_mismatch_disagreeing_toolkits_and_driver_not_loaded(tmp_path: Path, simnvml) -> None:
    sim = simnvml(gpus=2, init_error="driver_not_loaded")
    box = Sandbox(tmp_path)
    tk124 = box.toolkit("cuda-12.4", "12.4.131", gcc_max=13)
    tk126 = box.toolkit("cuda-12.6", "12.6.77", gcc_max=13, version_file=None)  # nvcc tells
    tk121 = box.toolkit("cuda-12.1", "12.1.105", gcc_max=12)
    clang = box.compiler("clang", "clang", "18.1.8")  # torch passes `-ccbin $CC` to nvcc
    site = box.torch("2.3.1+cu121", cuda="12.1", nccl="2.18.1", pip_nvcc="13.0.88")
    env = box.env(
        PATH=[tk126 / "bin"],
        CUDA_HOME=tk124,
        PYTHONPATH=site,
        LD_LIBRARY_PATH=str(sim.library_dir),
        XL_SIMNVML_CONFIG=sim.env["XL_SIMNVML_CONFIG"],
        CONDA_PREFIX=tk121,
        CC=clang,
        CUDA_DEVICE_ORDER="SLOWEST_FIRST",
        NCCL_BLOCKING_WAIT="1",
    )
    report, proc = run_doctor_json(env)
    _complete(report)
    st = statuses(report)
    checks = by_id(report)
    assert st["driver"] == "fail" and "modprobe" in checks["driver"]["fix"]
    assert checks["driver"]["data"]["error_kind"] == "driver_not_loaded"
    assert st["gpus"] == "skip"
    assert st["cuda_home"] == "warn" and "12.6" in checks["cuda_home"]["detail"]
    assert st["toolkits"] == "warn" and "disagree" in checks["toolkits"]["detail"]
    assert checks["toolkits"]["data"]["selected"] == {"PATH": str(tk126), "CUDA_HOME": str(tk124)}
    found = {t["root"]: t["version"] for t in checks["toolkits"]["data"]["toolkits"]}
    assert found[str(tk124)] == "12.4.131" and found[str(tk126)] == "12.6.77"
    assert next(t for t in report["toolkits"] if t["root"] == str(tk126))["version_from"] == "nvcc"
    pip13 = str(site / "nvidia" / "cu13")
    assert found[pip13] == "13.0.88"
    tcm = checks["torch_cuda_match"]
    assert st["torch_cuda_match"] == "warn" and "DeepSpeed accepts" in tcm["detail"]
    assert (
        tcm["fix"] == f"export CUDA_HOME={tk121} PATH={tk121}/bin:$PATH"
    )  # conda's 12.1 matches torch
    assert (
        "$CONDA_PREFIX"
        in next(t for t in report["toolkits"] if t["root"] == str(tk121))["found_by"]
    )
    assert st["driver_cuda"] == "skip"
    assert st["host_compiler"] == "fail" and "clang 18.1.8" in checks["host_compiler"]["detail"]
    assert (
        st["cuda_device_order"] == "warn"
        and "SLOWEST_FIRST" in checks["cuda_device_order"]["detail"]
    )
    assert st["nccl"] == "warn" and "TORCH_NCCL_BLOCKING_WAIT" in checks["nccl"]["fix"]
    assert proc.returncode == 1


@pytest.mark.parametrize(
    ("init_error", "status", "words"),
    [
        ("version_mismatch", "fail", "sudo modprobe nvidia"),
        ("no_permission", "fail", "video"),
        ("unknown", "error", "nvidia-smi"),
    ],
)
def test_each_nvml_init_failure_is_named(
    tmp_path: Path, simnvml, init_error: str, status: str, words: str
) -> None:
    sim = simnvml(gpus=1, init_error=init_error)
    box = Sandbox(tmp_path)
    env = box.env(PATH=["/usr/bin"], **sim.env)
    report, _ = run_doctor_json(env)
    _complete(report)
    driver = by_id(report)["driver"]
    assert driver["status"] == status and words in driver["fix"]
    assert by_id(report)["gpus"]["status"] == "skip"


def test_cpu_torch_on_gpu_box_and_consumer_nccl_trap(tmp_path: Path, simnvml) -> None:
    sim = simnvml(
        gpus=[SimGPU(model="RTX4090"), SimGPU(model="RTX4090")],
        driver_version="535.104.05",
        cuda_version=12020,
    )
    box = Sandbox(tmp_path)
    tk = box.toolkit("cuda-12.4", "12.4.131", gcc_max=13)
    env = box.env(
        PATH=[tk / "bin"],
        CUDA_HOME=tk,
        LD_LIBRARY_PATH=str(sim.library_dir),
        XL_SIMNVML_CONFIG=sim.env["XL_SIMNVML_CONFIG"],
        TORCH_CUDA_ARCH_LIST="7.0;7.5",
        CUDA_VISIBLE_DEVICES="",
    )
    report, proc = run_doctor_json(env)  # torch: this venv's CPU build
    _complete(report)
    st = statuses(report)
    checks = by_id(report)
    assert st["torch"] == "fail" and "CPU-only" in checks["torch"]["detail"]
    # The newest wheel the 12.2 driver runs fully: torch's last release on cu121 (2.13 never was).
    assert (
        "torch==2.5.1 --index-url https://download.pytorch.org/whl/cu121" in checks["torch"]["fix"]
    )
    assert st["nccl"] == "warn" and "NCCL_P2P_DISABLE=1 NCCL_IB_DISABLE=1" in checks["nccl"]["fix"]
    assert (
        st["cuda_visible_devices"] == "warn" and "empty" in checks["cuda_visible_devices"]["detail"]
    )
    assert st["cuda_device_order"] == "ok"  # identical GPUs
    assert st["host_compiler"] == "warn"  # no compiler at all on this PATH
    assert st["arch_list"] == "fail" and "leaves out 8.9" in checks["arch_list"]["detail"]
    assert checks["arch_list"]["fix"] == 'export TORCH_CUDA_ARCH_LIST="7.0;7.5;8.9"'
    assert proc.returncode == 1


def test_unbreakable_hangs_garbage_and_bad_bytes(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    box.nvcc_script(box.bin / "nvcc", None, "hang")
    box.compiler("gcc", "gcc", "0", behaviour="garbage")
    conda = tmp_path / "conda"
    box.nvcc_script(conda / "bin" / "nvcc", None, "garbage")
    hang_py = box.script(tmp_path / "py" / "python", f"/bin/sleep {box.marker}\n")
    not_a_dir = tmp_path / "file.so"
    not_a_dir.write_text("x")
    env = {
        k.encode(): v.encode()
        for k, v in box.env(
            CUDA_HOME=tmp_path / "nowhere",
            CONDA_PREFIX=conda,
            LD_LIBRARY_PATH=f"{not_a_dir}:/nonexistent",
        ).items()
    }
    env[b"WEIRD_\xff"] = b"\xfe\xff not utf-8"
    env[b"PATH"] += b":/nonexistent/\xff\xfe"
    env[b"LD_LIBRARY_PATH"] += b":/gone/\xff"
    env[b"TORCH_CUDA_ARCH_LIST"] = b"8.0;\xff\xfe"
    env[b"NCCL_DEBUG"] = b"TRACE"
    report, proc = run_doctor_json(env, "--python", str(hang_py))
    _complete(report)
    st = statuses(report)
    checks = by_id(report)
    assert st["nvcc"] == "error" and "did not answer within" in checks["nvcc"]["detail"]
    assert st["cuda_home"] == "fail" and "nowhere" in checks["cuda_home"]["detail"]
    assert st["host_compiler"] == "error"
    assert st["torch"] == "error" and "did not answer" in checks["torch"]["detail"]
    assert st["toolkits"] == "error" and str(conda) in checks["toolkits"]["detail"]
    assert st["arch_list"] == "fail" and "\ufffd" in checks["arch_list"]["detail"]
    assert st["ld_library_path"] == "warn" and "/gone/\ufffd" in checks["ld_library_path"]["detail"]
    assert st["nccl"] == "warn" and "TRACE" in checks["nccl"]["detail"]
    assert proc.returncode == 1
    assert box.leftovers() == []  # the hanging tools' children were killed with them


def test_real_machine(tmp_path: Path) -> None:
    """This box: CUDA 13.0 toolkit, gcc 12, no driver, CPU torch 2.13.0 in the venv."""
    if not Path("/usr/local/cuda-13.0/bin/nvcc").exists():
        pytest.skip("not the project's reference machine (no /usr/local/cuda-13.0)")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES")
    }
    report, proc = run_doctor_json(env)
    _complete(report)
    st = statuses(report)
    checks = by_id(report)
    assert st["driver"] == "skip" and st["gpus"] == "skip"
    assert checks["driver"]["data"]["error_kind"] == "library_not_found"
    assert st["nvcc"] == "ok" and "13.0" in checks["nvcc"]["detail"]
    assert st["host_compiler"] == "ok" and "gcc 12" in checks["host_compiler"]["detail"]
    assert checks["host_compiler"]["data"]["source"] == "gcc"  # nvcc's default: gcc on PATH
    # LD_LIBRARY_PATH unset: the loader's answer is the ldconfig cache's (read here by hand).
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    cache = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30).stdout
    cudart13 = [
        line.rsplit("=> ", 1)[1].strip()
        for line in cache.splitlines()
        if line.strip().startswith("libcudart.so.13 ") and "x86-64" in line
    ]
    ld = checks["ld_library_path"]
    assert st["ld_library_path"] == "ok"
    assert ld["detail"] == (
        f"unset; the ldconfig cache resolves libcudart.so.13 to {cudart13[0]}"
        if cudart13
        else "unset"
    )
    assert (
        st["torch"] == "ok"
        and "2.13.0" in checks["torch"]["detail"]
        and "CPU-only" in checks["torch"]["detail"]
    )
    assert any(
        t["real"] == "/usr/local/cuda-13.0" and t["version"].startswith("13.0")
        for t in report["toolkits"]
    )
    assert report["torch"]["location"].startswith(str(Path(sys.executable).parent.parent))
    assert proc.returncode == 0  # no driver is a valid CPU setup
    strict = run_doctor(env, "--json", "--strict")
    assert strict.returncode == (1 if report["status"] in ("warn", "error") else 0)
    plain = run_doctor({**env, "NO_COLOR": "1"})
    assert "\x1b[" not in plain.stdout and plain.stdout.rstrip().splitlines()[-1].startswith(
        "19 checks:"
    )
    assert "Traceback" not in plain.stderr


def test_python_without_torch(tmp_path: Path) -> None:
    other = "/usr/bin/python3"
    if not os.path.exists(other) or os.path.realpath(other) == os.path.realpath(sys.executable):
        pytest.skip("no second interpreter at /usr/bin/python3")
    report, proc = run_doctor_json(Sandbox(tmp_path).env(PATH=["/usr/bin"]), "--python", other)
    torch = by_id(report)["torch"]
    if torch["status"] == "ok":
        pytest.skip("/usr/bin/python3 has torch installed")
    assert torch["status"] == "fail" and "not installed" in torch["detail"]
    assert torch["fix"].startswith(f"{other} -m pip install torch") and proc.returncode == 1


def test_bad_usage_is_one_line_exit_2(tmp_path: Path) -> None:
    for args in (["--python", str(tmp_path / "nope")], ["--frobnicate"]):
        proc = run_doctor(os.environ, *args)
        assert proc.returncode == 2
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_json_mode_stays_lean(tmp_path: Path) -> None:
    """--json never pays for Rich, Textual or torch: the doctor's speed budget depends on it."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "xl", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=Sandbox(tmp_path).env(PATH=["/usr/bin"]),
    )
    json.loads(proc.stdout)
    modules = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    loaded = {m.split(".")[0] for m in modules}
    assert "xl.doctor.run" in modules
    assert not loaded & {"rich", "textual", "torch"}, loaded & {"rich", "textual", "torch"}
    assert not {m for m in modules if m == "xl.tui" or m.startswith("xl.tui.")}


def _cgroup_lines(out: str) -> list[str]:
    """The run cgroup check's line and the fix line under it, when there is one."""
    lines = out.splitlines()
    at = next(i for i, ln in enumerate(lines) if "run cgroup:" in ln)
    return lines[at : at + 2]


def test_a_cgroup_warning_prints_its_command_or_says_none_can_be_made(tmp_path: Path) -> None:
    """XL_CGROUP_ROOT at a folder that is no cgroup: the warning's fix is the command that undoes
    it. No cgroup filesystem at all (a mount namespace without them): no command of this user's
    makes one, the warning says so, and no fix line is printed."""
    env = {**os.environ, "XL_CGROUP_ROOT": str(tmp_path)}
    given = run_doctor(env)
    assert "Traceback" not in given.stderr, given.stderr
    warned, fix = _cgroup_lines(given.stdout)
    assert "WARN" in warned and f"XL_CGROUP_ROOT: {tmp_path} is not a cgroup folder" in warned
    assert fix.split() == ["fix:", "unset", "XL_CGROUP_ROOT"]
    assert "no command" not in warned
    umount = "umount -l /sys/fs/cgroup/memory 2>/dev/null; umount -l /sys/fs/cgroup/unified"
    no_mount = f"{umount} 2>/dev/null; umount -l /sys/fs/cgroup 2>/dev/null; "
    if os.geteuid() != 0 or subprocess.run(
        ["unshare", "-m", "true"], capture_output=True, timeout=30
    ).returncode != 0:
        pytest.skip("needs root and unshare -m")
    env = {k: v for k, v in os.environ.items() if k != "XL_CGROUP_ROOT"}
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", f'{no_mount}exec "$0" -m xl doctor', sys.executable],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    warned, after = _cgroup_lines(proc.stdout)
    assert "WARN" in warned and "no cgroup filesystem" in warned, proc.stdout
    assert warned.endswith("; no command run here gives runs one")
    assert "fix:" not in after and "fix:" not in "".join(
        ln for ln in proc.stdout.splitlines() if "cgroup" in ln
    )
