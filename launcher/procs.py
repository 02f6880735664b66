"""Finding and ending a run's processes.

Ranks live in their own sessions (torchrun starts them with ``start_new_session``), so they are
not torchrun's process group and outlive it when torchrun is killed. Every process of a run
carries ``XL_RUN_ID`` in its environment, which is how they are found whatever their parent.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable

import psutil

from xl.launcher.rundir.record import RunRecord


def _environ_has(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            data = b"\0" + fh.read()
    except OSError:
        return False
    return needle in data


def find_run_pids(run_id: str, *, exclude: Iterable[int] = ()) -> list[int]:
    """PIDs of live processes whose environment says ``XL_RUN_ID=<run_id>``."""
    skip = {os.getpid(), *exclude}
    needle = b"\0XL_RUN_ID=" + run_id.encode() + b"\0"
    pids: list[int] = []
    if os.path.isdir("/proc"):
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in skip and _environ_has(int(name), needle) and alive(int(name)):
                pids.append(int(name))
        return pids
    for proc in psutil.process_iter():
        try:
            if proc.pid not in skip and proc.environ().get("XL_RUN_ID") == run_id and alive(proc.pid):
                pids.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return pids


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def same_process(pid: int, create_time: float | None) -> bool:
    """``pid`` is still the process first seen at ``create_time`` (guards against PID reuse)."""
    if not alive(pid):
        return False
    if create_time is None:
        return True
    try:
        return abs(psutil.Process(pid).create_time() - create_time) < 1.0
    except psutil.Error:
        return False


def supervisor_alive(record: RunRecord) -> bool:
    """The run's supervisor, as run.json names it, is still running (never another process
    that got its PID since)."""
    pid = record.supervisor_pid
    return pid is not None and same_process(pid, record.supervisor_started_at)


def create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def signal_rank(pid: int, sig: int) -> None:
    """Signal a rank and everything in its process group (DataLoader workers, ...)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
            return
    except OSError:
        pass
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def kill_all(pids: Iterable[int]) -> None:
    for pid in pids:
        signal_rank(pid, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (the supervisor is a subreaper: a rank's child that left
    the rank's session or cleared its environment is still one of them)."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True) if alive(p.pid)]
    except psutil.Error:
        return []


def frozen(pid: int) -> bool:
    """``pid`` is stopped (SIGSTOP, a debugger): it will not act on a signal until resumed."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def is_run_process(pid: int, run_id: str) -> bool:
    """``pid`` carries ``XL_RUN_ID=<run_id>`` (a process of another user cannot be read: False)."""
    return _environ_has(pid, b"\0XL_RUN_ID=" + run_id.encode() + b"\0")


def find_supervisor(run_dir: str) -> int | None:
    """The live supervisor of ``run_dir`` found without run.json: it works in its run dir
    (cwd, "... (deleted)" once the folder is gone) and runs ``xl.launcher.supervisor``."""
    want = os.path.realpath(run_dir)
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            if os.readlink(f"/proc/{name}/cwd") not in (want, want + " (deleted)"):
                continue
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                if b"xl.launcher.supervisor" in fh.read() and alive(int(name)):
                    return int(name)
        except OSError:
            continue
    return None
