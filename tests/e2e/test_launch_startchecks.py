"""What `xl launch` checks before anything starts: a taken rendezvous port and an interpreter
without torch get one line naming them and exit 2, instead of torchrun's traceback. The real `xl`;
the healthy side of each check launches for real."""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from procs import only_run, run_json, wait_no_processes, xl, xl_env

pytestmark = pytest.mark.e2e


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('trained', flush=True)\n")
    return tmp_path


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, (
        proc.returncode,
        proc.stderr,
    )
    return lines[0]


@pytest.mark.parametrize("how", ["--master-port", "--rdzv", "--nnodes"])
def test_a_taken_rendezvous_port_is_named_before_anything_starts(work: Path, how: str) -> None:
    env = xl_env(work / "home")
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        args = {
            "--master-port": ["--master-port", str(port)],
            "--rdzv": ["--rdzv", f"127.0.0.1:{port}"],
            "--nnodes": ["--nnodes", "2", "--node-rank", "0", "--rdzv", f"127.0.0.1:{port}"],
        }[how]
        line = _one_line(xl(["launch", "--no-tui", *args, "train.py"], env, cwd=work))
        assert f"rendezvous port {port} is not free" in line
        assert not (work / "home" / "runs").exists() or not any((work / "home" / "runs").iterdir())
        # The port it suggests is a command that works.
        suggested = re.search(r"--rdzv 127\.0\.0\.1:(\d+)", line)
        assert suggested is not None, line
    if how == "--nnodes":
        return  # the suggestion for one node is checked by the other two
    done = xl(
        ["launch", "--no-tui", "--master-port", suggested.group(1), "train.py"],
        env,
        cwd=work,
        timeout=120,
    )
    run_dir = only_run(work / "home")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        run_json(run_dir)["status"] == "succeeded"
        and "trained" in (run_dir / "logs" / "rank-0.log").read_text()
    )
    wait_no_processes(run_dir, timeout=10)


def test_an_interpreter_without_torch_is_named_dry_run_included(work: Path) -> None:
    venv = work / "bare"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60
    )
    bare = str(venv / "bin" / "python")
    env = xl_env(work / "home")
    for extra in (["--dry-run"], ["--no-tui"]):
        line = _one_line(xl(["launch", *extra, "--python", bare, "train.py"], env, cwd=work))
        assert line == (
            f"xl launch: --python {bare} has no torch, and the ranks run under it: install torch "
            "there "
            f"('{bare} -m pip install torch') or give another interpreter"
        )
    line = _one_line(
        xl(["launch", "--dry-run", "--python", "/bin/true", "train.py"], env, cwd=work)
    )
    assert "--python /bin/true is not a working Python interpreter" in line
    assert not (work / "home" / "runs").exists()
    # An interpreter with torch passes, and what the dry run prints runs under it.
    ok = xl(["launch", "--dry-run", "--python", sys.executable, "train.py"], env, cwd=work)
    assert (
        ok.returncode == 0
        and shlex.quote(sys.executable) + " -m torch.distributed.run" in ok.stdout
    ), ok.stderr
