"""`xl launch --dry-run` and bad input, through the real `xl` command.

GPUs come from the simulated NVML driver (the real nvidia-ml-py loads it), so device choice and
order are checked exactly as they happen on a GPU machine.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from procs import xl, xl_env
from simnvml import SimGPU, default_uuid

from xl.launcher.cli.accelconf import parse_flat_yaml

SCRIPT = "print('hi')\n"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path


def _dry(work: Path, env: dict[str, str], *args: str) -> dict:
    proc = xl(["launch", "--dry-run", "--json", *args], env, cwd=work)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _env(work: Path, sim=None, **extra: str) -> dict[str, str]:
    env = xl_env(work / "home", **extra)
    if sim is not None:
        env.update(sim.env)
    return env


def test_gpu_order_as_written_is_the_rank_order(work: Path, simnvml) -> None:
    env = _env(work, simnvml(gpus=4))
    out = _dry(work, env, "--gpus", "2,0", "train.py", "--lr", "3e-4")
    assert out["env"] == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,0"}
    argv = out["argv"]
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert argv[argv.index("--nproc-per-node") + 1] == "2"
    # Single node: torchrun's static rendezvous on loopback; port 0 stands for the one the
    # supervisor holds for the run (a busy 29500 cannot matter).
    assert "--rdzv-backend" not in argv and "--rdzv-endpoint" not in argv
    assert argv[argv.index("--master-addr") + 1] == "127.0.0.1"
    assert argv[argv.index("--master-port") + 1] == "0"
    # Ranks run the script through xl's entry point (traceback capture, per-rank logs).
    assert argv[-5:] == ["-m", "xl.launcher.entry", "train.py", "--lr", "3e-4"]
    assert not (work / "home").exists()  # a dry run starts nothing and writes nothing


def test_dry_run_for_people_shows_command_variables_and_devices(work: Path, simnvml) -> None:
    proc = xl(
        ["launch", "--dry-run", "--gpus", "1,0", "train.py"], _env(work, simnvml(gpus=2)), cwd=work
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID \\" in lines and "CUDA_VISIBLE_DEVICES=1,0 \\" in lines
    assert any(
        ln.startswith(sys.executable) and ln.endswith("-m xl.launcher.entry train.py")
        for ln in lines
    )
    assert f"# LOCAL_RANK 0 -> GPU 1 NVIDIA A100-SXM4-80GB ({default_uuid(1)})" in lines
    assert not (work / "home").exists()


def test_uuids_and_prefixes_select_gpus(work: Path, simnvml) -> None:
    env = _env(work, simnvml(gpus=4))
    out = _dry(work, env, "--gpus", f"{default_uuid(3)},{default_uuid(1)[:12]}", "train.py")
    assert out["env"]["CUDA_VISIBLE_DEVICES"] == "3,1"
    assert (
        "--nproc-per-node" in out["argv"]
        and out["argv"][out["argv"].index("--nproc-per-node") + 1] == "2"
    )


def test_auto_picks_most_free_memory_then_least_busy(work: Path, simnvml) -> None:
    gpus = [
        SimGPU(memory_used_mib=40_000, util_gpu=0),
        SimGPU(memory_used_mib=1_000, util_gpu=90),
        SimGPU(memory_used_mib=70_000, util_gpu=0),
        SimGPU(memory_used_mib=1_000, util_gpu=5),
    ]
    env = _env(work, simnvml(gpus=gpus))
    assert _dry(work, env, "--gpus", "auto:2", "train.py")["env"]["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert _dry(work, env, "--gpus", "auto:1", "train.py")["env"]["CUDA_VISIBLE_DEVICES"] == "3"
    out = _dry(work, env, "--gpus", "all", "train.py")
    assert out["env"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert out["argv"][out["argv"].index("--nproc-per-node") + 1] == "4"


def test_default_is_every_gpu_or_one_cpu_rank(work: Path, simnvml) -> None:
    out = _dry(work, _env(work, simnvml(gpus=2)), "train.py")
    assert out["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert out["argv"][out["argv"].index("--nproc-per-node") + 1] == "2"
    cpu = _dry(work, _env(work, simnvml(gpus=1, init_error="driver_not_loaded")), "train.py")
    assert cpu["env"] == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ""}
    assert cpu["argv"][cpu["argv"].index("--nproc-per-node") + 1] == "1"


def test_default_follows_the_shells_cuda_visible_devices(work: Path, simnvml) -> None:
    sim = simnvml(gpus=4)
    out = _dry(
        work,
        _env(work, sim, CUDA_VISIBLE_DEVICES="3,1", CUDA_DEVICE_ORDER="PCI_BUS_ID"),
        "train.py",
    )
    assert out["env"]["CUDA_VISIBLE_DEVICES"] == "3,1"
    hidden = _dry(work, _env(work, sim, CUDA_VISIBLE_DEVICES=""), "train.py")
    assert hidden["env"]["CUDA_VISIBLE_DEVICES"] == ""  # hidden on purpose: a CPU run
    line = _bad(work, _env(work, sim, CUDA_VISIBLE_DEVICES="0,9"), "train.py")
    assert "CUDA_VISIBLE_DEVICES='0,9' in your environment is wrong" in line


def test_mixed_precision_env_and_module(work: Path, simnvml) -> None:
    env = _env(work, simnvml(gpus=2))
    out = _dry(work, env, "--gpus", "1", "--mixed-precision", "bf16", "--env", "NCCL_DEBUG=INFO",
               "--env", "A=b=c", "-m", "json.tool", "--sort-keys")
    assert out["env"] == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "1",
        "ACCELERATE_MIXED_PRECISION": "bf16",
        "NCCL_DEBUG": "INFO",
        "A": "b=c",
    }
    assert out["argv"][-5:] == ["-m", "xl.launcher.entry", "-m", "json.tool", "--sort-keys"]


def test_multi_node_uses_c10d_rendezvous_at_the_given_address(work: Path, simnvml) -> None:
    out = _dry(
        work,
        _env(work, simnvml(gpus=2), XL_TOKEN="t" * 32),
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--rdzv",
        "10.0.0.1:29400",
        "train.py",
    )
    argv = out["argv"]
    assert argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--nproc-per-node") + 1] == "2"
    assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"
    rdzv_id = argv[argv.index("--rdzv-id") + 1]
    assert rdzv_id.startswith("xl-") and len(rdzv_id) == 15 and "t" * 32 not in " ".join(argv)
    assert argv[argv.index("--max-restarts") + 1] == "0"
    assert argv[argv.index("--rdzv-conf") + 1] == "is_host=0"  # node 0 serves the store
    # torch ignores --node-rank under c10d; xl keeps it as its own node identity.
    assert not {"--node-rank", "--master-addr", "--master-port"} & set(argv)


ACCEL = """compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_GPU
downcast_bf16: 'no'
gpu_ids: 3,1
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
use_cpu: false
fsdp_config:
  fsdp_sharding_strategy: FULL_SHARD
"""


def test_accelerate_config_fills_in_and_flags_win(work: Path, simnvml) -> None:
    sim = simnvml(gpus=4)
    hf = work / "hf"
    (hf / "accelerate").mkdir(parents=True)
    (hf / "accelerate" / "default_config.yaml").write_text(ACCEL)
    env = _env(work, sim, HF_HOME=str(hf))
    out = _dry(work, env, "--accelerate-config", "train.py")
    assert out["env"]["CUDA_VISIBLE_DEVICES"] == "3,1"
    assert out["env"]["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert out["argv"][out["argv"].index("--nproc-per-node") + 1] == "2"
    other = work / "other.yaml"
    other.write_text(ACCEL.replace("num_processes: 2", "num_processes: 1"))
    out = _dry(
        work, env, "--accelerate-config", str(other), "--mixed-precision", "fp16", "--gpus", "0",
        "train.py",
    )
    assert out["env"]["ACCELERATE_MIXED_PRECISION"] == "fp16"
    assert out["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert out["argv"][out["argv"].index("--nproc-per-node") + 1] == "1"


def test_flat_yaml_reader_without_pyyaml() -> None:
    data = parse_flat_yaml(ACCEL)
    assert data["gpu_ids"] == "3,1" and data["num_processes"] == 2 and data["downcast_bf16"] == "no"
    assert data["use_cpu"] is False and "fsdp_sharding_strategy" not in data


def _bad(work: Path, env: dict[str, str], *args: str) -> str:
    proc = xl(["launch", *args], env, cwd=work)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["missing.py"], "no such script: missing.py"),
        (["--gpus", "7", "train.py"], "unknown GPU '7'"),
        (["--gpus", "1,1", "train.py"], "GPU 1 appears twice"),
        (["--gpus", "0,1", "--nproc", "3", "train.py"], "--nproc 3 is more than the 2 GPU(s)"),
        (["--nproc", "0", "train.py"], "--nproc must be at least 1"),
        (["--env", "NOEQUALS", "train.py"], "--env 'NOEQUALS' is not NAME=VALUE"),
        (["--gpus", "auto:9", "train.py"], "only 4 usable GPU(s)"),
        (["--nnodes", "2", "train.py"], "--nnodes > 1 needs --rdzv"),
        (
            ["--nnodes", "2", "--node-rank", "2", "--rdzv", "h:1", "train.py"],
            "--node-rank 2 must be in 0..1",
        ),
        (["--nnodes", "2", "--rdzv", "nohost", "train.py"], "is not HOST:PORT"),
        (["--gpus", "0"], "give a training script"),
        (["--accelerate-config", "nope.yaml", "train.py"], "no Accelerate config at nope.yaml"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(work: Path, simnvml, args: list[str], says: str) -> None:
    line = _bad(work, _env(work, simnvml(gpus=4)), *args)
    assert says in line, line
    assert not (work / "home").exists()


def test_more_ranks_than_gpus_says_how_to_run_them_on_cpu(work: Path, simnvml) -> None:
    """A GPU machine with fewer GPUs than --nproc: the refusal offers CPU ranks, and the command
    it prints for them plans 2 CPU ranks there."""
    env = _env(work, simnvml(gpus=1))
    line = _bad(work, env, "--nproc", "2", "train.py")
    assert "--nproc 2 is more than the 1 GPU(s) chosen (0)" in line, line
    assert line.endswith("or run CPU ranks: CUDA_VISIBLE_DEVICES= xl launch ..."), line
    ok = xl(
        ["launch", "--dry-run", "--nproc", "2", "train.py"],
        {**env, "CUDA_VISIBLE_DEVICES": ""},
        cwd=work,
    )
    assert ok.returncode == 0, ok.stderr
    assert "# 2 CPU rank(s) (gloo): no GPU chosen" in ok.stdout, ok.stdout
    # --gpus named the GPUs: more of them, or fewer processes, is the fix; not the CPU.
    named = _bad(work, env, "--gpus", "0", "--nproc", "2", "train.py")
    assert "CPU" not in named, named


def test_unreadable_xl_home_is_one_line(work: Path) -> None:
    blocker = work / "file"
    blocker.write_text("")
    line = _bad(work, xl_env(blocker), "train.py")
    assert "set XL_HOME to a writable folder" in line and "is a file" in line
    for cmd in (["runs"], ["logs", "last"], ["attach", "last"], ["stop", "last"]):
        proc = xl(cmd, xl_env(blocker), cwd=work)  # not "no runs yet": XL_HOME itself is wrong
        assert proc.returncode == 2 and "is a file, not a folder" in proc.stderr, (cmd, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1
    if os.geteuid() != 0:  # root reads anything
        locked = work / "locked"
        locked.mkdir(mode=0o000)
        assert "XL_HOME" in _bad(work, xl_env(locked), "train.py")
