"""launcher.runprocs: which of a run's descendants count as having left its environment."""

from __future__ import annotations

import os
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
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert procfs.state(child.pid) in ("R", "S") and runprocs.alive(child.pid)
        assert child.stdin is not None
        child.stdin.close()  # it exits; not reaped yet, it is a zombie
        deadline = time.monotonic() + 30
        while procfs.state(child.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert procfs.state(child.pid) == "Z" and not runprocs.alive(child.pid)
    finally:
        child.wait(30)
    assert procfs.state(child.pid) is None and not runprocs.alive(child.pid)
