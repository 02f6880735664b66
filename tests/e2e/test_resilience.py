"""Training outlives what is done to its run: a full disk, a flood, a damaged or deleted record
(real torchrun, CPU ranks).

Each test runs a real `xl launch`, does to the run what an unlucky user or a stranger would (a
full filesystem, a flood of connections, a damaged run.json, a deleted run folder, a rank's child
that left its session), and checks that the training finished, that run.json tells what
happened, and that no process of the run is left. (A supervisor that dies or freezes is in
test_supervisor_dies.py.)
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import socket
import struct
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from procs import (
    Launched,
    launched_run,
    run_json,
    wait_final,
    wait_for,
    wait_no_processes,
    wait_ranks_running,
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


def _launched(
    tmp_path: Path, body: str, env: dict[str, str], **popen: Any
) -> contextlib.AbstractContextManager[Launched]:
    """Two ranks of PRELUDE + ``body``, launched with --detach; none of the run's processes left
    when the test ends."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PRELUDE) + textwrap.dedent(body))
    args = ["--nproc", "2", str(script), str(tmp_path / "go")]
    return launched_run(args, env, cwd=tmp_path, how="detach", **popen)


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
    with _launched(tmp_path, body, xl_env(small_disk)) as launched:
        run_dir = launched.run_dir
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
    with _launched(tmp_path, body, xl_env(tmp_path / "home"), preexec_fn=_limit_fds) as launched:
        run_dir = launched.run_dir
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
                lambda: sup.num_fds() > 300,
                timeout=10,
                what="the supervisor to take the connections",
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


def test_secrets_given_with_env_reach_no_command_line_and_run_files_are_private(
    tmp_path: Path,
) -> None:
    secret = "s3cr3t-" + os.urandom(6).hex()
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(PRELUDE) + f"print(os.environ['WANDB_API_KEY'] == {secret!r}, flush=True)\n"
    )
    env = xl_env(tmp_path / "home")
    args = ["--nproc", "2", "--env", f"WANDB_API_KEY={secret}", str(script), str(tmp_path / "go")]
    with launched_run(args, env, cwd=tmp_path) as launched:
        run_dir, proc = launched.run_dir, launched.launch
        assert proc is not None
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
        done = launched.finish(timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "True" in (run_dir / "logs" / "rank-0.log").read_text()  # the rank still got it
        for path in [run_dir, *run_dir.rglob("*")]:
            mode = path.stat().st_mode & 0o777
            assert mode == (0o700 if path.is_dir() else 0o600), f"{path} is {oct(mode)}"
        wait_no_processes(run_dir, timeout=GRACE + 5)


def test_a_damaged_run_json_still_lists_the_run_and_xl_stop_last_ends_it(tmp_path: Path) -> None:
    env = xl_env(tmp_path / "home")
    with _launched(tmp_path, "time.sleep(120)\n", env) as launched:
        run_dir = launched.run_dir
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
    with _launched(tmp_path, body, env) as launched:
        run_dir = launched.run_dir
        child = None
        try:
            wait_ranks_running(run_dir, 2)
            (tmp_path / "go").touch()
            pid_file = tmp_path / "go.child"
            child = psutil.Process(
                int(
                    wait_for(
                        lambda: pid_file.exists() and pid_file.read_text(),
                        timeout=30,
                        what="the child",
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


def test_a_run_whose_folder_was_deleted_can_still_be_stopped_by_its_id(tmp_path: Path) -> None:
    env = xl_env(tmp_path / "home")
    with _launched(tmp_path, "time.sleep(120)\n", env) as launched:
        run_dir = launched.run_dir
        procs_before: list[psutil.Process] = []
        try:
            run = wait_ranks_running(run_dir, 2)
            procs_before = [
                psutil.Process(p)
                for p in (
                    run["supervisor_pid"],
                    run["torchrun_pid"],
                    *(r["pid"] for r in run["ranks"]),
                )
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
