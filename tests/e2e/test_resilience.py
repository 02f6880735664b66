"""Training outlives its supervisor: frozen, starved of disk, flooded (real torchrun, CPU ranks).

Each test runs a real `xl launch`, does to the supervisor what an unlucky user or a stranger
would (SIGSTOP, a full filesystem, a flood of connections), and checks that the training
finished, that run.json tells what happened, and that no process of the run is left.
(The SIGKILLed supervisor is in test_supervisor_stops.py.)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
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
from smalldisk import fill, tmpfs

pytestmark = pytest.mark.e2e
GRACE = 1.0

# Ranks print "ready", wait for the test's go file, then do their part and print "done".
PRELUDE = """
import os, sys, time, xl
rank = int(os.environ["RANK"])
go = sys.argv[1]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.02)
"""


def _launch(tmp_path: Path, body: str, env: dict[str, str], **popen: Any) -> Path:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PRELUDE) + textwrap.dedent(body))
    home = Path(env["XL_HOME"])
    done = subprocess.run(
        [*XL, "launch", "--detach", "--nproc", "2", str(script), str(tmp_path / "go")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        **popen,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return wait_run(home)


def _live(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _steps(run_dir: Path) -> set[tuple[int, int]]:
    return {
        (r["rank"], r["step"])
        for r in _lines(run_dir / "metrics.jsonl")
        if r.get("kind") == "train" and "step" in r
    }


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
    run_dir = _launch(tmp_path, body, xl_env(tmp_path / "home"))
    sup = 0
    try:
        sup = wait_ranks_running(run_dir, 2)["supervisor_pid"]
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
        stop = xl(["stop", run_dir.name], xl_env(tmp_path / "home"), timeout=60)
        assert stop.returncode == 0 and stop.stdout.strip() == f"{run_dir.name} stopped", (
            stop.stdout + stop.stderr
        )
        run = run_json(run_dir)
        assert run["status"] == "stopped"
        assert [(r["state"], r["exit_code"]) for r in run["ranks"]] == [
            ("exited", 0),
            ("stopped", None),
        ]
        wait_no_processes(run_dir, timeout=GRACE + 5)
    finally:
        with contextlib.suppress(OSError):
            os.kill(sup, signal.SIGKILL)
        kill_run(run_dir)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs for XL_HOME."""
    with tmpfs(tmp_path / "home", "8m") as mnt:
        yield mnt


def test_a_full_disk_loses_no_output_or_metrics_that_fit_in_memory_and_ends_nothing(
    tmp_path: Path, small_disk: Path
) -> None:
    # Ranks print and log while XL_HOME is full, then the space comes back: they finished,
    # their output and metrics caught up, and run.json says succeeded.
    body = """
    free = go + ".free"
    i = 0
    while not os.path.exists(free) or i < 400:
        print(f"step {i} " + "y" * 100, flush=True)
        xl.log(step=i, loss=1.0 / (i + 1))
        i += 1
        time.sleep(0.005)
    print(f"done at {i}", flush=True)
    """
    run_dir = _launch(tmp_path, body, xl_env(small_disk))
    try:
        wait_ranks_running(run_dir, 2)
        fill(small_disk / "filler")
        (tmp_path / "go").touch()
        wait_for(
            lambda: psutil.disk_usage(str(small_disk)).free == 0,
            timeout=10,
            what="the disk to be full",
        )
        time.sleep(1.5)  # ranks print and log into a full disk
        (small_disk / "filler").unlink()
        (tmp_path / "go.free").touch()
        run = wait_final(run_dir, timeout=90)
        assert run["status"] == "succeeded", run
        assert [r["exit_code"] for r in run["ranks"]] == [0, 0]
        for rank in (0, 1):
            log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
            last = int(log.rsplit("done at ", 1)[1].split()[0])
            assert "step 0 " in log and f"step {last - 1} " in log  # nothing lost in between
            assert (rank, last - 1) in _steps(run_dir)
        wait_no_processes(run_dir, timeout=GRACE + 5)
    finally:
        kill_run(run_dir)


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))


def test_a_flood_of_strangers_costs_little_memory_and_ends_nothing(tmp_path: Path) -> None:
    # 700 unauthenticated connections (more than the supervisor's 512 descriptors): 300 send
    # almost a whole 1 MiB frame instead of a handshake (refused after 53 bytes), 400 say
    # nothing (held small until the idle cut, or refused at the cap); the training goes on and
    # its metrics are stored.
    body = """
    for i in range(50):
        xl.log(step=i, loss=1.0 / (i + 1))
        time.sleep(0.01)
    print("done", flush=True)
    """
    run_dir = _launch(tmp_path, body, xl_env(tmp_path / "home"), preexec_fn=_limit_fds)
    strangers: list[socket.socket] = []
    try:
        run = wait_ranks_running(run_dir, 2)
        sup = psutil.Process(run["supervisor_pid"])
        host, _, port = (
            psutil.Process(run["ranks"][0]["pid"]).environ()["XL_COLLECTOR"].rpartition(":")
        )
        before = sup.memory_info().rss
        big = struct.pack(">I", 1 << 20) + b"z" * ((1 << 20) - 16)  # almost a whole frame
        for i in range(700):
            s = socket.create_connection((host, int(port)), timeout=5)
            s.setblocking(False)
            with contextlib.suppress(OSError):
                if i % 7 < 3:
                    s.send(big)  # 300 send ~1 MiB, 400 say nothing
            strangers.append(s)
        wait_for(
            lambda: sup.num_fds() > 300, timeout=10, what="the supervisor to take the connections"
        )
        grown = (sup.memory_info().rss - before) >> 20
        assert grown < 100, f"the supervisor grew by {grown} MiB for strangers"
        (tmp_path / "go").touch()
        run = wait_final(run_dir, timeout=60)
        assert run["status"] == "succeeded", run
        assert {(0, 49), (1, 49)} <= _steps(run_dir)
        assert "crashed" not in (run_dir / "supervisor.log").read_text()
        wait_no_processes(run_dir, timeout=GRACE + 5)
    finally:
        for s in strangers:
            s.close()
        kill_run(run_dir)


def test_secrets_given_with_env_reach_no_command_line_and_run_files_are_private(
    tmp_path: Path,
) -> None:
    secret = "s3cr3t-" + os.urandom(6).hex()
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(PRELUDE) + f"print(os.environ['WANDB_API_KEY'] == {secret!r}, flush=True)\n"
    )
    env = xl_env(tmp_path / "home")
    proc = subprocess.Popen(
        [
            *XL,
            "launch",
            "--no-tui",
            "--nproc",
            "2",
            "--env",
            f"WANDB_API_KEY={secret}",
            str(script),
            str(tmp_path / "go"),
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_dir = wait_run(tmp_path / "home")
    try:
        run = wait_ranks_running(run_dir, 2)
        pids = [
            proc.pid,
            run["supervisor_pid"],
            run["torchrun_pid"],
            *(r["pid"] for r in run["ranks"]),
        ]
        for pid in pids:
            assert secret not in " ".join(psutil.Process(pid).cmdline()), psutil.Process(
                pid
            ).cmdline()
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, out + err
        assert "True" in (run_dir / "logs" / "rank-0.log").read_text()  # the rank still got it
        for path in [run_dir, *run_dir.rglob("*")]:
            mode = path.stat().st_mode & 0o777
            assert mode == (0o700 if path.is_dir() else 0o600), f"{path} is {oct(mode)}"
        wait_no_processes(run_dir, timeout=GRACE + 5)
    finally:
        proc.kill()
        proc.communicate(timeout=10)
        kill_run(run_dir)


def test_a_damaged_run_json_still_lists_the_run_and_xl_stop_last_ends_it(tmp_path: Path) -> None:
    env = xl_env(tmp_path / "home")
    run_dir = _launch(tmp_path, "time.sleep(120)\n", env)
    try:
        wait_ranks_running(run_dir, 2)
        (run_dir / "run.json").write_text("{")  # truncated by a full disk, a bad copy, a person
        listed = json.loads(xl(["runs", "--json"], env).stdout)
        assert [(r["run_id"], r["status"]) for r in listed] == [(run_dir.name, "unreadable")]
        stop = xl(["stop", "last"], env, timeout=60)
        assert stop.returncode == 0 and stop.stdout.strip() == f"{run_dir.name} stopped", (
            stop.stdout + stop.stderr
        )
        # its supervisor stopped it and wrote it whole
        assert run_json(run_dir)["status"] == "stopped"
        wait_no_processes(run_dir, timeout=GRACE + 5)
    finally:
        kill_run(run_dir)


def test_xl_stop_ends_a_child_that_left_the_rank_s_session_and_environment(tmp_path: Path) -> None:
    body = """
    if rank == 0:
        import subprocess
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)"], env={}, start_new_session=True
        )
        with open(go + ".child", "w") as fh:
            fh.write(str(child.pid))
    time.sleep(120)
    """
    env = xl_env(tmp_path / "home")
    run_dir = _launch(tmp_path, body, env)
    child = None
    try:
        wait_ranks_running(run_dir, 2)
        (tmp_path / "go").touch()
        pid_file = tmp_path / "go.child"
        child = psutil.Process(
            int(
                wait_for(
                    lambda: pid_file.exists() and pid_file.read_text(), timeout=30, what="the child"
                )
            )
        )
        assert "XL_RUN_ID" not in child.environ()
        stop = xl(["stop", run_dir.name], env, timeout=60)
        assert stop.returncode == 0 and stop.stdout.strip() == f"{run_dir.name} stopped", (
            stop.stdout + stop.stderr
        )
        wait_for(
            lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE,
            timeout=5,
            what="the child to end",
        )
        wait_no_processes(run_dir, timeout=GRACE + 5)
    finally:
        if child is not None:
            with contextlib.suppress(psutil.Error):
                child.kill()
        kill_run(run_dir)


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
    run = run_json(run_dir)
    assert run["status"] == "failed" and run["failure"]["message"].startswith(
        f"supervisor error: {crash[1]}("
    )
    assert [r["state"] for r in run["ranks"]] == ["failed", "failed"]
    wait_no_processes(run_dir, timeout=5)


def test_a_run_whose_folder_was_deleted_can_still_be_stopped_by_its_id(tmp_path: Path) -> None:
    env = xl_env(tmp_path / "home")
    run_dir = _launch(tmp_path, "time.sleep(120)\n", env)
    procs_before: list[psutil.Process] = []
    try:
        run = wait_ranks_running(run_dir, 2)
        procs_before = [
            psutil.Process(p)
            for p in (run["supervisor_pid"], run["torchrun_pid"], *(r["pid"] for r in run["ranks"]))
        ]
        for _ in range(20):  # the supervisor may be replacing a file in it meanwhile
            shutil.rmtree(run_dir, ignore_errors=True)
            if not run_dir.exists():
                break
        assert not run_dir.exists()
        stop = xl(["stop", run_dir.name], env, timeout=60)
        assert (
            stop.returncode == 0
            and stop.stdout.strip() == f"{run_dir.name} stopped (its run folder is gone)"
        ), stop.stdout + stop.stderr
        wait_for(
            lambda: not any(_live(p) for p in procs_before),
            timeout=GRACE + 5,
            what="the run's processes to end",
        )
        wait_no_processes(run_dir, timeout=GRACE + 5)
    finally:
        for p in procs_before:
            with contextlib.suppress(psutil.Error):
                p.kill()
        kill_run(run_dir)


# Rank 0 starts a sidecar in its own session with an empty environment (no XL_RUN_ID) once the
# test's file says so, and writes its pid; the ranks end when the test's end file appears.
SIDECAR = """
import subprocess
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


def test_xl_stop_ends_a_rank_s_sidecar_after_the_supervisor_was_sigkilled(tmp_path: Path) -> None:
    env = xl_env(tmp_path / "home")
    run_dir = _launch(tmp_path, SIDECAR, env)
    child = None
    try:
        run = wait_ranks_running(run_dir, 2)
        (tmp_path / "go").touch()
        os.kill(run["supervisor_pid"], signal.SIGKILL)
        # started after the supervisor died: only its parent rank knows it
        child = _sidecar(tmp_path)
        time.sleep(1)
        assert _live(child)
        stop = xl(["stop", run_dir.name], env, timeout=60)
        assert stop.returncode == 0 and stop.stdout.strip() == f"{run_dir.name} stopped", (
            stop.stdout + stop.stderr
        )
        wait_for(lambda: not _live(child), timeout=5, what="the sidecar to end")
        wait_no_processes(run_dir, timeout=GRACE + 5)
    finally:
        if child is not None:
            with contextlib.suppress(psutil.Error):
                child.kill()
        kill_run(run_dir)


@pytest.mark.parametrize("how", ["stop", "ranks_finish"])
def test_a_sidecar_recorded_by_the_supervisor_ends_with_the_run_after_the_supervisor_died(
    tmp_path: Path, how: str
) -> None:
    """The sidecar outlives its rank (orphaned, no environment, its own session): the supervisor
    saw it before it was SIGKILLed; `xl stop`, or the last rank settling the run, ends it."""
    env = xl_env(tmp_path / "home")
    run_dir = _launch(tmp_path, SIDECAR, env)
    child = None
    try:
        run = wait_ranks_running(run_dir, 2)
        (tmp_path / "go").touch()
        child = _sidecar(tmp_path)
        pid = child.pid
        wait_for(
            lambda: (
                (run_dir / "escaped.json").exists()
                and str(pid) in (run_dir / "escaped.json").read_text()
            ),
            timeout=30,
            what="the supervisor to see the sidecar",
        )
        os.kill(run["supervisor_pid"], signal.SIGKILL)
        if how == "stop":
            stop = xl(["stop", run_dir.name], env, timeout=60)
            assert stop.returncode == 0 and stop.stdout.strip() == f"{run_dir.name} stopped", (
                stop.stdout + stop.stderr
            )
        else:
            (tmp_path / "go.end").touch()
            assert wait_final(run_dir, timeout=60)["status"] == "succeeded"
        wait_for(lambda: not _live(child), timeout=5, what="the sidecar to end")
        wait_no_processes(run_dir, timeout=GRACE + 5)
    finally:
        if child is not None:
            with contextlib.suppress(psutil.Error):
                child.kill()
        kill_run(run_dir)


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
