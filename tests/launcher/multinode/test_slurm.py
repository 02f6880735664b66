"""Slurm, without a cluster: the nodelist parser, the allocation reader, the srun command for a
fake allocation (variables set by the test), the step found by name and signalled, and the first
Ctrl-C of `xl launch --slurm` when no step can be found.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from slurmenv import fake_alloc_env

from xl.errors import UsageError
from xl.launcher.cli import sbatch as cmd_slurm
from xl.launcher.multinode import slurm

# --------------------------------------------------------------------------------- nodelists
NODELISTS = [
    (
        "node[01-03,07],gpu-a,rack1-[2-3]",
        ["node01", "node02", "node03", "node07", "gpu-a", "rack1-2", "rack1-3"],
    ),
    ("gpu-a", ["gpu-a"]),
    ("node[8-11]", ["node8", "node9", "node10", "node11"]),
    ("x[009-011]", ["x009", "x010", "x011"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("n[1-02]", ["n1", "n2"]),  # the start's width decides the padding, as scontrol does
    ("n[00-1]", ["n00", "n01"]),
    ("n0[1-2]", ["n01", "n02"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("a,,b", ["a", "b"]),
    ("a[3]", ["a3"]),
    ("", []),
]


@pytest.mark.parametrize(("text", "hosts"), NODELISTS)
def test_nodelist_expands_like_scontrol(text: str, hosts: list[str]) -> None:
    assert slurm.expand_nodelist(text) == hosts


@pytest.mark.parametrize("text", ["a[2-1]", "a[1", "a]1[", "a[x-2]", "a[1-]", "a[[1]]"])
def test_bad_nodelist_is_an_error(text: str) -> None:
    with pytest.raises(ValueError, match="nodelist"):
        slurm.expand_nodelist(text)


@pytest.mark.skipif(not shutil.which("scontrol"), reason="scontrol not installed")
@pytest.mark.parametrize(("text", "hosts"), [c for c in NODELISTS if c[0]])
def test_table_agrees_with_scontrol(tmp_path: Path, text: str, hosts: list[str]) -> None:
    """`scontrol show hostnames` parses with no cluster running: the table is Slurm's own answer."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    proc = subprocess.run(
        ["scontrol", "show", "hostnames", text], capture_output=True, text=True, timeout=10, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == hosts


def test_hostnames_prefers_scontrol_then_falls_back() -> None:
    asked: list[list[str]] = []

    def scontrol(argv: Any) -> str | None:
        asked.append(list(argv))
        return "a1\na2\n"

    assert slurm.hostnames("a[1-2]", scontrol) == ["a1", "a2"]
    assert asked == [["scontrol", "show", "hostnames", "a[1-2]"]]
    assert slurm.hostnames("b[1-2]", lambda _argv: None) == ["b1", "b2"]
    with pytest.raises(UsageError, match="cannot read SLURM_JOB_NODELIST"):
        slurm.hostnames("b[2-1]", lambda _argv: None)


def test_node_address_is_slurms_nodeaddr() -> None:
    out = (
        "NodeName=node01 Arch=x86_64 CoresPerSocket=2 NodeAddr=10.1.2.3 NodeHostName=vm "
        "Version=22.05.8\n"
    )
    assert slurm.node_address("node01", lambda _argv: out) == "10.1.2.3"
    assert slurm.node_address("node01", lambda _argv: None) == "node01"


def test_allocation_from_env() -> None:
    alloc = slurm.allocation_from_env(fake_alloc_env(), lambda _argv: None)
    assert alloc is not None
    assert (alloc.job_id, alloc.nodes, alloc.nnodes) == ("4242", ["gpu07", "gpu08", "gpu10"], 3)
    assert (alloc.gpus_per_node, alloc.cpus_per_node) == (4, 32)
    # SLURM_GPUS_PER_NODE may carry a type; the old variable names still work.
    env = {
        "SLURM_JOBID": "7",
        "SLURM_NODELIST": "n1",
        "SLURM_NNODES": "1",
        "SLURM_GPUS_PER_NODE": "a100:8",
    }
    alloc = slurm.allocation_from_env(env, lambda _argv: None)
    assert alloc is not None and alloc.gpus_per_node == 8 and alloc.cpus_per_node is None
    assert slurm.allocation_from_env({"SLURM_JOB_ID": "1"}, lambda _argv: None) is None
    assert slurm.allocation_from_env({}, lambda _argv: None) is None
    with pytest.raises(UsageError, match="names 3 node\\(s\\) but SLURM_JOB_NUM_NODES says 2"):
        slurm.allocation_from_env(fake_alloc_env(SLURM_JOB_NUM_NODES="2"), lambda _argv: None)


def test_srun_runs_one_xl_per_node_with_the_whole_node() -> None:
    alloc = slurm.allocation_from_env(fake_alloc_env(), lambda _argv: None)
    assert alloc is not None
    task = slurm.node_argv(
        alloc, "gpu07:21000", "RID", ["--nproc", "4", "--", "t.py", "--lr", "1"], xl=["XL"]
    )
    assert task == [
        "XL", "launch", "--slurm-node", "--nnodes", "3", "--rdzv", "gpu07:21000", "--run-id", "RID",
        "--no-tui", "--nproc", "4", "--", "t.py", "--lr", "1",
    ]  # fmt: skip
    argv = slurm.srun_argv(alloc, task, slurm.step_name("RID"))
    assert argv[: -len(task)] == [
        "srun", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
        "--cpu-bind=none", "--export=ALL", "--mem=0", "--job-name=xl-RID",
        "--cpus-per-task=32", "--gpus-per-node=4",
    ]  # fmt: skip
    assert argv[-len(task) :] == task


def test_rendezvous_port_is_the_jobs_own() -> None:
    assert slurm.rdzv_port("4242") == slurm.rdzv_port("4242")
    assert slurm.rdzv_port("4242") != slurm.rdzv_port("4243")
    assert all(20000 <= slurm.rdzv_port(str(j)) < 29000 for j in (0, 1, 8999, 9000, 123456789))
    assert slurm.rdzv_port("77_3") == slurm.rdzv_port("773")  # array jobs: digits only


def test_step_is_found_by_name_and_signalled() -> None:
    calls: list[list[str]] = []

    def run(argv: Any) -> str | None:
        calls.append(list(argv))
        return "4242.0 xl-other\n4242.1 xl-RID\n4242.extern extern\n" if argv[0] == "squeue" else ""

    assert slurm.find_step("4242", "xl-RID", run) == "4242.1"
    assert slurm.find_step("4242", "xl-nope", run) is None
    assert slurm.signal_step("4242.1", "INT", run) and slurm.signal_step("4242.1", None, run)
    assert calls[-2:] == [["scancel", "--signal=INT", "4242.1"], ["scancel", "4242.1"]]


def test_first_ctrl_c_never_kills_srun_when_no_step_is_found(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No run of node 0 here and squeue shows no step yet: the first signal says so and leaves
    srun alone; the next one (still no step to scancel) ends srun."""

    asked: list[str] = []
    monkeypatch.setattr(cmd_slurm, "_stop_here", lambda run_id: asked.append("stop_here") or False)
    monkeypatch.setattr(
        slurm, "find_step", lambda job_id, name, run=None: asked.append("find_step") or None
    )
    alive_after_first: list[bool] = []

    def interrupt() -> None:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
        alive_after_first.append(
            all(
                p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                for p in psutil.Process().children()
            )
        )
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    code = cmd_slurm._run_srun(
        [sys.executable, "-c", "import time; time.sleep(30)"],
        dict(os.environ),
        "4242",
        "xl-RID",
        "RID",
    )
    assert code == 130 and alive_after_first == [True]
    assert asked == ["stop_here", "find_step", "find_step"]  # _stop_here first, squeue after it
    err = capsys.readouterr().err
    assert "stopping the run on every node" in err and "step xl-RID not found in squeue" in err
