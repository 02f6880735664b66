"""launcher.runprocs: which of a run's descendants count as having left its environment."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from xl import procfs
from xl.launcher import runprocs

RUN_ID = "20261126-000000-abcd"
SLEEP = [sys.executable, "-c", "import time; time.sleep(30)"]


def _ours(pid: int) -> list[int]:
    return [found for found, _ in runprocs.escaped_descendants(os.getpid(), RUN_ID) if found == pid]


def test_a_child_with_a_scrubbed_environment_is_escaped_and_one_with_the_run_id_is_not() -> None:
    scrubbed = subprocess.Popen(SLEEP, env={})
    tagged = subprocess.Popen(SLEEP, env={**os.environ, "XL_RUN_ID": RUN_ID})
    try:
        time.sleep(0.3)  # both past their exec
        assert _ours(scrubbed.pid) == [scrubbed.pid]
        assert _ours(tagged.pid) == []
    finally:
        for proc in (scrubbed, tagged):
            proc.kill()
            proc.wait(timeout=10)


def test_a_process_that_has_let_go_of_its_memory_is_not_called_escaped() -> None:
    # An exiting process shows an empty environment once its memory is gone; so does a zombie,
    # which is what a test can hold still: neither has shed XL_RUN_ID, they are ending.
    child = subprocess.Popen([sys.executable, "-c", "pass"], env={})
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and runprocs._has_memory(child.pid):
            time.sleep(0.02)
        assert not runprocs._has_memory(child.pid)
        assert _ours(child.pid) == []
        assert not runprocs._has_memory(2**22 + 7)  # no such process
    finally:
        child.wait(timeout=10)
    assert runprocs._has_memory(os.getpid())


def test_a_real_child_is_alive_until_it_exits_and_gone_once_a_zombie() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        assert procfs.proc_state(child.pid) in ("R", "S") and runprocs.alive(child.pid)
        assert child.stdin is not None
        child.stdin.close()  # it exits; not reaped yet, it is a zombie
        deadline = time.monotonic() + 30
        while procfs.proc_state(child.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert procfs.proc_state(child.pid) == "Z" and not runprocs.alive(child.pid)
    finally:
        child.wait(30)
    assert procfs.proc_state(child.pid) is None and not runprocs.alive(child.pid)


def test_a_pid_is_the_same_process_only_with_its_own_start_time() -> None:
    child = subprocess.Popen(SLEEP)
    try:
        started = runprocs.create_time(child.pid)
        assert started is not None and abs(started - time.time()) < 30
        assert runprocs.same_process(child.pid, started) and runprocs.same_process(child.pid, None)
        # Another process that got the PID later: its start differs (the record's is older).
        assert not runprocs.same_process(child.pid, started - 60)
    finally:
        child.kill()
        child.wait(10)
    assert not runprocs.same_process(child.pid, started) and runprocs.create_time(child.pid) is None


def test_a_stopped_process_is_frozen_until_it_is_resumed() -> None:
    child = subprocess.Popen(SLEEP)
    try:
        assert not runprocs.frozen(child.pid)
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not runprocs.frozen(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert runprocs.frozen(child.pid)
        os.kill(child.pid, signal.SIGCONT)
        while runprocs.frozen(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not runprocs.frozen(child.pid)
    finally:
        child.kill()
        child.wait(10)
    assert not runprocs.frozen(child.pid)


def test_descendants_are_the_live_children_and_theirs() -> None:
    code = (
        "import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(30)'])\ntime.sleep(30)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while len(runprocs.descendants(parent.pid)) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        (grandchild,) = runprocs.descendants(parent.pid)
        assert parent.pid in runprocs.descendants(
            os.getpid()
        ) and grandchild in runprocs.descendants(os.getpid())
        os.kill(grandchild, signal.SIGKILL)  # a zombie until its parent reaps it: not live
        while runprocs.descendants(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert runprocs.descendants(parent.pid) == []
    finally:
        parent.kill()
        parent.wait(10)
    deadline = time.monotonic() + 10
    while procfs.proc_state(grandchild) is not None and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(grandchild, os.WNOHANG)  # ours to reap where this process is a subreaper
        time.sleep(0.02)
    assert procfs.proc_state(parent.pid) is None and procfs.proc_state(grandchild) is None
