"""A supervisor that dies or freezes mid-run (real `xl launch`, torchrun, CPU ranks): training
goes on, no record is lost, and run.json, `xl runs` and `xl stop` tell the truth afterwards.

Frozen (SIGSTOP, as a swapping or overloaded host does to it): no rank's print blocks, no
healthy rank is blamed, and `xl stop` still ends the run. Killed outright (SIGKILL): the ranks
finish and settle the run from what they left, `xl runs` says the supervisor is gone, `xl stop`
ends the ranks and any sidecar they started, and a run found dead ends at its last sign of life.
Crashed: one line, and a true record. Every test checks that no process of the run is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from procs import (
    XL,
    Launched,
    launched_run,
    run_json,
    run_processes,
    wait_for,
    wait_no_processes,
    xl_env,
)
from where import SUPPORT

pytestmark = pytest.mark.e2e
GRACE = 1.0  # XL_STOP_GRACE in procs.xl_env

FREEZE_S = 20.0
# Each rank logs a step every 0.1 s and writes each step it logged to a file of its own (the
# ground truth); rank 1 is held still while the test's hold file is there.
STEPPER = textwrap.dedent(
    """
    import os, sys, time
    import xl
    rank = int(os.environ["RANK"])
    here = sys.argv[1]
    steps = open(os.path.join(here, f"steps-{rank}.txt"), "w")
    print("ready", flush=True)
    step = 0
    while not os.path.exists(os.path.join(here, "end")):
        while rank == 1 and os.path.exists(os.path.join(here, "hold")):
            time.sleep(0.1)  # rank 1 held still: no step while the file is there
        step += 1
        xl.log(step=step, loss=1.0 / step, samples=4)
        steps.write(f"{step}\\n")
        steps.flush()
        time.sleep(0.1)
    print("flushed", xl.flush(timeout=30), flush=True)
    """
)

# Ranks print "ready", wait for the test's go file, then do their part.
PRELUDE = """
import os, sys, time, xl
rank = int(os.environ["RANK"])
go = sys.argv[1]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.02)
"""
# ... then rank 0 starts a sidecar in its own session with an empty environment (no XL_RUN_ID)
# once the test's spawn file says so, and writes its pid; the ranks print "go" and end when the
# test's end file appears.
SIDECAR = """
import subprocess
print("go", flush=True)
while not os.path.exists(go + ".spawn"):
    time.sleep(0.02)
if rank == 0:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], env={}, start_new_session=True
    )
    with open(go + ".child", "w") as fh:
        fh.write(str(child.pid))
while not os.path.exists(go + ".end"):
    time.sleep(0.02)
"""


def _script(tmp_path: Path, body: str) -> list[str]:
    """`xl launch`'s arguments for two ranks of PRELUDE + ``body``, gated on the go file."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PRELUDE) + textwrap.dedent(body))
    return ["--nproc", "2", str(script), str(tmp_path / "go")]


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if path.exists()
        else []
    )


def _live(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _sidecar(tmp_path: Path) -> psutil.Process:
    (tmp_path / "go.spawn").touch()
    pid_file = tmp_path / "go.child"
    child = psutil.Process(
        int(
            wait_for(
                lambda: pid_file.exists() and pid_file.read_text(), timeout=30, what="the sidecar"
            )
        )
    )
    assert "XL_RUN_ID" not in child.environ() and child.pid == os.getsid(child.pid)
    return child


def _stopped(run: Launched) -> None:
    stop = run.xl("stop", run.run_dir.name, timeout=60)
    assert stop.returncode == 0 and stop.stdout.strip() == f"{run.run_dir.name} stopped", (
        stop.stdout + stop.stderr
    )


def _listed(run: Launched) -> tuple[str, dict[str, Any]]:
    """The run's row of `xl runs` and its object of `xl runs --json`."""
    table = run.xl("runs")
    assert table.returncode == 0, table.stderr
    row = next(ln for ln in table.stdout.splitlines() if ln.startswith(run.run_dir.name))
    listed = run.xl("runs", "--json")
    assert listed.returncode == 0, listed.stderr
    return row, next(r for r in json.loads(listed.stdout) if r["run_id"] == run.run_dir.name)


# --------------------------------------------------------------------------------------- frozen
def test_a_frozen_supervisor_loses_no_record_and_blames_only_the_rank_that_stopped(
    tmp_path: Path,
) -> None:
    """The supervisor is stopped for 20 s (longer than the stall threshold, 8 s here) and let go
    on. Rank 1 is held still from the freeze until the test has seen its stall named; rank 0
    keeps stepping throughout."""
    (tmp_path / "train.py").write_text(STEPPER)
    env = xl_env(tmp_path / "home", XL_STALL_MIN_S="8")
    args = ["--nproc", "2", "train.py", str(tmp_path)]
    with launched_run(args, env, cwd=tmp_path, ranks=2, merge_stderr=True) as run:
        run_dir = run.run_dir
        supervisor = None
        try:
            wait_for(
                lambda: (
                    all(
                        len((tmp_path / f"steps-{r}.txt").read_text().split()) >= 20
                        for r in (0, 1)
                        if (tmp_path / f"steps-{r}.txt").exists()
                    )
                    and (tmp_path / "steps-1.txt").exists()
                ),
                timeout=60,
                what="both ranks stepping",
            )
            supervisor = int(run.run()["supervisor_pid"])
            os.kill(supervisor, signal.SIGSTOP)
            (tmp_path / "hold").touch()
            held_at = len((tmp_path / "steps-1.txt").read_text().split())
            time.sleep(FREEZE_S)
            os.kill(supervisor, signal.SIGCONT)
            supervisor = None
            # Rank 1 stopped stepping during the freeze: named once its threshold has passed.
            wait_for(
                lambda: any(
                    e.get("kind") == "stalled" and e.get("rank") == 1 for e in _events(run_dir)
                ),
                timeout=90,
                what="rank 1's stall",
            )
            (tmp_path / "hold").unlink()
            wait_for(
                lambda: len((tmp_path / "steps-1.txt").read_text().split()) > held_at + 20,
                timeout=60,
                what="rank 1 stepping again",
            )
            (tmp_path / "end").touch()
            done = run.finish(timeout=120)
        finally:
            (tmp_path / "end").touch()
            (tmp_path / "hold").unlink(missing_ok=True)
            if supervisor is not None:
                os.kill(supervisor, signal.SIGCONT)
        out = done.stdout
        assert done.returncode == 0, out[-3000:]
        # xl.flush() said every record was stored
        assert "[rank 0] flushed True" in out and "[rank 1] flushed True" in out, out[-3000:]
        events = _events(run_dir)
        # The supervisor says it was paused; it blames rank 0, which stepped throughout,
        # for nothing.
        blamed = [
            e
            for e in events
            if e.get("kind") in ("stalled", "hang", "straggler") and e.get("rank") == 0
        ]
        assert not blamed, blamed
        assert not [e for e in events if e.get("kind") == "hang" and 0 in (e.get("ranks") or [])], (
            events
        )
        paused = [e for e in events if e.get("kind") == "supervisor_paused"]
        assert paused and paused[0]["paused_s"] >= FREEZE_S - 2, events
        assert not [e for e in events if e.get("kind") == "dropped"], events
        # Every step each rank logged is in metrics.jsonl, once.
        stored: dict[int, list[int]] = {0: [], 1: []}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if rec.get("kind") == "train" and rec.get("rank") in stored:
                stored[rec["rank"]].append(int(rec["step"]))
        for rank in (0, 1):
            logged = [int(s) for s in (tmp_path / f"steps-{rank}.txt").read_text().split()]
            missing = sorted(set(logged) - set(stored[rank]))
            assert not missing, (rank, missing[:20], len(logged))
            assert sorted(stored[rank]) == logged, f"rank {rank}: a step stored twice"


def test_a_frozen_supervisor_blocks_no_print_and_xl_stop_still_ends_the_run(tmp_path: Path) -> None:
    # Rank 0 prints 2 MiB (far past any socket or pipe buffer) while the supervisor is stopped.
    body = """
    if rank == 0:
        for i in range(20000):
            print(f"line {i:06d} " + "x" * 90)
        print("rank 0 done", flush=True)
    else:
        time.sleep(120)
    """
    env = xl_env(tmp_path / "home")
    with launched_run(_script(tmp_path, body), env, cwd=tmp_path, how="detach", ranks=2) as run:
        run_dir = run.run_dir
        sup = run.run()["supervisor_pid"]
        os.kill(sup, signal.SIGSTOP)
        (tmp_path / "go").touch()
        rank0 = run_dir / "ranks" / "rank-0.json"
        wait_for(
            lambda: rank0.exists() and json.loads(rank0.read_text()).get("exit_code") == 0,
            timeout=60,
            what="rank 0 to finish",
        )
        assert "rank 0 done" in (run_dir / "logs" / "rank-0.log").read_text()
        assert psutil.Process(sup).status() == psutil.STATUS_STOPPED  # it never ran meanwhile
        _stopped(run)
        assert run.run()["status"] == "stopped"
        assert [(r["state"], r["exit_code"]) for r in run.run()["ranks"]] == [
            ("exited", 0),
            ("stopped", None),
        ]
        wait_no_processes(run_dir, timeout=GRACE + 5)


# --------------------------------------------------------------------------------------- killed
def test_supervisor_killed_outright_training_finishes_and_the_record_is_told_by_the_ranks(
    tmp_path: Path,
) -> None:
    # Ranks print and log after their supervisor is SIGKILLed: no print dies of EPIPE, the
    # spooled metrics are merged, and run.json ends true (succeeded, every rank exit 0).
    script = tmp_path / "steps.py"
    script.write_text(
        "import time, xl\n"
        'print("ready", flush=True)\n'
        "for i in range(30):\n"
        '    print(f"step {i}", flush=True)\n'
        "    xl.log(step=i, loss=1.0 / (i + 1))\n"
        "    time.sleep(0.1)\n"
    )
    env = xl_env(tmp_path / "home")
    with launched_run(["--nproc", "2", str(script)], env, cwd=tmp_path, ranks=2) as run:
        run_dir = run.run_dir
        os.kill(run.run()["supervisor_pid"], signal.SIGKILL)
        done = run.finish(timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        record = run.run()
        assert record["status"] == "succeeded", record
        assert [(r["state"], r["exit_code"]) for r in record["ranks"]] == [
            ("exited", 0),
            ("exited", 0),
        ]
        for rank in (0, 1):
            assert "step 29" in (run_dir / "logs" / f"rank-{rank}.log").read_text()
        steps = {
            (r["rank"], r.get("step"))
            for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        }
        assert {(0, 29), (1, 29)} <= steps  # logged after the supervisor died: spooled, then merged
        ended = [e for e in _events(run_dir) if e["kind"] == "run_ended"]
        assert len(ended) == 1 and "what the ranks left" in ended[0]["message"]
        # torchrun outlives its killed supervisor until its ranks end (2.8 s at load 19 on 2
        # cores): what matters is that it goes, not how fast a loaded machine lets it.
        wait_no_processes(run_dir, timeout=GRACE + 30)


def test_a_run_whose_supervisor_was_killed_is_accounted_from_what_its_ranks_left(
    tmp_path: Path,
) -> None:
    env = xl_env(tmp_path / "home")
    args = ["--nproc", "2", str(SUPPORT / "stall_ddp.py"), "--steps", "200", "--step-s", "0.03"]
    with launched_run(args, env, cwd=tmp_path, how="detach") as run:
        run_dir = run.run_dir
        wait_for(
            lambda: b'"train"' in (run_dir / "metrics.jsonl").read_bytes(),
            timeout=120,
            what="a first step",
        )
        os.kill(run.run()["supervisor_pid"], signal.SIGKILL)
        # The ranks train on, spool what they log, and the last one to end settles the run.
        record = run.final(timeout=120)
        t = record["time"]
        parts = ("startup_s", "training_s", "stalled_s", "restarts_s", "shutdown_s")
        assert (
            record["status"] == "succeeded" and abs(sum(t[k] for k in parts) - t["total_s"]) < 0.01
        ), t
        # the steps after the kill count too (spooled, merged)
        assert t["training_s"] >= 200 * 0.03 * 0.9, t
        assert all(isinstance(r.get("waited_s"), float) for r in record["ranks"]), record["ranks"]
        wait_no_processes(run_dir, timeout=30)


def test_a_killed_supervisor_is_said_gone_and_xl_stop_ends_its_ranks_and_their_sidecar_at_the_stop(
    tmp_path: Path,
) -> None:
    """The supervisor is SIGKILLed while its ranks wait; rank 0 then starts a sidecar (only its
    parent rank knows it). `xl runs` says the supervisor is gone; the ranks wait silently (no
    file of the run changes), so `xl stop` ends the run at the stop, sidecar and all."""
    env = xl_env(tmp_path / "home", OMP_NUM_THREADS="1")
    with launched_run(_script(tmp_path, SIDECAR), env, cwd=tmp_path, how="detach") as run:
        run_dir = run.run_dir
        record = run.ranks_running(2)
        (tmp_path / "go").touch()
        os.kill(record["supervisor_pid"], signal.SIGKILL)
        killed_at = time.time()
        child = _sidecar(tmp_path)
        try:
            row, obj = wait_for(
                lambda: (got := _listed(run))[1]["supervisor"] == "gone" and got,
                timeout=30,
                what="the supervisor said gone",
            )
            assert "running (supervisor gone; 'xl stop' cleans up)" in row, row
            assert obj["status"] == "running" and not obj["supervisor_alive"], obj
            time.sleep(max(0.0, killed_at + 4 - time.time()))  # a while later
            assert _live(child)
            stop_at = time.time()
            _stopped(run)
            ended_at = run.run()["ended_at"]
            assert stop_at <= ended_at <= time.time(), (ended_at, stop_at)
            wait_for(lambda: not _live(child), timeout=5, what="the sidecar to end")
            wait_no_processes(run_dir, timeout=GRACE + 5)
        finally:
            if _live(child):
                child.kill()


@pytest.mark.parametrize("how", ["stop", "ranks_finish"])
def test_a_sidecar_recorded_by_the_supervisor_ends_with_the_run_after_the_supervisor_died(
    tmp_path: Path, how: str
) -> None:
    """The sidecar outlives its rank (orphaned, no environment, its own session): the supervisor
    saw it before it was SIGKILLed; `xl stop`, or the last rank settling the run, ends it."""
    env = xl_env(tmp_path / "home")
    with launched_run(_script(tmp_path, SIDECAR), env, cwd=tmp_path, how="detach") as run:
        run_dir = run.run_dir
        record = run.ranks_running(2)
        (tmp_path / "go").touch()
        child = _sidecar(tmp_path)
        try:
            pid = child.pid
            wait_for(
                lambda: (
                    (run_dir / "escaped.json").exists()
                    and str(pid) in (run_dir / "escaped.json").read_text()
                ),
                timeout=30,
                what="the supervisor to see the sidecar",
            )
            os.kill(record["supervisor_pid"], signal.SIGKILL)
            if how == "stop":
                _stopped(run)
            else:
                (tmp_path / "go.end").touch()
                assert run.final(timeout=60)["status"] == "succeeded"
            wait_for(lambda: not _live(child), timeout=5, what="the sidecar to end")
            wait_no_processes(run_dir, timeout=GRACE + 5)
        finally:
            if _live(child):
                child.kill()


def test_an_unrelated_process_that_got_a_recorded_pid_is_left_alone(tmp_path: Path) -> None:
    # escaped.json names a pid with another start time (the pid was reused): it is not the run's.
    from xl.launcher import runprocs  # noqa: PLC0415 - the unit under test, beside its e2e tests

    bystander = subprocess.Popen(["sleep", "60"])
    try:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        runprocs.save_escaped(
            run_dir, [(bystander.pid, psutil.Process(bystander.pid).create_time() - 100.0)]
        )
        assert runprocs.end_escaped(run_dir) == []
        assert bystander.poll() is None
        runprocs.save_escaped(
            run_dir, [(bystander.pid, psutil.Process(bystander.pid).create_time())]
        )
        assert runprocs.end_escaped(run_dir) == [bystander.pid]
        assert bystander.wait(5) == -signal.SIGTERM
    finally:
        bystander.kill()
        bystander.wait(5)


def test_a_run_found_dead_ends_at_its_last_sign_of_life_not_when_someone_looked(
    tmp_path: Path,
) -> None:
    env = xl_env(tmp_path / "home")
    with launched_run(_script(tmp_path, SIDECAR), env, cwd=tmp_path, how="detach") as run:
        run_dir = run.run_dir
        run.ranks_running(2)
        (tmp_path / "go").touch()
        wait_for(
            lambda: all(
                "go" in (run_dir / "logs" / f"rank-{r}.log").read_text().split() for r in (0, 1)
            ),
            timeout=30,
            what="go",
        )
        # SIGKILL the supervisor, then every process of the run.
        os.kill(run.run()["supervisor_pid"], signal.SIGKILL)
        for proc in run_processes(run_dir):
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGKILL)
        killed_at = time.time()
        wait_no_processes(run_dir, timeout=10)
        time.sleep(4)  # someone looks later
        listed = run.xl("runs")
        assert listed.returncode == 0, listed.stderr
        record = run.run()
        assert record["status"] == "failed", record
        assert record["started_at"] < record["ended_at"] <= killed_at + 0.5, (
            record["ended_at"],
            killed_at,
        )
        assert killed_at - record["ended_at"] < 3.0  # the sampler's metrics were its heartbeat
        ended = [e for e in _events(run_dir) if e["kind"] == "run_ended"]
        assert len(ended) == 1


# -------------------------------------------------------------------------------------- crashed
def test_a_supervisor_that_crashes_says_so_in_one_line_and_leaves_a_true_record(
    tmp_path: Path,
) -> None:
    # A run.json whose torchrun command cannot be started: the supervisor's start raises.
    run_dir = tmp_path / "run"
    (run_dir / "ranks").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    rec = {
        "run_id": "crash-" + os.urandom(4).hex(),
        "name": "crash",
        "status": "running",
        "argv": None,
        "nnodes": 1,
        "node_rank": 0,
        "nproc_per_node": 2,
        "world_size": 2,
        "ranks": [],
        "failure": None,
    }
    (run_dir / "run.json").write_text(json.dumps(rec))
    with open(run_dir / "supervisor.log", "wb") as log:
        done = subprocess.run(
            [*XL[:1], "-m", "xl.launcher.supervisor", str(run_dir)],
            stdout=log,
            stderr=log,
            cwd=run_dir,
            env=xl_env(tmp_path / "home"),
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    first = (run_dir / "supervisor.log").read_text().splitlines()[0]
    # The error is whatever the start raised on that command (which one is the supervisor's detail).
    crash = re.match(r"xl supervisor: crashed: (\w+Error)\(.*\); ending the run$", first)
    assert crash, first
    record = run_json(run_dir)
    assert record["status"] == "failed" and record["failure"]["message"].startswith(
        f"supervisor error: {crash[1]}("
    )
    assert [r["state"] for r in record["ranks"]] == ["failed", "failed"]
    wait_no_processes(run_dir, timeout=5)
