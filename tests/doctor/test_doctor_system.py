"""The machine around the GPUs: a container started without GPU access,
/dev/shm filled by dead jobs, and NCCL settings that cannot work; each on a world built for real
and run through the real `xl doctor`, each with the healthy-but-unusual setups left alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakecuda import Sandbox, assert_fix_works, by_id, run_doctor_json, statuses
from simnvml import CONFIG_ENV, SimGPU

pytestmark = pytest.mark.e2e


def _env(box: Sandbox, sim, site: Path, **extra: str) -> dict[str, str]:
    tk = box.toolkit("cuda-12.4", "12.4.131", gcc_max=13)
    return box.env(
        PATH=[tk / "bin"],
        CUDA_HOME=tk,
        PYTHONPATH=site,
        LD_LIBRARY_PATH=str(sim.library_dir),
        XL_SIMNVML_CONFIG=sim.env[CONFIG_ENV],
        extra=extra,
    )


# -- 8. containers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("visible", "status"), [("all", "warn"), ("0,1", "warn"), ("void", "skip")]
)
def test_a_container_started_without_gpus_gets_the_runtimes_fix(
    tmp_path: Path, simnvml, visible: str, status: str
) -> None:
    sim = simnvml(gpus=0, init_error="library_not_found")  # no libnvidia-ml: nothing mounted in
    box = Sandbox(tmp_path)
    report, proc = run_doctor_json(
        _env(box, sim, box.torch("2.4.0+cpu", cuda=None), NVIDIA_VISIBLE_DEVICES=visible)
    )
    d = by_id(report)["driver"]
    assert d["status"] == status and proc.returncode == 0, d
    if status == "warn":
        assert (
            f"NVIDIA_VISIBLE_DEVICES={visible}" in d["detail"]
            and "without GPU access" in d["detail"]
        )
        assert d["fix"] == (
            "sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker "
            "&& docker run --gpus all ..."
        )
        assert "on the host, not in this container" in d["detail"]
    # Installing a driver inside a container breaks it: no fix anywhere says so.
    assert not [c for c in report["checks"] if "install the NVIDIA driver" in (c["fix"] or "")]


@pytest.mark.parametrize("torch", ["2.7.0+cpu", "2.7.0+cu128"])
def test_a_container_without_a_driver_asks_for_gpus_only_when_torch_wants_them(
    tmp_path: Path, simnvml, torch: str
) -> None:
    """A CPU image in docker (its marker, no driver) is a CPU setup: skipped, nothing to run. With
    a CUDA torch it warns with the runtime's command for the host."""
    sim = simnvml(gpus=0, init_error="library_not_found")
    box = Sandbox(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    (root / ".dockerenv").write_text("")
    site = box.torch(torch, cuda="12.8" if "cu" in torch else None)
    report, _ = run_doctor_json(_env(box, sim, site, XL_DOCTOR_ROOT=str(root)))
    d = by_id(report)["driver"]
    if torch.endswith("+cpu"):
        assert d["status"] == "skip" and d["fix"] == "", d
        return
    assert d["status"] == "warn" and d["fix"].startswith("sudo nvidia-ctk runtime configure"), d
    assert "on the host, not in this container" in d["detail"]


def test_in_a_gpu_container_a_driver_upgrade_is_the_hosts(tmp_path: Path, simnvml) -> None:
    sim = simnvml(gpus=[SimGPU()], driver_version="520.61.05", cuda_version=11080)
    box = Sandbox(tmp_path)
    site = box.torch("2.13.0+cu130", cuda="13.0")  # 520 runs only downgrades of it (cu118)
    inside, _ = run_doctor_json(_env(box, sim, site, NVIDIA_VISIBLE_DEVICES="all"))
    dc = by_id(inside)["driver_cuda"]
    assert dc["status"] == "fail" and "on the host, not in this container" in dc["detail"], dc
    assert "apt-get" not in dc["fix"], dc
    # Outside a container (a fake root without a container's marker), a command for this machine.
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "os-release").write_text("ID=ubuntu\nID_LIKE=debian\nVERSION_ID=22.04\n")
    outside, _ = run_doctor_json({**_env(box, sim, site), "XL_DOCTOR_ROOT": str(root)})
    assert (
        by_id(outside)["driver_cuda"]["fix"]
        == "sudo apt-get install -y nvidia-driver-580 && sudo reboot"
    )


# -- 9. /dev/shm: free space and stale segments --------------------------------------------------


def _shm_env(tmp_path: Path, shm: Path) -> dict[str, str]:
    box = Sandbox(tmp_path / "box")
    return box.env(PYTHONPATH=box.torch("2.4.0+cpu", cuda=None), XL_DOCTOR_SHM=str(shm))


def test_stale_nccl_and_torch_segments_are_named_with_the_command_that_removes_them(
    tmp_path: Path,
) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    (shm / "nccl-Zq81xk").write_bytes(b"\0" * 65536)  # left by a killed job: nobody maps it
    (shm / f"torch_{dead.pid}_3712_0").write_bytes(b"\0" * 4096)  # its pid is gone
    (shm / "unrelated.lock").write_bytes(b"")
    live = shm / "nccl-Live42"
    live.write_bytes(b"\0" * 4096)
    starting = shm / "nccl-Young7"  # a job setting up right now: NCCL unlinks it in a moment
    starting.write_bytes(b"\0" * 4096)
    hour_ago = time.time() - 3600
    for old in ("nccl-Zq81xk", f"torch_{dead.pid}_3712_0", "nccl-Live42"):
        os.utime(shm / old, (hour_ago, hour_ago))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import "
            "mmap,sys,time;f=open(sys.argv[1],'r+b');m=mmap.mmap(f.fileno(),0);print('ok',flush=True);time.sleep(60)",
            str(live),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"ok"
        report, _ = run_doctor_json(_shm_env(tmp_path, shm))
        c = by_id(report)["shm"]
        assert c["status"] == "warn", c
        assert "2 stale NCCL/torch segment(s)" in c["detail"] and "nccl-Zq81xk" in c["detail"]
        assert "nccl-Live42" not in c["detail"] + c["fix"] and "unrelated" not in c["fix"]
        assert "nccl-Young7" not in c["detail"] + c["fix"]
        assert c["fix"].startswith("rm -f ")
        subprocess.run(c["fix"], shell=True, check=True, timeout=10)  # the command works
        after, _ = run_doctor_json(_shm_env(tmp_path, shm))
        assert statuses(after)["shm"] == "ok" and live.exists() and starting.exists()
    finally:
        holder.kill()
        holder.wait(timeout=10)


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """A 600 MiB tmpfs: a shared-memory mount that can really fill up (needs root)."""
    mnt = tmp_path / "small-shm"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=600m", "tmpfs", str(mnt)],
        capture_output=True,
        timeout=30,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def test_a_shm_left_full_by_dead_jobs(tmp_path: Path, small_tmpfs: Path) -> None:
    stale = small_tmpfs / "nccl-dead01"
    with open(stale, "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, 560 << 20)  # tmpfs pages, really taken
    os.utime(stale, (time.time() - 3600, time.time() - 3600))  # left by a job an hour ago
    report, _ = run_doctor_json(_shm_env(tmp_path, small_tmpfs))
    c = by_id(report)["shm"]
    assert c["status"] == "warn" and "under 512 MiB free" in c["detail"], c
    assert "nccl-dead01" in c["detail"] and c["fix"] == f"rm -f {stale}"
    subprocess.run(c["fix"], shell=True, check=True, timeout=10)
    after, _ = run_doctor_json(_shm_env(tmp_path, small_tmpfs))
    assert statuses(after)["shm"] == "ok"
    # Full, but of files that are not NCCL's or torch's: no rm of them; grow the mount.
    with open(small_tmpfs / "dataset.bin", "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, 560 << 20)
    full, _ = run_doctor_json(_shm_env(tmp_path, small_tmpfs))
    c = by_id(full)["shm"]
    assert c["status"] == "warn" and "no stale NCCL/torch segments" in c["detail"]
    assert "rm " not in c["fix"] and ("remount" in c["fix"] or "--shm-size" in c["fix"])


# -- 10. NCCL settings that cannot work ------------------------------------------------------------


def _nccl(tmp_path: Path, simnvml, site_kw: dict | None = None, **env: str) -> dict:
    sim = simnvml(gpus=[SimGPU(), SimGPU()])
    box = Sandbox(tmp_path)
    site = box.torch("2.4.0+cu124", cuda="12.4", **(site_kw or {"nccl": "2.20.5"}))
    world = _env(box, sim, site, **env)
    report, _ = run_doctor_json(world)
    c = by_id(report)["nccl"]
    if c["status"] == "fail" and c["fix"].startswith(("unset ", "export ")):
        assert_fix_works(box, world, "nccl")  # applied for real: cleared, and nothing else fails
    return c


def _no_infiniband() -> None:
    if os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"):
        pytest.skip("this machine has InfiniBand devices")


def test_nccl_net_ib_without_infiniband_fails(tmp_path: Path, simnvml) -> None:
    _no_infiniband()
    c = _nccl(tmp_path, simnvml, NCCL_NET="IB")
    assert c["status"] == "fail" and "no InfiniBand device" in c["detail"], c
    assert c["fix"].startswith("unset NCCL_NET")


def test_nccl_net_socket_without_infiniband_is_fine(tmp_path: Path, simnvml) -> None:
    _no_infiniband()
    assert _nccl(tmp_path, simnvml, NCCL_NET="Socket")["status"] == "ok"


def test_nccl_socket_ifname(tmp_path: Path, simnvml) -> None:
    real = sorted(n for n in os.listdir("/sys/class/net") if n != "lo")
    if not real:
        pytest.skip("no network interface besides lo")
    bad = _nccl(tmp_path / "bad", simnvml, NCCL_SOCKET_IFNAME="nosuchnic")
    assert bad["status"] == "fail" and "no socket interface found" in bad["detail"]
    assert bad["fix"] == f"export NCCL_SOCKET_IFNAME={real[0]}"
    # A prefix of a real one, and an exclusion list, select interfaces: fine.
    assert _nccl(tmp_path / "prefix", simnvml, NCCL_SOCKET_IFNAME=real[0][:2])["status"] == "ok"
    assert _nccl(tmp_path / "exclude", simnvml, NCCL_SOCKET_IFNAME="^docker,lo")["status"] == "ok"


def test_an_nccl_wheel_of_another_cuda_major_fails_with_the_reinstall(
    tmp_path: Path, simnvml
) -> None:
    site_kw = {
        "nccl": "2.20.5",
        "nccl_wheels": {"cu11": "2.21.5"},
        "requires_nccl": "nvidia-nccl-cu12==2.20.5",
    }
    c = _nccl(tmp_path, simnvml, site_kw)
    assert c["status"] == "fail" and "nvidia-nccl-cu11 2.21.5" in c["detail"], c
    py = sys.executable
    assert c["fix"] == (
        f"{py} -m pip uninstall -y nvidia-nccl-cu11 && "
        f"{py} -m pip install --force-reinstall --no-deps nvidia-nccl-cu12==2.20.5"
    )
    assert c["data"]["wheels"] == [["nvidia-nccl-cu11", "2.21.5"], ["nvidia-nccl-cu12", "2.20.5"]]


def test_torchs_own_nccl_wheel_alone_is_fine(tmp_path: Path, simnvml) -> None:
    c = _nccl(tmp_path, simnvml, {"nccl": "2.20.5", "requires_nccl": "nvidia-nccl-cu12==2.20.5"})
    assert c["status"] == "ok" and "NCCL 2.20.5" in c["detail"]
