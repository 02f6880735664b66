"""A run's cgroup holds every process of the run, however it was started, and ends with it (real
torchrun, CPU ranks, this machine's cgroups: root and cgroup v1's memory controller).

A sidecar a rank starts in a session of its own with an empty environment (no XL_RUN_ID), or
after a double fork, is found by nothing but the cgroup once the supervisor is gone: the tests
SIGKILL the supervisor before the sidecar starts, so nothing recorded it. Every test checks that
no process of the run is left, that the cgroup is removed, and that a process of the test's own
(started beside the run, in the same cgroup as `xl launch`) is left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from procs import (
    launched_run,
    run_json,
    wait_final,
    wait_for,
    wait_no_processes,
    wait_ranks_running,
    xl,
    xl_env,
)

from xl import cgroup

pytestmark = pytest.mark.e2e
GRACE = 1.0
PLACE = cgroup.find_place()
needs_cgroup = pytest.mark.skipif(
    PLACE.parent is None or not PLACE.memory,
    reason=f"no cgroup with the memory controller can be made here: {PLACE.reason}",
)

# Ranks print "ready" and wait for the test's go file; rank 0 then starts its sidecar (SIDECAR or
# DOUBLE_FORK) and writes its pid; every rank ends once the end file appears.
PRELUDE = """
import os, subprocess, sys, time
rank = int(os.environ["RANK"])
go = sys.argv[1]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.02)
"""
SIDECAR = """
if rank == 0:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], env={}, start_new_session=True
    )
    with open(go + ".child", "w") as fh:
        fh.write(str(child.pid))
"""
# A daemon as a C programmer writes one: fork, setsid, fork again, the middle one exits; the
# grandchild clears its environment by exec.
DOUBLE_FORK = """
if rank == 0:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(go + ".child", "w") as fh:
                fh.write(str(os.getpid()))
            os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)"], {})
        os._exit(0)
"""
THE_END = """
while not os.path.exists(go + ".end"):
    time.sleep(0.02)
"""


@pytest.fixture
def bystander() -> Iterator[psutil.Process]:
    """A process of the test's own, in the cgroup `xl launch` runs in: no run may touch it."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield psutil.Process(proc.pid)
        assert proc.poll() is None, "a process of the test's own was ended"
    finally:
        proc.kill()
        proc.wait(timeout=30)


@contextlib.contextmanager
def _launched(
    tmp_path: Path, body: str, env: dict[str, str], *opts: str
) -> Iterator[tuple[Path, str, list[psutil.Process]]]:
    """Two ranks of PRELUDE + ``body`` launched with --detach: the run dir, what the launch said
    on stderr, and the list the test keeps the sidecars in. No process of the run is left when
    the test ends, and whatever is left of the sidecars is killed, however it ends."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PRELUDE) + textwrap.dedent(body))
    args = ["--nproc", "2", *opts, str(script), str(tmp_path / "go")]
    sidecars: list[psutil.Process] = []
    try:
        with launched_run(args, env, cwd=tmp_path, how="detach") as launched:
            yield launched.run_dir, launched.result.stderr, sidecars
    finally:
        _kill(sidecars)


def _kill(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()


def _live(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _started(tmp_path: Path, sidecars: list[psutil.Process]) -> psutil.Process:
    """The ranks let go, the process rank 0 then starts, kept in ``sidecars``."""
    (tmp_path / "go").touch()
    pid_file = tmp_path / "go.child"
    pid = wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=30, what="sidecar")
    child = psutil.Process(int(pid))
    sidecars.append(child)
    return child


def _sidecar(
    tmp_path: Path, group: str, rank0: int, sidecars: list[psutil.Process]
) -> psutil.Process:
    """The sidecar, once rank 0 started it: in a session of its own, without the run's
    environment, and in the run's cgroup."""
    session = os.getsid(rank0)
    child = _started(tmp_path, sidecars)
    wait_for(lambda: "XL_RUN_ID" not in child.environ(), timeout=10, what="its clean environment")
    assert os.getsid(child.pid) not in (session, os.getsid(0))
    assert child.pid in cgroup.pids(group), (child.pid, cgroup.pids(group))
    return child


def _rank0(run: dict[str, Any]) -> int:
    return next(int(r["pid"]) for r in run["ranks"] if r["rank"] == 0)


def _ended(child: psutil.Process, run_dir: Path, group: str) -> None:
    _sidecar_ended(child)
    wait_no_processes(run_dir, timeout=GRACE + 10)
    _removed(group)


def _sidecar_ended(child: psutil.Process) -> None:
    wait_for(lambda: not _live(child), timeout=GRACE + 30, what="the sidecar to end")


def _removed(group: str) -> None:
    wait_for(lambda: not os.path.exists(group), timeout=30, what="the cgroup to be removed")


def _ended_in_cgroup(run_dir: Path) -> dict[str, Any]:
    """run.json once the supervisor (or the run's last rank, where it was killed) wrote what it
    ended in the cgroup."""
    return wait_for(
        lambda: "ended_in_cgroup" in run_json(run_dir) and run_json(run_dir),
        timeout=30,
        what="run.json's ended_in_cgroup",
    )


def _stop(run_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    stop = xl(["stop", run_dir.name], env, timeout=90)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    return stop


def _orphaned_sidecar(
    tmp_path: Path, run_dir: Path, said: str, sidecars: list[psutil.Process], place: str
) -> dict[str, Any]:
    """The run's cgroup under ``place``; its supervisor SIGKILLed before rank 0 starts the
    sidecar, then the ranks let finish: run.json once it says what was ended in the cgroup, the
    sidecar, every process of the run and the cgroup gone by then."""
    run = wait_ranks_running(run_dir, 2)
    group = run["cgroup"]
    assert "no cgroup" not in said and group.startswith(place), (said, run)
    os.kill(run["supervisor_pid"], signal.SIGKILL)
    child = _sidecar(tmp_path, group, _rank0(run), sidecars)
    (tmp_path / "go.end").touch()
    # The last rank settles the run; what is left in its cgroup is ended after it.
    _ended(child, run_dir, group)
    return _ended_in_cgroup(run_dir)


@needs_cgroup
@pytest.mark.parametrize("body", [SIDECAR, DOUBLE_FORK], ids=["own_session", "double_fork"])
def test_a_sidecar_started_after_the_supervisor_was_killed_ends_when_the_ranks_finish(
    tmp_path: Path, bystander: psutil.Process, body: str
) -> None:
    env = xl_env(tmp_path / "home")
    with _launched(tmp_path, body + THE_END, env) as (run_dir, said, sidecars):
        final = _orphaned_sidecar(tmp_path, run_dir, said, sidecars, f"{PLACE.parent}/xl-")
        assert final["status"] == "succeeded", final
        assert final["ended_in_cgroup"] == 1, final
        assert _live(bystander)


V2 = Path("/sys/fs/cgroup/unified")


@pytest.fixture
def v2_folder() -> Iterator[Path]:
    """A folder of this machine's cgroup v2 tree (beside v1, with no memory controller) for
    XL_CGROUP_ROOT: a delegated subtree as a user of a v2-only host has one."""
    if os.geteuid() != 0 or not (V2 / "cgroup.controllers").exists():
        pytest.skip("needs root and a cgroup v2 tree at /sys/fs/cgroup/unified")
    folder = V2 / f"xl-test-{os.getpid()}-{os.urandom(3).hex()}"
    folder.mkdir()
    try:
        yield folder
    finally:
        cgroup.remove(str(folder))


def test_on_cgroup_v2_the_run_s_cgroup_holds_it_together_without_memory_figures(
    tmp_path: Path, bystander: psutil.Process, v2_folder: Path
) -> None:
    env = xl_env(tmp_path / "home", XL_CGROUP_ROOT=str(v2_folder))
    with _launched(tmp_path, SIDECAR + THE_END, env) as (run_dir, said, sidecars):
        final = _orphaned_sidecar(tmp_path, run_dir, said, sidecars, f"{v2_folder}/xl-run-")
        assert final["status"] == "succeeded" and final["ended_in_cgroup"] == 1, final
        assert "cgroup_memory" not in final, final  # no memory controller in that tree
        assert _live(bystander)


@needs_cgroup
def test_a_sidecar_ends_with_a_run_whose_supervisor_lives(
    tmp_path: Path, bystander: psutil.Process
) -> None:
    """The supervisor ends the run (its ranks finished): the sidecar it never knew is gone too;
    the cgroup's memory figures are the run's."""
    env = xl_env(tmp_path / "home")
    with _launched(tmp_path, DOUBLE_FORK + THE_END, env) as (run_dir, _, sidecars):
        run = wait_ranks_running(run_dir, 2)
        group = run["cgroup"]
        child = _sidecar(tmp_path, group, _rank0(run), sidecars)
        (tmp_path / "go.end").touch()
        final = wait_final(run_dir, timeout=60)
        _ended(child, run_dir, group)
        assert final["status"] == "succeeded", final
        assert isinstance(final["ended_in_cgroup"], int), final
        # Two ranks of Python and torchrun together: more than 50 MiB at their peak.
        memory = final["cgroup_memory"]
        assert memory["peak"] > 50 << 20 and memory["limit"] is None, memory
        assert memory["oom_kills"] == 0, memory
        assert _live(bystander)


@needs_cgroup
@pytest.mark.parametrize("supervisor", ["alive", "killed"])
def test_xl_stop_ends_a_double_forked_sidecar(
    tmp_path: Path, bystander: psutil.Process, supervisor: str
) -> None:
    env = xl_env(tmp_path / "home")
    with _launched(tmp_path, DOUBLE_FORK + "time.sleep(300)\n", env) as (run_dir, _, sidecars):
        run = wait_ranks_running(run_dir, 2)
        group = run["cgroup"]
        if supervisor == "killed":
            os.kill(run["supervisor_pid"], signal.SIGKILL)
        child = _sidecar(tmp_path, group, _rank0(run), sidecars)
        stop = _stop(run_dir, env)
        assert stop.stdout.strip() == f"{run_dir.name} stopped", stop.stdout + stop.stderr
        _ended(child, run_dir, group)
        final = run_json(run_dir)
        assert final["status"] == "stopped" and isinstance(final["ended_in_cgroup"], int), final
        assert _live(bystander)


@needs_cgroup
def test_xl_stop_of_a_run_with_a_damaged_run_json_ends_its_cgroup_by_name(
    tmp_path: Path, bystander: psutil.Process
) -> None:
    env = xl_env(tmp_path / "home")
    with _launched(tmp_path, DOUBLE_FORK + "time.sleep(300)\n", env) as (run_dir, _, sidecars):
        run = wait_ranks_running(run_dir, 2)
        group = run["cgroup"]
        os.kill(run["supervisor_pid"], signal.SIGKILL)
        child = _sidecar(tmp_path, group, _rank0(run), sidecars)
        (run_dir / "run.json").write_text("{")
        _stop(run_dir, env)
        _sidecar_ended(child)
        _removed(group)
        assert not [p for p in psutil.process_iter() if _in_run(p, run["run_id"])]
        assert _live(bystander)


def _in_run(proc: psutil.Process, run_id: str) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get("XL_RUN_ID") == run_id
    except psutil.Error:
        return False


def test_a_run_that_cannot_have_a_cgroup_says_so_and_is_still_kept_together(
    tmp_path: Path, bystander: psutil.Process
) -> None:
    """XL_CGROUP_ROOT names a folder that is no cgroup: the launch says so in one line, run.json
    says why, and the run is followed as before (the sidecar, seen by the live supervisor,
    ends with `xl stop`)."""
    env = xl_env(tmp_path / "home", XL_CGROUP_ROOT=str(tmp_path / "no-cgroup"))
    with _launched(tmp_path, SIDECAR + "time.sleep(300)\n", env) as (run_dir, said, sidecars):
        run = wait_ranks_running(run_dir, 2)
        reason = f"XL_CGROUP_ROOT: {tmp_path / 'no-cgroup'} is not a cgroup folder"
        assert said.splitlines()[0] == (
            f"xl: no cgroup for this run ({reason}); its processes are followed by their process "
            "tree and environment instead"
        ), said
        assert run["cgroup"] is None and run["cgroup_reason"] == reason, run
        child = _started(tmp_path, sidecars)
        _stop(run_dir, env)
        _sidecar_ended(child)
        wait_no_processes(run_dir, timeout=GRACE + 10)
        assert "ended_in_cgroup" not in run_json(run_dir)
        assert _live(bystander)


@needs_cgroup
def test_memory_limit_is_the_kernel_s_and_its_oom_kill_is_host_oom_naming_it(
    tmp_path: Path, bystander: psutil.Process
) -> None:
    """Rank 1 allocates past the run's --memory-limit 512M (torchrun and two ranks hold about
    200 MiB); rank 0 stays small. The kernel's OOM killer ends rank 1, the largest; the cause
    says host_oom with the limit and a rerun with a larger one."""
    body = """
    chunks = []
    if rank == 1:
        for _ in range(48):
            chunks.append(bytearray(16 << 20))
    time.sleep(300)
    """
    env = xl_env(tmp_path / "home")
    with _launched(tmp_path, body, env, "--memory-limit", "512M") as (run_dir, _, _):
        run = wait_ranks_running(run_dir, 2)
        assert run["spec"]["memory_limit"] == "512M"
        assert cgroup.memory(run["cgroup"])["limit"] == 512 << 20
        (tmp_path / "go").touch()
        final = wait_final(run_dir, timeout=90)
        assert final["status"] == "failed", final
        failure = final["failure"]
        assert failure["rank"] == 1 and failure["exit_code"] == -signal.SIGKILL, failure
        cause = failure["cause"]
        assert cause["kind"] == "host_oom", cause
        assert "--memory-limit of 512 MiB" in cause["summary"], cause
        assert cause["fix"].startswith("xl launch --memory-limit 1G "), cause
        assert final["cgroup_memory"]["limit"] == 512 << 20, final
        assert final["cgroup_memory"]["oom_kills"] >= 1, final
        wait_no_processes(run_dir, timeout=GRACE + 10)
        assert not os.path.exists(run["cgroup"])
        assert _live(bystander)


@needs_cgroup
def test_a_run_under_its_memory_limit_is_left_alone_and_its_memory_is_on_the_sys_lines(
    tmp_path: Path,
) -> None:
    """The same kind of limit, 1G, and rank 1 holding 400 MiB under it: the run succeeds, nothing
    was OOM-killed, and the sys lines carry the run's memory (under 400 MiB before rank 1
    allocates, at least that after) and its limit."""
    body = """
    held = b"x" * (400 << 20) if rank == 1 else b""
    open(go + f".held{rank}", "w").close()
    while not os.path.exists(go + ".end"):
        time.sleep(0.02)
    """
    env = xl_env(tmp_path / "home")
    with _launched(tmp_path, body, env, "--memory-limit", "1G") as (run_dir, _, _):
        wait_ranks_running(run_dir, 2)
        before = wait_for(lambda: _cgroup_lines(run_dir), timeout=30, what="a sys line")
        assert before[-1]["cgroup_mem_limit_mib"] == 1024.0, before[-1]
        assert before[-1]["cgroup_mem_mib"] < 400, before[-1]
        (tmp_path / "go").touch()
        wait_for(lambda: (tmp_path / "go.held1").exists(), timeout=60, what="rank 1's 400 MiB")
        after = wait_for(
            lambda: [r for r in _cgroup_lines(run_dir) if r["cgroup_mem_mib"] >= 400],
            timeout=30,
            what="a sys line with the 400 MiB",
        )
        assert after[-1]["cgroup_mem_limit_mib"] == 1024.0, after[-1]
        (tmp_path / "go.end").touch()
        final = wait_final(run_dir, timeout=90)
        assert final["status"] == "succeeded", final
        assert final["cgroup_memory"]["oom_kills"] == 0, final
        assert final["cgroup_memory"]["limit"] == 1 << 30, final
        assert final["cgroup_memory"]["peak"] >= 400 << 20, final
        wait_no_processes(run_dir, timeout=GRACE + 10)


def _cgroup_lines(run_dir: Path) -> list[dict[str, Any]]:
    try:
        text = (run_dir / "metrics.jsonl").read_text()
    except OSError:
        return []
    lines = [json.loads(x) for x in text.splitlines() if '"cgroup_mem_mib"' in x]
    return [r for r in lines if r.get("kind") == "sys"]


def test_memory_limit_where_no_cgroup_can_be_made_starts_nothing(tmp_path: Path) -> None:
    env = xl_env(tmp_path / "home", XL_CGROUP_ROOT=str(tmp_path / "no-cgroup"))
    script = tmp_path / "train.py"
    script.write_text("print('never')\n")
    done = xl(["launch", "--memory-limit", "64G", "--no-tui", str(script)], env, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("xl launch: --memory-limit 64G needs a cgroup for the run"), (
        done.stderr
    )
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not list((tmp_path / "home" / "runs").glob("*/run.json")), "a run dir was left"


# Each node's rank starts a double-forked sidecar once the world is formed, then trains on.
TWO_NODES = """
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open("sidecar-" + os.environ["GROUP_RANK"], "w") as fh:
            fh.write(str(os.getpid()))
        os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)"], {})
    os._exit(0)
while not os.path.exists("sidecar-" + os.environ["GROUP_RANK"]):
    time.sleep(0.02)
dist.barrier()
dist.destroy_process_group()
print("done", flush=True)
"""


@needs_cgroup
def test_each_node_s_supervisor_ends_its_own_cgroup(
    tmp_path: Path, bystander: psutil.Process, monkeypatch: pytest.MonkeyPatch
) -> None:
    import twonodes  # noqa: PLC0415 - the multi-node helpers, for this test only

    monkeypatch.setattr(twonodes, "SCRIPT", TWO_NODES)
    home = tmp_path / "home"
    homes = (home, home)
    sidecars: list[psutil.Process] = []
    try:
        results = twonodes.finish(twonodes.start_nodes(tmp_path, homes), timeout=90)
        for code, out in results:
            assert code == 0, out[-3000:]
        runs = twonodes.node_runs(homes)
        groups = [run_json(r)["cgroup"] for r in runs]
        assert groups[0] != groups[1] and groups[1].endswith(".node1"), groups
        for node, run_dir in enumerate(runs):
            run = run_json(run_dir)
            assert run["status"] == "succeeded" and isinstance(run["ended_in_cgroup"], int), run
            pid = int((tmp_path / f"sidecar-{node}").read_text())
            with contextlib.suppress(psutil.NoSuchProcess):
                sidecars.append(psutil.Process(pid))
            wait_no_processes(run_dir, timeout=GRACE + 10)
        for child in sidecars:
            _sidecar_ended(child)
        for group in groups:
            _removed(group)
        assert _live(bystander)
    finally:
        _kill(sidecars)
        twonodes.cleanup(homes)
