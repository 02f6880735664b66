"""The supervisor with real processes: torchrun + CPU (gloo-less) ranks, the real `xl` command.

Every test checks that no process of the run is left (psutil scan by XL_RUN_ID and the recorded
PIDs), not just exit codes. XL_STOP_GRACE=1 keeps stops short.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from procs import (
    XL,
    kill_run,
    run_json,
    wait_final,
    wait_for,
    wait_no_processes,
    wait_ranks_running,
    wait_run,
    xl,
    xl_env,
)

pytestmark = pytest.mark.e2e
GRACE = 1.0

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

FAILER = """
import os, threading, time
rank = int(os.environ["RANK"])
print("ready", flush=True)

def explode():
    raise ValueError(f"boom from rank {rank}")

if rank == 1:
    time.sleep(0.3)
    # A non-daemon thread keeps the failed process alive after its exception (as a stuck
    # NCCL teardown does): it must be ended too.
    threading.Thread(target=time.sleep, args=(120,)).start()
    explode()
time.sleep(120)
"""

REPORTER = """
import json, os, sys
rank = int(os.environ["RANK"])
keys = ["XL_RUN_ID", "XL_RUN_DIR", "XL_COLLECTOR", "XL_TOKEN", "CUDA_DEVICE_ORDER",
        "CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "WORLD_SIZE", "FOO"]
print("env " + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
for i in range(3):
    print(f"out rank={rank} line={i}", flush=True)
    print(f"err rank={rank} line={i}", file=sys.stderr, flush=True)
print("args " + json.dumps(sys.argv[1:]), flush=True)
"""


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _popen_launch(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    # stdout is a pipe, not a terminal: the plain line view.
    return subprocess.Popen(
        [*XL, "launch", "--no-tui", *args], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_run_succeeds_with_separate_rank_logs_and_busy_port_29500(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = _script(tmp_path, "report.py", REPORTER)
    busy = socket.socket()
    try:
        busy.bind(("0.0.0.0", 29500))
        busy.listen(1)
    except OSError:
        pass  # something else already holds it: busy all the same
    try:
        proc = xl(["launch", "--no-tui", "--nproc", "2", "--env", "FOO=bar", str(script), "--x", "1"],
                  xl_env(home), cwd=tmp_path, timeout=90)
    finally:
        busy.close()
    run_dir = wait_run(home)
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        run = run_json(run_dir)
        assert run["status"] == "succeeded"
        assert [r["rank"] for r in run["ranks"]] == [0, 1]
        for r in run["ranks"]:
            assert r["exit_code"] == 0 and r["state"] == "exited" and r["pid"] > 0 and r["gpu"] is None
        for rank in (0, 1):
            log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
            lines = log.splitlines()
            # stdout and stderr of this rank only, in the order written, whole lines.
            assert [ln for ln in lines if ln.startswith(("out ", "err "))] == [
                f"{kind} rank={rank} line={i}" for i in range(3) for kind in ("out", "err")
            ]
            env = json.loads(next(ln for ln in lines if ln.startswith("env "))[4:])
            assert env["XL_RUN_ID"] == run["run_id"]
            assert Path(env["XL_RUN_DIR"]) == run_dir
            assert env["XL_COLLECTOR"] and env["XL_TOKEN"]
            assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["CUDA_VISIBLE_DEVICES"] == ""
            assert env["LOCAL_RANK"] == str(rank) and env["WORLD_SIZE"] == "2" and env["FOO"] == "bar"
            assert json.loads(next(ln for ln in lines if ln.startswith("args "))[5:]) == ["--x", "1"]
        kinds = [json.loads(ln)["kind"] for ln in (run_dir / "events.jsonl").read_text().splitlines()]
        assert kinds[0] == "run_started" and kinds[-1] == "run_ended", kinds
        assert kinds.count("rank_started") == 2 and kinds.count("rank_exited") == 2, kinds
        # The plain view shows each rank's lines, prefixed, and the outcome.
        assert "[rank 1] out rank=1 line=2" in proc.stdout
        assert "succeeded" in proc.stdout.splitlines()[-1]
        wait_no_processes(run_dir, timeout=GRACE + 2)
    finally:
        kill_run(run_dir)


def test_failing_rank_without_record_is_root_cause_with_traceback(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = _script(tmp_path, "fail.py", FAILER)
    proc = xl(["launch", "--no-tui", "--nproc", "2", str(script)], xl_env(home), cwd=tmp_path, timeout=90)
    run_dir = wait_run(home)
    try:
        assert proc.returncode == 1, proc.stdout + proc.stderr
        run = run_json(run_dir)
        assert run["status"] == "failed"
        failure = run["failure"]
        assert failure["rank"] == 1 and failure["exit_code"] == 1
        tb = failure["traceback"]
        assert tb.startswith("Traceback (most recent call last):")
        assert "ValueError: boom from rank 1" in tb and "in explode" in tb and str(script) in tb
        # The traceback starts in the user's script, not in xl's entry point or runpy.
        assert "entry.py" not in tb and "runpy" not in tb
        ranks = {r["rank"]: r for r in run["ranks"]}
        assert ranks[1]["state"] == "failed" and ranks[1]["exit_code"] == 1
        assert ranks[0]["state"] == "stopped" and ranks[0]["exit_code"] == -signal.SIGTERM
        assert "ValueError: boom from rank 1" in (run_dir / "logs" / "rank-1.log").read_text()
        events = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()]
        failures = [e for e in events if e["kind"] == "failure"]
        assert len(failures) == 1 and failures[0]["rank"] == 1
        assert "ValueError: boom from rank 1" in proc.stdout
        wait_no_processes(run_dir, timeout=GRACE + 2)
    finally:
        kill_run(run_dir)


EXITER = """
import os, sys, time
if os.environ["RANK"] == "1":
    print("train.py: error: unrecognized arguments: --lr-warmup", file=sys.stderr, flush=True)
    sys.exit(2)  # argparse's way out: no Python traceback to show
time.sleep(60)
"""


def test_rank_exiting_without_a_traceback_is_explained_by_its_last_lines(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = _script(tmp_path, "exiter.py", EXITER)
    proc = xl(["launch", "--no-tui", "--nproc", "2", str(script)], xl_env(home), cwd=tmp_path, timeout=90)
    run_dir = wait_run(home)
    try:
        assert proc.returncode == 1, proc.stdout + proc.stderr
        failure = run_json(run_dir)["failure"]
        assert failure["rank"] == 1 and failure["exit_code"] == 2
        assert failure["message"].endswith("error: unrecognized arguments: --lr-warmup")
        assert "unrecognized arguments: --lr-warmup" in failure["traceback"]
        wait_no_processes(run_dir, timeout=GRACE + 2)
    finally:
        kill_run(run_dir)


def test_rank_killed_by_a_signal_is_named_with_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = _script(tmp_path, "segv.py", """
        import os, signal, time
        print("ready", flush=True)
        if os.environ["RANK"] == "1":
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(120)
    """)
    proc = xl(["launch", "--no-tui", "--nproc", "2", str(script)], xl_env(home), cwd=tmp_path, timeout=90)
    run_dir = wait_run(home)
    try:
        assert proc.returncode == 1, proc.stdout + proc.stderr
        run = run_json(run_dir)
        assert run["status"] == "failed"
        assert (run["failure"]["rank"], run["failure"]["exit_code"]) == (1, -signal.SIGSEGV)
        assert "SIGSEGV" in run["failure"]["message"]
        ranks = {r["rank"]: (r["state"], r["exit_code"]) for r in run["ranks"]}
        assert ranks == {0: ("stopped", -signal.SIGTERM), 1: ("failed", -signal.SIGSEGV)}
        wait_no_processes(run_dir, timeout=GRACE + 2)
    finally:
        kill_run(run_dir)


def test_ctrl_c_stops_every_rank_even_one_ignoring_sigterm(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = _script(tmp_path, "sleep.py", SLEEPER)
    proc = _popen_launch(["--nproc", "2", str(script), "--ignore-term", "--child"], xl_env(home), tmp_path)
    run_dir = wait_run(home)
    try:
        wait_ranks_running(run_dir, 2)
        asked = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 1, out + err
        run = run_json(run_dir)
        assert run["status"] == "stopped"
        assert {r["state"] for r in run["ranks"]} == {"stopped"}
        # rank 1 ignored SIGTERM: it took the SIGKILL after the grace period.
        assert {r["rank"]: r["exit_code"] for r in run["ranks"]} == {0: -signal.SIGTERM, 1: -signal.SIGKILL}
        kinds = [json.loads(ln)["kind"] for ln in (run_dir / "events.jsonl").read_text().splitlines()]
        assert "stop_requested" in kinds
        # The promise: every process gone within the grace period plus 2 s of the Ctrl-C.
        wait_no_processes(run_dir, timeout=max(0.0, asked + GRACE + 2 - time.monotonic()))
    finally:
        proc.kill()
        proc.communicate(timeout=10)
        kill_run(run_dir)


def test_xl_stop_ends_a_detached_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = xl_env(home)
    script = _script(tmp_path, "sleep.py", SLEEPER)
    started = xl(["launch", "--detach", "--nproc", "2", str(script), "--ignore-term"], env, cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    run_dir = home / "runs" / run_id
    try:
        wait_ranks_running(run_dir, 2)
        assert run_json(run_dir)["status"] == "running"
        asked = time.monotonic()
        stopped = xl(["stop", run_id[:-3]], env, timeout=30)  # a unique prefix
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.strip() == f"{run_id} stopped"
        assert run_json(run_dir)["status"] == "stopped"
        # Counted from the moment `xl stop` was typed (its own start-up included).
        wait_no_processes(run_dir, timeout=max(0.0, asked + GRACE + 2 - time.monotonic()))
    finally:
        kill_run(run_dir)


def test_sigkill_to_torchrun_leaves_no_rank(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = _script(tmp_path, "sleep.py", SLEEPER)
    started = xl(["launch", "--detach", "--nproc", "2", str(script), "--ignore-term"], xl_env(home), cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    run_dir = home / "runs" / started.stdout.strip()
    try:
        run = wait_ranks_running(run_dir, 2)
        os.kill(run["torchrun_pid"], signal.SIGKILL)
        run = wait_final(run_dir, timeout=30)
        assert run["status"] == "failed"
        assert run["failure"]["rank"] is None and "torchrun" in run["failure"]["message"]
        assert run["torchrun_exit_code"] == -signal.SIGKILL
        wait_no_processes(run_dir, timeout=GRACE + 2)
    finally:
        kill_run(run_dir)


def test_supervisor_killed_outright_the_view_ends_the_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = _script(tmp_path, "sleep.py", SLEEPER)
    proc = _popen_launch(["--nproc", "2", str(script)], xl_env(home), tmp_path)
    run_dir = wait_run(home)
    try:
        run = wait_ranks_running(run_dir, 2)
        os.kill(run["supervisor_pid"], signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 1, out + err
        run = run_json(run_dir)
        assert run["status"] == "failed" and "supervisor was gone" in run["failure"]["message"]
        wait_no_processes(run_dir, timeout=GRACE + 2)
    finally:
        proc.kill()
        proc.communicate(timeout=10)
        kill_run(run_dir)


def test_sighup_to_foreground_launch_leaves_the_run_going(tmp_path: Path) -> None:
    home = tmp_path / "home"
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("import time\nprint('ready', flush=True)\ntime.sleep(2)\nprint('done', flush=True)\n")
    proc = _popen_launch(["--nproc", "2", "-m", "mypkg.train"], xl_env(home), tmp_path)
    run_dir = wait_run(home)
    try:
        wait_ranks_running(run_dir, 2)
        proc.send_signal(signal.SIGHUP)
        proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGHUP  # the view went away...
        run = wait_final(run_dir, timeout=60)  # ...the run did not
        assert run["status"] == "succeeded", run
        assert "done" in (run_dir / "logs" / "rank-1.log").read_text()
        wait_no_processes(run_dir, timeout=GRACE + 2)
    finally:
        proc.kill()
        proc.communicate(timeout=10)
        kill_run(run_dir)


def test_attach_shows_a_running_run_until_it_ends(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = xl_env(home)
    script = _script(tmp_path, "short.py", "import time\nprint('ready', flush=True)\ntime.sleep(1.5)\nprint('bye', flush=True)\n")
    started = xl(["launch", "--detach", "--nproc", "2", str(script)], env, cwd=tmp_path)
    run_dir = home / "runs" / started.stdout.strip()
    try:
        wait_ranks_running(run_dir, 2)
        follow = subprocess.Popen([*XL, "logs", "last", "-f"], env=env, stdout=subprocess.PIPE, text=True)
        attached = xl(["attach", "last"], env, timeout=60)
        assert attached.returncode == 0, attached.stderr
        assert "[rank 0] bye" in attached.stdout and "succeeded" in attached.stdout
        # `xl logs -f` followed both ranks to the end of the run, then returned by itself.
        out, _ = follow.communicate(timeout=30)
        assert follow.returncode == 0
        assert sorted(out.splitlines()) == ["[rank 0] bye", "[rank 0] ready", "[rank 1] bye", "[rank 1] ready"]
        wait_for(lambda: run_json(run_dir).get("status") != "running", timeout=10, what="the end")
        wait_no_processes(run_dir, timeout=GRACE + 2)
    finally:
        kill_run(run_dir)


def test_start_run_api_spawns_a_detached_supervisor(tmp_path: Path) -> None:
    """The library path the TUI uses (a fresh interpreter, no fork) runs a whole run too."""
    home = tmp_path / "home"
    script = _script(tmp_path, "short.py", "print('hello', flush=True)\n")
    code = (
        "import sys; from xl.launcher.control import start_run; from xl.launcher.spec import LaunchSpec\n"
        f"h = start_run(LaunchSpec(script={str(script)!r}, nproc=2))\n"
        "print(h.run_id, h.pid)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=xl_env(home), cwd=tmp_path, capture_output=True, text=True, timeout=60)
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
