"""The supervisor with real processes (torchrun, CPU ranks, the real `xl`): stops and lost parts.

Ctrl-C, `xl stop` (of a run with a SIGSTOPped rank, and two at once while `xl attach` follows),
a SIGKILLed torchrun leave no process of the run (XL_STOP_GRACE=1 keeps stops short); a view
gone with SIGHUP leaves training going, and the record is told true afterwards; `xl attach` and
`xl logs -f` follow a run to its end; the library's start_run runs a whole run too. (A
supervisor that dies or freezes is in test_supervisor_dies.py.)
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from procs import (
    XL,
    end_run,
    kill_run,
    launched_run,
    run_json,
    wait_final,
    wait_for,
    wait_no_processes,
    wait_ranks_running,
    wait_run,
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

    def hangup_ends_it() -> None:  # as in a terminal: a test run under nohup ignores SIGHUP
        signal.signal(signal.SIGHUP, signal.SIG_DFL)

    with launched_run(
        args, xl_env(home), cwd=tmp_path, ranks=2, preexec_fn=hangup_ends_it
    ) as launched:
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


STEPPING = textwrap.dedent(
    """
    import os, sys, time
    import xl
    rank = int(os.environ["RANK"])
    print("ready", flush=True)
    step = 0
    while True:
        step += 1
        xl.log(step=step, loss=1.0 / step)
        with open(f"{sys.argv[1]}-{rank}", "a") as fh:
            fh.write(f"{step}\\n")
        time.sleep(0.05)
    """
)


def _steps(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


def test_a_stopped_rank_is_ended_by_xl_stop_with_the_rest_and_the_run_says_stopped(
    tmp_path: Path,
) -> None:
    """SIGSTOP one rank (a debugger's breakpoint, a job-control mistake): the other trains on;
    `xl stop` ends both, the frozen one too (SIGTERM alone never reaches it), and nothing is
    left."""
    home = tmp_path / "home"
    env = xl_env(home)
    (tmp_path / "train.py").write_text(STEPPING)
    steps = tmp_path / "steps"
    done = xl(
        ["launch", "--detach", "--nproc", "2", "train.py", str(steps)],
        env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = wait_run(home)
    try:
        run = wait_ranks_running(run_dir, 2, timeout=90)
        pid1 = next(r["pid"] for r in run["ranks"] if r["rank"] == 1)
        wait_for(lambda: _steps(Path(f"{steps}-1")) >= 5, timeout=60, what="rank 1's steps")
        os.kill(pid1, signal.SIGSTOP)
        at_stop = _steps(Path(f"{steps}-1"))
        before = _steps(Path(f"{steps}-0"))
        wait_for(
            lambda: _steps(Path(f"{steps}-0")) >= before + 40, timeout=60, what="rank 0 going on"
        )
        assert _steps(Path(f"{steps}-1")) == at_stop, "rank 1 is stopped"
        stopped = xl(["stop", run_dir.name], env, timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        rec = wait_final(run_dir, timeout=90)
        assert rec["status"] == "stopped", rec
        wait_no_processes(run_dir, timeout=60)
    finally:
        end_run(None, run_dir, timeout=30)


def test_xl_stop_while_xl_attach_follows_the_run_ends_both_truthfully(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = xl_env(home)
    (tmp_path / "train.py").write_text(STEPPING)
    done = xl(
        ["launch", "--detach", "--nproc", "2", "train.py", str(tmp_path / "steps")],
        env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = wait_run(home)
    attach = subprocess.Popen(
        [*XL, "attach", "--no-tui", run_dir.name],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_ranks_running(run_dir, 2, timeout=90)
        wait_for(lambda: _steps(tmp_path / "steps-0") >= 10, timeout=60, what="steps")
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            stops = list(pool.map(lambda _: xl(["stop", run_dir.name], env, timeout=120), range(2)))
        assert all(s.returncode == 0 for s in stops), [s.stdout + s.stderr for s in stops]
        out, _ = attach.communicate(timeout=120)
        shown = out.decode(errors="replace")
        assert attach.returncode != 0 and "stopped" in shown, shown[-2000:]
        assert "Traceback" not in shown
        assert run_json(run_dir)["status"] == "stopped"
        events = [
            json.loads(line)
            for line in (run_dir / "events.jsonl").read_text().splitlines()
            if line.strip()
        ]
        assert [e["status"] for e in events if e["kind"] == "run_ended"] == ["stopped"], events
        wait_no_processes(run_dir, timeout=60)
    finally:
        if attach.poll() is None:
            attach.kill()
            attach.wait(timeout=30)
        end_run(None, run_dir, timeout=30)
