"""Why a rank died, from the words torch, NCCL, Python and the kernel print: each kind as its
author writes it (the GPU kinds cannot be made on a machine without a GPU, so their texts are
torch's and NCCL's own, from c10's CUDA caching allocator, ProcessGroupNCCL and its watchdog),
with the doctor's real checks on given facts for the fixes they know; and both ways: a script's
own error that merely mentions memory, CUDA or shared tables is its own `exception`.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from deadrank import KERNEL, PY
from deadrank import make_doctor as _doctor
from deadrank import why as _why
from gpus import idle_gpu

from xl.gpu.health import Health
from xl.gpu.inventory import GPUProcess
from xl.launcher.causes import Evidence, explain, one_line, peer_loss
from xl.launcher.causes import why as why_module
from xl.launcher.causes.doctor_facts import Doctor
from xl.launcher.causes.host import oom_kill
from xl.launcher.rundir.outcome import CauseKind

# torch 2.x's c10/cuda/CUDACachingAllocator.cpp, as printed.
CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.10 GiB of which "
    "1.20 GiB is free. Including non-PyTorch memory, this process has 77.89 GiB memory in use. "
    "Of the allocated memory 70.12 GiB "
    "is allocated by PyTorch, and {slack} is reserved by PyTorch but unallocated. If reserved "
    "but unallocated memory is large try "
    "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
    "documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
CUDA_OOM_OLD = (
    "RuntimeError: CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total "
    "capacity; 130.35 MiB already allocated; "
    "47.06 MiB free; 188.00 MiB reserved in total by PyTorch) If reserved memory is >> allocated "
    "memory try setting max_split_size_mb"
)
# c10d's ProcessGroupNCCL (NCCL_CHECK) and ncclGetErrorString / ncclGetLastError, as printed.
NCCL_SYSTEM = (
    "torch.distributed.DistBackendError: NCCL error in: "
    "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system "
    "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
    "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
    "device error. \n"
    "Last error:\nsocket startConnect: Connect to 10.0.0.2<43531> failed : Software caused "
    "connection abort"
)
NCCL_REMOTE = (
    "torch.distributed.DistBackendError: NCCL error in: "
    "../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, remote process exited or "
    "there was a network error, NCCL version 2.21.5\n"
    "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
    "prematurely.\nLast error:\n"
    "NET/IB : Got completion from peer 10.0.0.3<54321> with status=IBV_WC_RETRY_EXC_ERR(12) "
    "opcode=0 len=0 vendor err 129"
)
WATCHDOG = (
    "[rank0]:[E1128 01:02:03.456789 123 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught "
    "collective operation timeout: "
    "WorkNCCL(SeqNum=6, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
    "600060 milliseconds before timing out."
)
CUDA_TAIL = (
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to "
    "enable device-side assertions.\n"
)
GLOO_PEER = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
    "[127.0.0.1]:52345"
)
# ---------------------------------------------------------------- one line, and peers' losses
def test_one_line_is_the_real_error_never_a_joined_traceback() -> None:
    worker = (
        "RuntimeError: Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback "
        "(most recent call last):\n"
        '  File "torch/utils/data/_utils/worker.py", line 308, in _worker_loop\n    data = '
        'fetcher.fetch(index)\n'
        "RuntimeError: unable to allocate shared memory(shm) for file "
        "</torch_13404_2056025742_0>: No space left on device (28)"
    )
    assert (
        one_line(worker)
        == "RuntimeError: unable to allocate shared memory(shm) for file "
        "</torch_13404_2056025742_0>: No space left on device (28)"
    )
    assert (
        one_line(NCCL_SYSTEM)
        == "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
        "device error."
    )
    assert one_line("ValueError: bad batch") == "ValueError: bad batch"
    assert (
        one_line("RuntimeError: shared table full\nsee cache.py")
        == "RuntimeError: shared table full"
    )
    assert one_line("x" * 1000) is not None and len(one_line("x" * 1000) or "") == 300
    assert one_line(None) is None and one_line("  \n") is None


@pytest.mark.parametrize(
    "said",
    [
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error "
        "[127.0.0.1]:4321: Connection reset by peer",
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Write error "
        "[127.0.0.1]:4321: Broken pipe",
        GLOO_PEER,
        NCCL_REMOTE,
        WATCHDOG,
        "torch.distributed.DistNetworkError: failed to recv, got 0 bytes",
    ],
)
def test_a_peer_s_loss_is_recognised(said: str) -> None:
    assert peer_loss(said) is not None


@pytest.mark.parametrize(
    "said",
    [
        "ValueError: bad batch",
        CUDA_OOM.format(slack="1.00 GiB"),
        NCCL_SYSTEM,
        "RuntimeError: the peer table is full",
    ],
)
def test_a_rank_s_own_error_is_no_peer_s_loss(said: str) -> None:
    assert peer_loss(said) is None


# -------------------------------------------------------------- GPU kinds, torch's and NCCL's words
def test_cuda_oom_with_torch_s_figures_and_a_fix_that_fits() -> None:
    cause = _why(CUDA_OOM.format(slack="3.50 GiB"))
    assert cause.kind is CauseKind.CUDA_OOM
    assert (
        cause.summary
        == "GPU 0 out of memory: asked for 2.00 GiB with 1.20 GiB free of 79.10 GiB; 3.50 GiB "
        "reserved by PyTorch but unallocated"
    )
    # Fragmentation (more reserved-but-unallocated than was asked): expandable segments, on this
    # very launch.
    assert (
        cause.fix
        == "xl launch --env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True --nproc 2 -- "
        "train.py --batch 64"
    )
    tight = _why(CUDA_OOM.format(slack="20.00 MiB"))
    assert tight.kind is CauseKind.CUDA_OOM and "expandable_segments" not in (tight.fix or "")
    assert "gradient accumulation" in (tight.fix or "") and "torch.utils.checkpoint" in (
        tight.fix or ""
    )
    old = _why(CUDA_OOM_OLD)
    assert old.summary == "GPU 0 out of memory: asked for 36.00 MiB with 47.06 MiB free of 7.93 GiB"


def test_nccl_error_gets_the_debug_rerun_or_the_doctor_s_fix_for_a_trap() -> None:
    cause = _why(NCCL_SYSTEM)
    assert cause.kind is CauseKind.NCCL_ERROR
    assert cause.summary == (
        "NCCL unhandled system error (ncclSystemError): socket startConnect: Connect to "
        "10.0.0.2<43531> failed : "
        "Software caused connection abort"
    )
    assert cause.fix == "xl launch --env NCCL_DEBUG=INFO --nproc 2 -- train.py --batch 64"
    assert (
        "network interfaces: eth0, lo" in cause.evidence
        and "InfiniBand devices: none" in cause.evidence
    )
    # A trap the doctor knows (an interface that is not here): its exact fix, not a rerun.
    trap = _why(NCCL_SYSTEM, doctor=_doctor(env={"NCCL_SOCKET_IFNAME": "eth9"}))
    assert (
        trap.fix == "export NCCL_SOCKET_IFNAME=eth0"
        and "NCCL_SOCKET_IFNAME=eth9 matches no interface" in trap.summary
    )


def test_a_watchdog_timeout_names_the_collective_and_xl_s_own_verdict() -> None:
    cause = _why(
        None,
        code=-6,
        tail=[
            "step 12",
            WATCHDOG,
            "terminate called after throwing an instance of 'c10::DistBackendError'",
        ],
        hang="rank 1 stuck in train.py:42 (load_batch); ranks 0, 2, 3 wait for it in all_reduce",
    )
    assert cause.kind is CauseKind.COLLECTIVE_TIMEOUT
    assert cause.summary == (
        "ALLREDUCE #6 timed out after 600 s (then SIGABRT); xl's hang verdict: rank 1 stuck in "
        "train.py:42 "
        "(load_batch); ranks 0, 2, 3 wait for it in all_reduce"
    )
    assert cause.fix is None


def test_no_kernel_image_gets_the_doctor_s_wheel() -> None:
    blackwell = _doctor(gpus=(idle_gpu(0, "NVIDIA GeForce RTX 5090", "12.0"),))
    cause = _why(
        "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
        + CUDA_TAIL,
        doctor=blackwell,
    )
    assert cause.kind is CauseKind.NO_KERNEL_IMAGE
    assert "RTX 5090 (sm_120)" in cause.summary and "5.0;6.0;7.0;7.5;8.0;8.6;9.0" in cause.summary
    assert (
        cause.fix
        == f"{PY} -m pip install --force-reinstall torch==2.7.0 --index-url "
        "https://download.pytorch.org/whl/cu128"
    )
    # The doctor finds the wheel right for these GPUs (an extension built without the arch): no
    # wheel fix.
    fine = _why(
        "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        doctor=_doctor(),
    )
    assert fine.kind is CauseKind.NO_KERNEL_IMAGE and "pip install" not in (fine.fix or "")


def test_device_busy_names_the_compute_mode_and_the_process_holding_the_gpu() -> None:
    held = dataclasses.replace(
        idle_gpu(0),
        processes=(
            GPUProcess(
                pid=4242, used_mib=1024.0, name="python", rank=None, local_rank=None, run_id=None
            ),
        ),
    )
    doctor = _doctor(gpus=(held,), health={0: Health(0, compute_mode="exclusive_process")})
    cause = _why(
        "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable\n" + CUDA_TAIL,
        doctor=doctor,
    )
    assert cause.kind is CauseKind.DEVICE_BUSY
    assert (
        "exclusive-process mode and held by pid 4242" in cause.summary
        and cause.fix == "sudo kill 4242"
    )


def test_a_device_side_assert_gets_the_blocking_rerun() -> None:
    assertion = (
        "../aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [0,0,0], thread: "
        "[0,0,0] Assertion "
        '`-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.'
    )
    cause = _why(
        "RuntimeError: CUDA error: device-side assert triggered\n" + CUDA_TAIL, tail=[assertion]
    )
    assert cause.kind is CauseKind.CUDA_ERROR and "index out of bounds" in cause.summary
    assert cause.fix == "xl launch --env CUDA_LAUNCH_BLOCKING=1 --nproc 2 -- train.py --batch 64"
    other = _why("RuntimeError: CUDA error: an illegal memory access was encountered\n" + CUDA_TAIL)
    assert (
        other.kind is CauseKind.CUDA_ERROR
        and other.summary == "CUDA error: an illegal memory access was encountered"
    )


# ---------------------------------------------------------------- host kinds
def test_the_oom_killer_in_a_memory_cgroup_from_the_kernel_s_own_lines() -> None:
    oom = oom_kill({10513}, KERNEL)
    # the report's, the cgroup being gone
    assert oom is not None and oom.memcg == "/xl-test-b863b7dc" and oom.limit == 64 << 20
    assert oom.rss == (72960 + 6404) * 1024
    cause = _why(None, code=-9, pids={10513}, kernel=KERNEL)
    assert cause.kind is CauseKind.HOST_OOM
    assert cause.summary.startswith(
        "killed by the kernel's OOM killer: its memory cgroup /xl-test-b863b7dc has a limit of "
        "64 MiB; it held 78 MiB"
    )
    # Another process's kill is not this rank's: a SIGKILL from outside.
    other = _why(None, code=-9, pids={777}, kernel=KERNEL)
    assert (
        other.kind is CauseKind.KILLED
        and other.summary
        == "killed by SIGKILL from outside xl (the kernel's OOM killer did not log it)"
    )
    whole = [
        "Out of memory: Killed process 4321 (python) total-vm:9000000kB, anon-rss:8000000kB, "
        "file-rss:0kB, shmem-rss:0kB, UID:0"
    ]
    machine = _why(None, code=-9, pids={4321}, kernel=whole)
    assert machine.kind is CauseKind.HOST_OOM and "the machine ran out of memory" in machine.summary


def _kernel_reads(monkeypatch: pytest.MonkeyPatch, reads: list[list[str]]) -> list[int]:
    """The kernel log as it reads on each look (the last read repeats); returns the look count."""
    looks = [0]

    def read(path: str = "/dev/kmsg") -> list[str]:
        looks[0] += 1
        return reads[min(looks[0], len(reads)) - 1]

    monkeypatch.setattr(why_module.host, "kernel_lines", read)
    monkeypatch.setattr(why_module.time, "sleep", lambda s: None)
    return looks


def test_a_sigkill_the_oom_killer_chose_waits_for_its_killed_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A busy machine reaps the rank before the kernel logs "Killed process": its report already
    names the rank as the victim, so the kill line is waited for, long after the death."""
    report, killed = KERNEL[:3], KERNEL
    looks = _kernel_reads(monkeypatch, [report, report, report, killed])
    ev = Evidence(rank=1, exit_code=-9, pids={10513}, died_at=time.time() - 60)
    cause = explain(ev)
    assert cause.kind is CauseKind.HOST_OOM and "has a limit of 64 MiB" in cause.summary
    assert looks[0] == 4
    # Another rank's SIGKILL in the same log: a kill from outside, read once, nothing waited for.
    looks = _kernel_reads(monkeypatch, [report])
    other = explain(Evidence(rank=0, exit_code=-9, pids={777}, died_at=time.time() - 60))
    assert other.kind is CauseKind.KILLED and looks[0] == 1


def test_a_rank_gone_before_its_exit_code_is_known_waits_for_the_oom_killer_s_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a busy machine torchrun reaps the killed rank and reports its code later: the cause is
    asked with no exit code yet, and the OOM killer's report names the rank, so its kill line is
    waited for as for a SIGKILL."""
    report, killed = KERNEL[:3], KERNEL
    looks = _kernel_reads(monkeypatch, [report, report, killed])
    ev = Evidence(rank=1, exit_code=None, pids={10513}, vanished=True, died_at=time.time() - 60)
    cause = explain(ev)
    assert cause.kind is CauseKind.HOST_OOM and "has a limit of 64 MiB" in cause.summary
    assert looks[0] == 3
    # A rank gone without a code whom no report names: read once, nothing waited for.
    looks = _kernel_reads(monkeypatch, [report])
    other = explain(
        Evidence(rank=0, exit_code=None, pids={777}, vanished=True, died_at=time.time() - 60)
    )
    assert other.kind is CauseKind.KILLED and looks[0] == 1


def test_a_dataloader_worker_the_oom_killer_ended() -> None:
    said = "RuntimeError: DataLoader worker (pid 10513) is killed by signal: Killed. "
    assert _why(said, kernel=KERNEL).kind is CauseKind.HOST_OOM
    assert _why(said, kernel=[]).kind is CauseKind.EXCEPTION  # no kernel word: no invented OOM


def test_shm_full_with_the_doctor_s_way_to_grow_it() -> None:
    cause = _why(
        "RuntimeError: unable to write to file </torch_123_456_0>: No space left on device (28)",
        doctor=_doctor(shm_total=1 << 20, shm_free=0),
    )
    assert cause.kind is CauseKind.SHM_FULL and cause.summary.startswith(
        "shared memory /dev/shm (1 MiB, 0 B free now) is too small"
    )
    assert cause.fix == "sudo mount -o remount,size=16G /dev/shm"
    docker = _why(
        "RuntimeError: unable to write to file </torch_123_456_0>: No space left on device (28)",
        doctor=_doctor(shm_total=64 << 20, shm_free=0, container="docker"),
    )
    assert docker.fix is not None and "--shm-size=16g" in docker.fix


def test_slurm_s_time_limit_is_who_killed_it() -> None:
    tail = [
        "step 900",
        "slurmstepd: error: *** STEP 1234.0 ON node01 CANCELLED AT 2026-11-28T01:00:00 DUE TO "
        "TIME LIMIT ***",
    ]
    cause = _why(None, code=-15, tail=tail)
    assert (
        cause.kind is CauseKind.KILLED
        and cause.summary == "killed by SIGTERM: Slurm ended the job at its time limit"
    )
    assert cause.fix == "give the job a longer time limit (sbatch --time=HH:MM:SS)"


# ---------------------------------------------------------------- Python's own
@pytest.mark.parametrize(
    ("module", "dist"),
    [
        ("cv2", "opencv-python"), ("sklearn", "scikit-learn"), ("yaml", "PyYAML"),
        ("PIL", "pillow"), ("einops", "einops"),
    ],
)
def test_a_missing_module_is_installed_under_its_distribution_name(module: str, dist: str) -> None:
    cause = _why(f"ModuleNotFoundError: No module named '{module}'")
    assert cause.kind is CauseKind.MODULE_NOT_FOUND and cause.fix == f"{PY} -m pip install {dist}"


def test_a_missing_module_that_is_the_script_s_own_file_or_a_submodule_gets_no_pip_guess(
    tmp_path: Path,
) -> None:
    (tmp_path / "model.py").write_text("")
    local = explain(
        Evidence(
            rank=0,
            exit_code=1,
            error="ModuleNotFoundError: No module named 'model'",
            python=PY,
            cwd=str(tmp_path / "elsewhere"),
            script=str(tmp_path / "train.py"),
        ),
        _doctor(),
        [],
    )
    assert (
        local.kind is CauseKind.MODULE_NOT_FOUND
        and local.fix is None
        and str(tmp_path / "model.py") in local.summary
    )
    sub = _why("ModuleNotFoundError: No module named 'transformers.models.llama4'")
    assert sub.kind is CauseKind.MODULE_NOT_FOUND and sub.fix is None
    spaced = explain(
        Evidence(
            rank=0,
            exit_code=1,
            error="ModuleNotFoundError: No module named 'cv2'",
            python="/opt/my env/bin/python",
        ),
        _doctor(),
        [],
    )
    assert shlex.split(spaced.fix or "") == [
        "/opt/my env/bin/python", "-m", "pip", "install", "opencv-python",
    ]


def test_usage_errors_of_argparse_and_click() -> None:
    argparse = _why(
        None,
        code=2,
        tail=[
            "usage: train.py [-h] [--lr LR]",
            "train.py: error: unrecognized arguments: --lr-warmup 3",
        ],
        script="train.py",
        cwd="/work",
    )
    assert argparse.kind is CauseKind.USAGE_ERROR and argparse.fix == f"{PY} /work/train.py --help"
    click = _why(
        None,
        code=2,
        tail=[
            "Usage: train [OPTIONS]",
            "Try 'train --help' for help.",
            "",
            "Error: No such option: --lrr",
        ],
        module="train",
    )
    assert (
        click.kind is CauseKind.USAGE_ERROR
        and click.summary.endswith("Error: No such option: --lrr")
        and click.fix == f"{PY} -m train --help"
    )
    # Exit 2 without argparse's words, or "error:" with another exit code: not a usage error.
    assert _why(None, code=2, tail=["done"]).kind is CauseKind.EXCEPTION
    assert _why(None, code=1, tail=["train.py: error: something"]).kind is CauseKind.EXCEPTION


@pytest.mark.parametrize("said", [
    "RuntimeError: shared memory table full: out of memory in the embedding cache",
    "MemoryError: the cache's shared table is out of memory",
    "ValueError: CUDA error budget exceeded in my metric",
    "RuntimeError: NCCL-like ring of my own broke: connection dropped",
])
def test_a_script_s_own_error_that_mentions_memory_is_its_own_exception(said: str) -> None:
    cause = _why(
        said,
        tail=["CUDA out of memory. Tried to allocate 2.00 GiB (an old warning the script printed)"],
    )
    assert (
        cause.kind is CauseKind.EXCEPTION
        and cause.summary == said
        and cause.fix is None
        and cause.evidence == [said]
    )


def test_a_segfault_from_faulthandler_s_dump() -> None:
    tail = [
        "ready",
        "Fatal Python error: Segmentation fault",
        "",
        "Current thread 0x00007f01 (most recent call first):",
        f'  File "{sys.prefix}/lib/python3.11/ctypes/__init__.py", line 519 in string_at',
        '  File "/work/train.py", line 5 in <module>',
        '  File "<frozen runpy>", line 88 in _run_code',
    ]
    cause = _why(None, code=-11, tail=tail)
    assert cause.kind is CauseKind.SEGFAULT
    assert (
        cause.summary
        == "segmentation fault in native code called from /work/train.py:5 in <module> (inside "
        f"{sys.prefix}/lib/python3.11/ctypes/__init__.py:519 in string_at)"
    )
    bare = _why(None, code=-11, tail=["ready"])
    assert (
        bare.kind is CauseKind.SEGFAULT
        and bare.summary == "segmentation fault in native code (no Python line was printed)"
    )


def test_a_failure_s_cause_crosses_the_node_link_clipped_and_a_malformed_one_is_refused() -> None:
    """Another node's failure comes to node 0 with its cause (the wire's checks take it, long
    texts clipped as the link clips them); a cause that is not the object is refused."""
    import json  # noqa: PLC0415 - this test only

    from xl.launcher.multinode.clip import clip_failure  # noqa: PLC0415 - this test only
    from xl.launcher.multinode.protocol import (  # noqa: PLC0415 - this test only
        EndMessage,
        FailureMessage,
        parse_message,
    )
    from xl.wire import FrameError  # noqa: PLC0415 - this test only

    cause = {"kind": "cuda_oom", "summary": "s" * 9000, "fix": None, "evidence": ["x" * 9000] * 40}
    failure = {
        "rank": 1,
        "exit_code": 1,
        "traceback": "t",
        "error": "e",
        "message": "m",
        "node": "vm",
        "node_rank": 1,
        "cause": cause,
    }
    for kind in ("failure", "end"):
        msg = {
            "type": kind,
            "failure": clip_failure(failure),
            "at": 1.0,
            **({"status": "failed"} if kind == "end" else {}),
        }
        parsed = parse_message(json.loads(json.dumps(msg)), 1)
        if isinstance(parsed, EndMessage):
            assert parsed.failure is not None
            parsed = parsed.failure
        assert isinstance(parsed, FailureMessage)
        took = parsed.failure.cause
        assert (
            took is not None
            and took.kind is CauseKind.CUDA_OOM
            and len(took.summary) <= 4096
            and len(took.evidence) == 16
        )
    for bad in (
        {"kind": "x", "summary": "s", "evidence": [{"a": 1}]},
        {"kind": "x", "summary": "s", "extra": 1},
        ["kind"],
    ):
        with pytest.raises(FrameError):
            parse_message({"type": "failure", "failure": {**failure, "cause": bad}, "at": 1.0}, 1)


def test_the_doctor_s_facts_read_the_gpus_as_the_doctor_does(simnvml: Any) -> None:
    # The doctor's API reads NVML's inventory, health and fabric as the doctor's own probe gives
    # them: a cause whose probe answers in another shape has no GPU facts, and says nothing.
    with simnvml(gpus=2).in_process():
        facts = Doctor(python=sys.executable).facts()
    assert facts.nvml_problem in (None, "") and len(facts.gpus) == 2 and facts.driver is not None
