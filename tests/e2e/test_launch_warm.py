"""torchrun's interpreter starts ahead of the plan (docs/launch.md, "How a launch starts"):
`xl launch` forks its supervisor as soon as its command line is parsed, and that supervisor
starts torchrun's interpreter at once. Checked from the outside: the run's torchrun is that
interpreter (it was started before the collector's port existed, yet its ranks report to it),
`ps` shows it as torchrun; a launch whose environment differs starts torchrun as before; a launch
that fails after the fork leaves no process and no run behind. Real torchrun, gloo, the real `xl`."""

from __future__ import annotations

import ast
import os
import sys
import textwrap
from pathlib import Path

import pytest
from procs import only_run, run_json, wait_no_processes, xl, xl_env

from xl.launcher.plan import NO_SHARED_STORE
from xl.launcher.supervisor.warm import LATE, WarmTorchrun

PROBE = """
import os
import torch.distributed as dist
import xl

dist.init_process_group("gloo")
agent = os.getppid()
with open(f"/proc/{agent}/cmdline", "rb") as fh:
    cmdline = fh.read().rstrip(b"\\0").split(b"\\0")
with open(f"/proc/{agent}/environ", "rb") as fh:
    started_with = dict(v.split(b"=", 1) for v in fh.read().split(b"\\0") if b"=" in v)
print("agent:", agent, flush=True)
print("agent cmdline:", [a.decode() for a in cmdline], flush=True)
print("agent started with:", sorted(k.decode() for k in started_with if k.startswith(b"XL_")), flush=True)
print("rank has:", sorted(k for k in os.environ if k.startswith("XL_") or k == "FOO"), os.environ.get("FOO"), flush=True)
xl.log(step=1, loss=0.5)
dist.barrier()
dist.destroy_process_group()
"""


def _line(log: str, head: str) -> str:
    return next(line for line in log.splitlines() if line.startswith(head))[len(head) :].strip()


@pytest.mark.e2e
def test_the_run_s_torchrun_is_the_interpreter_started_before_the_plan(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(PROBE))
    home = tmp_path / "home"
    done = xl(["launch", "--no-tui", "--nproc", "2", "--env", "FOO=bar", "train.py"], xl_env(home), cwd=tmp_path, timeout=120)
    run_dir = only_run(home)
    assert done.returncode == 0, done.stdout + done.stderr
    run = run_json(run_dir)
    for rank in (0, 1):
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        assert int(_line(log, "agent:")) == run["torchrun_pid"], log
        # ps shows torchrun as `python -m torch.distributed.run ...`, the command run.json records.
        assert _line(log, "agent cmdline:") == repr(run["argv"]), log
        # It started before the supervisor held the collector's port (its first environment has
        # the run's id, not the port) ...
        first = set(ast.literal_eval(_line(log, "agent started with:")))
        assert {"XL_RUN_ID", "XL_RUN_DIR", "XL_SUPERVISOR_PID"} <= first and not {"XL_COLLECTOR", "XL_TOKEN"} & first, log
        # ... yet its ranks got the whole run's environment, --env's too, and reported.
        names, foo = _line(log, "rank has:").rsplit(" ", 1)
        assert {"FOO", "XL_COLLECTOR", "XL_TOKEN", "XL_RUN_ID"} <= set(ast.literal_eval(names)) and foo == "bar", log
    metrics = (run_dir / "metrics.jsonl").read_text()
    assert metrics.count('"loss"') >= 2, metrics
    assert "torch.distributed.run" not in (run_dir / "logs" / "torchrun.log").read_text().split("*****")[0], "a warning of the boot"
    wait_no_processes(run_dir, timeout=10)


@pytest.mark.e2e
def test_a_launch_whose_environment_the_plan_changes_starts_torchrun_anew(tmp_path: Path) -> None:
    # --python puts xl's rank code on PYTHONPATH: torch would import under another path, so the
    # interpreter started ahead is ended and torchrun starts as a new process, as before.
    other = tmp_path / "other-python"
    other.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    other.chmod(0o755)
    (tmp_path / "train.py").write_text(textwrap.dedent(PROBE))
    home = tmp_path / "home"
    done = xl(["launch", "--no-tui", "--nproc", "2", "--python", str(other), "train.py"], xl_env(home), cwd=tmp_path, timeout=120)
    run_dir = only_run(home)
    assert done.returncode == 0, done.stdout + done.stderr
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert int(_line(log, "agent:")) == run_json(run_dir)["torchrun_pid"], log
    assert "XL_COLLECTOR" in ast.literal_eval(_line(log, "agent started with:")), log  # started once the port was held
    # The unused interpreter carried the run's id: it is gone too.
    wait_no_processes(run_dir, timeout=10)


def _processes_with(variable: bytes) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if variable in fh.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


@pytest.mark.e2e
def test_a_launch_that_fails_after_the_fork_leaves_nothing_behind(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('never')\n")
    home = tmp_path / "home"
    done = xl(["launch", "--no-tui", "--nproc", "1", "--gpus", "0", "train.py"], xl_env(home), cwd=tmp_path, timeout=60)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == ["xl launch: unknown GPU '0' in --gpus (this machine has no GPU; 'xl gpus' lists them)"]
    # The early supervisor and torchrun's interpreter ended before the command returned.
    assert _processes_with(f"XL_HOME={home}".encode()) == []
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


def test_only_what_torch_reads_after_its_import_may_change_under_it() -> None:
    warm = WarmTorchrun.__new__(WarmTorchrun)
    warm.python, warm.env = "/venv/bin/python", {"PATH": "/bin", "XL_RUN_ID": "r"}
    argv = ["/venv/bin/python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "xl.launcher.entry", "t.py"]
    late = {"XL_COLLECTOR": "127.0.0.1:1", "XL_TOKEN": "t", "CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", NO_SHARED_STORE: "1"}
    assert NO_SHARED_STORE in LATE
    assert warm.fits(argv, {"PATH": "/bin", "XL_RUN_ID": "r", **late})
    assert not warm.fits(argv, {"PATH": "/bin", "XL_RUN_ID": "r", "PYTHONPATH": "/shim"})  # --python
    assert not warm.fits(argv, {"PATH": "/usr/bin", "XL_RUN_ID": "r"})
    assert not warm.fits(argv, {"XL_RUN_ID": "r"})  # a variable gone
    assert not warm.fits(["/other/python", *argv[1:]], {"PATH": "/bin", "XL_RUN_ID": "r"})
