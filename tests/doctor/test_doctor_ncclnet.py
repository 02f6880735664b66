"""NCCL's InfiniBand and plugin variables against what NCCL will really use (the HCAs with an
active port in /sys/class/infiniband of a fake root, XL_DOCTOR_ROOT; a plugin library the loader
finds): NCCL falls back to TCP without a word, so the doctor says it; selections NCCL reads as
meant are left alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakecuda import Sandbox, apply_fix, by_id, run_doctor_json, statuses
from simnvml import SimGPU

pytestmark = pytest.mark.e2e


def _root(tmp_path: Path, hcas: dict[str, str]) -> Path:
    root = tmp_path / "root"
    ib = root / "sys" / "class" / "infiniband"
    ib.mkdir(parents=True)
    for dev, state in hcas.items():
        port = ib / dev / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text(state + "\n")
    return root


def _nccl(
    tmp_path: Path, simnvml, hcas: dict[str, str], **env: str
) -> tuple[dict, dict[str, str], Sandbox]:
    sim = simnvml(gpus=[SimGPU(), SimGPU()])
    box = Sandbox(tmp_path / "box")
    world = box.env(
        PYTHONPATH=box.torch("2.4.0+cu124", cuda="12.4", nccl="2.20.5"),
        LD_LIBRARY_PATH=str(sim.library_dir),
        XL_SIMNVML_CONFIG=sim.env["XL_SIMNVML_CONFIG"],
        XL_DOCTOR_ROOT=_root(tmp_path, hcas),
        extra=env,
    )
    report, _ = run_doctor_json(world)
    return by_id(report)["nccl"], world, box


HGX = {"mlx5_0": "4: ACTIVE", "mlx5_1": "4: ACTIVE", "mlx5_2": "1: DOWN"}


def test_nccl_ib_hca_naming_absent_hcas_says_nccl_falls_back_to_tcp(
    tmp_path: Path, simnvml
) -> None:
    c, world, box = _nccl(tmp_path, simnvml, HGX, NCCL_IB_HCA="mlx4_0,mlx4_1")
    assert c["status"] == "warn" and "falls back to TCP sockets" in c["detail"], c
    assert "mlx5_0 (active)" in c["detail"] and "mlx5_2 (no active port)" in c["detail"]
    assert c["fix"].startswith("unset NCCL_IB_HCA")
    after, _ = run_doctor_json(apply_fix(box, world, c["fix"]))
    assert statuses(after)["nccl"] == "ok", by_id(after)["nccl"]
    # With NCCL_NET=IB NCCL can't fall back: it stops at init.
    c, _, _ = _nccl(tmp_path / "ib", simnvml, HGX, NCCL_IB_HCA="mlx4_0", NCCL_NET="IB")
    assert c["status"] == "fail" and "Failed to initialize any NET plugin" in c["detail"], c


def test_some_absent_hcas_are_dropped_from_the_list(tmp_path: Path, simnvml) -> None:
    c, world, box = _nccl(tmp_path, simnvml, HGX, NCCL_IB_HCA="=mlx5_0,mlx5_1,mlx5_2,mlx5_9")
    assert (
        c["status"] == "warn"
        and "mlx5_2, mlx5_9" in c["detail"]
        and "uses only mlx5_0, mlx5_1" in c["detail"]
    ), c
    assert c["fix"] == "export NCCL_IB_HCA==mlx5_0,mlx5_1"
    after, _ = run_doctor_json(apply_fix(box, world, c["fix"]))
    assert statuses(after)["nccl"] == "ok", by_id(after)["nccl"]


def test_no_infiniband_at_all_with_nccl_ib_hca_set(tmp_path: Path, simnvml) -> None:
    c, _, _ = _nccl(tmp_path, simnvml, {}, NCCL_IB_HCA="mlx5")
    assert (
        c["status"] == "warn"
        and "no InfiniBand or RoCE device" in c["detail"]
        and c["fix"] == "unset NCCL_IB_HCA"
    ), c


@pytest.mark.parametrize(
    "value", ["mlx5", "=mlx5_0:1,mlx5_1:1", "^mlx5_2", "^=mlx5_1", "mlx5_0"]
)
def test_selections_nccl_reads_as_meant_are_fine(tmp_path: Path, simnvml, value: str) -> None:
    c, _, _ = _nccl(tmp_path, simnvml, HGX, NCCL_IB_HCA=value)
    assert c["status"] == "ok", c


def test_an_ib_hca_switched_off_is_not_judged(tmp_path: Path, simnvml) -> None:
    c, _, _ = _nccl(tmp_path, simnvml, HGX, NCCL_IB_HCA="mlx4", NCCL_IB_DISABLE="1")
    assert "NCCL_IB_HCA" not in c["detail"], c


def test_a_net_plugin_the_loader_cannot_find(tmp_path: Path, simnvml) -> None:
    c, world, box = _nccl(tmp_path, simnvml, HGX, NCCL_NET_PLUGIN="aws-ofi")
    assert c["status"] == "warn" and "libnccl-net-aws-ofi.so" in c["detail"], c
    assert c["fix"] == "unset NCCL_NET_PLUGIN"
    # Found on LD_LIBRARY_PATH (as the AWS OFI plugin's install puts it there), or "none": fine.
    plugin = box.lib_dir("opt/amazon/ofi-nccl/lib")
    (plugin / "libnccl-net-aws-ofi.so").write_bytes(b"\x7fELF fake")
    found, _ = run_doctor_json({**world, "LD_LIBRARY_PATH": f"{plugin}:{world['LD_LIBRARY_PATH']}"})
    assert statuses(found)["nccl"] == "ok", by_id(found)["nccl"]
    none, _ = run_doctor_json({**world, "NCCL_NET_PLUGIN": "none"})
    assert statuses(none)["nccl"] == "ok"
