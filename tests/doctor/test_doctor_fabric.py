"""CUDA's own start and the NVSwitch fabric: cuInit in a subprocess (a libcuda built by the test
whose cuInit returns what the scenario needs) and NVML's fabric state (the simulated NVML), under
the real `xl doctor`. An HGX box whose Fabric Manager is not running passed everything before:
it must be named, with the Fabric Manager's start at the driver's version; healthy boxes
(fabric set up, PCIe GPUs, lifetime-only ECC with rows remapped) are left alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakecuda import Sandbox, by_id, run_doctor_json, statuses
from simnvml import SimGPU

pytestmark = pytest.mark.e2e


def _root(
    tmp_path: Path, distro: str = "ubuntu", fabric_manager: bool = False, dpkg: str | None = None
) -> Path:
    """`dpkg`: the Fabric Manager package dpkg lists as installed, at that version."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    os_release = {"ubuntu": "ID=ubuntu\nID_LIKE=debian\n", "rhel": 'ID="rhel"\nID_LIKE="fedora"\n'}[
        distro
    ]
    (root / "etc" / "os-release").write_text(os_release)
    if fabric_manager:
        (root / "usr" / "bin").mkdir(parents=True)
        (root / "usr" / "bin" / "nv-fabricmanager").write_text("")
    if dpkg:
        (root / "var" / "lib" / "dpkg").mkdir(parents=True)
        (root / "var" / "lib" / "dpkg" / "status").write_text(
            "Package: libc6\nStatus: install ok installed\nVersion: 2.39-0ubuntu8\n\n"
            f"Package: nvidia-fabricmanager-570\nStatus: install ok installed\n"
            f"Priority: optional\nVersion: {dpkg}-1\n\n"
        )
    return root


def _doctor(tmp_path: Path, simnvml, *, code: int | None, gpus: list[SimGPU],
            driver: str = "570.124.06", cuda: int = 12080, libcuda_version: str | None = None,
            missing: tuple[str, ...] = (), **root_kw) -> dict:
    """`code`: what cuInit returns (None: no libcuda to load, so NVML's word stands alone);
    `missing`: NVML functions the driver lacks."""
    sim = simnvml(gpus=gpus, driver_version=driver, cuda_version=cuda, missing=missing)
    box = Sandbox(tmp_path / "box")
    libs = [] if code is None else [str(box.libcuda(code=code, version=libcuda_version))]
    env = box.env(
        PYTHONPATH=box.torch("2.7.0+cu128", cuda="12.8"),
        LD_LIBRARY_PATH=":".join([*libs, str(sim.library_dir)]),
        XL_SIMNVML_CONFIG=sim.env["XL_SIMNVML_CONFIG"],
        XL_DOCTOR_ROOT=_root(tmp_path, **root_kw),
    )
    report, _ = run_doctor_json(env)
    return report


def test_hgx_whose_fabric_manager_is_not_running_fails_with_its_install_and_start(
    tmp_path: Path, simnvml
) -> None:
    report = _doctor(
        tmp_path, simnvml, code=802, gpus=[SimGPU(model="H100", fabric_state=1) for _ in range(8)]
    )
    c = by_id(report)["cuda_init"]
    assert c["status"] == "fail" and report["status"] == "fail", c
    assert "NVSwitch fabric is not started on GPU 0, 1, 2, 3, 4, 5, 6, 7" in c["detail"]
    assert (
        "cuInit returns 802 (CUDA_ERROR_SYSTEM_NOT_READY)" in c["detail"]
        and "not installed" in c["detail"]
    )
    assert c["fix"] == (
        "sudo apt-get install -y nvidia-fabricmanager-570=570.124.06-1 && "
        "sudo systemctl enable --now nvidia-fabricmanager"
    )
    assert c["data"]["fabric"]["0"] == {"state": "not_started", "status": None}
    # The driver and the GPUs look healthy: only this check says it.
    st = statuses(report)
    assert st["driver"] == "ok" and st["gpus"] == "ok" and st["driver_cuda"] == "ok", report[
        "checks"
    ]


@pytest.mark.parametrize("installed", ["570.86.10", "570.124.06"], ids=["another", "the-drivers"])
def test_a_fabric_manager_of_another_version_than_the_driver_is_installed_at_the_drivers(
    tmp_path: Path, simnvml, installed: str
) -> None:
    """Fabric Manager refuses to start beside a driver of another version: then the fix installs
    the driver's version before the start; at the driver's version the start alone."""
    report = _doctor(
        tmp_path, simnvml, code=802, gpus=[SimGPU(model="H100", fabric_state=1)] * 4,
        fabric_manager=True, dpkg=installed,
    )
    c = by_id(report)["cuda_init"]
    assert c["status"] == "fail", c
    start = "sudo systemctl enable --now nvidia-fabricmanager"
    if installed == "570.124.06":
        assert c["fix"] == start and "the installed one" not in c["detail"], c
        return
    assert "the installed one is 570.86.10, the driver 570.124.06" in c["detail"], c
    assert c["fix"] == (
        "sudo apt-get install -y --allow-downgrades nvidia-fabricmanager-570=570.124.06-1 && "
        + start
    )


# The fabric's calls a driver may answer: both (the simulated default), only the versioned one
# (a driver that dropped the original), only the original (one before the versioned one).
ONLY_V = ("nvmlDeviceGetGpuFabricInfo",)
ONLY_ORIGINAL = ("nvmlDeviceGetGpuFabricInfoV",)


@pytest.mark.parametrize("missing", [(), ONLY_V, ONLY_ORIGINAL], ids=["both", "v-only", "original"])
def test_nvml_alone_says_the_fabric_is_not_started_whichever_call_the_driver_answers(
    tmp_path: Path, simnvml, missing: tuple[str, ...]
) -> None:
    """No libcuda here to start (cuInit not tried): NVML's fabric state is the only word, read
    through nvmlDeviceGetGpuFabricInfoV (whose one-byte state sits before padding NVML does not
    clear) or the original call."""
    report = _doctor(
        tmp_path, simnvml, code=None, missing=missing, fabric_manager=True,
        gpus=[SimGPU(model="H100", fabric_state=1) for _ in range(8)],
    )
    c = by_id(report)["cuda_init"]
    assert c["status"] == "fail" and report["status"] == "fail", c
    assert "NVSwitch fabric is not started on GPU 0, 1, 2, 3, 4, 5, 6, 7" in c["detail"], c
    assert "cuInit fails with 802 (CUDA_ERROR_SYSTEM_NOT_READY) until it is" in c["detail"]
    assert c["fix"] == "sudo systemctl enable --now nvidia-fabricmanager"
    assert c["data"]["fabric"]["3"] == {"state": "not_started", "status": None}


@pytest.mark.parametrize("missing", [ONLY_V, ONLY_ORIGINAL], ids=["v-only", "original"])
@pytest.mark.parametrize("state", [3, -1], ids=["fabric-set-up", "no-nvswitch"])
def test_a_set_up_fabric_or_none_at_all_is_left_alone_whichever_call_answers(
    tmp_path: Path, simnvml, missing: tuple[str, ...], state: int
) -> None:
    report = _doctor(
        tmp_path, simnvml, code=None, missing=missing,
        gpus=[SimGPU(model="H100", fabric_state=state) for _ in range(4)],
    )
    c = by_id(report)["cuda_init"]
    assert c["status"] == "skip" and "fabric" not in c["detail"].lower(), c
    assert c["data"]["fabric"] == (
        {str(i): {"state": "completed", "status": None} for i in range(4)} if state == 3 else {}
    )


@pytest.mark.parametrize(
    ("driver", "cuda", "distro", "installed", "fix"),
    [
        ("580.65.06", 13000, "ubuntu", False, "sudo apt-get install -y "
                                              "nvidia-fabricmanager=580.65.06-1 && sudo systemctl "
                                              "enable --now nvidia-fabricmanager"),
        ("570.124.06", 12080, "rhel", False, "sudo dnf install -y "
                                             "nvidia-fabric-manager-570.124.06-1 && sudo "
                                             "systemctl enable --now nvidia-fabricmanager"),
        ("570.124.06", 12080, "ubuntu", True, "sudo systemctl enable --now nvidia-fabricmanager"),
    ],
)  # fmt: skip
def test_the_fabric_manager_fix_follows_the_driver_and_the_distribution(
    tmp_path: Path, simnvml, driver, cuda, distro, installed, fix
) -> None:
    """An A100 HGX: NVML reports no fabric state for Ampere, cuInit's 802 says it alone."""
    report = _doctor(tmp_path, simnvml, code=802, gpus=[SimGPU(model="A100")] * 2, driver=driver,
                     cuda=cuda, distro=distro, fabric_manager=installed)
    c = by_id(report)["cuda_init"]
    assert c["status"] == "fail" and "802" in c["detail"] and c["fix"] == fix, c


@pytest.mark.parametrize(
    "gpus",
    [
        [SimGPU(model="H100", fabric_state=3) for _ in range(4)],  # HGX, fabric set up
        [SimGPU(model="L4"), SimGPU(model="L4")],  # PCIe GPUs: no fabric at all
        # The real H100 of 2026-11-27: one lifetime uncorrectable error, its row remapped.
        [SimGPU(model="H100", ecc_unc_aggregate=1, remap_unc=1)],
    ],
)
def test_healthy_boxes_start_cuda_and_are_left_alone(tmp_path: Path, simnvml, gpus) -> None:
    report = _doctor(tmp_path, simnvml, code=0, gpus=gpus)
    st = statuses(report)
    assert st["cuda_init"] == "ok" and st["gpus"] == "ok", report["checks"]
    if gpus[0].fabric_state == 3:
        assert "NVSwitch fabric set up on 4 GPU(s)" in by_id(report)["cuda_init"]["detail"]


def test_a_fabric_still_being_set_up_while_cuda_starts_only_warns(tmp_path: Path, simnvml) -> None:
    report = _doctor(
        tmp_path,
        simnvml,
        code=0,
        gpus=[SimGPU(model="H100", fabric_state=2)] * 2,
        fabric_manager=True,
    )
    c = by_id(report)["cuda_init"]
    assert c["status"] == "warn" and "in progress" in c["detail"], c


def test_cuinit_803_names_the_libcuda_and_leaves_its_fix_to_driver_cuda(
    tmp_path: Path, simnvml
) -> None:
    """A cuda-compat libcuda older than the kernel module on LD_LIBRARY_PATH: cuInit's 803. One
    finding, one fix: driver_cuda gives it, cuda_init names the library and points there."""
    report = _doctor(
        tmp_path, simnvml, code=803, gpus=[SimGPU(model="H100")], libcuda_version="550.54.14"
    )
    c, d = by_id(report)["cuda_init"], by_id(report)["driver_cuda"]
    assert c["status"] == "fail" and "803 (CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)" in c["detail"], c
    assert d["status"] == "fail" and d["fix"].startswith("export LD_LIBRARY_PATH=")
    assert not c["fix"] and "driver_cuda gives the fix" in c["detail"], c


def test_no_gpus_no_cuinit(tmp_path: Path) -> None:
    """Without a driver (this machine) the probe is not run at all."""
    box = Sandbox(tmp_path)
    report, _ = run_doctor_json(box.env(PYTHONPATH=box.torch("2.7.0+cu128", cuda="12.8")))
    c = by_id(report)["cuda_init"]
    assert c["status"] == "skip" and c["data"]["cuinit"] is None, c
    assert c["data"]["cuinit_problem"] == "NVML reports no GPUs"
