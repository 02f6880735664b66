"""What a rank finds under `xl launch`: no warning of xl's making in its log (the Flight Recorder's
buffer set under the one name the installed torch reads), the priority the command had (only the
supervisor gives way), and no stdin (said in one line when a
rank dies of exactly that). Real torchrun, gloo, the real `xl`."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from procs import only_run, run_json, wait_no_processes, xl, xl_env

from xl.launcher.rank.frenv import NEW, OLD, set_buffer, torch_dir
from xl.launcher.runprocs import NICE

GLOO = """
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
print(
    "fr vars:",
    sorted(k for k in os.environ if k in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")),
    flush=True,
)
def nice(pid):
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[16])
torchrun = os.getppid()
with open(f"/proc/{torchrun}/stat") as fh:
    supervisor = int(fh.read().rsplit(")", 1)[1].split()[1])
print("nice:", nice(os.getpid()), nice(torchrun), nice(supervisor), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.e2e
def test_a_ranks_log_carries_no_warning_xl_caused(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(GLOO))
    home = tmp_path / "home"
    done = xl(
        ["launch", "--no-tui", "--nproc", "2", "train.py"], xl_env(home), cwd=tmp_path, timeout=120
    )
    run_dir = only_run(home)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        # torch 2.13 reads TORCH_FR_BUFFER_SIZE; the old name set as well made it warn in
        # every rank.
        assert f"fr vars: ['{NEW}']" in log, log
        assert "deprecated" not in log and "Warning" not in log and "warn" not in log.lower(), log
        # The training keeps the command's priority; its supervisor gives way to it.
        own = os.nice(0)
        assert f"nice: {own} {own} {min(own + NICE, 19)}" in log, log
    wait_no_processes(run_dir, timeout=10)


def test_the_buffer_goes_under_the_name_the_installed_torch_reads(tmp_path: Path) -> None:
    here = torch_dir()
    assert here is not None
    env: dict[str, str] = {}
    assert set_buffer(env, "2000") == NEW and env == {NEW: "2000"}  # this venv's torch 2.13
    # A torch from before the rename knows only the old name.
    old = tmp_path / "torch"
    (old / "distributed").mkdir(parents=True)
    (old / "distributed" / "distributed_c10d.py").write_text(
        "# reads TORCH_NCCL_TRACE_BUFFER_SIZE in C++ only\n"
    )
    env = {}
    assert set_buffer(env, "2000", str(old)) == OLD and env == {OLD: "2000"}
    # The person's own setting, under either name, stands.
    for mine in ({OLD: "10"}, {NEW: "0"}):
        env = dict(mine)
        assert set_buffer(env, "2000") is None and env == mine


NO_STDIN = (
    "ranks have no stdin: input() and breakpoint() cannot read the terminal under xl launch "
    "(docs/launch.md)"
)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("body", "error", "said"),
    [
        ("answer = input('continue? ')", "EOFError: EOF when reading a line", True),
        ("breakpoint()\nprint('after')", "bdb.BdbQuit", True),
        # Another EOFError is no stdin matter.
        ("import pickle\npickle.loads(b'')", "EOFError: Ran out of input", False),
    ],
)
def test_a_rank_that_reads_stdin_dies_with_one_line_that_says_why(
    tmp_path: Path, body: str, error: str, said: bool
) -> None:
    (tmp_path / "ask.py").write_text(body + "\n")
    home = tmp_path / "home"
    done = xl(
        ["launch", "--no-tui", "--nproc", "1", "ask.py"],
        xl_env(home, XL_STOP_GRACE="1"),
        cwd=tmp_path,
        timeout=120,
    )
    run_dir = only_run(home)
    failure = run_json(run_dir)["failure"]
    assert done.returncode == 1 and failure["rank"] == 0, done.stdout + done.stderr
    assert failure["message"] == f"rank 0 failed first: {error}" + (
        f" ({NO_STDIN})" if said else ""
    ), failure
    assert (NO_STDIN in done.stdout + done.stderr) == said
    wait_no_processes(run_dir, timeout=10)


BESIDE = """
import os
import sys

here = os.path.dirname(__file__)
os.chdir(os.sep)  # the script's data is found beside the script, wherever the cwd goes
with open(os.path.join(here, "data.txt")) as fh:
    print("file:", __file__, "argv0:", sys.argv[0], "data:", fh.read().strip(), flush=True)
"""


@pytest.mark.e2e
def test_a_script_finds_its_data_beside_itself_as_under_torchrun(tmp_path: Path) -> None:
    # python and torchrun give __main__ an absolute __file__ while sys.argv[0] stays as typed.
    project = tmp_path / "project"
    project.mkdir()
    (project / "f.py").write_text(textwrap.dedent(BESIDE))
    (project / "data.txt").write_text("beside\n")
    home = tmp_path / "home"
    done = xl(
        ["launch", "--no-tui", "--nproc", "2", "f.py"], xl_env(home), cwd=project, timeout=120
    )
    run_dir = only_run(home)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        assert f"file: {project / 'f.py'} argv0: f.py data: beside" in log, log
    wait_no_processes(run_dir, timeout=10)
