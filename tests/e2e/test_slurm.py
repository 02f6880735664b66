"""Slurm: `xl launch --slurm` (one srun step, one xl agent per node) and `xl sbatch`.

Always run: the nodelist parser, the allocation reader and the srun command for a fake
allocation (variables set by the test), `xl sbatch` and `xl launch --slurm --dry-run` as real
processes, and the srun task run for real through a stand-in `srun` on PATH.

Opt-in, against a real Slurm (Debian's slurm-wlm 22.05 with munge) that the test starts itself in
a temp dir: a one-host cluster with two slurmd "nodes" (node01, node02; both this machine, with
NodeAddr 127.0.0.1), then `salloc -N2 xl launch --slurm`, `sbatch` of an `xl sbatch` script, and
Ctrl-C. It needs root (slurmd launches the tasks) and the packages:

    apt-get install -y slurm-wlm munge
    XL_TEST_SLURM=1 .venv/bin/pytest tests/e2e/test_slurm.py -k real

To use a cluster that is already running instead, also set XL_TEST_SLURM_CONF=/path/slurm.conf
(it must have 2 idle nodes whose NodeAddr the other can reach).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from procs import XL, kill_run, run_json, run_processes, wait_for, wait_no_processes, xl, xl_env

from xl.errors import UsageError
from xl.launcher.cli import sbatch as cmd_slurm
from xl.launcher.multinode import slurm

# --------------------------------------------------------------------------------- nodelists
NODELISTS = [
    ("node[01-03,07],gpu-a,rack1-[2-3]", ["node01", "node02", "node03", "node07", "gpu-a", "rack1-2", "rack1-3"]),
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
    proc = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True, text=True, timeout=10, env=env)
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
    out = "NodeName=node01 Arch=x86_64 CoresPerSocket=2 NodeAddr=10.1.2.3 NodeHostName=vm Version=22.05.8\n"
    assert slurm.node_address("node01", lambda _argv: out) == "10.1.2.3"
    assert slurm.node_address("node01", lambda _argv: None) == "node01"


# --------------------------------------------------------------------------------- allocation
def _fake_alloc_env(**extra: str) -> dict[str, str]:
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu[07-08],gpu10",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_GPUS_ON_NODE": "4",
        "SLURM_JOB_CPUS_PER_NODE": "64(x2),32",
    }
    env.update(extra)
    return env


def test_allocation_from_env() -> None:
    alloc = slurm.allocation_from_env(_fake_alloc_env(), lambda _argv: None)
    assert alloc is not None
    assert (alloc.job_id, alloc.nodes, alloc.nnodes) == ("4242", ["gpu07", "gpu08", "gpu10"], 3)
    assert (alloc.gpus_per_node, alloc.cpus_per_node) == (4, 32)
    # SLURM_GPUS_PER_NODE may carry a type; the old variable names still work.
    env = {"SLURM_JOBID": "7", "SLURM_NODELIST": "n1", "SLURM_NNODES": "1", "SLURM_GPUS_PER_NODE": "a100:8"}
    alloc = slurm.allocation_from_env(env, lambda _argv: None)
    assert alloc is not None and alloc.gpus_per_node == 8 and alloc.cpus_per_node is None
    assert slurm.allocation_from_env({"SLURM_JOB_ID": "1"}, lambda _argv: None) is None
    assert slurm.allocation_from_env({}, lambda _argv: None) is None
    with pytest.raises(UsageError, match="names 3 node\\(s\\) but SLURM_JOB_NUM_NODES says 2"):
        slurm.allocation_from_env(_fake_alloc_env(SLURM_JOB_NUM_NODES="2"), lambda _argv: None)


def test_srun_runs_one_xl_per_node_with_the_whole_node() -> None:
    alloc = slurm.allocation_from_env(_fake_alloc_env(), lambda _argv: None)
    assert alloc is not None
    task = slurm.node_argv(alloc, "gpu07:21000", "RID", ["--nproc", "4", "--", "t.py", "--lr", "1"], xl=["XL"])
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


def test_first_ctrl_c_never_kills_srun_when_no_step_is_found(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """No run of node 0 here and squeue shows no step yet: the first signal says so and leaves
    srun alone; the next one (still no step to scancel) ends srun."""

    asked: list[str] = []
    monkeypatch.setattr(cmd_slurm, "_stop_here", lambda run_id: asked.append("stop_here") or False)
    monkeypatch.setattr(slurm, "find_step", lambda job_id, name, run=None: asked.append("find_step") or None)
    alive_after_first: list[bool] = []

    def interrupt() -> None:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
        alive_after_first.append(all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in psutil.Process().children()))
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    code = cmd_slurm._run_srun([sys.executable, "-c", "import time; time.sleep(30)"], dict(os.environ), "4242", "xl-RID", "RID")
    assert code == 130 and alive_after_first == [True]
    assert asked == ["stop_here", "find_step", "find_step"]  # _stop_here first, squeue after it
    err = capsys.readouterr().err
    assert "stopping the run on every node" in err and "step xl-RID not found in squeue" in err


# --------------------------------------------------------------------------------- real `xl`
@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def _env(work: Path, *, stub_scontrol: bool = True, **extra: str) -> dict[str, str]:
    """xl's environment for a test, with none of this shell's SLURM* variables."""
    env = xl_env(work / "home")
    for key in [k for k in env if k.startswith("SLURM")]:
        del env[key]
    if not stub_scontrol:
        env.update(extra)
        return env
    # An scontrol that fails at once (a real one, with no cluster to ask, retries for a minute):
    # xl's own parser and the node names answer.
    stub = work / "stub-bin"
    stub.mkdir(exist_ok=True)
    (stub / "scontrol").write_text("#!/bin/sh\nexit 1\n")
    (stub / "scontrol").chmod(0o755)
    env["PATH"] = f"{stub}{os.pathsep}{env['PATH']}"
    env.update(extra)
    return env


def _one_line(proc: subprocess.CompletedProcess[str], prefix: str, says: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix) and says in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_launch_slurm_outside_an_allocation_is_one_line_and_exit_2(work: Path) -> None:
    proc = xl(["launch", "--slurm", "--nproc", "2", "train.py"], _env(work), cwd=work)
    _one_line(proc, "xl launch: ", "not inside a Slurm allocation: run it from salloc/sbatch, or use `xl sbatch` to write a batch script")
    assert proc.stdout == "" and not (work / "home").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--detach"], "--detach does not go with --slurm"),
        (["--node-rank", "1"], "--node-rank does not go with --slurm"),
        (["--nnodes", "2"], "--nnodes 2: this allocation has 3 node(s) (gpu[07-08],gpu10)"),
        (["--nproc", "0"], "--nproc must be at least 1"),
        (["--env", "nope"], "--env 'nope' is not NAME=VALUE"),
        (["--rdzv", "nohost"], "--rdzv 'nohost' is not HOST:PORT"),
        (["--rdzv", "h:70000"], "port 70000 is out of range"),
    ],
)
def test_launch_slurm_bad_input(work: Path, args: list[str], says: str) -> None:
    proc = xl(["launch", "--slurm", "--dry-run", *args, "train.py"], _env(work, **_fake_alloc_env()), cwd=work)
    _one_line(proc, "xl launch: ", says)


def test_launch_slurm_dry_run_json_in_a_fake_allocation(work: Path) -> None:
    env = _env(work, **_fake_alloc_env(SLURMD_NODENAME="gpu07"))
    args = ["launch", "--slurm", "--dry-run", "--json", "--nproc", "4", "--env", "NCCL_DEBUG=INFO", "train.py", "--lr", "3e-4"]
    proc = xl(args, env, cwd=work)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) == {"argv", "env"}
    # The token travels in the environment (srun --export=ALL), shown redacted, never in argv.
    assert out["env"] == {"XL_TOKEN": "<redacted>"}
    argv = out["argv"]
    assert argv[0] == "srun" and "--export=ALL" in argv and "--kill-on-bad-exit=0" in argv
    assert argv[1:4] == ["--nodes=3", "--ntasks=3", "--ntasks-per-node=1"]
    start = argv.index(sys.executable)
    assert argv[start : start + 4] == [sys.executable, "-m", "xl", "launch"]
    task = argv[start + 4 :]
    run_id = task[task.index("--run-id") + 1]
    assert task == [
        "--slurm-node", "--nnodes", "3", "--rdzv", f"gpu07:{slurm.rdzv_port('4242')}", "--run-id", run_id,
        "--no-tui", "--nproc", "4", "--env", "NCCL_DEBUG=INFO", "--", "train.py", "--lr", "3e-4",
    ]  # fmt: skip
    assert "train" in run_id and f"--job-name=xl-{run_id}" in argv
    assert not (work / "home").exists()

    # For people: the same command, the nodes, the run to attach to; still no token.
    proc = xl([a for a in args if a != "--json"], env, cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert "XL_TOKEN='<redacted>' \\" in proc.stdout.splitlines()
    assert "# node rank 2: gpu10" in proc.stdout and "'xl attach " in proc.stdout


def test_slurm_node_takes_its_rank_from_slurm_nodeid(work: Path) -> None:
    base = ["launch", "--slurm-node", "--nnodes", "2", "--rdzv", "10.0.0.1:21000", "--dry-run", "--json", "train.py"]
    proc = xl(base, _env(work, SLURM_NODEID="1"), cwd=work)
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(proc.stdout)["argv"]
    assert argv[argv.index("--rdzv-backend") + 1] == "c10d" and argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:21000"
    # xl's node rank (not torch's: c10d numbers nodes as they join) is SLURM_NODEID's.
    text = xl([a for a in base if a != "--json"], _env(work, SLURM_NODEID="1"), cwd=work)
    assert "# xl node 1 of 2 " in text.stdout, text.stdout
    _one_line(xl(base, _env(work, SLURM_NODEID="2"), cwd=work), "xl launch: ", "--node-rank 2 must be in 0..1")
    _one_line(xl(base, _env(work), cwd=work), "xl launch: ", "--slurm-node is for tasks srun starts")


def test_sbatch_writes_a_batch_script_bash_accepts(work: Path) -> None:
    args = [
        "sbatch", "--nodes", "2", "--gpus-per-node", "8", "--time", "04:00:00", "--partition", "gpu",
        "--job-name", "llm", "-c", "32", "--sbatch=--qos=high", "--nproc", "8", "--mixed-precision", "bf16",
        "train.py", "--data", "a b",
    ]  # fmt: skip
    proc = xl(args, _env(work), cwd=work)
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    sbatch = [ln for ln in lines if ln.startswith("#SBATCH")]
    assert sbatch == [
        "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=32", "#SBATCH --time=04:00:00", "#SBATCH --partition=gpu",
        "#SBATCH --job-name=llm", "#SBATCH --qos=high",
    ]  # fmt: skip
    # The last line runs this very xl (the venv's interpreter, by absolute path) with --slurm.
    assert lines[-1] == (
        f"exec {sys.executable} -m xl launch --slurm --nproc 8 --mixed-precision bf16 -- train.py --data 'a b'"
    )
    assert f"cd {work}" in lines
    path = work / "job.sh"
    path.write_text(script)
    check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=10)
    assert check.returncode == 0, check.stderr
    assert not (work / "home").exists()


def test_sbatch_help_and_bad_input(work: Path) -> None:
    proc = xl(["sbatch", "--help"], _env(work), cwd=work)
    assert proc.returncode == 0 and "--gpus-per-node" in proc.stdout and "--nproc" in proc.stdout
    assert "sbatch" in xl(["--help"], _env(work)).stdout
    _one_line(xl(["sbatch", "--nodes", "0", "train.py"], _env(work), cwd=work), "xl sbatch: ", "--nodes must be at least 1")
    _one_line(xl(["sbatch", "--time", "1 h", "train.py"], _env(work), cwd=work), "xl sbatch: ", "cannot be empty or hold spaces")
    _one_line(xl(["sbatch", "--nnodes", "2", "train.py"], _env(work), cwd=work), "xl sbatch: ", "unknown option --nnodes; did you mean --nodes?")
    _one_line(xl(["sbatch", "missing.py"], _env(work), cwd=work), "xl sbatch: ", "no such script: missing.py")
    _one_line(xl(["sbatch", "--sbatch", "qos", "train.py"], _env(work), cwd=work), "xl sbatch: ", "give an sbatch option as written")
    _one_line(xl(["sbatch", "--rdzv", "nohost", "train.py"], _env(work), cwd=work), "xl sbatch: ", "--rdzv 'nohost' is not HOST:PORT")


# A stand-in srun: runs the task once per node on this machine with the node's SLURM_NODEID, as
# srun would, and reports what it was given. It checks the token came in the environment only.
FAKE_SRUN = r'''#!PYTHON
import json, os, subprocess, sys
args = sys.argv[1:]
opts = []
while args and args[0].startswith("--"):
    opts.append(args.pop(0))
n = int(next(o for o in opts if o.startswith("--nodes=")).split("=")[1])
token = os.environ.get("XL_TOKEN", "")
with open(os.environ["FAKE_SRUN_REPORT"], "w") as fh:
    json.dump({"opts": opts, "task": args, "token_len": len(token), "token_in_argv": bool(token) and token in " ".join(sys.argv)}, fh)
procs = [subprocess.Popen(args, env={**os.environ, "SLURM_NODEID": str(k), "SLURM_PROCID": str(k)}) for k in range(n)]
sys.exit(max(p.wait(timeout=120) for p in procs))
'''


@pytest.mark.e2e
def test_launch_slurm_runs_the_srun_task_for_real(tmp_path: Path) -> None:
    """One node through a stand-in srun: the generated task command trains 2 CPU ranks."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "srun"
    fake.write_text(FAKE_SRUN.replace("PYTHON", sys.executable, 1))
    fake.chmod(0o755)
    (tmp_path / "t.py").write_text(
        "import os, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "print('rank', dist.get_rank(), 'of', dist.get_world_size(), 'node', os.environ['GROUP_RANK'], flush=True)\n"
        "dist.barrier(); dist.destroy_process_group()\n"
    )
    env = _env(tmp_path, SLURM_JOB_ID="99", SLURM_JOB_NODELIST="localhost", SLURM_JOB_NUM_NODES="1", FAKE_SRUN_REPORT=str(tmp_path / "report.json"))
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    runs = tmp_path / "home" / "runs"
    try:
        proc = xl(["launch", "--slurm", "--nproc", "2", "t.py"], env, cwd=tmp_path, timeout=90)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        report = json.loads((tmp_path / "report.json").read_text())
        assert report["token_len"] == 32 and not report["token_in_argv"]
        run_id = report["task"][report["task"].index("--run-id") + 1]
        run_dir = runs / run_id  # node 0's run is the id the launcher chose
        run = run_json(run_dir)
        assert run["status"] == "succeeded" and run["world_size"] == 2 and run["node_rank"] == 0
        assert sorted(r["rank"] for r in run["ranks"]) == [0, 1]
        assert "rank 0 of 2 node 0" in (run_dir / "logs" / "rank-0.log").read_text()
        assert f"node 0's run is {run_id}" in proc.stderr
        assert not run_processes(run_dir)
    finally:
        for d in runs.iterdir() if runs.is_dir() else ():
            kill_run(d)


# --------------------------------------------------------------------------------- real Slurm
def _slurm_ready() -> str | None:
    if os.environ.get("XL_TEST_SLURM") != "1":
        return "opt-in: set XL_TEST_SLURM=1 (see this module's docstring)"
    missing = [c for c in ("srun", "salloc", "sbatch", "scontrol", "sinfo", "slurmctld", "slurmd", "munged") if not shutil.which(c)]
    if missing and not os.environ.get("XL_TEST_SLURM_CONF"):
        return f"not installed: {', '.join(missing)} (apt-get install -y slurm-wlm munge)"
    if not os.environ.get("XL_TEST_SLURM_CONF") and os.geteuid() != 0:
        return "starting slurmd needs root (or point XL_TEST_SLURM_CONF at a running cluster)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SLURM_CONF = """\
ClusterName=xltest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
AuthType=auth/munge
AuthInfo=socket={dir}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
KillWait=5
NodeName=node01 NodeHostname={host} NodeAddr=127.0.0.1 Port={port1} CPUs={cpus} RealMemory=1000 State=UNKNOWN
NodeName=node02 NodeHostname={host} NodeAddr=127.0.0.1 Port={port2} CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=node01,node02 Default=YES MaxTime=INFINITE State=UP
"""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    """SLURM_CONF of a running 2-node cluster: the one given, or munged + slurmctld + 2 slurmd
    started here (in the foreground, so the test owns their PIDs) and stopped afterwards."""
    reason = _slurm_ready()
    if reason:
        pytest.skip(reason)
    given = os.environ.get("XL_TEST_SLURM_CONF")
    if given:
        yield {"SLURM_CONF": given}
        return
    # Short: munge's socket path must fit a unix socket address.
    d = Path(tempfile.mkdtemp(prefix="xlslurm-", dir="/tmp"))
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (d / "slurm.conf").write_text(
        SLURM_CONF.format(host=socket.gethostname(), dir=d, ctld_port=_free_port(), port1=_free_port(), port2=_free_port(), cpus=os.cpu_count() or 1)
    )
    env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
    daemons: list[subprocess.Popen[bytes]] = []
    log = open(d / "daemons.log", "ab")  # noqa: SIM115 - closed in finally
    try:
        munge = ["munged", "-F", "-f", f"--socket={d}/munge.sock", f"--key-file={key}", f"--log-file={d}/munged.log", f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed"]
        daemons.append(subprocess.Popen(munge, env=env, stdout=log, stderr=log))
        wait_for(lambda: (d / "munge.sock").exists(), timeout=10, what="munged")
        daemons.append(subprocess.Popen(["slurmctld", "-D", "-i"], env=env, stdout=log, stderr=log))
        time.sleep(1)
        for node in ("node01", "node02"):
            daemons.append(subprocess.Popen(["slurmd", "-D", "-N", node], env=env, stdout=log, stderr=log))

        def idle() -> bool:
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True, timeout=10).stdout
            return out.split() == ["node01", "idle", "node02", "idle"]

        wait_for(idle, timeout=40, what="2 idle slurmd nodes", interval=0.5)
        yield {"SLURM_CONF": str(d / "slurm.conf")}
    finally:
        subprocess.run(["scancel", "--full", "--user=root"], env=env, capture_output=True, timeout=20)
        for proc in reversed(daemons):
            _stop(proc)
        log.close()
        shutil.rmtree(d, ignore_errors=True)


MN_SCRIPT = '''
import os, time
import torch, torch.distributed as dist
import xl
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print(f"rank {rank} of {world} on slurm node {os.environ['SLURM_NODEID']}: sum {total.item():g}", flush=True)
for step in range(int(os.environ.get("MN_STEPS", "3"))):
    dist.all_reduce(torch.ones(1))
    xl.log(step=step, loss=1.0 / (step + 1), samples=4)
    if step == 0:
        print("ready", flush=True)
    time.sleep(float(os.environ.get("MN_SLEEP", "0")))
dist.barrier()
dist.destroy_process_group()
if os.environ.get("MN_FAIL_NODE") == os.environ["SLURM_NODEID"]:
    raise RuntimeError(f"late boom on rank {rank}")
print("done", flush=True)
'''


def _slurm_env(tmp_path: Path, cluster: dict[str, str], **extra: str) -> dict[str, str]:
    # The real scontrol: the cluster answers it (NodeAddr, hostnames).
    return _env(tmp_path, stub_scontrol=False, **cluster, **extra)


def _node_runs(home: Path) -> dict[int, Path]:
    """node rank -> run dir, for the runs whose run.json is written already."""
    runs = {}
    for d in (home / "runs").iterdir() if (home / "runs").is_dir() else ():
        node = run_json(d).get("node_rank")
        if node is not None:
            runs[int(node)] = d
    return runs


def _assert_nothing_left(runs: dict[int, Path], env: dict[str, str]) -> None:
    for run_dir in runs.values():
        wait_no_processes(run_dir, timeout=15)

    def no_jobs() -> bool:
        out = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True, timeout=10).stdout
        return not out.strip()

    wait_for(no_jobs, timeout=20, what="the cluster's queue to be empty", interval=0.5)


def _check_two_node_run(home: Path, output: str) -> dict[int, Path]:
    runs = _node_runs(home)
    assert sorted(runs) == [0, 1], output[-3000:]
    node0 = runs[0].name
    assert runs[1].name == f"{node0}-node1"
    # c10d numbers nodes as they join: global rank 0 may be on either Slurm node. xl's node
    # rank is SLURM_NODEID, and node 0 lists each rank with it.
    layout = {r["rank"]: r["node_rank"] for r in run_json(runs[0])["ranks"]}
    assert sorted(layout) == [0, 1] and sorted(layout.values()) == [0, 1], layout
    for node, run_dir in runs.items():
        run = run_json(run_dir)
        assert run["status"] == "succeeded" and run["world_size"] == 2 and run["nnodes"] == 2, output[-3000:]
        # Node 0's run is the view of the whole run: every node's ranks and logs.
        ranks = [0, 1] if node == 0 else [r for r, n in layout.items() if n == node]
        assert [(r["rank"], r["exit_code"]) for r in run["ranks"]] == [(r, 0) for r in ranks]
        for rank in ranks:
            log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
            assert f"rank {rank} of 2 on slurm node {layout[rank]}: sum 3" in log and "done" in log
    # One view in the output: node 0's, with every rank once; node 1 only says how it ended.
    assert output.count("[rank 0] done") == 1 and output.count("[rank 1] done") == 1, output[-3000:]
    return runs


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_real_salloc_two_nodes(tmp_path: Path, cluster: dict[str, str]) -> None:
    (tmp_path / "mn.py").write_text(MN_SCRIPT)
    env = _slurm_env(tmp_path, cluster)
    argv = ["salloc", "-N2", *XL, "launch", "--slurm", "--nproc", "1", "--no-tui", "mn.py"]
    proc = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "rendezvous at 127.0.0.1:" in output  # the first node's NodeAddr, from scontrol
    runs = _check_two_node_run(tmp_path / "home", output)
    _assert_nothing_left(runs, env)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_real_sbatch_script(tmp_path: Path, cluster: dict[str, str]) -> None:
    (tmp_path / "mn.py").write_text(MN_SCRIPT)
    env = _slurm_env(tmp_path, cluster)
    made = xl(["sbatch", "--nodes", "2", "--job-name", "xltest", "--output", "job.out", "--nproc", "1", "mn.py"], env, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    (tmp_path / "job.sh").write_text(made.stdout)
    proc = subprocess.run(["sbatch", "--wait", "job.sh"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    output = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert proc.returncode == 0, proc.stderr + output[-3000:]
    runs = _check_two_node_run(tmp_path / "home", output)
    _assert_nothing_left(runs, env)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_real_ctrl_c_stops_every_node(tmp_path: Path, cluster: dict[str, str]) -> None:
    (tmp_path / "mn.py").write_text(MN_SCRIPT)
    env = _slurm_env(tmp_path, cluster, MN_STEPS="100000", MN_SLEEP="0.05")
    argv = ["salloc", "-N2", *XL, "launch", "--slurm", "--nproc", "1", "--no-tui", "mn.py"]
    salloc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    home = tmp_path / "home"
    try:

        def training() -> bool:
            # Node 0's run dir gets both ranks' logs, node 1's its own (whichever rank it is).
            runs = _node_runs(home)
            return sorted(runs) == [0, 1] and all(
                len(logs := list((d / "logs").glob("rank-*.log"))) == 2 - n and all("ready" in p.read_text() for p in logs)
                for n, d in runs.items()
            )

        wait_for(training, timeout=60, what="both nodes to train", interval=0.2)
        [launcher] = [p for p in psutil.Process(salloc.pid).children() if "--slurm" in p.cmdline()]
        launcher.send_signal(signal.SIGINT)  # Ctrl-C in the launching terminal
        output, _ = salloc.communicate(timeout=60)
    finally:
        if salloc.poll() is None:
            # A failed test must not leave the run going: the launcher (which shares salloc's
            # output pipe) first, then salloc.
            for child in psutil.Process(salloc.pid).children():
                child.send_signal(signal.SIGINT)
            try:
                salloc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                salloc.kill()
                salloc.communicate(timeout=30)
    runs = _node_runs(home)
    assert "stopping the run on every node" in output, output[-3000:]
    assert salloc.returncode == 1, output[-3000:]
    # Node 0's run was stopped as `xl stop` stops it; node 1's rank may see its peer go first
    # and fail on its own (as in tests/e2e/test_multinode.py): either way it ended, nothing hangs.
    run0, run1 = run_json(runs[0]), run_json(runs[1])
    assert run0["status"] == "stopped", output[-3000:]
    assert [r["state"] for r in run0["ranks"] if r["node_rank"] == 0] == ["stopped"], run0["ranks"]
    assert run1["status"] in ("stopped", "failed"), output[-3000:]
    _assert_nothing_left(runs, env)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_real_rank_failing_on_node_1_fails_node_0(tmp_path: Path, cluster: dict[str, str]) -> None:
    """Node 1's rank raises after the last collective: node 1's xl exits 1 once it has told node
    0, and Slurm must not kill the step for it (--kill-on-bad-exit=0): node 0's run records the
    failure, naming node 1 and its rank, and every process ends."""
    (tmp_path / "mn.py").write_text(MN_SCRIPT)
    env = _slurm_env(tmp_path, cluster, MN_FAIL_NODE="1")
    argv = ["salloc", "-N2", *XL, "launch", "--slurm", "--nproc", "1", "--no-tui", "mn.py"]
    home = tmp_path / "home"
    try:
        proc = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=150)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 1, output[-3000:]
        runs = _node_runs(home)
        assert sorted(runs) == [0, 1], output[-3000:]
        [r1] = [r["rank"] for r in run_json(runs[1])["ranks"]]
        run0 = wait_for(lambda: (r := run_json(runs[0])).get("status") != "running" and r, timeout=30, what="node 0's run to end")
        assert run0["status"] == "failed", output[-3000:]
        failure = run0["failure"]
        assert (failure["rank"], failure["node_rank"]) == (r1, 1), failure
        assert failure["message"].startswith("node 1 (") and f"late boom on rank {r1}" in failure["traceback"], failure
        assert run_json(runs[1])["status"] == "failed"
        _assert_nothing_left(runs, env)
    finally:
        for d in _node_runs(home).values():
            kill_run(d)
