"""Slurm through the real `xl`, without a cluster: `xl launch --slurm` and `xl sbatch` as real
processes in a fake allocation (variables set by the test), and the srun task run for real
through a stand-in `srun` on PATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from procs import kill_run, run_json, run_processes, xl
from slurmenv import env_without_slurm, fake_alloc_env

from xl.launcher.multinode import slurm


# --------------------------------------------------------------------------------- real `xl`
@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def _one_line(proc: subprocess.CompletedProcess[str], prefix: str, says: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix) and says in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_launch_slurm_outside_an_allocation_is_one_line_and_exit_2(work: Path) -> None:
    proc = xl(["launch", "--slurm", "--nproc", "2", "train.py"], env_without_slurm(work), cwd=work)
    _one_line(
        proc,
        "xl launch: ",
        "not inside a Slurm allocation: run it from salloc/sbatch, or use `xl sbatch` to write a "
        "batch script",
    )
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
    proc = xl(
        ["launch", "--slurm", "--dry-run", *args, "train.py"],
        env_without_slurm(work, **fake_alloc_env()),
        cwd=work,
    )
    _one_line(proc, "xl launch: ", says)


def test_launch_slurm_dry_run_json_in_a_fake_allocation(work: Path) -> None:
    env = env_without_slurm(work, **fake_alloc_env(SLURMD_NODENAME="gpu07"))
    args = [
        "launch", "--slurm", "--dry-run", "--json", "--nproc", "4", "--env", "NCCL_DEBUG=INFO",
        "train.py", "--lr", "3e-4",
    ]
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
        "--slurm-node", "--nnodes", "3", "--rdzv", f"gpu07:{slurm.rdzv_port('4242')}",
        "--run-id", run_id, "--no-tui", "--nproc", "4", "--env", "NCCL_DEBUG=INFO", "--",
        "train.py", "--lr", "3e-4",
    ]  # fmt: skip
    assert "train" in run_id and f"--job-name=xl-{run_id}" in argv
    assert not (work / "home").exists()

    # For people: the same command, the nodes, the run to attach to; still no token.
    proc = xl([a for a in args if a != "--json"], env, cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert "XL_TOKEN='<redacted>' \\" in proc.stdout.splitlines()
    assert "# node rank 2: gpu10" in proc.stdout and "'xl attach " in proc.stdout


def test_slurm_node_takes_its_rank_from_slurm_nodeid(work: Path) -> None:
    base = [
        "launch", "--slurm-node", "--nnodes", "2", "--rdzv", "10.0.0.1:21000", "--dry-run",
        "--json", "train.py",
    ]
    proc = xl(base, env_without_slurm(work, SLURM_NODEID="1"), cwd=work)
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(proc.stdout)["argv"]
    assert (
        argv[argv.index("--rdzv-backend") + 1] == "c10d"
        and argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:21000"
    )
    # xl's node rank (not torch's: c10d numbers nodes as they join) is SLURM_NODEID's.
    text = xl(
        [a for a in base if a != "--json"], env_without_slurm(work, SLURM_NODEID="1"), cwd=work
    )
    assert "# xl node 1 of 2 " in text.stdout, text.stdout
    _one_line(
        xl(base, env_without_slurm(work, SLURM_NODEID="2"), cwd=work),
        "xl launch: ",
        "--node-rank 2 must be in 0..1",
    )
    _one_line(
        xl(base, env_without_slurm(work), cwd=work),
        "xl launch: ",
        "--slurm-node is for tasks srun starts",
    )


def test_sbatch_writes_a_batch_script_bash_accepts(work: Path) -> None:
    args = [
        "sbatch", "--nodes", "2", "--gpus-per-node", "8", "--time", "04:00:00",
        "--partition", "gpu", "--job-name", "llm", "-c", "32", "--sbatch=--qos=high",
        "--nproc", "8", "--mixed-precision", "bf16", "train.py", "--data", "a b",
    ]  # fmt: skip
    proc = xl(args, env_without_slurm(work), cwd=work)
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
        f"exec {sys.executable} -m xl launch --slurm --nproc 8 --mixed-precision bf16 -- "
        "train.py --data 'a b'"
    )
    assert f"cd {work}" in lines
    path = work / "job.sh"
    path.write_text(script)
    check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=10)
    assert check.returncode == 0, check.stderr
    assert not (work / "home").exists()


def test_sbatch_help_and_bad_input(work: Path) -> None:
    proc = xl(["sbatch", "--help"], env_without_slurm(work), cwd=work)
    assert proc.returncode == 0 and "--gpus-per-node" in proc.stdout and "--nproc" in proc.stdout
    assert "sbatch" in xl(["--help"], env_without_slurm(work)).stdout
    for argv, said in [
        (["sbatch", "--nodes", "0", "train.py"], "--nodes must be at least 1"),
        (["sbatch", "--time", "1 h", "train.py"], "cannot be empty or hold spaces"),
        (["sbatch", "--nnodes", "2", "train.py"], "unknown option --nnodes; did you mean --nodes?"),
        (["sbatch", "missing.py"], "no such script: missing.py"),
        (["sbatch", "--sbatch", "qos", "train.py"], "give an sbatch option as written"),
        (["sbatch", "--rdzv", "nohost", "train.py"], "--rdzv 'nohost' is not HOST:PORT"),
    ]:
        _one_line(xl(argv, env_without_slurm(work), cwd=work), "xl sbatch: ", said)


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
    json.dump({"opts": opts, "task": args, "token_len": len(token),
               "token_in_argv": bool(token) and token in " ".join(sys.argv)}, fh)
procs = [subprocess.Popen(args, env={**os.environ, "SLURM_NODEID": str(k), "SLURM_PROCID": str(k)})
         for k in range(n)]
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
        "print('rank', dist.get_rank(), 'of', dist.get_world_size(), 'node', "
        "os.environ['GROUP_RANK'], flush=True)\n"
        "dist.barrier(); dist.destroy_process_group()\n"
    )
    env = env_without_slurm(
        tmp_path,
        SLURM_JOB_ID="99",
        SLURM_JOB_NODELIST="localhost",
        SLURM_JOB_NUM_NODES="1",
        FAKE_SRUN_REPORT=str(tmp_path / "report.json"),
    )
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
