"""run.json's one owner: the typed run record, its status, the only code that reads or writes it.

run.json is a contract (docs/contracts.md, "run.json"): other tools read it, so the record keeps
every key it was given, known or not, in the order it was given, and replaces the file atomically on
every change. Everything else asks this module: what the status is, whether it is final, what exit
code it means. ``RunJson`` is its keys, ``DeviceRow`` and ``RankRow`` its rows (``rows.py``), each
documented in docs/contracts.md (a test holds them to it); ``RankReport`` is what a rank says of
itself in ``ranks/rank-<r>.json``.

One name per concept, in Python: ``host`` is a machine's name (run.json's key ``node`` in a rank's
row and in ``failure``), ``node_rank`` is xl's number of a node (``--node-rank``), ``group_rank`` is
torchrun's ``GROUP_RANK`` (the number torch gave the node as it joined; the key ``node`` in a rank's
own report). The JSON keys are a contract and keep their names.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, TypedDict

from xl.atomic import write_json_atomic
from xl.launcher.rundir.layout import RunLayout, record_rank
from xl.launcher.rundir.outcome import Failure
from xl.launcher.rundir.rows import DeviceRow, RankRow, Row, as_int, as_number, as_text


@dataclass(frozen=True)
class RankReport:
    """``ranks/rank-<r>.json``: what a rank's entry reported of itself (``launcher/rank/entry.py``):
    its pid as it starts, its exit code, traceback and error line as it ends. ``group_rank`` is
    torchrun's GROUP_RANK, under the JSON key ``node``."""

    rank: int
    local_rank: int | None = None
    group_rank: int | None = None
    pid: int | None = None
    started_at: float | None = None
    exit_code: int | None = None
    traceback: str | None = None
    error: str | None = None
    ended_at: float | None = None
    log_bytes_lost: int = 0  # of its output, what its relay could never write (a full disk)

    @property
    def ended(self) -> bool:
        """It wrote its end (a rank killed by a signal never does)."""
        return self.exit_code is not None

    @classmethod
    def from_json(cls, rank: int, data: Mapping[str, object]) -> RankReport:
        text = {
            k: v if isinstance(v, str) else None
            for k, v in ((k, data.get(k)) for k in ("traceback", "error"))
        }
        return cls(
            rank=rank,
            local_rank=as_int(data.get("local_rank")),
            group_rank=as_int(data.get("node")),
            pid=as_int(data.get("pid")),
            started_at=as_number(data.get("started_at")),
            exit_code=as_int(data.get("exit_code")),
            traceback=text["traceback"],
            error=text["error"],
            ended_at=as_number(data.get("ended_at")),
            log_bytes_lost=as_int(data.get("log_bytes_lost")) or 0,
        )


def read_rank_reports(run_dir: Path) -> dict[int, RankReport]:
    """Every ``ranks/rank-<r>.json`` of ``run_dir`` by rank (unreadable ones left out)."""
    folder = RunLayout(run_dir).ranks
    out: dict[int, RankReport] = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for name in names:
        rank = record_rank(name)
        if rank is None:
            continue
        data = read_object(folder / name)
        if data is not None:
            out[rank] = RankReport.from_json(rank, data)
    return out


class RunJson(TypedDict, total=False):
    """run.json's keys, each documented in docs/contracts.md ("run.json"). ``failure`` is an
    ``outcome.Failure`` as JSON."""

    run_id: str
    name: str
    status: str  # RunStatus
    spec: dict[str, Any]  # launcher.spec.LaunchSpec as JSON
    argv: list[str]
    rank_env: dict[str, str]  # the variables xl sets for the ranks
    # the nodes' environments compared: {"diffs": [...]} always; node 0 of several adds
    # "fingerprints", "compared" and "missing" (launcher/multinode/envcheck.py)
    env: dict[str, Any]
    cwd: str
    devices: list[dict[str, Any]]  # DeviceRow as JSON
    nnodes: int
    node_rank: int
    nproc_per_node: int
    world_size: int
    host: str
    started_at: float
    ended_at: float | None
    supervisor_pid: int | None
    supervisor_started_at: float | None
    torchrun_pid: int | None
    torchrun_exit_code: int | None
    grace_s: float
    stop_requested_at: float
    attempt: int
    versions: dict[str, str | None]
    ranks: list[dict[str, Any]]  # RankRow as JSON
    failure: dict[str, Any] | None
    time: dict[str, float]
    metrics_bytes_lost: int
    write_lost: dict[str, int]
    cgroup: str | None  # the run's cgroup on this node (xl.cgroup), null when none was made
    cgroup_reason: str  # why none was made
    ended_in_cgroup: int  # processes still in it at the run's end, ended then
    cgroup_memory: dict[str, int | None]  # the kernel's count of its memory at the end


class RunStatus(str, Enum):
    """A run's ``status`` in run.json."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def final(self) -> bool:
        return self is not RunStatus.RUNNING

    @property
    def exit_code(self) -> int:
        """What a command that watched the run to this status exits with (0 only on success)."""
        return exit_code_for(self.value)


FINAL: frozenset[str] = frozenset(s.value for s in RunStatus if s.final)


def is_final(status: object) -> bool:
    """True when ``status`` (a run.json value, possibly garbage) says the run is over."""
    return isinstance(status, str) and status in FINAL


def exit_code_for(status: object) -> int:
    """The exit code of a command that watched a run to ``status``."""
    return 0 if status == RunStatus.SUCCEEDED.value else 1


@dataclass
class RunRecord:
    """run.json, typed: a property for each key xl reads (a value of the wrong type reads as
    None, or the default said), rows for its devices and ranks, its ``failure``. Every key is
    carried as it was, known or not, so another tool's keys survive a rewrite."""

    run_id: str
    status: str = RunStatus.RUNNING.value
    # the JSON, less run_id and status
    data: dict[str, Any] = field(default_factory=dict, repr=False)
    # The key order of the run.json this record was read from: another tool's keys, and ours,
    # are written back where they were (new keys go last).
    _keys: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)
    # The rows decoded last, with the JSON list they came from: a view that draws them on every
    # frame decodes them once per change of run.json.
    _rows: tuple[object, tuple[RankRow, ...]] = field(
        default=(None, ()), init=False, repr=False, compare=False
    )

    # ---------------------------------------------------------------- reading
    @property
    def final(self) -> bool:
        return is_final(self.status)

    @property
    def exit_code(self) -> int:
        return exit_code_for(self.status)

    @property
    def name(self) -> str | None:
        name = self.data.get("name")
        return None if name is None else str(name)

    @property
    def started_at(self) -> float | None:
        return as_number(self.data.get("started_at"))

    @property
    def ended_at(self) -> float | None:
        return as_number(self.data.get("ended_at"))

    @property
    def world_size(self) -> int | None:
        return as_int(self.data.get("world_size"))

    @property
    def host(self) -> str | None:
        """The name of the machine this record's node runs on."""
        return as_text(self.data.get("host"))

    @property
    def node_rank(self) -> int:
        """xl's number of this record's node (``--node-rank``; 0 on a one-node run)."""
        return as_int(self.data.get("node_rank")) or 0

    @property
    def nnodes(self) -> int:
        return as_int(self.data.get("nnodes")) or 1

    @property
    def nproc_per_node(self) -> int | None:
        return as_int(self.data.get("nproc_per_node"))

    # edge: LaunchSpec's JSON as the launching xl wrote it: each caller reads the keys it knows
    @property
    def spec(self) -> dict[str, Any]:
        """What was asked (``launcher.spec.LaunchSpec`` as JSON); {} when missing."""
        spec = self.data.get("spec")
        return spec if isinstance(spec, dict) else {}

    @property
    def max_restarts(self) -> int:
        """torchrun's --max-restarts the run was started with (the spec's; 0 when not said)."""
        return as_int(self.spec.get("max_restarts")) or 0

    @property
    def rdzv(self) -> str | None:
        """The spec's --rdzv HOST:PORT (multi-node runs)."""
        return as_text(self.spec.get("rdzv"))

    @property
    def argv(self) -> list[str]:
        """The exact torchrun command ([] when missing)."""
        argv = self.data.get("argv")
        return [str(a) for a in argv] if isinstance(argv, list) else []

    @property
    def rank_env(self) -> dict[str, str]:
        """The variables xl set for the ranks ({} when missing). A run.json written before they
        moved to ``rank_env`` has them as ``env``, a flat map of strings: read there."""
        env = self.data.get("rank_env")
        if not isinstance(env, dict):
            env = self.data.get("env")
            if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
                return {}
        return {str(k): str(v) for k, v in env.items()}

    @property
    def cwd(self) -> str | None:
        return as_text(self.data.get("cwd"))

    @property
    def devices(self) -> tuple[DeviceRow, ...]:
        devices = self.data.get("devices")
        return (
            tuple(DeviceRow.from_json(d) for d in devices if isinstance(d, dict))
            if isinstance(devices, list)
            else ()
        )

    @property
    def grace_s(self) -> float | None:
        """The stop grace the run was started with (None: not recorded, use the default)."""
        grace = as_number(self.data.get("grace_s"))
        return grace if grace else None

    @property
    def cgroup(self) -> str | None:
        """The run's cgroup on this node (xl.cgroup; None: it has none)."""
        path = self.data.get("cgroup")
        return path if isinstance(path, str) and path else None

    @property
    def stop_requested_at(self) -> float | None:
        """When a stop was asked (None: none was, or it is not a number)."""
        return as_number(self.data.get("stop_requested_at"))

    @property
    def stop_requested(self) -> bool:
        """A stop was asked: run.json has ``stop_requested_at`` (whatever its value)."""
        return self.data.get("stop_requested_at") is not None

    @property
    def ranks(self) -> tuple[RankRow, ...]:
        ranks = self.data.get("ranks")
        if not isinstance(ranks, list):
            return ()
        if self._rows[0] is not ranks:
            self._rows = (ranks, tuple(RankRow.from_json(r) for r in ranks if isinstance(r, dict)))
        return self._rows[1]

    @property
    def failure(self) -> Failure | None:
        """The root cause; None while nothing failed (or what is there is not an object)."""
        failure = self.data.get("failure")
        return Failure.from_json(failure) if isinstance(failure, dict) and failure else None

    @property
    def failure_json(self) -> dict[str, object] | None:
        """``failure`` exactly as run.json holds it, for outputs that pass it on (``xl runs
        --json``); None when it is not an object."""
        failure = self.data.get("failure")
        return failure if isinstance(failure, dict) else None

    @property
    def versions(self) -> Mapping[str, object]:
        """What the run was made with (``xl``, ``torch``, ...); {} when missing."""
        versions = self.data.get("versions")
        return versions if isinstance(versions, dict) else {}

    @property
    def time(self) -> Mapping[str, object] | None:
        """Where the run's time went, once it ended (``launcher/view/timing.py`` reads it); None
        before."""
        spent = self.data.get("time")
        return spent if isinstance(spent, dict) else None

    @property
    def supervisor_pid(self) -> int | None:
        pid = as_int(self.data.get("supervisor_pid"))
        return pid if pid is not None and pid > 0 else None

    @property
    def supervisor_started_at(self) -> float | None:
        """The supervisor process's create time, which tells it from a later process with its
        PID."""
        return as_number(self.data.get("supervisor_started_at"))

    # ---------------------------------------------------------------- changing
    def update(self, **fields: object) -> None:
        """Set keys of run.json; rows and the failure may be given typed (written as JSON)."""
        for key, value in fields.items():
            if key == "run_id":
                self.run_id = str(value)
            elif key == "status":
                self.status = RunStatus(value).value
            else:
                self.data[key] = _as_json(value)

    def end(self, status: RunStatus | str, at: float | None = None) -> None:
        """Mark the run over: its final status and end time."""
        status = RunStatus(status)
        if not status.final:
            raise ValueError(f"{status.value!r} is not a final status")
        self.status = status.value
        self.data["ended_at"] = time.time() if at is None else at

    # ---------------------------------------------------------------- JSON
    # edge: run.json as written, another tool's keys and values as they were read
    def to_json(self) -> dict[str, Any]:
        fresh: dict[str, Any] = {"run_id": self.run_id}
        # A new record's order: run_id, then the keys as given, with status after name.
        for key, value in self.data.items():
            fresh[key] = value
            if key == "name" and "status" not in fresh:
                fresh["status"] = self.status
        fresh.setdefault("status", self.status)
        if not self._keys:
            return fresh
        # A loaded record's order: the file's, keys it did not have after them.
        out: dict[str, Any] = dict.fromkeys(k for k in self._keys if k in fresh)
        out.update(fresh)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, object], fallback_id: str = "") -> RunRecord:
        rest = {k: v for k, v in data.items() if k not in ("run_id", "status")}
        status = data.get("status")
        record = cls(
            run_id=str(data.get("run_id") or fallback_id),
            status=status if isinstance(status, str) and status else "unknown",
            data=rest,
        )
        record._keys = tuple(data)
        return record


def _as_json(value: object) -> object:
    """A value for run.json: typed rows and the failure as their JSON, anything else as given."""
    if isinstance(value, (Row, Failure)):
        return value.to_json()
    if isinstance(value, list):
        return [v.to_json() if isinstance(v, Row) else v for v in value]
    return value


def run_file(run_dir: Path) -> Path:
    return RunLayout(run_dir).run


# edge: a JSON file of the run dir as read; its reader checks each key it knows
def read_object(path: Path) -> dict[str, Any] | None:
    """A JSON object file of the run dir (run.json, collector.json); None while it is missing,
    damaged or not an object (a reader tries again on its next poll)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_json(run_dir: Path) -> dict[str, object]:
    """run.json of ``run_dir`` as a plain dict ({} while it cannot be read)."""
    return read_object(run_file(run_dir)) or {}


def load(run_dir: Path) -> RunRecord | None:
    """The record of ``run_dir``; None while run.json is missing or unreadable."""
    data = read_json(run_dir)
    return RunRecord.from_json(data, run_dir.name) if data else None


def save(run_dir: Path, record: RunRecord) -> None:
    """Replace run.json atomically (a reader sees the old file or the new one, never half)."""
    write_json_atomic(run_file(run_dir), record.to_json())
