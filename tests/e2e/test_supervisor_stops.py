"""The supervisor with real processes (torchrun, CPU ranks, the real `xl`): stops and lost parts.

Ctrl-C, `xl stop`, a SIGKILLed torchrun leave no process of the run (XL_STOP_GRACE=1 keeps stops
short); a view gone with SIGHUP leaves training going, and the record is told true afterwards;
`xl attach` and `xl logs -f` follow a run to its end; the library's start_run runs a whole run
too. (A supervisor that dies or freezes is in test_supervisor_dies.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import (
    XL,
    kill_run,
    launched_run,
    run_json,
    wait_final,
    wait_for,
    wait_no_processes,
    xl,
    xl_env,
)
from supervised import GRACE, write_script

pytestmark = pytest.mark.e2e

SLEEPER = """
import os, signal, subprocess, sys, time
rank = int(os.environ["RANK"])
if rank == 1 and "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if rank == 0 and "--child" in sys.argv:
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print("ready", flush=True)
time.sleep(120)
"""


def test_ctrl_c_stops_every_rank_even_one_ignoring_sigterm(tmp_path: Path) -> None:
    script = write_script(tmp_path, "sleep.py", SLEEPER)
    args = ["--nproc", "2", str(script), "--ignore-term", "--child"]
    with launched_run(args, xl_env(tmp_path / "home"), cwd=tmp_path, ranks=2) as launched:
        run_dir, proc = launched.run_dir, launched.launch
        assert proc is not None
        asked = time.monotonic()
        proc.send_signal(signal.SIGINT)
        done = launched.finish(timeout=30)
        assert done.returncode == 1, done.stdout + done.stderr
        run = run_json(run_dir)
        assert run["status"] == "stopped"
        assert {r["state"] for r in run["ranks"]} == {"stopped"}
        # rank 1 ignored SIGTERM: it took the SIGKILL after the grace period.
        assert {r["rank"]: r["exit_code"] for r in run["ranks"]} == {
            0: -signal.SIGTERM,
            1: -signal.SIGKILL,
        }
        kinds = [
            json.loads(ln)["kind"] for ln in (run_dir / "events.jsonl").read_text().splitlines()
        ]
        assert "stop_requested" in kinds
        # The promise: every process gone within the grace period plus 2 s of the Ctrl-C.
        wait_no_processes(run_dir, timeout=max(0.0, asked + GRACE + 2 - time.monotonic()))


def test_xl_stop_ends_a_detached_run(tmp_path: Path) -> None:
    env = xl_env(tmp_path / "home")
    script = write_script(tmp_path, "sleep.py", SLEEPER)
    args = ["--nproc", "2", str(script), "--ignore-term"]
    with launched_run(args, env, cwd=tmp_path, how="detach", ranks=2) as launched:
        run_dir = launched.run_dir
        run_id = run_dir.name
        assert run_json(run_dir)["status"] == "running"
        asked = time.monotonic()
        stopped = xl(["stop", run_id[:-3]], env, timeout=30)  # a unique prefix
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.strip() == f"{run_id} stopped"
        assert run_json(run_dir)["status"] == "stopped"
        # Counted from the moment `xl stop` was typed (its own start-up included).
        wait_no_processes(run_dir, timeout=max(0.0, asked + GRACE + 2 - time.monotonic()))


def test_sigkill_to_torchrun_leaves_no_rank(tmp_path: Path) -> None:
    script = write_script(tmp_path, "sleep.py", SLEEPER)
    args = ["--nproc", "2", str(script), "--ignore-term"]
    with launched_run(args, xl_env(tmp_path / "home"), cwd=tmp_path, how="detach") as launched:
        run_dir = launched.run_dir
        run = launched.ranks_running(2)
        os.kill(run["torchrun_pid"], signal.SIGKILL)
        run = wait_final(run_dir, timeout=30)
        assert run["status"] == "failed"
        assert run["failure"]["rank"] is None and "torchrun" in run["failure"]["message"]
        assert run["torchrun_exit_code"] == -signal.SIGKILL
        wait_no_processes(run_dir, timeout=GRACE + 2)


def test_sighup_to_foreground_launch_leaves_the_run_going(tmp_path: Path) -> None:
    home = tmp_path / "home"
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    # The ranks train on until the test's go file, however long a busy machine keeps the test.
    (pkg / "train.py").write_text(
        "import os, sys, time\nprint('ready', flush=True)\n"
        "while not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n"
        "print('done', flush=True)\n"
    )
    args = ["--nproc", "2", "-m", "mypkg.train", str(tmp_path / "go")]
    with launched_run(args, xl_env(home), cwd=tmp_path, ranks=2) as launched:
        run_dir, proc = launched.run_dir, launched.launch
        assert proc is not None
        proc.send_signal(signal.SIGHUP)
        assert launched.finish(timeout=30).returncode == -signal.SIGHUP  # the view went away...
        (tmp_path / "go").touch()
        run = wait_final(run_dir, timeout=60)  # ...the run did not
        assert run["status"] == "succeeded", run
        assert "done" in (run_dir / "logs" / "rank-1.log").read_text()
        wait_no_processes(run_dir, timeout=GRACE + 2)


def test_attach_shows_a_running_run_until_it_ends(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = xl_env(home)
    script = write_script(
        tmp_path,
        "short.py",
        "import time\nprint('ready', flush=True)\ntime.sleep(1.5)\nprint('bye', flush=True)\n",
    )
    with launched_run(["--nproc", "2", str(script)], env, cwd=tmp_path, how="detach") as launched:
        run_dir = launched.run_dir
        launched.ranks_running(2)
        follow = subprocess.Popen(
            [*XL, "logs", "last", "-f"], env=env, stdout=subprocess.PIPE, text=True
        )
        attached = xl(["attach", "last"], env, timeout=60)
        assert attached.returncode == 0, attached.stderr
        assert "[rank 0] bye" in attached.stdout and "succeeded" in attached.stdout
        # `xl logs -f` followed both ranks to the end of the run, then returned by itself.
        out, _ = follow.communicate(timeout=30)
        assert follow.returncode == 0
        assert sorted(out.splitlines()) == [
            "[rank 0] bye",
            "[rank 0] ready",
            "[rank 1] bye",
            "[rank 1] ready",
        ]
        wait_for(lambda: run_json(run_dir).get("status") != "running", timeout=10, what="the end")
        wait_no_processes(run_dir, timeout=GRACE + 2)


def test_start_run_api_spawns_a_detached_supervisor(tmp_path: Path) -> None:
    """The library path the TUI uses (a fresh interpreter, no fork) runs a whole run too."""
    home = tmp_path / "home"
    script = write_script(tmp_path, "short.py", "print('hello', flush=True)\n")
    code = (
        "import sys; from xl.launcher.control import start_run; from xl.launcher.spec import "
        "LaunchSpec\n"
        f"h = start_run(LaunchSpec(script={str(script)!r}, nproc=2))\n"
        "print(h.run_id, h.pid)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=xl_env(home),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    run_id, pid = proc.stdout.split()
    run_dir = home / "runs" / run_id
    try:
        run = wait_final(run_dir, timeout=60)
        assert run["status"] == "succeeded" and run["supervisor_pid"] == int(pid)
        assert [r["exit_code"] for r in run["ranks"]] == [0, 0]
        assert (run_dir / "logs" / "rank-1.log").read_text() == "hello\n"
        wait_no_processes(run_dir, timeout=GRACE + 2)
    finally:
        kill_run(run_dir)
