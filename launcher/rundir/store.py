"""The run store: where runs live, their ids, and finding them (`xl runs`, RUN arguments).

Runs live in ``$XL_HOME/runs/<run-id>/``. The store only reads: a run's directory is written by
its supervisor (and by xl.launcher.control when the supervisor is gone).
"""

from __future__ import annotations

import os
import pwd
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xl import paths
from xl.errors import NotYours, UsageError
from xl.launcher import runprocs
from xl.launcher.rundir import runrecord as record
from xl.launcher.rundir.runrecord import RunRecord, RunStatus
from xl.launcher.spec import LaunchSpec


@dataclass
class RunInfo:
    """One line of `xl runs` (and of its --json array: the keys of ``to_json`` are a contract)."""

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
    # ``starting`` (launched, its supervisor not yet known by pid), ``running`` or ``gone`` (a
    # supervisor that was there is gone) while the run runs; None once it ended.
    supervisor: str | None = None

    # edge: a line of `xl runs --json`
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
            "supervisor": self.supervisor,
        }

    @classmethod
    def of(cls, run_dir: Path, rec: RunRecord) -> RunInfo:
        spec = rec.spec
        target = spec.get("script") or (f"-m {spec['module']}" if spec.get("module") else "?")
        supervisor = supervisor_presence(run_dir, rec)
        return cls(
            run_id=rec.run_id,
            run_dir=run_dir,
            name=rec.name,
            status=rec.status,
            target=str(target),
            started_at=rec.started_at,
            ended_at=rec.ended_at,
            world_size=rec.world_size or len(rec.ranks),
            devices=[d.to_json() for d in rec.devices],
            # A supervisor being started counts as there: nothing of the run needs cleaning up.
            supervisor_alive=supervisor in (STARTING, SUPERVISED),
            supervisor=supervisor,
        )


STARTING, SUPERVISED, GONE = "starting", "running", "gone"
# How long after its launch a run whose supervisor has no pid in run.json and cannot be seen yet
# is still taken to be starting: between the fork (or spawn) and its first chdir, no process names
# the run dir; a supervisor that died before writing its pid is gone once this has passed.
START_UNSEEN_S = 30.0


def supervisor_presence(run_dir: Path, rec: RunRecord) -> str | None:
    """Whether a running run's supervisor is ``starting`` (launched, not yet known by pid: its
    process, found by its cwd, or a launch too recent for it to show), ``running`` or ``gone``;
    None for a run that ended. Only a running run is asked about (a PID check; a /proc scan only
    while one starts)."""
    if rec.status != RunStatus.RUNNING:
        return None
    if rec.supervisor_pid is not None:
        if runprocs.supervisor_alive(rec):
            return SUPERVISED
        return GONE
    started = rec.started_at
    if runprocs.find_supervisor(str(run_dir)) is not None:
        return STARTING
    fresh = record.load(run_dir)
    if fresh is not None and fresh.supervisor_pid is not None:
        return SUPERVISED if runprocs.supervisor_alive(fresh) else GONE
    if started is not None and time.time() - started < START_UNSEEN_S:
        return STARTING
    return GONE


def runs_root(create: bool) -> Path:
    """``$XL_HOME/runs``; with ``create``, made and proven writable. UsageError (one line, with
    the fix) when XL_HOME cannot hold runs."""
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
    """``<date>-<time>-<name>-<4 hex>``: sorts by start, says what ran, and two launches in
    one second rarely collide (start_run retries when they do)."""
    base = spec.name or (
        Path(spec.script).stem if spec.script else str(spec.module).rsplit(".", 1)[-1]
    )
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(base)}-{os.urandom(2).hex()}"


UNREADABLE = "unreadable"
# Another user's run: this user may not read its folder, so it is listed, never read.
NOT_YOURS = "not yours"


def run_owner(path: Path) -> str:
    """Who owns a run's folder: the login name, else the uid; "" when it cannot be read."""
    try:
        uid = path.stat().st_uid
    except OSError:
        return ""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _belongs(path: Path) -> str:
    owner = run_owner(path)
    return f"user {owner}" if owner else "another user"


def _not_readable(run_dir: Path) -> bool:
    return not os.access(run_dir, os.R_OK | os.X_OK) or (
        record.run_file(run_dir).exists() and not os.access(record.run_file(run_dir), os.R_OK)
    )


def _unreadable(run_dir: Path) -> RunInfo:
    """A run whose run.json is damaged or missing: still listed, stoppable, readable by id."""
    try:
        started: float | None = time.mktime(time.strptime(run_dir.name[:15], "%Y%m%d-%H%M%S"))
    except ValueError:
        try:
            started = run_dir.stat().st_mtime
        except OSError:
            started = None
    status = NOT_YOURS if _not_readable(run_dir) else UNREADABLE
    return RunInfo(run_dir.name, run_dir, None, status, "?", started, None, 0, [], False)


def _settled_if_abandoned(run_dir: Path, rec: RunRecord) -> RunRecord:
    """A running run whose supervisor is gone and no process of which is left: its record is
    made true now, from what its ranks left (xl.launcher.rundir.settle)."""
    from xl.launcher.rundir import settle  # noqa: PLC0415 - listing runs only: `xl launch` imports this module for new run ids

    if (
        rec.status != RunStatus.RUNNING
        or rec.supervisor_pid is None
        or runprocs.supervisor_alive(rec)
    ):
        return rec
    if runprocs.find_run_pids(rec.run_id):
        return rec  # its training goes on without it
    return settle.settle(run_dir, stopped=False) or record.load(run_dir) or rec


def list_runs() -> list[RunInfo]:
    """Every run under XL_HOME, oldest first; a folder whose run.json is damaged or missing is
    listed with status "unreadable"."""
    root = runs_root(create=False)
    if not root.is_dir():
        return []
    out = []
    for entry in os.scandir(root):
        if entry.is_dir() and not entry.name.startswith("."):
            run_dir = Path(entry.path)
            rec = record.load(run_dir)
            out.append(
                _unreadable(run_dir)
                if rec is None
                else RunInfo.of(run_dir, _settled_if_abandoned(run_dir, rec))
            )
    out.sort(key=lambda r: (r.started_at or 0.0, r.run_id))
    return out


LAST = "last"  # the RUN argument that means the newest run (docs/contracts.md, "Runs")


def resolve_run(token: str, command: str | None = None) -> Path:
    """A run dir from a run id, a unique prefix of one, or ``last``; NotYours for a run of
    another user (its folder cannot be read: nothing of it can be shown nor stopped).

    ``last`` is the newest run, always, for every command. When that one has ended while an
    older one still runs, one line on stderr says so and names the running one(s), with the
    command (``xl COMMAND RUN``) for it when ``command`` is given: a person typing ``xl stop last``
    meant, more
    likely than not, the run that trains on."""
    found, runs = _resolve(token)
    if found.status == NOT_YOURS:
        raise NotYours(
            f"run {found.run_id} is not yours (permission denied: its folder belongs to "
            f"{_belongs(found.run_dir)})"
        )
    if token == LAST and (note := last_note(found, runs, command)):
        sys.stderr.write(f"xl: {note}\n")
    return found.run_dir


def last_note(newest: RunInfo, runs: list[RunInfo], command: str | None = None) -> str | None:
    """What ``last`` leaves out: "the last run, B, already failed; A is still running; for it: 'xl
    stop A'", or None when the newest runs (or nothing else does)."""
    if newest.status == RunStatus.RUNNING:
        return None
    running = [
        r.run_id for r in runs if r.status == RunStatus.RUNNING and r.run_id != newest.run_id
    ]
    if not running:
        return None
    ended = (
        "is unreadable" if newest.status in (UNREADABLE, NOT_YOURS) else f"already {newest.status}"
    )
    names = ", ".join(running[-3:][::-1]) + (
        f" and {len(running) - 3} more" if len(running) > 3 else ""
    )
    verb = "is" if len(running) == 1 else "are"
    reach = (
        f"; for {'it' if len(running) == 1 else 'the newest'}: 'xl {command} {running[-1]}'"
        if command
        else ""
    )
    return f"the last run, {newest.run_id}, {ended}; {names} {verb} still running{reach}"


def _resolve(token: str) -> tuple[RunInfo, list[RunInfo]]:
    runs = list_runs()
    if not runs:
        raise UsageError(f"no runs under {paths.runs_dir()} yet (start one with 'xl launch')")
    if token == LAST:
        return runs[-1], runs
    exact = [r for r in runs if r.run_id == token]
    if exact:
        return exact[0], runs
    matches = [r for r in runs if r.run_id.startswith(token)]
    if len(matches) == 1:
        return matches[0], runs
    if not matches:
        raise UsageError(f"no run matches {token!r} (see 'xl runs')")
    names = ", ".join(r.run_id for r in matches[:3])
    raise UsageError(f"{token!r} matches {len(matches)} runs ({names}...); give more of the id")
