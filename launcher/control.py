"""The run store: start a run (spawn its supervisor), find runs, stop them.

A run lives in ``$XL_HOME/runs/<run-id>/`` (see xl.launcher.supervisor for run.json's fields).
Everything here reads the run dir; only the supervisor writes it while it is alive.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xl import paths
from xl.atomic import write_json_atomic
from xl.errors import UsageError
from xl.launcher import procs
from xl.launcher.plan import Plan, build_plan
from xl.launcher.spec import LaunchSpec

DEFAULT_GRACE_S = 10.0

FINAL = ("succeeded", "failed", "stopped")


def grace_from_env() -> float:
    """Seconds between SIGTERM and SIGKILL when a run stops (``XL_STOP_GRACE``, default 10)."""
    try:
        return max(0.0, float(os.environ.get("XL_STOP_GRACE", DEFAULT_GRACE_S)))
    except ValueError:
        return DEFAULT_GRACE_S


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


@dataclass
class RunInfo:
    run_id: str
    run_dir: Path
    name: str | None
    status: str
    target: str
    started_at: float | None
    ended_at: float | None
    world_size: int
    devices: list[dict[str, Any]]
    supervisor_alive: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "name": self.name,
            "status": self.status,
            "target": self.target,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "world_size": self.world_size,
            "devices": self.devices,
            "supervisor_alive": self.supervisor_alive,
        }


def _runs_root(create: bool) -> Path:
    root = paths.runs_dir()
    home = root.parent
    if home.exists() and not home.is_dir():
        raise UsageError(f"{home} is a file, not a folder; set XL_HOME to a writable folder")
    try:
        if create:
            root.mkdir(parents=True, exist_ok=True)
            probe = root / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        elif root.exists():
            os.listdir(root)
    except OSError as exc:
        raise UsageError(
            f"cannot use {root} for runs ({exc.strerror}); set XL_HOME to a writable folder"
        ) from None
    return root


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.")[:32] or "run"


def new_run_id(spec: LaunchSpec) -> str:
    base = spec.name or (Path(spec.script).stem if spec.script else str(spec.module).rsplit(".", 1)[-1])
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(base)}-{secrets.token_hex(2)}"


def _inventory() -> Any:
    from xl.gpu.nvml import inventory

    return inventory(processes=False)


def read_run(run_dir: Path) -> dict[str, Any]:
    """run.json of ``run_dir`` ({} while it cannot be read)."""
    try:
        data = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def supervisor_alive(run: dict[str, Any]) -> bool:
    pid = run.get("supervisor_pid")
    if not pid:
        return False
    return procs.same_process(int(pid), run.get("supervisor_started_at"))


def _fork_supervisor(run_dir: Path) -> ForkedSupervisor:
    """Start the supervisor as a forked copy of this (single-threaded) process.

    Saves a Python start and the imports (~0.1 s of a launch). Only for callers without threads:
    the child of a threaded process may inherit a held lock.
    """
    from xl.gpu import nvml

    nvml.shutdown()  # the child opens its own NVML handle; never share the driver's fds
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return ForkedSupervisor(pid)
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(run_dir / "supervisor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
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
        from xl.launcher.supervisor.loop import main as supervisor_main

        code = supervisor_main([str(run_dir)])
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def start_run(
    spec: LaunchSpec,
    plan: Plan | None = None,
    *,
    fork: bool = False,
    run_id: str | None = None,
    env: Mapping[str, str] | None = None,
) -> RunHandle:
    """Create the run dir, spawn its detached supervisor and return at once.

    ``fork=True`` (the ``xl launch`` command) forks the supervisor instead of starting a new
    interpreter; threaded callers (the TUI) keep the default, and may give the supervisor an
    ``env`` of its own (e.g. a multi-node run's XL_TOKEN) instead of this process's.
    """
    if fork and env is not None:
        raise ValueError("a forked supervisor has this process's environment")
    spec.cwd = spec.cwd or os.getcwd()
    if plan is None:
        plan = build_plan(spec, _inventory(), env)
    root = _runs_root(create=True)
    if run_id is not None:  # chosen by `xl launch --slurm` for every node at once
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", run_id):
            raise UsageError(f"run id {run_id!r} may hold only letters, digits, '_', '.' and '-'")
        run_dir = root / run_id
        try:
            run_dir.mkdir()
        except FileExistsError:
            raise UsageError(f"a run {run_id} exists already in {root}") from None
    while run_id is None:  # two launches in the same second with the same name: another suffix
        candidate = new_run_id(spec)
        run_dir = root / candidate
        try:
            run_dir.mkdir()
            run_id = candidate
        except FileExistsError:
            continue
    (run_dir / "logs").mkdir()
    (run_dir / "ranks").mkdir()
    run = {
        "run_id": run_id,
        "name": spec.name or (Path(spec.script).name if spec.script else spec.module),
        "status": "running",
        "spec": spec.to_json(),
        "argv": plan.argv,
        "env": plan.env,
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
    }
    write_json_atomic(run_dir / "run.json", run)
    (run_dir / "events.jsonl").touch()
    (run_dir / "metrics.jsonl").touch()
    if fork:
        forked = _fork_supervisor(run_dir)
        return RunHandle(run_id=run_id, run_dir=run_dir, pid=forked.pid, proc=forked)
    with open(run_dir / "supervisor.log", "ab") as log:
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
    return RunHandle(run_id=run_id, run_dir=run_dir, pid=proc.pid, proc=proc)


def _info(run_dir: Path, run: dict[str, Any]) -> RunInfo:
    spec = run.get("spec") or {}
    target = spec.get("script") or (f"-m {spec['module']}" if spec.get("module") else "?")
    return RunInfo(
        run_id=str(run.get("run_id") or run_dir.name),
        run_dir=run_dir,
        name=run.get("name"),
        status=str(run.get("status") or "unknown"),
        target=str(target),
        started_at=run.get("started_at"),
        ended_at=run.get("ended_at"),
        world_size=int(run.get("world_size") or len(run.get("ranks") or [])),
        devices=list(run.get("devices") or []),
        supervisor_alive=supervisor_alive(run) if run.get("status") == "running" else False,
    )


def list_runs() -> list[RunInfo]:
    """Every run under XL_HOME, oldest first."""
    root = _runs_root(create=False)
    if not root.is_dir():
        return []
    out = []
    for entry in os.scandir(root):
        if entry.is_dir() and not entry.name.startswith("."):
            run = read_run(Path(entry.path))
            if run:
                out.append(_info(Path(entry.path), run))
    out.sort(key=lambda r: (r.started_at or 0.0, r.run_id))
    return out


def resolve_run(token: str) -> Path:
    """A run dir from a run id, a unique prefix of one, or ``last``."""
    runs = list_runs()
    if not runs:
        raise UsageError(f"no runs under {paths.runs_dir()} yet (start one with 'xl launch')")
    if token == "last":
        return runs[-1].run_dir
    exact = [r for r in runs if r.run_id == token]
    if exact:
        return exact[0].run_dir
    matches = [r for r in runs if r.run_id.startswith(token)]
    if len(matches) == 1:
        return matches[0].run_dir
    if not matches:
        raise UsageError(f"no run matches {token!r} (see 'xl runs')")
    names = ", ".join(r.run_id for r in matches[:3])
    raise UsageError(f"{token!r} matches {len(matches)} runs ({names}...); give more of the id")


def _append_event(run_dir: Path, event: dict[str, Any]) -> None:
    event.setdefault("t", time.time())
    event.setdefault("rank", None)
    with open(run_dir / "events.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(event) + "\n")


def _cleanup_orphaned(run_dir: Path, run: dict[str, Any], grace: float, status: str = "stopped") -> None:
    """The supervisor is gone: end what is left of the run and record ``status``.

    "stopped" when someone asked to stop it; "failed" when a viewer finds the supervisor died
    on its own (killed, OOM) with the run unfinished.
    """
    run_id = str(run.get("run_id") or run_dir.name)
    pids = procs.find_run_pids(run_id)
    for pid in pids:
        procs.signal_rank(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = [p for p in pids if procs.alive(p)]
    procs.kill_all(procs.find_run_pids(run_id))
    fresh = read_run(run_dir) or run
    if fresh.get("status") == "running":
        message = f"run {status} (its supervisor was gone; see supervisor.log)"
        fresh.update(status=status, ended_at=time.time())
        if status == "failed" and not fresh.get("failure"):
            fresh["failure"] = {"rank": None, "exit_code": None, "traceback": None, "error": None, "message": message}
        write_json_atomic(run_dir / "run.json", fresh)
        _append_event(run_dir, {"kind": "run_ended", "status": status, "message": message})


def abandon_if_supervisor_gone(run_dir: Path, *, exited: bool = False) -> bool:
    """For viewers: when the run's supervisor is gone but the run never finished, end the run
    as failed; True if that happened. ``exited``: the caller saw its supervisor child exit
    (covers a supervisor that died before writing its PID)."""
    run = read_run(run_dir)
    if run.get("status") != "running":
        return False
    if run.get("supervisor_pid") and supervisor_alive(run):
        return False
    if not run.get("supervisor_pid") and not exited:
        return False  # still starting
    _cleanup_orphaned(run_dir, run, 0.0, status="failed")
    return True


def stop_run(run_dir: Path) -> None:
    """Ask the run's supervisor to stop it (SIGTERM to every rank, SIGKILL after the grace)."""
    run = read_run(run_dir)
    if run.get("status") != "running":
        return
    deadline = time.monotonic() + 5.0
    while not run.get("supervisor_pid") and time.monotonic() < deadline:
        # Just launched: the supervisor writes its PID as its first act.
        time.sleep(0.05)
        run = read_run(run_dir) or run
    if run.get("status") != "running":
        return
    if supervisor_alive(run):
        procs.signal_pid(int(run["supervisor_pid"]), signal.SIGTERM)
        return
    _cleanup_orphaned(run_dir, run, float(run.get("grace_s") or grace_from_env()))


def wait_for_end(run_dir: Path, timeout: float) -> dict[str, Any]:
    """Poll run.json until the run is over or ``timeout`` passes; returns the last run.json.

    A supervisor that died without finishing (SIGKILL, OOM killer) leaves "running" behind:
    then what is left of the run is ended here and the run recorded as stopped.
    """
    deadline = time.monotonic() + timeout
    while True:
        run = read_run(run_dir)
        if run.get("status") in FINAL:
            return run
        if run.get("supervisor_pid") and not supervisor_alive(run):
            run = read_run(run_dir)  # it may have finished between the two reads
            if run.get("status") not in FINAL:
                _cleanup_orphaned(run_dir, run, 0.0)
            return read_run(run_dir)
        if time.monotonic() >= deadline:
            return run
        time.sleep(0.05)
