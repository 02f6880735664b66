"""Slurm for real: `salloc -N2 xl launch --slurm`, `sbatch` of an `xl sbatch` script,
Ctrl-C, and a rank failing on the second node.

Against a real Slurm (Debian's slurm-wlm 22.05 with munge) that the test starts itself in a temp
dir: a one-host cluster with two slurmd "nodes" (node01, node02; both this machine, with NodeAddr
127.0.0.1). It needs root (slurmd launches the tasks) and the packages the README's test
command installs (`apt-get install -y slurmd slurmctld`; munge comes with them).

To use a cluster that is already running instead, set XL_TEST_SLURM_CONF=/path/slurm.conf
(it must have 2 idle nodes whose NodeAddr the other can reach).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from procs import XL, free_port, kill_run, run_json, wait_for, wait_no_processes, xl
from slurmenv import env_without_slurm


# --------------------------------------------------------------------------------- real Slurm
def _slurm_ready() -> str | None:
    """Why this machine cannot run the tests (a skip), or None. Missing packages are a failure,
    not a skip: the README's test command installs them."""
    if os.environ.get("XL_TEST_SLURM_CONF"):
        return None
    if os.geteuid() != 0:
        return "starting slurmd needs root (or point XL_TEST_SLURM_CONF at a running cluster)"
    missing = [
        c
        for c in ("srun", "salloc", "sbatch", "scontrol", "sinfo", "slurmctld", "slurmd", "munged")
        if not shutil.which(c)
    ]
    assert not missing, (
        f"not installed: {', '.join(missing)} (the README's test command installs Debian's "
        "slurmd and slurmctld)"
    )
    return None


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
NodeName=node01 NodeHostname={host} NodeAddr=127.0.0.1 Port={port1} CPUs={cpus} \
RealMemory=1000 State=UNKNOWN
NodeName=node02 NodeHostname={host} NodeAddr=127.0.0.1 Port={port2} CPUs={cpus} \
RealMemory=1000 State=UNKNOWN
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
        SLURM_CONF.format(
            host=socket.gethostname(),
            dir=d,
            ctld_port=free_port(),
            port1=free_port(),
            port2=free_port(),
            cpus=os.cpu_count() or 1,
        )
    )
    env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
    daemons: list[subprocess.Popen[bytes]] = []
    log = open(d / "daemons.log", "ab")  # noqa: SIM115 - closed in finally
    try:
        munge = [
            "munged", "-F", "-f", f"--socket={d}/munge.sock", f"--key-file={key}",
            f"--log-file={d}/munged.log", f"--pid-file={d}/munged.pid",
            f"--seed-file={d}/munged.seed",
        ]
        daemons.append(subprocess.Popen(munge, env=env, stdout=log, stderr=log))
        wait_for(lambda: (d / "munge.sock").exists(), timeout=10, what="munged")
        daemons.append(subprocess.Popen(["slurmctld", "-D", "-i"], env=env, stdout=log, stderr=log))
        time.sleep(1)
        for node in ("node01", "node02"):
            daemons.append(
                subprocess.Popen(["slurmd", "-D", "-N", node], env=env, stdout=log, stderr=log)
            )

        def idle() -> bool:
            out = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %t"],
                env=env,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
            return out.split() == ["node01", "idle", "node02", "idle"]

        wait_for(idle, timeout=40, what="2 idle slurmd nodes", interval=0.5)
        yield {"SLURM_CONF": str(d / "slurm.conf")}
    finally:
        subprocess.run(
            ["scancel", "--full", "--user=root"], env=env, capture_output=True, timeout=20
        )
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
print(f"rank {rank} of {world} on slurm node {os.environ['SLURM_NODEID']}: "
      f"sum {total.item():g}", flush=True)
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
    return env_without_slurm(tmp_path, stub_scontrol=False, **cluster, **extra)


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
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True, timeout=10
        ).stdout
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
        assert run["status"] == "succeeded" and run["world_size"] == 2 and run["nnodes"] == 2, (
            output[-3000:]
        )
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
    # Node 0 compared both nodes' environments before the ranks started: alike, so not a word.
    assert run_json(runs[0])["env"]["compared"] == [0, 1], run_json(runs[0])
    assert run_json(runs[0])["env"]["diffs"] == [] and "differs" not in output
    _assert_nothing_left(runs, env)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_real_sbatch_script(tmp_path: Path, cluster: dict[str, str]) -> None:
    (tmp_path / "mn.py").write_text(MN_SCRIPT)
    env = _slurm_env(tmp_path, cluster)
    made = xl(
        [
            "sbatch", "--nodes", "2", "--job-name", "xltest", "--output", "job.out", "--nproc", "1",
            "mn.py",
        ],
        env,
        cwd=tmp_path,
    )
    assert made.returncode == 0, made.stderr
    (tmp_path / "job.sh").write_text(made.stdout)
    proc = subprocess.run(
        ["sbatch", "--wait", "job.sh"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
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
    salloc = subprocess.Popen(
        argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    home = tmp_path / "home"
    try:

        def training() -> bool:
            # Each node's run dir gets its own rank's log (whichever rank it is): a rank's output
            # stays on its node while it runs.
            runs = _node_runs(home)
            return sorted(runs) == [0, 1] and all(
                len(logs := list((d / "logs").glob("rank-*.log"))) == 1
                and all("ready" in p.read_text() for p in logs)
                for d in runs.values()
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
    # and fail on its own (as in tests/e2e/test_multinode_links.py): either way it ended,
    # nothing hangs.
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
        proc = subprocess.run(
            argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=150
        )
        output = proc.stdout + proc.stderr
        assert proc.returncode == 1, output[-3000:]
        runs = _node_runs(home)
        assert sorted(runs) == [0, 1], output[-3000:]
        [r1] = [r["rank"] for r in run_json(runs[1])["ranks"]]
        run0 = wait_for(
            lambda: (r := run_json(runs[0])).get("status") != "running" and r,
            timeout=30,
            what="node 0's run to end",
        )
        assert run0["status"] == "failed", output[-3000:]
        failure = run0["failure"]
        assert (failure["rank"], failure["node_rank"]) == (r1, 1), failure
        assert (
            failure["message"].startswith("node 1 (")
            and f"late boom on rank {r1}" in failure["traceback"]
        ), failure
        assert run_json(runs[1])["status"] == "failed"
        _assert_nothing_left(runs, env)
    finally:
        for d in _node_runs(home).values():
            kill_run(d)
