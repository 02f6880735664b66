"""The supervisor with real processes: torchrun + CPU (gloo-less) ranks, the real `xl` command.

Every test checks that no process of the run is left (psutil scan by XL_RUN_ID and the recorded
PIDs), not just exit codes. XL_STOP_GRACE=1 keeps stops short.

The tests at the end drive the supervisor's parts directly (its state is values: a rank's phase,
the stop, the root cause), with plain processes standing in for ranks and no torchrun.
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

from xl.launcher.rundir import record as run_record
from xl.launcher.rundir.record import RunStatus
from xl.launcher.supervisor.failure import RootCause
from xl.launcher.supervisor.journal import Journal
from xl.launcher.supervisor.logsink import LogSink
from xl.launcher.supervisor.loop import Supervisor
from xl.launcher.supervisor.ranks import Ranks
from xl.launcher.supervisor.stopping import StopReason, grace_from_env

e2e = pytest.mark.e2e  # the tests with real torchrun; the state tests at the end run none
GRACE = 1.0

STEPPER = """
import time, xl
print("ready", flush=True)
for i in range(30):
    print(f"step {i}", flush=True)
    xl.log(step=i, loss=1.0 / (i + 1))
    time.sleep(0.1)
"""

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


@e2e
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
        outcome, took = proc.stdout.splitlines()[-2:]
        assert "succeeded" in outcome and took.startswith("time: startup "), (outcome, took)
        wait_no_processes(run_dir, timeout=GRACE + 2)
    finally:
        kill_run(run_dir)


@e2e
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


@e2e
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


@e2e
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


@e2e
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


@e2e
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


@e2e
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


@e2e
def test_supervisor_killed_outright_training_finishes_and_the_record_is_told_by_the_ranks(tmp_path: Path) -> None:
    # Ranks print and log after their supervisor is SIGKILLed: no print dies of EPIPE, the
    # spooled metrics are merged, and run.json ends true (succeeded, every rank exit 0).
    home = tmp_path / "home"
    script = _script(tmp_path, "steps.py", STEPPER)
    proc = _popen_launch(["--nproc", "2", str(script)], xl_env(home), tmp_path)
    run_dir = wait_run(home)
    try:
        run = wait_ranks_running(run_dir, 2)
        os.kill(run["supervisor_pid"], signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, out + err
        run = run_json(run_dir)
        assert run["status"] == "succeeded", run
        assert [(r["state"], r["exit_code"]) for r in run["ranks"]] == [("exited", 0), ("exited", 0)]
        for rank in (0, 1):
            assert "step 29" in (run_dir / "logs" / f"rank-{rank}.log").read_text()
        steps = {(r["rank"], r.get("step")) for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
        assert {(0, 29), (1, 29)} <= steps  # logged after the supervisor died: spooled, then merged
        ended = [e for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines()) if e["kind"] == "run_ended"]
        assert len(ended) == 1 and "what the ranks left" in ended[0]["message"]
        wait_no_processes(run_dir, timeout=GRACE + 2)
    finally:
        proc.kill()
        proc.communicate(timeout=10)
        kill_run(run_dir)


@e2e
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


@e2e
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


@e2e
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


# ---------------------------------------------------------------- the parts, without torchrun


def _unit_run_dir(tmp_path: Path, nproc: int = 2, grace: float = 0.3) -> Path:
    """A run dir as start_run leaves it, for a supervisor that is never started."""
    run_dir = tmp_path / "run"
    (run_dir / "ranks").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    record = {
        "run_id": f"unit-{os.getpid()}-{time.monotonic_ns()}",
        "name": "unit",
        "status": "running",
        "nnodes": 1,
        "node_rank": 0,
        "nproc_per_node": nproc,
        "world_size": nproc,
        "host": "here",
        "ended_at": None,
        "grace_s": grace,
        "ranks": [],
        "failure": None,
    }
    (run_dir / "run.json").write_text(json.dumps(record))
    return run_dir


def _fake_rank(ignore_term: bool = False) -> subprocess.Popen[str]:
    """A process that sleeps like a rank at work, in its own session as torchrun starts ranks."""
    body = "import signal, time\n"
    if ignore_term:
        body += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    body += "print('ready', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", body], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def _end(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(5)
    if proc.stdout is not None:
        proc.stdout.close()


def _events(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_first_failing_rank_is_the_cause_and_a_rank_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    run_dir = _unit_run_dir(tmp_path, grace=0.3)
    sup = Supervisor(run_dir)
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    failed.wait(10)
    stubborn = _fake_rank(ignore_term=True)
    try:
        sup.ranks.hello(0, failed.pid)
        sup.ranks.hello(1, stubborn.pid)
        tb = "Traceback (most recent call last):\nValueError: boom\n"
        (run_dir / "ranks" / "rank-0.json").write_text(
            json.dumps({"pid": failed.pid, "local_rank": 0, "exit_code": 3, "traceback": tb, "ended_at": time.time()})
        )
        sup.ranks.scan_records()
        assert sup.stopping.state is not None and sup.stopping.state.reason is StopReason.FAILURE
        time.sleep(0.1)
        sup.stopping.advance()
        assert stubborn.poll() is None  # SIGTERM ignored, and the grace is not over
        time.sleep(0.3)
        sup.stopping.advance()
        assert stubborn.wait(5) == -signal.SIGKILL
        sup.ranks.check_alive()
        status = sup.finish()
    finally:
        _end(stubborn)
    assert status is RunStatus.FAILED and status.exit_code == 1
    run = run_json(run_dir)
    assert run["status"] == "failed" and run["ended_at"] is not None
    assert run["failure"] == {
        "rank": 0,
        "exit_code": 3,
        "traceback": tb,
        "error": None,
        "message": "rank 0 failed first: rank 0 exited with code 3",
        "node": "here",
        "node_rank": 0,
    }
    assert [(r["rank"], r["state"], r["exit_code"]) for r in run["ranks"]] == [(0, "failed", 3), (1, "stopped", -9)]
    events = _events(run_dir)
    assert [e["kind"] for e in events] == ["rank_started", "rank_started", "rank_exited", "failure", "rank_exited", "run_ended"]
    assert events[-1]["status"] == "failed" and events[-1]["message"] == "run failed"
    # As the rank table shows it: stopped, with its code (not "killed", not "exit code unknown").
    assert events[4]["message"] == "rank 1 stopped (-9)"


def test_a_requested_stop_ends_every_rank_as_stopped(tmp_path: Path) -> None:
    run_dir = _unit_run_dir(tmp_path)
    sup = Supervisor(run_dir)
    ranks = [_fake_rank(), _fake_rank()]
    try:
        for rank, proc in enumerate(ranks):
            sup.ranks.hello(rank, proc.pid)
        sup.stopping.begin(StopReason.REQUESTED)
        assert [proc.wait(5) for proc in ranks] == [-signal.SIGTERM, -signal.SIGTERM]
        sup.ranks.check_alive()
        status = sup.finish()
    finally:
        for proc in ranks:
            _end(proc)
    assert status is RunStatus.STOPPED and status.exit_code == 1
    run = run_json(run_dir)
    assert run["status"] == "stopped" and run["failure"] is None
    assert [(r["state"], r["exit_code"]) for r in run["ranks"]] == [("stopped", -15), ("stopped", -15)]
    exits = [e["message"] for e in _events(run_dir) if e["kind"] == "rank_exited"]
    assert exits == ["rank 0 stopped (-15)", "rank 1 stopped (-15)"], exits


def test_torchrun_summary_names_the_rank_that_really_failed(tmp_path: Path) -> None:
    """The rank blamed first was killed by the stop (SIGTERM in torchrun's summary): the rank
    that died of its own signal is the cause, and a new failure event says so."""
    run_dir = _unit_run_dir(tmp_path)
    record = run_record.load(run_dir)
    assert record is not None
    journal = Journal(run_dir, record)
    ranks = Ranks(run_dir, record, lambda st: None, lambda st, code, when: None, journal.changed)
    cause = RootCause(run_dir, "here", 0, journal)
    for st in ranks:
        st.pid, st.ended_at = 1000 + st.rank, 100.0 + st.rank
    cause.set(cause.local(0, None, None, None, "rank 0 failed first: died"), 100.0)
    (run_dir / "logs" / "torchrun.log").write_text(
        "Failures:\n[1]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -6 (pid: 1001)\n"
        "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 1000)\n"
    )
    cause.fill_from_torchrun_log(ranks, journal.emit)
    assert cause.failure is not None
    assert (cause.failure.rank, cause.failure.exit_code) == (1, -6)
    assert cause.failure.message == "rank 1 failed first: rank 1 was killed by SIGABRT"
    assert [(st.state.value, st.exit_code) for st in ranks] == [("stopped", -15), ("failed", -6)]
    assert _events(run_dir)[-1]["rank"] == 1


def test_no_rank_started_the_failure_quotes_torchrun(tmp_path: Path) -> None:
    run_dir = _unit_run_dir(tmp_path)
    sup = Supervisor(run_dir)
    (run_dir / "logs" / "torchrun.log").write_text("\nusage: torchrun ...\n\ntorchrun: error: bad --nnodes\n")
    sup.torchrun.code = 2
    assert sup.ranks.all_done(sup.torchrun.code, stopping=False)
    status = sup.finish()
    assert status is RunStatus.FAILED
    run = run_json(run_dir)
    assert run["failure"]["rank"] is None and run["failure"]["exit_code"] == 2
    assert run["failure"]["traceback"] == "usage: torchrun ...\ntorchrun: error: bad --nnodes"
    assert run["failure"]["message"] == "torchrun exited with code 2 (see logs/torchrun.log)"
    assert [r["state"] for r in run["ranks"]] == ["failed", "failed"]


def test_log_sink_reads_each_rank_log_as_it_grows_and_parses_whole_lines(tmp_path: Path) -> None:
    run_dir = _unit_run_dir(tmp_path)
    lines: list[tuple[int, str]] = []
    forwarded: list[tuple[int, bytes]] = []
    sink = LogSink(run_dir, lambda what, exc: None)
    sink.on_line = lambda rank, line: lines.append((rank, line))
    sink.forward = lambda rank, data: forwarded.append((rank, data))
    log = run_dir / "logs" / "rank-1.log"
    log.write_bytes(b"epoch 1\n 10%|#\r 20%|##\rhalf a li")
    sink.tail()
    assert lines == [(1, "epoch 1"), (1, " 10%|#"), (1, " 20%|##")]
    with open(log, "ab") as fh:
        fh.write(b"ne\nlast without newline")
    sink.tail()
    sink.close_logs()
    assert lines[3:] == [(1, "half a line"), (1, "last without newline")]
    assert b"".join(d for _, d in forwarded) == log.read_bytes()
    # Another node's rank output (node 0 of several) is written here, and not read back.
    assert sink.append(5, b"remote\npart", b"") == b"part"
    assert (run_dir / "logs" / "rank-5.log").read_bytes() == b"remote\npart"
    sink.tail()
    assert lines[-1] == (5, "remote")
    sink.close_all()


@pytest.mark.parametrize(("value", "grace"), [(None, 10.0), ("2.5", 2.5), ("-3", 0.0), ("soon", 10.0)])
def test_stop_grace_from_the_environment(monkeypatch: pytest.MonkeyPatch, value: str | None, grace: float) -> None:
    if value is None:
        monkeypatch.delenv("XL_STOP_GRACE", raising=False)
    else:
        monkeypatch.setenv("XL_STOP_GRACE", value)
    assert grace_from_env() == grace



@pytest.mark.parametrize("given", [0, 1])
def test_node_1_s_rows_show_only_the_rank_torch_gave_it_whichever_node_joined_first(tmp_path: Path, given: int) -> None:
    """Node 1 of two, one rank: torch numbers nodes in the order they join, so its rank is 1
    (it joined second) or 0 (it joined first). Until the rank reports, its number is only a
    guess (1) and run.json lists no row; once it reports, one row with the rank torch gave it.
    A viewer polling all along never shows a row for a rank this node does not have."""
    from xl.launcher.rundir.reader import RunReader  # noqa: PLC0415 - the viewer, only for this test

    run_dir = _unit_run_dir(tmp_path, nproc=1)
    data = json.loads((run_dir / "run.json").read_text())
    data.update(nnodes=2, node_rank=1, world_size=2, spec={"rdzv": "127.0.0.1:29400"})
    (run_dir / "run.json").write_text(json.dumps(data))
    record = run_record.load(run_dir)
    assert record is not None
    journal = Journal(run_dir, record)
    started: list[int] = []
    ranks = Ranks(run_dir, record, lambda st: started.append(st.rank), lambda st, code, when: None, journal.changed)
    reader = RunReader(run_dir)
    journal.save(ranks.to_json(), None)
    assert run_json(run_dir)["ranks"] == [] and reader.poll().ranks == {}
    env = {**os.environ, "XL_RUN_ID": record.run_id, "LOCAL_RANK": "0", "RANK": str(given), "WORLD_SIZE": "2"}
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        wait_for(lambda: f"XL_RUN_ID={record.run_id}".encode() in Path(f"/proc/{rank.pid}/environ").read_bytes(), timeout=10, what="the rank's environment")
        (run_dir / "ranks" / f"rank-{given}.json").write_text(json.dumps({"rank": given, "local_rank": 0, "pid": rank.pid, "started_at": time.time()}))
        ranks.scan_records()
        journal.save(ranks.to_json(), None)
        rows = run_json(run_dir)["ranks"]
        assert [(r["rank"], r["pid"], r["state"]) for r in rows] == [(given, rank.pid, "running")], rows
        assert started == [given]
        assert sorted(reader.poll().ranks) == [given]
    finally:
        rank.kill()
        rank.wait(5)
