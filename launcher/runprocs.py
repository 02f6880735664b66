"""Finding and ending a run's processes.

Ranks live in their own sessions (torchrun starts them with ``start_new_session``), so they are
not torchrun's process group and outlive it when torchrun is killed. Every process of a run
carries ``XL_RUN_ID`` in its environment, which is how they are found whatever their parent.

A process a rank started with a scrubbed environment (a sidecar, a server in its own session)
carries no XL_RUN_ID: while the supervisor lives it is one of its descendants (the supervisor is
a subreaper), and the supervisor writes every such "escaped" process to ``escaped.json`` in the
run dir (pid and start time) so that `xl stop`, and whoever settles the run, find it after the
supervisor is gone (``escaped``). A pid there is only taken while the same process holds it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

from xl import envnames, procfs
from xl.atomic import write_json_atomic
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.runrecord import RunRecord

# How much lower than the training xl's own processes run once torchrun has started: the
# supervisor, and the view of `xl launch` without the app (docs/launch.md, "How a launch starts").
# Their work (telemetry's start, parsing the ranks' lines, drawing them) waits for a free core
# instead of taking one from a rank; at nice 5 each still gets about a third of a core it shares.
NICE = 5


def give_way() -> None:
    """Lower this process below the training (never the other way: torchrun and its ranks keep
    the priority the person gave the command). Whatever it starts later inherits it."""
    with contextlib.suppress(OSError):
        os.nice(NICE)


def _needle(run_id: str) -> bytes:
    """``XL_RUN_ID=<run_id>`` as it stands in /proc/<pid>/environ, between NULs."""
    return f"\0{envnames.RUN_ID}={run_id}\0".encode()


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
    needle = _needle(run_id)
    pids: list[int] = []
    if os.path.isdir("/proc"):
        for name in os.listdir("/proc"):
            if (
                name.isdigit()
                and int(name) not in skip
                and _environ_has(int(name), needle)
                and alive(int(name))
            ):
                pids.append(int(name))
        return pids
    import psutil  # noqa: PLC0415 - only where there is no /proc to read

    for proc in psutil.process_iter():
        try:
            if (
                proc.pid not in skip
                and proc.environ().get(envnames.RUN_ID) == run_id
                and alive(proc.pid)
            ):
                pids.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return pids


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as gone. Read from /proc
    directly: the supervisor asks it of every rank on every tick."""
    return procfs.proc_state(pid) not in (None, "Z", "X")


def same_process(pid: int, started_at: float | None) -> bool:
    """``pid`` is still the process first seen started at ``started_at`` (guards against PID
    reuse)."""
    if not alive(pid):
        return False
    if started_at is None:
        return True
    now = procfs.create_time(pid)
    return now is not None and abs(now - started_at) < 1.0


def supervisor_alive(record: RunRecord) -> bool:
    """The run's supervisor, as run.json names it, is still running (never another process
    that got its PID since)."""
    pid = record.supervisor_pid
    return pid is not None and same_process(pid, record.supervisor_started_at)


def create_time(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch, as psutil has it), None when it is gone."""
    return procfs.create_time(pid)


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
    return [child for child in procfs.descendants(pid, procfs.process_tree()) if alive(child)]


def frozen(pid: int) -> bool:
    """``pid`` is stopped (SIGSTOP, a debugger): it will not act on a signal until resumed."""
    return procfs.proc_state(pid) in ("T", "t")  # stopped, or stopped by a tracer


def _has_memory(pid: int) -> bool:
    """``pid`` still has its address space: a process in the middle of exiting has let it go, and
    with it the environment /proc shows (empty), so it would look as if it had shed XL_RUN_ID."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split(maxsplit=1)[0]) > 0
    except (OSError, ValueError, IndexError):
        return False


def is_run_process(pid: int, run_id: str) -> bool:
    """``pid`` carries ``XL_RUN_ID=<run_id>`` (a process of another user cannot be read: False)."""
    return _environ_has(pid, _needle(run_id))


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


def escaped_descendants(root: int, run_id: str) -> list[tuple[int, float]]:
    """(pid, start time) of the live descendants of ``root`` without ``XL_RUN_ID=<run_id>``."""
    out = []
    for pid in procfs.descendants(root, procfs.process_tree()):
        # The environment first: a rank's own processes (nearly all) stop there, at one read.
        if not is_run_process(pid, run_id) and _has_memory(pid) and alive(pid):
            started = create_time(pid)
            if started is not None:
                out.append((pid, started))
    return sorted(out)


def save_escaped(run_dir: Path, found: list[tuple[int, float]]) -> None:
    write_json_atomic(
        RunLayout(run_dir).escaped, [{"pid": pid, "started": started} for pid, started in found]
    )


def escaped(run_dir: Path) -> list[int]:
    """The escaped processes the supervisor recorded that still run (the same processes)."""
    try:
        data = json.loads(RunLayout(run_dir).escaped.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    pids = []
    for item in data if isinstance(data, list) else []:
        pid, started = (
            (item.get("pid"), item.get("started")) if isinstance(item, dict) else (None, None)
        )
        if (
            type(pid) is int
            and pid > 1
            and type(started) is float
            and pid != os.getpid()
            and same_process(pid, started)
        ):
            pids.append(pid)
    return pids


def end_escaped(run_dir: Path, grace: float = 1.0) -> list[int]:
    """A run is over: SIGTERM what it left behind (``escaped``), SIGKILL after ``grace``."""
    pids = escaped(run_dir)
    for pid in pids:
        signal_rank(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = pids
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    kill_all(left)
    return pids
