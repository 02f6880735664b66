"""A node's fingerprint and the comparison of several (doctor/fingerprint.py): each difference
that breaks a run is a stop, each that slows it a warning, each that does not matter nothing;
every verdict both ways, and the fingerprints of simulated GPUs and of the torch a node's ranks
would import."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from simnvml import SimGPU

from xl.doctor.fingerprint import (
    Fingerprint,
    compare,
    gather,
    ib_devices,
    nccl_interfaces,
    node_lines,
)

BASE: dict[str, Any] = {
    "driver": "570",
    "driver_cuda": "12.8",
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "gpu_count": 8,
    "gpu_memory_mib": 81559,
    "torch": "2.7.1+cu128",
    "torch_cuda": "12.8",
    "nccl": "2.26.2",
    "cudnn": "9.7.1.26",
    "python": "3.12.3",
    "shm_bytes": 64 << 30,
    "nccl_ifaces": "eth0,ib0",
    "ib_devices": "mlx5_0,mlx5_1",
    "kernel": "6.8.0-60-generic",
    "container": None,
}


def fp(
    host: str = "gpu-a", env: dict[str, str] | None = None, nproc: int = 8, **fields: Any
) -> Fingerprint:
    return Fingerprint(
        host=host,
        fields={**BASE, **fields},
        env=env or {},
        python="/opt/venv/bin/python",
        nproc=nproc,
        nccl_from="wheel nvidia-nccl-cu12",
        ifname=(env or {}).get("NCCL_SOCKET_IFNAME"),
    )


def nodes(*odd: Fingerprint, alike: int = 2) -> list[tuple[int, Fingerprint]]:
    """``alike`` nodes as BASE (hosts gpu-0...), then the odd ones."""
    prints = [fp(host=f"gpu-{n}") for n in range(alike)] + list(odd)
    return list(enumerate(prints))


def one(prints: list[tuple[int, Fingerprint]]) -> dict[str, Any]:
    diffs = compare(prints)
    assert len(diffs) == 1, diffs
    return diffs[0].to_json()


def test_another_torch_minor_stops_with_the_others_wheel() -> None:
    diff = one(nodes(fp(host="gpu-x", torch="2.6.0+cu128")))
    assert diff == {
        "node": 2,
        "host": "gpu-x",
        "field": "torch",
        "value": "2.6.0+cu128",
        "others": "2.7.1+cu128",
        "severity": "stop",
        "fix": "/opt/venv/bin/python -m pip install --force-reinstall torch==2.7.1 "
        "--index-url https://download.pytorch.org/whl/cu128",
    }


def test_another_torch_patch_only_warns() -> None:
    diff = one(nodes(fp(torch="2.7.0+cu128")))
    assert diff["severity"] == "warn" and diff["others"] == "2.7.1+cu128"


def test_cuda_major_stops_and_minor_warns() -> None:
    stop = compare(nodes(fp(torch_cuda="11.8")))
    assert [(d.field, d.severity) for d in stop] == [("torch_cuda", "stop")]
    warn = compare(nodes(fp(torch_cuda="12.6")))
    assert [(d.field, d.severity) for d in warn] == [("torch_cuda", "warn")]


def test_nccl_minor_stops_with_the_wheel_pin_and_an_unknown_nccl_says_nothing() -> None:
    diff = one(nodes(fp(nccl="2.21.5")))
    assert (diff["severity"], diff["others"]) == ("stop", "2.26.2")
    assert diff["fix"] == "/opt/venv/bin/python -m pip install nvidia-nccl-cu12==2.26.2"
    assert compare(nodes(fp(nccl=None))) == []
    assert one(nodes(fp(nccl="2.26.5")))["severity"] == "warn"


def test_an_nccl_on_one_node_s_library_path_is_named_with_the_path_that_drops_it() -> None:
    odd = Fingerprint(
        host="gpu-x",
        fields={**BASE, "nccl": "2.18.3"},
        python="/opt/venv/bin/python",
        nproc=8,
        nccl_from="LD_LIBRARY_PATH /opt/old-nccl/lib",
        ld_library_path="/usr/local/cuda/lib64:/opt/old-nccl/lib",
    )
    diff = one(nodes(odd))
    assert diff["fix"] == "export LD_LIBRARY_PATH=/usr/local/cuda/lib64"


def test_three_nodes_name_the_odd_one_even_when_it_is_node_0() -> None:
    prints = [(0, fp(host="a", torch="2.6.0+cu128")), (1, fp(host="b")), (2, fp(host="c"))]
    diff = one(prints)
    assert (diff["node"], diff["value"], diff["others"]) == (0, "2.6.0+cu128", "2.7.1+cu128")


def test_smaller_shm_warns_with_the_remount_and_a_larger_one_is_fine() -> None:
    diff = one(nodes(fp(shm_bytes=64 << 20)))
    assert diff["severity"] == "warn"
    assert diff["fix"] == "sudo mount -o remount,size=64G /dev/shm"
    assert compare(nodes(fp(shm_bytes=128 << 30))) == []
    assert compare(nodes(fp(shm_bytes=(64 << 30) - (1 << 30)))) == []  # within 10%


def test_no_infiniband_where_the_others_have_it_warns_the_reverse_does_not() -> None:
    assert one(nodes(fp(ib_devices="")))["severity"] == "warn"
    assert compare(nodes(fp(ib_devices="mlx5_0,mlx5_1,mlx5_2"))) == []


def test_another_gpu_model_warns_with_no_fix() -> None:
    diff = one(nodes(fp(gpu_model="NVIDIA A100-SXM4-80GB")))
    assert (diff["severity"], diff["fix"]) == ("warn", None)


def test_gpus_short_of_nproc_stop_and_fewer_gpus_than_the_others_alone_do_not() -> None:
    diff = one(nodes(fp(host="gpu-x", gpu_count=4)))
    assert (diff["field"], diff["value"], diff["others"], diff["severity"]) == (
        "gpu_count",
        4,
        8,
        "stop",
    )
    assert diff["fix"] == "give every node's xl launch --nproc 4"
    assert compare(nodes(fp(gpu_count=4, nproc=4))) == []
    # CPU ranks: no GPU anywhere, nothing to count
    cpu = [(n, fp(gpu_count=0, nproc=2, gpu_model=None)) for n in range(2)]
    assert compare(cpu) == []


def test_an_interface_that_is_not_there_stops_and_other_names_that_exist_do_not() -> None:
    missing = fp(env={"NCCL_SOCKET_IFNAME": "=ens9"}, nccl_ifaces="")
    diff = one(nodes(missing))
    assert (diff["field"], diff["severity"], diff["fix"]) == (
        "nccl_ifaces",
        "stop",
        "unset NCCL_SOCKET_IFNAME",
    )
    assert diff["others"] == "eth0,ib0"
    other_names = fp(env={"NCCL_SOCKET_IFNAME": "ens"}, nccl_ifaces="ens5")
    assert compare(nodes(other_names)) == []


def test_variables_warn_with_the_export_and_harmless_ones_say_nothing() -> None:
    diff = one(nodes(fp(env={"NCCL_ALGO": "Tree"})))
    assert (diff["field"], diff["value"], diff["others"]) == ("env.NCCL_ALGO", "Tree", None)
    assert diff["fix"] == "unset NCCL_ALGO"
    prints = [(0, fp(env={"NCCL_ALGO": "Ring"})), (1, fp(env={"NCCL_ALGO": "Tree tree"}))]
    assert one(prints)["fix"] == "export NCCL_ALGO=Ring"
    harmless = fp(
        host="elsewhere",
        env={"NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "3,2", "TORCH_HOME": "/scratch/t"},
    )
    assert compare(nodes(harmless)) == []


def test_a_node_alike_in_all_that_matters_says_nothing_and_lines_are_one_per_node() -> None:
    assert compare(nodes(fp(host="another-host"))) == []
    diffs = compare(nodes(fp(host="gpu-x", torch="2.6.0+cu128", nccl="2.21.5")))
    [line] = node_lines(diffs)
    assert line.startswith("node 2 (gpu-x) differs [stops the run]: NCCL 2.21.5 (others 2.26.2)")
    assert "torch 2.6.0+cu128 (others 2.7.1+cu128)" in line and "fix there: " in line


def test_fingerprint_round_trips_through_json() -> None:
    one_fp = fp(env={"NCCL_ALGO": "Ring"})
    assert Fingerprint.from_json(one_fp.to_json()) == one_fp


@pytest.mark.parametrize(
    ("ifname", "present", "used"),
    [
        (None, ["lo", "docker0", "eth0", "ib0"], ["eth0", "ib0"]),
        ("eth", ["lo", "eth0", "eth10", "ib0"], ["eth0", "eth10"]),
        ("=eth1", ["eth0", "eth10", "eth1"], ["eth1"]),
        ("^docker,lo", ["lo", "docker0", "ens5"], ["ens5"]),
        ("ens9", ["lo", "eth0"], []),
    ],
)
def test_the_interfaces_nccl_would_use(
    ifname: str | None, present: list[str], used: list[str]
) -> None:
    assert nccl_interfaces(ifname, present) == used


def test_simulated_gpus_are_fingerprinted_as_nvml_lists_them(simnvml: Any) -> None:
    sim = simnvml(
        gpus=[SimGPU(model="H100"), SimGPU(model="H100")],
        driver_version="570.86.15",
        cuda_version=12080,
    )
    with sim.in_process():
        got = gather(sys.executable, dict(os.environ), nproc=2)
    fields = got.fields
    assert (fields["driver"], fields["driver_cuda"], fields["gpu_count"]) == ("570", "12.8", 2)
    assert "H100" in str(fields["gpu_model"]) and isinstance(fields["gpu_memory_mib"], int)
    other = simnvml(gpus=[SimGPU(model="A100")], driver_version="550.54.15", cuda_version=12040)
    with other.in_process():
        odd = gather(sys.executable, dict(os.environ), nproc=2)
    diffs = {d.field: d for d in compare([(0, got), (1, odd)])}
    assert diffs["gpu_count"].severity == "stop" and diffs["gpu_model"].severity == "warn"
    assert diffs["driver"].value == "550" and diffs["driver"].others == "570"


def test_the_nccl_torch_would_load_comes_from_the_library_path_first(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch" / "version.py").write_text("__version__ = '2.7.1+cu128'\ncuda = '12.8'\n")
    (site / "torch-2.7.1.dist-info").mkdir()
    (site / "nvidia_nccl_cu12-2.26.2.dist-info").mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("LD_LIBRARY_PATH", None)
    wheel = gather(sys.executable, env)
    assert (wheel.fields["torch"], wheel.fields["nccl"]) == ("2.7.1+cu128", "2.26.2")
    assert wheel.nccl_from == "wheel nvidia-nccl-cu12"
    old = tmp_path / "old-nccl"
    old.mkdir()
    (old / "libnccl.so.2.18.3").write_bytes(b"")
    (old / "libnccl.so.2").symlink_to("libnccl.so.2.18.3")
    shadowed = gather(sys.executable, {**env, "LD_LIBRARY_PATH": str(old)})
    assert shadowed.fields["nccl"] == "2.18.3"
    [diff] = [d for d in compare([(0, wheel), (1, shadowed)]) if d.field == "nccl"]
    assert (diff.node, diff.severity, diff.fix) == (1, "stop", "unset LD_LIBRARY_PATH")
    # A newer NCCL first on the path is another NCCL all the same, but only a warning.
    new = tmp_path / "new-nccl"
    new.mkdir()
    (new / "libnccl.so.2.26.5").write_bytes(b"")
    newer = gather(sys.executable, {**env, "LD_LIBRARY_PATH": str(new)})
    assert [d.severity for d in compare([(0, wheel), (1, newer)]) if d.field == "nccl"] == ["warn"]


@pytest.mark.parametrize(
    ("env", "used"),
    [
        ({}, ["mlx5_0", "mlx5_1", "mlx5_10"]),
        ({"NCCL_IB_DISABLE": "1"}, []),
        ({"NCCL_IB_DISABLE": "0"}, ["mlx5_0", "mlx5_1", "mlx5_10"]),
        ({"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1"}, ["mlx5_0", "mlx5_1"]),
        ({"NCCL_IB_HCA": "mlx5_1"}, ["mlx5_1", "mlx5_10"]),
        ({"NCCL_IB_HCA": "^mlx5_1"}, ["mlx5_0"]),
    ],
)
def test_the_infiniband_devices_nccl_would_use(env: dict[str, str], used: list[str]) -> None:
    assert ib_devices(env, ["mlx5_0", "mlx5_1", "mlx5_10"]) == used
