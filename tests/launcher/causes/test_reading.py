"""A rank's last output read as a person reads it (xl.launcher.causes.reading), and the causes
read from words a rank printed and exited on without raising: the prefixes torchrun, c10's C++
logging, NCCL and Python's logging put on lines come off; the last traceback's error and the
lines libraries print in their own voice are read; a script's own lines are not. Usage errors
come from the real click, typer and argparse (run here), and from jsonargparse's and hydra's
wording; a DataLoader worker killed without a word is the OOM killer's, shared memory's or the
script's own, each both ways.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from deadrank import KERNEL, PY
from deadrank import make_doctor as _doctor
from deadrank import why as _why

from xl.launcher.causes import Evidence, explain
from xl.launcher.causes.reading import clean, read
from xl.launcher.rundir.outcome import CauseKind


@pytest.mark.parametrize(
    ("line", "text", "library"),
    [
        ("[rank1]: RuntimeError: boom", "RuntimeError: boom", False),
        ("[default0]:[rank0]:   File \"t.py\", line 3", '  File "t.py", line 3', False),
        (
            "[rank0]:[E1103 04:12:09.774120 9012 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog x",
            "[Rank 0] Watchdog x", True,
        ),
        ("[W socket.cpp:426] [c10d] cannot bind", "[c10d] cannot bind", True),
        ("gpu-1:311:377 [3] include/alloc.h:103 NCCL WARN Cuda failure 'out of memory'",
         "Cuda failure 'out of memory'", True),
        ("gpu-1:311:377 [3] NCCL INFO Channel 00/0 : 3[3] -> 0[0]", "NCCL INFO Channel 00/0 : "
         "3[3] -> 0[0]", False),
        ("2026-11-02 10:14:58,402 - ERROR - training crashed", "training crashed", False),
        ("[2026-10-30 17:40:02,554][__main__][ERROR] - step failed", "step failed", False),
        ("ERROR:root:could not read", "could not read", False),
        ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient "
         "shared memory (shm).", "Unexpected bus error encountered in worker. This might be caused "
         "by insufficient shared memory (shm).", True),
        ("step 12 loss 0.5", "step 12 loss 0.5", False),
        ("Error: No such option: --lrr", "Error: No such option: --lrr", False),
    ],
)
def test_prefixes_come_off_and_libraries_are_known_by_their_voice(
    line: str, text: str, library: bool
) -> None:
    assert clean(line) == (text, library)


def test_the_error_is_the_last_traceback_s_and_torch_s_with_nccl_s_code_is_one() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in <module>',
        "ValueError: an old one, handled and printed",
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "b.py", line 9, in <module>',
        "[rank1]: KeyError: 'labels'",
        "[rank1]: done",
    ]
    said = read(lines)
    assert said.error == "KeyError: 'labels'\ndone" and said.library == []
    bare = read([
        "step 3",
        "torch.distributed.DistBackendError: NCCL error in: x.cpp:1, unhandled system error",
        "ncclSystemError: System call failed.",
        "Last error:",
        "socket: refused",
    ])
    assert bare.error is not None and bare.error.startswith("torch.distributed.DistBackendError")
    assert bare.error.endswith("socket: refused")
    assert read(["step 3", "loss went up: Error in my metric"]).error is None


# ------------------------------------------------------------- printed, then exit without raising
@pytest.mark.parametrize(
    ("printed", "kind"),
    [
        # The most specific words win over the generic CUDA error they are inside.
        (["[rank0]: RuntimeError: CUDA error: no kernel image is available for execution on the "
          "device"], CauseKind.NO_KERNEL_IMAGE),
        (["RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable"],
         CauseKind.DEVICE_BUSY),
        (["RuntimeError: CUDA error: out of memory", "Compile with `TORCH_USE_CUDA_DSA` to enable"],
         CauseKind.CUDA_OOM),
        (["RuntimeError: CUDA error: an illegal memory access was encountered"],
         CauseKind.CUDA_ERROR),
        (["h:1:2 [0] transport/shm.cc:1 NCCL WARN Error while creating shared memory segment "
          "/dev/shm/nccl-ab12 (size 9637888)",
          "RuntimeError: NCCL error in: x.cpp:1, unhandled system error, NCCL version 2.21.5"],
         CauseKind.SHM_FULL),
        (["Exception in thread Thread-1:", "Traceback (most recent call last):",
          '  File "t.py", line 2, in run',
          "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:1] Timed out waiting "
          "60000ms for recv operation to complete"], CauseKind.COLLECTIVE_TIMEOUT),
        (["2026-11-02 10:00:00 ERROR boom", "Traceback (most recent call last):",
          '  File "/venv/site-packages/lib/x.py", line 2, in <module>',
          "ModuleNotFoundError: No module named 'flash_attn.flash_attn_interface'"],
         CauseKind.MODULE_NOT_FOUND),
    ],
)
def test_words_a_rank_printed_before_exiting_name_the_kind(
    printed: list[str], kind: CauseKind
) -> None:
    assert _why(None, tail=["step 1", *printed]).kind is kind


def test_a_module_inside_a_library_gets_its_distribution() -> None:
    sub = _why(
        None, tail=["ModuleNotFoundError: No module named 'flash_attn.flash_attn_interface'"]
    )
    assert sub.fix == f"{PY} -m pip install flash-attn"
    several = _why(
        "ImportError: This modeling file requires the following packages that were not found in "
        "your environment: einops, sklearn. Run `pip install einops sklearn`"
    )
    assert several.kind is CauseKind.MODULE_NOT_FOUND
    assert several.fix == f"{PY} -m pip install einops scikit-learn"


@pytest.mark.parametrize(
    "printed",
    [
        # A script's own lines, in its own words: never a kind.
        ["my cache: CUDA error: out of memory (simulated, for the test of my cache)"],
        ["warning: no kernel image is available for execution on the device, falling back"],
        ["shard list: [Errno 2] No such file or directory, retrying"],
        ["NCCL error in: nowhere (my own ring said so)"],
    ],
)
def test_a_script_s_own_printed_words_stay_its_exception(printed: list[str]) -> None:
    cause = _why(None, tail=["step 1", *printed])
    assert cause.kind is CauseKind.EXCEPTION and cause.fix is None
    assert cause.summary == f"exited with code 1 after: {printed[-1]}"


def test_a_script_s_own_exception_is_not_read_with_a_library_s_old_lines() -> None:
    # An NCCL warning it lived through, then its own ValueError: the ValueError is the cause.
    tail = ["h:1:2 [0] misc/socket.cc:1 NCCL WARN Cuda failure 'out of memory'", "step 9"]
    cause = _why("ValueError: labels out of range", tail=tail)
    assert cause.kind is CauseKind.EXCEPTION and cause.summary == "ValueError: labels out of range"
    # ... while torch's RuntimeError wrapping a library's failure is read with those lines.
    wrapped = _why("RuntimeError: NCCL communicator was aborted", tail=tail)
    assert wrapped.kind is CauseKind.CUDA_OOM


CUDA_ADVICE = [
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
]


def test_a_printed_cuda_error_s_headline_is_its_error_line_not_torch_s_advice() -> None:
    printed = [
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/opt/train/model.py", line 88, in forward',
        "[rank1]:     out = fused_gelu(x)",
        "[rank1]: RuntimeError: CUDA error: no kernel image is available for execution on the "
        "device",
        *(f"[rank1]: {line}" for line in CUDA_ADVICE),
    ]
    said = read(printed)
    error = "RuntimeError: CUDA error: no kernel image is available for execution on the device"
    assert said.error == error and said.headline == error
    # The advice is still what the rank printed, and the kind is read from the error.
    assert said.lines[-1] == CUDA_ADVICE[-1]
    assert _why(None, tail=printed).kind is CauseKind.NO_KERNEL_IMAGE


def test_a_script_s_own_multi_line_message_stays_whole() -> None:
    own = ["config invalid:", "  lr must be > 0", "Compile with care, then retry."]
    printed = ["Traceback (most recent call last):", '  File "t.py", line 3, in <module>',
               f"ValueError: {own[0]}", *own[1:]]
    said = read(printed)
    assert said.error == "\n".join(["ValueError: config invalid:", "lr must be > 0", own[2]])
    assert said.headline == "ValueError: config invalid:"
    assert read(["step 9", "all done"]).headline is None


# ---------------------------------------------------------------- usage errors
def _real_cli(tmp_path: Path, body: str, *args: str) -> tuple[list[str], int]:
    script = tmp_path / "cli.py"
    script.write_text(body)
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, "COLUMNS": "80"},
    )
    return (done.stdout + done.stderr).splitlines(), done.returncode


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("import argparse\np = argparse.ArgumentParser()\np.add_argument('--lr')\np.parse_args()\n",
         "cli.py: error: unrecognized arguments: --lrr 3"),
        ("import click\n@click.command()\n@click.option('--lr')\ndef main(lr):\n    pass\nmain()\n",
         "Error: No such option"),
        ("import typer\ndef main(lr: float = 0.1):\n    pass\ntyper.run(main)\n",
         "Error: No such option"),
    ],
    ids=["argparse", "click", "typer"],
)
def test_real_cli_libraries_refusals_are_usage_errors(
    tmp_path: Path, body: str, said: str
) -> None:
    lines, code = _real_cli(tmp_path, body, "--lrr", "3")
    cause = _why(None, code=code, tail=lines, script="cli.py", cwd=str(tmp_path))
    assert cause.kind is CauseKind.USAGE_ERROR, lines
    assert said in cause.summary and "--lrr" in cause.summary
    assert cause.fix == f"{PY} {tmp_path / 'cli.py'} --help"
    # The same script run well: nothing refused, nothing to explain.
    assert _real_cli(tmp_path, body, "--lr", "3")[1] == 0


def test_jsonargparse_s_and_hydra_s_refusals_and_their_look_alikes() -> None:
    lightning = _why(None, code=2, tail=[
        "usage: main.py [-h] [-c CONFIG] {fit,validate,test,predict} ...",
        "error: Parser key \"model.lr\":", "  Expected a <class 'float'>. Got value: fast",
    ], module="main")
    assert lightning.kind is CauseKind.USAGE_ERROR and lightning.fix == f"{PY} -m main --help"
    assert lightning.summary.endswith("Expected a <class 'float'>. Got value: fast")
    hydra = _why(None, code=1, tail=[
        "Could not override 'optim.lr'.", "To append to your config use +optim.lr=0.1",
        "Key 'lr' is not in struct", "    full_key: optim.lr", "",
        "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
    ], module="main")
    assert hydra.kind is CauseKind.USAGE_ERROR
    assert hydra.summary.endswith("Could not override 'optim.lr': Key 'lr' is not in struct")
    # "error:" without a usage line, hydra's stack hint after a config of its own missing, and
    # argparse's words with exit 1: not a refused command line.
    assert _why(None, code=2, tail=["error: disk quota"]).kind is CauseKind.EXCEPTION
    missing = _why(None, code=1, tail=[
        "Primary config directory not found.",
        "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
    ])
    assert missing.kind is CauseKind.EXCEPTION


# ---------------------------------------------------------------- paths and ports
def test_a_missing_script_names_its_path_where_the_ranks_ran_and_the_close_one(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text("")
    ev = Evidence(
        rank=0, exit_code=1, error=f"FileNotFoundError: [Errno 2] No such file or directory: "
        f"'{tmp_path / 'trian.py'}'", python=PY, cwd=str(tmp_path), script="trian.py",
        launch_args=["--nproc", "2", "--", "trian.py", "--lr", "3"],
    )
    cause = explain(ev, _doctor(), [])
    assert cause.kind is CauseKind.FILE_NOT_FOUND
    assert cause.summary == (
        f"the script {tmp_path / 'trian.py'} does not exist (the ranks ran in {tmp_path})"
    )
    assert cause.fix == "xl launch --nproc 2 -- train.py --lr 3"
    (tmp_path / "train.py").unlink()
    far = explain(ev, _doctor(), [])
    assert far.kind is CauseKind.FILE_NOT_FOUND and far.fix is None
    python_s = _why(None, code=2, tail=["/usr/bin/python3: can't open file '/x/a.py': [Errno 2] "
                                        "No such file or directory"], cwd="/x")
    assert python_s.summary == "the script /x/a.py does not exist (the ranks ran in /x)"


def test_a_port_the_store_cannot_bind_names_who_holds_it() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cause = _why(None, tail=[
            f"[W socket.cpp:426] [c10d] The server socket cannot be initialized on [::]:{port} "
            "(errno: 98 - Address already in use).",
            "RuntimeError: The server socket has failed to listen on any local network address. "
            f"The server socket has failed to bind to 0.0.0.0:{port} (errno: 98 - Address already "
            "in use).",
        ])
    assert cause.kind is CauseKind.PORT_IN_USE
    assert cause.summary.startswith(f"port {port} is already in use, held by pid {os.getpid()} (")
    new = _why("torch.distributed.DistNetworkError: The server socket has failed to listen on any "
               "local network address. port: 1, useIpv6: false, code: -98, name: EADDRINUSE, "
               "message: address already in use")
    assert new.kind is CauseKind.PORT_IN_USE and new.summary == "port 1 is already in use"


# ---------------------------------------------------------------- a DataLoader worker killed
WORKER = "RuntimeError: DataLoader worker (pid(s) 10513) exited unexpectedly"


def test_a_worker_killed_is_the_oom_killer_s_when_the_kernel_or_the_cgroup_says_so(
    tmp_path: Path,
) -> None:
    assert _why(WORKER, kernel=KERNEL).kind is CauseKind.HOST_OOM
    group = tmp_path / "xl-run"
    group.mkdir()
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n")
    (group / "memory.max").write_text(f"{64 << 20}\n")
    counted = _why(WORKER, cgroup=str(group))
    assert counted.kind is CauseKind.HOST_OOM and f"{group}: oom_kill 1" in counted.evidence
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    assert _why(WORKER, cgroup=str(group)).kind is CauseKind.EXCEPTION  # its cgroup killed none


def test_a_worker_killed_without_an_oom_is_shared_memory_only_when_it_is_small_or_full() -> None:
    small = _why(WORKER, doctor=_doctor(shm_total=64 << 20, shm_free=0))
    assert small.kind is CauseKind.SHM_FULL and "64 MiB" in small.summary
    roomy = _why(WORKER)  # 64 GiB free: no invented cause
    assert roomy.kind is CauseKind.EXCEPTION and roomy.summary == WORKER
    bus = _why("RuntimeError: DataLoader worker (pid 77) is killed by signal: Bus error. It is "
               "possible that dataloader's workers are out of shared memory.")
    assert bus.kind is CauseKind.SHM_FULL  # torch's own word for it, whatever the size now
