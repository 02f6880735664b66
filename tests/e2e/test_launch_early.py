"""torchrun's early start (xl.launcher.early): `xl launch` starts torchrun's interpreter as soon as
it has read its command line, and makes it the run's torchrun once the run is planned. The run
must not tell the difference: the real `xl` and torchrun, 2 CPU ranks, each rank reporting what
its parent (torchrun) is; the same launch with XL_EARLY_TORCHRUN=0 is the reference. The unhappy
paths: a launch refused after the early start leaves no process behind, and a variable a running
interpreter cannot take on (--env PYTHONPATH) gets torchrun started as before."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from procs import only_run, run_dirs, run_json, wait_no_processes, xl, xl_env

pytestmark = pytest.mark.e2e

# Each rank writes what its parent, torchrun, is: as ps, /proc and `xl stop` see it.
PROBE = """\
import json, os, resource, sys
import torch.distributed as dist
dist.init_process_group("gloo")
parent = os.getppid()
def read(name):
    with open(f"/proc/{parent}/{name}", "rb") as fh:
        return fh.read()
environ = dict(e.split(b"=", 1) for e in read("environ").split(b"\\0") if b"=" in e)
seen = {
    "argv": [a.decode() for a in read("cmdline").split(b"\\0") if a],
    "cwd": os.readlink(f"/proc/{parent}/cwd"),
    "run_id": environ.get(b"XL_RUN_ID", b"").decode(),
    "pythonpath": environ.get(b"PYTHONPATH", b"").decode(),
    "nofile": [int(x) for x in read("limits").decode().split("Max open files")[1].split()[:2]],
    "mine": {k: os.environ.get(k) for k in ("XL_RUN_ID", "XL_RUN_DIR", "XL_TOKEN", "EXTRA", "PYTHONPATH")},
    "umask": os.umask(0),
}
try:
    import helper_mod
    seen["helper"] = helper_mod.VALUE
except ImportError:
    seen["helper"] = None
with open(os.path.join(sys.argv[1], f"seen-{os.environ['RANK']}.json"), "w") as fh:
    json.dump(seen, fh)
dist.barrier()
dist.destroy_process_group()
print("rank", os.environ["RANK"], "done", flush=True)
"""


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "probe.py").write_text(PROBE)
    return tmp_path


def _launch(work: Path, name: str, *extra: str, early: bool = True) -> tuple[Path, dict[str, Any]]:
    """One run of the probe; its run dir and what rank 0 saw of torchrun."""
    out = work / name
    out.mkdir()
    env = xl_env(work / f"home-{name}", XL_DEBUG_TIMING="1", XL_EARLY_TORCHRUN="1" if early else "0")
    proc = xl(["launch", "--no-tui", "--nproc", "2", "--env", "EXTRA=yes", *extra, "probe.py", str(out)], env, cwd=work, timeout=120)
    run_dir = only_run(work / f"home-{name}")
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert "rank 0 done" in proc.stdout and "rank 1 done" in proc.stdout, proc.stdout[-2000:]
    wait_no_processes(run_dir, timeout=10)
    seen = json.loads((out / "seen-0.json").read_text())
    return run_dir, seen


def _started(run_dir: Path) -> str:
    lines = [ln for ln in (run_dir / "supervisor.log").read_text().splitlines() if "torchrun started" in ln]
    assert len(lines) == 1, (run_dir / "supervisor.log").read_text()
    return lines[0].split(" ", 1)[1]


def test_the_early_torchrun_is_the_torchrun_the_run_would_have_had(work: Path) -> None:
    early_dir, early = _launch(work, "early")
    cold_dir, cold = _launch(work, "cold", early=False)
    assert _started(early_dir) == "torchrun started (early)"
    assert _started(cold_dir) == "torchrun started"
    for run_dir, seen in ((early_dir, early), (cold_dir, cold)):
        run = run_json(run_dir)
        # As ps shows it: the command line the record says, not the waiting interpreter's.
        assert seen["argv"] == run["argv"], seen["argv"]
        assert seen["argv"][1:3] == ["-m", "torch.distributed.run"]
        assert seen["cwd"] == str(work)
        # `xl stop` finds torchrun by its environment, as it finds the ranks.
        assert seen["run_id"] == run["run_id"] == seen["mine"]["XL_RUN_ID"]
        assert seen["mine"]["XL_RUN_DIR"] == str(run_dir) and seen["mine"]["XL_TOKEN"]
        assert seen["mine"]["EXTRA"] == "yes"
        assert run["torchrun_exit_code"] == 0 and run["status"] == "succeeded"
        log = (run_dir / "logs" / "torchrun.log").read_text()
        assert "OMP_NUM_THREADS" in log  # torchrun's own output reaches its log
    # The same limits and umask as the torchrun started once the run was planned.
    assert early["nofile"] == cold["nofile"]
    assert early["umask"] == cold["umask"]


def test_a_variable_only_a_new_interpreter_takes_on_starts_torchrun_as_before(work: Path) -> None:
    """--env PYTHONPATH: Python reads it at its start, so the waiting interpreter cannot become
    this torchrun. It is ended and torchrun starts as before: with the variable, in its
    environment as in the ranks'."""
    lib = work / "lib"
    lib.mkdir()
    (lib / "helper_mod.py").write_text("VALUE = 42\n")
    run_dir, seen = _launch(work, "pythonpath", "--env", f"PYTHONPATH={lib}")
    assert _started(run_dir) == "torchrun started"
    assert seen["pythonpath"] == str(lib)
    assert seen["mine"]["PYTHONPATH"] == str(lib) and seen["helper"] == 42


def _leftovers(marker: str) -> list[str]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.status() != psutil.STATUS_ZOMBIE:
                line = " ".join(proc.cmdline())
                if marker in line or "xl.launcher.early import boot" in line:
                    found.append(f"{proc.pid}: {line[:160]}")
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("args", [["missing.py"], ["--nproc", "0", "probe.py"], ["--gpus", "7", "probe.py"]])
def test_a_launch_refused_after_the_early_start_leaves_no_process(work: Path, args: list[str]) -> None:
    """The refusal comes after torchrun's interpreter started: one line, exit 2, no run dir,
    and neither the supervisor-to-be nor the waiting torchrun outlives the command."""
    marker = f"marker-{os.getpid()}-{time.monotonic_ns()}"
    env = xl_env(work / "home")
    proc = xl(["launch", "--no-tui", "--name", marker, *args], env, cwd=work)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert run_dirs(work / "home") == []
    assert _leftovers(marker) == []
