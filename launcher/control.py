"""Start, stop and wait for a run; end what is left of one whose supervisor is gone.

A run lives in ``$XL_HOME/runs/<run-id>/`` (xl.launcher.rundir owns its files). While its
supervisor is alive only the supervisor changes the run dir; this module writes it at the start
(before the supervisor exists) and at the end of a run whose supervisor died without ending it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from xl import cgroup as xl_cgroup
from xl.errors import UsageError
from xl.gpu import nvml
from xl.launcher import runprocs
from xl.launcher.plan import Plan, build_plan
from xl.launcher.rundir import layout, stopmark
from xl.launcher.rundir import runrecord as record
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.runrecord import RunJson, RunRecord, RunStatus
from xl.launcher.rundir.store import new_run_id, runs_root
from xl.launcher.spec import LaunchSpec
from xl.launcher.supervisor.stopping import grace_from_env
from xl.procfs import hide_values, set_cmdline

STOPPED_WAIT_S = 15.0  # beyond the grace: a supervisor's own ending (events, run.json, torchrun)


class ForkedSupervisor:
    """The Popen-like handle of a supervisor started by fork (poll() reaps it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = 0
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


@dataclass
class RunHandle:
    run_id: str
    run_dir: Path
    pid: int
    proc: subprocess.Popen[bytes] | ForkedSupervisor | None = None
    cgroup_reason: str | None = None  # why the run has no cgroup (None: it has one)


def _fork_supervisor(run_dir: Path) -> ForkedSupervisor:
    """Start the supervisor as a forked copy of this (single-threaded) process.

    Saves a Python start and the imports (~0.1 s of a launch). Only for callers without threads:
    the child of a threaded process may inherit a held lock.
    """
    nvml.shutdown()  # the child opens its own NVML handle; never share the driver's fds
    sys.stdout.flush()
    sys.stderr.flush()
    # `xl launch --env KEY=SECRET`: neither this process nor its fork may show the value in ps.
    set_cmdline(hide_values(_own_cmdline(), "--env"))
    pid = os.fork()
    if pid:
        return ForkedSupervisor(pid)
    code = 1
    try:
        os.setsid()
        # A fork keeps `xl launch`'s argv: show what this process is instead.
        set_cmdline(
            [os.path.basename(sys.executable), "-m", "xl.launcher.supervisor", str(run_dir)]
        )
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(
            RunLayout(run_dir).supervisor_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
        )
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        # Nothing of the launching process may stay open here (a caller's pipe would not see
        # EOF until the run ends).
        os.closerange(3, 1 << 16)
        os.chdir(run_dir)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        # As a fresh interpreter has it: a peer that vanished is an EPIPE error, not a death.
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        sys.argv = [sys.executable, "-m", "xl.launcher.supervisor", str(run_dir)]
        from xl.launcher.supervisor.loop import main as supervisor_main  # noqa: PLC0415 - only the forked child runs the supervisor; `xl stop`/`xl attach` must not load it

        code = supervisor_main([str(run_dir)])
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(2, f"xl supervisor: crashed: {exc!r}\n".encode("utf-8", "replace"))
        with contextlib.suppress(BaseException):
            import traceback  # noqa: PLC0415 - a crash only

            traceback.print_exc()
    finally:
        os._exit(code)


def _own_cmdline() -> list[str]:
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            return [a.decode("utf-8", "replace") for a in fh.read().rstrip(b"\0").split(b"\0")]
    except OSError:
        return list(sys.argv)


def _make_run_dir(spec: LaunchSpec, run_id: str | None) -> Path:
    """A new, empty run dir: ``run_id``'s (chosen by `xl launch --slurm` for every node at once)
    or a fresh id's."""
    root = runs_root(create=True)
    if run_id is not None:
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", run_id):
            raise UsageError(f"run id {run_id!r} may hold only letters, digits, '_', '.' and '-'")
        run_dir = root / run_id
        try:
            run_dir.mkdir(mode=0o700)
        except FileExistsError:
            raise UsageError(f"a run {run_id} exists already in {root}") from None
        return run_dir
    while True:  # two launches in the same second with the same name: another suffix
        run_dir = root / new_run_id(spec)
        try:
            run_dir.mkdir(mode=0o700)
            return run_dir
        except FileExistsError:
            continue


def _no_room(root: Path, exc: OSError) -> UsageError:
    return UsageError(
        f"cannot write a new run in {root} ({exc.strerror or exc}; a run needs "
        f"{layout.RESERVE_BYTES >> 20} MiB free to start); free some space there, "
        "or set XL_HOME to a folder with room"
    )


def _hold_reserve(run_dir: Path) -> None:
    """The space the run's end is written in (``layout.RESERVE``), taken first: a disk without
    it refuses the run now, in one line, instead of starting one whose final record and exit
    codes could not be written. A filesystem that cannot preallocate runs without it (the
    supervisor tries again as torchrun starts)."""
    fd = os.open(run_dir / layout.RESERVE, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.posix_fallocate(fd, 0, layout.RESERVE_BYTES)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
    finally:
        os.close(fd)


def _make_cgroup(
    run_id: str, node_rank: int, memory_limit: str | None
) -> tuple[str | None, str | None]:
    """The run's cgroup, made now: (its path, None), or (None, why none could be). A run with
    ``--memory-limit`` that cannot have its limit does not start (UsageError)."""
    limit = xl_cgroup.parse_size(memory_limit) if memory_limit else None
    try:
        place = xl_cgroup.find_place()
        return xl_cgroup.make(place, xl_cgroup.run_name(run_id, node_rank), limit), None
    except xl_cgroup.CgroupError as exc:
        if memory_limit:
            raise UsageError(
                f"--memory-limit {memory_limit} needs a cgroup for the run, and none can be made "
                f"here: {exc}; run without --memory-limit (or as root)"
            ) from None
        return None, str(exc)


def _new_record(
    run_id: str, spec: LaunchSpec, plan: Plan, cgroup: tuple[str | None, str | None]
) -> RunRecord:
    """run.json as it is before the supervisor starts (docs/contracts.md, "run.json")."""
    data: RunJson = {
        "name": spec.name or (Path(spec.script).name if spec.script else spec.module or ""),
        "spec": spec.to_json(),
        "argv": plan.argv,
        "rank_env": plan.env,
        # the nodes' environments compared: node 0 of several fills it in before any rank starts
        "env": {"diffs": []},
        "cwd": plan.cwd,
        "devices": [{"index": g.index, "uuid": g.uuid, "name": g.name} for g in plan.devices],
        "nnodes": spec.nnodes,
        "node_rank": spec.node_rank,
        "nproc_per_node": plan.nproc,
        "world_size": plan.nproc * spec.nnodes,
        "host": socket.gethostname(),
        "started_at": time.time(),
        "ended_at": None,
        "supervisor_pid": None,
        "torchrun_pid": None,
        "grace_s": grace_from_env(),
        "ranks": [],
        "failure": None,
        "cgroup": cgroup[0],
    }
    if cgroup[1] is not None:
        data["cgroup_reason"] = cgroup[1]
    return RunRecord(run_id=run_id, status=RunStatus.RUNNING.value, data=dict(data))


def start_run(
    spec: LaunchSpec,
    plan: Plan | None = None,
    *,
    fork: bool = False,
    run_id: str | None = None,
    env: Mapping[str, str] | None = None,
) -> RunHandle:
    """Create the run dir, spawn its detached supervisor and return at once.

    ``plan``: the one already made for ``spec`` (by `xl launch`, or the one the app's Launch
    form showed), which the run then is; without it, one is made here from a fresh inventory.
    ``fork=True`` (the ``xl launch`` command) forks the supervisor instead of starting a new
    interpreter; threaded callers (the TUI) keep the default, and may give the supervisor an
    ``env`` of its own (e.g. a multi-node run's XL_TOKEN) instead of this process's.
    """
    if fork and env is not None:
        raise ValueError("a forked supervisor has this process's environment")
    spec.cwd = spec.cwd or os.getcwd()
    if plan is None:
        plan = build_plan(spec, nvml.inventory(processes=False), env)
    try:
        run_dir = _make_run_dir(spec, run_id)
    except OSError as exc:
        raise _no_room(runs_root(create=False), exc) from None
    run_id = run_dir.name
    import shutil  # noqa: PLC0415 - a run that cannot start only

    try:
        # Its processes are the cgroup's from torchrun's start (docs/launch.md).
        cgroup = _make_cgroup(run_id, spec.node_rank, spec.memory_limit)
    except UsageError:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    try:
        _hold_reserve(run_dir)
        for folder in layout.MADE_FOLDERS:
            (run_dir / folder).mkdir(mode=0o700)
        record.save(run_dir, _new_record(run_id, spec, plan, cgroup))
        for name in layout.MADE_FILES:
            (run_dir / name).touch(mode=0o600)
    except OSError as exc:
        # A full disk (or quota) before anything started: no half-made run is left behind.
        shutil.rmtree(run_dir, ignore_errors=True)
        if cgroup[0] is not None:
            xl_cgroup.remove(cgroup[0])
        raise _no_room(run_dir.parent, exc) from None
    if fork:
        forked = _fork_supervisor(run_dir)
        return RunHandle(run_id, run_dir, forked.pid, forked, cgroup[1])
    log_fd = os.open(
        RunLayout(run_dir).supervisor_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
    )
    with open(log_fd, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "xl.launcher.supervisor", str(run_dir)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # setsid: no terminal, no Ctrl-C, no SIGHUP from the shell
            close_fds=True,
            cwd=str(run_dir),
            env=None if env is None else dict(env),
        )
    return RunHandle(run_id, run_dir, proc.pid, proc, cgroup[1])


def grace_for(rec: RunRecord) -> float:
    """The run's stop grace: the one it was started with, else today's default."""
    return rec.grace_s or grace_from_env()


def run_pids(run_dir: Path, rec: RunRecord) -> list[int]:
    """The run's live processes: XL_RUN_ID in their environment, their descendants and those of
    its supervisor (a rank's child with a scrubbed environment), and what its supervisor recorded
    as escaped (never a pid only named in a file unless the same process still holds it)."""
    pids = set(runprocs.find_run_pids(rec.run_id))
    for pid in list(pids):
        pids.update(runprocs.descendants(pid))
    pids.update(runprocs.escaped(run_dir))
    sup = rec.supervisor_pid
    if sup is not None and runprocs.supervisor_alive(rec):
        pids.update(runprocs.descendants(sup))
        pids.discard(sup)
    return sorted(pids)


def _end_orphaned(run_dir: Path, rec: RunRecord, grace: float, *, stopped: bool) -> None:
    """Nobody supervises the run (its supervisor is gone or frozen): end its processes (SIGTERM,
    SIGKILL after ``grace``), then make the record true from what the ranks left."""
    from xl.launcher.rundir import settle  # noqa: PLC0415 - ending runs only: not on a launch's path to torchrun
    # Training that had ended before this stop keeps the outcome its ranks recorded.
    stopped = stopped and not settle.all_ranks_ended(run_dir, rec)
    pids = run_pids(run_dir, rec)
    if rec.supervisor_pid is not None and runprocs.supervisor_alive(rec):
        # Frozen: it must not wake up later and act on a run that is over.
        runprocs.signal_pid(rec.supervisor_pid, signal.SIGKILL)
    _terminate(pids, rec.run_id, grace)
    # Processes ended just now: the run ended now; else at its last sign of life.
    settle.settle(run_dir, stopped=stopped, ended_now=bool(pids))


def _terminate(pids: list[int], run_id: str, grace: float) -> None:
    """SIGTERM to ``pids``; SIGKILL to what is left of them, and of the run, after ``grace``."""
    for pid in pids:
        runprocs.signal_rank(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = [p for p in pids if runprocs.alive(p)]
    runprocs.kill_all(pids + runprocs.find_run_pids(run_id))


def abandon_if_supervisor_gone(run_dir: Path, *, exited: bool = False) -> bool:
    """For viewers: when the run's supervisor is gone, its training goes on; once nothing of it
    is left, the record is made true from what the ranks left. True if that happened.
    ``exited``: the caller saw its supervisor child exit (covers a supervisor that died before
    writing its PID)."""
    from xl.launcher.rundir import settle  # noqa: PLC0415 - ending runs only: not on a launch's path to torchrun
    rec = record.load(run_dir)
    if rec is None or rec.status != RunStatus.RUNNING:
        return False
    if rec.supervisor_pid is not None and runprocs.supervisor_alive(rec):
        return False
    if rec.supervisor_pid is None and not exited:
        return False  # still starting
    if runprocs.find_run_pids(rec.run_id):
        return False  # training outlives its supervisor
    return settle.settle(run_dir, stopped=False) is not None


def stop_run(run_dir: Path) -> None:
    """Stop the run: its supervisor does (SIGTERM to every rank, SIGKILL after the grace); when
    it is gone or frozen, this process does it and records the run stopped. A supervisor still
    starting finds the stop file (``stopmark``) and never starts the run."""
    rec = record.load(run_dir)
    if rec is None:
        stop_unreadable(run_dir)
        return
    if rec.status != RunStatus.RUNNING:
        return
    if rec.supervisor_pid is None:
        with contextlib.suppress(OSError):
            stopmark.ask_stop(run_dir)
        if _stop_starting(run_dir):
            return
        rec = record.load(run_dir) or rec
        if rec.final:
            return
    sup = rec.supervisor_pid
    if sup is not None and runprocs.supervisor_alive(rec) and not runprocs.frozen(sup):
        runprocs.signal_pid(sup, signal.SIGTERM)
        return
    _end_orphaned(run_dir, rec, grace_for(rec), stopped=True)


def _stop_starting(run_dir: Path) -> bool:
    """The run's supervisor has not written its PID yet: SIGTERM it where it runs (before it
    catches the signal it just ends; after, it stops the run), or, when none runs, record the
    run stopped (one that starts later finds the stop file). False: it wrote its PID meanwhile."""
    from xl.launcher.rundir import settle  # noqa: PLC0415 - ending runs only: not on a launch's path to torchrun
    sup = runprocs.find_supervisor(str(run_dir))
    rec = record.load(run_dir)
    if rec is not None and rec.supervisor_pid is not None:
        return False
    if sup is None:
        settle.settle(
            run_dir, stopped=True, why="stopped before its supervisor started", ended_now=True
        )
    elif runprocs.frozen(sup):
        runprocs.signal_pid(sup, signal.SIGKILL)
        settle.settle(
            run_dir, stopped=True, why="its supervisor was frozen as it started", ended_now=True
        )
    else:
        runprocs.signal_pid(sup, signal.SIGTERM)
    return True


def _starting_ended(run_dir: Path, rec: RunRecord) -> bool:
    """A stopped run whose supervisor never wrote its PID and runs no more (it ended on the
    SIGTERM before catching it): recorded stopped here. True when it was."""
    from xl.launcher.rundir import settle  # noqa: PLC0415 - ending runs only: not on a launch's path to torchrun

    if (
        rec.supervisor_pid is not None
        or not stopmark.stop_asked(run_dir)
        or runprocs.find_supervisor(str(run_dir))
    ):
        return False
    rec = record.load(run_dir) or rec
    if rec.final or rec.supervisor_pid is not None:
        return rec.final
    settle.settle(
        run_dir, stopped=True, why="stopped before its supervisor started", ended_now=True
    )
    return True


def stop_unreadable(run_dir: Path) -> None:
    """A run whose run.json is damaged or gone: its supervisor (found by its cwd) stops it; when
    there is none, or it is frozen, every process carrying the run's id (and what it recorded as
    escaped) is ended here."""
    run_id = run_dir.name
    sup = runprocs.find_supervisor(str(run_dir))
    if sup is not None and not runprocs.frozen(sup):
        runprocs.signal_pid(sup, signal.SIGTERM)
        deadline = time.monotonic() + grace_from_env() + STOPPED_WAIT_S
        while runprocs.alive(sup) and time.monotonic() < deadline:
            time.sleep(0.05)
    if sup is not None:
        runprocs.signal_pid(sup, signal.SIGKILL)  # frozen, or never done: it must not wake up later
    _terminate(runprocs.find_run_pids(run_id) + runprocs.escaped(run_dir), run_id, grace_from_env())
    from xl.launcher.runcgroup import end_named  # noqa: PLC0415 - a damaged run's stop only

    end_named(run_id, grace_from_env())


def wait_for_end(run_dir: Path, timeout: float) -> RunRecord | None:
    """Poll run.json until the run is over or ``timeout`` passes; returns the last record
    (None while run.json cannot be read).

    A supervisor that died or froze without finishing (SIGKILL, OOM killer, SIGSTOP) cannot
    end the run: then what is left of it is ended here and the run recorded as stopped; one
    that is alive but never ends it within ``timeout`` (a stuck disk) is ended the same way.
    """
    deadline = time.monotonic() + timeout
    while True:
        rec = record.load(run_dir)
        if rec is not None and rec.final:
            return rec
        if rec is not None and _starting_ended(run_dir, rec):
            return record.load(run_dir)
        if rec is not None and rec.supervisor_pid is not None:
            sup_gone = not runprocs.supervisor_alive(rec)
            if sup_gone or runprocs.frozen(rec.supervisor_pid) or time.monotonic() >= deadline:
                rec = record.load(run_dir) or rec  # it may have finished between the two reads
                if not rec.final:
                    _end_orphaned(run_dir, rec, 0.0 if sup_gone else grace_for(rec), stopped=True)
                return record.load(run_dir)
        if time.monotonic() >= deadline:
            return rec
        time.sleep(0.05)
