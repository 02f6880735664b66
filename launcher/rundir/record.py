"""run.json's one owner: the typed run record, its status, and the only code that reads or writes it.

run.json is a contract (docs/contracts.md, "run.json"): other tools read it, so the record keeps every
key it was given, known or not, in the order it was given, and replaces the file atomically on
every change. Everything else asks this module: what the status is, whether it is final, what exit
code it means. ``RunJson`` is its keys, ``DeviceRow`` and ``RankRow`` its rows, each documented in
docs/contracts.md (a test holds them to it); ``RankReport`` is what a rank says of itself in
``ranks/rank-<r>.json``.

One name per concept, in Python: ``host`` is a machine's name (run.json's key ``node`` in a rank's
row and in ``failure``), ``node_rank`` is xl's number of a node (``--node-rank``), ``group_rank`` is
torchrun's ``GROUP_RANK`` (the number torch gave the node as it joined; the key ``node`` in a rank's
own report). The JSON keys are a contract and keep their names.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, TypedDict, TypeVar

from xl.atomic import write_json_atomic
from xl.launcher.rundir.layout import RunLayout, record_rank
from xl.launcher.rundir.outcome import Failure


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _gpu(value: object) -> int | str | None:
    """A rank's GPU as run.json names it: its index, or a name (a MIG UUID)."""
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None


# A row's keys: (attribute, JSON key, decoder), in the order a new row writes them.
_Keys = tuple[tuple[str, str, Callable[[object], object]], ...]


@dataclass(frozen=True)
class _Row:
    """A row of run.json read leniently: each known key decoded to its type (a value of the wrong
    type reads as None), and the object as read kept in ``source``, so that writing the row back
    keeps another tool's keys, the order and every value xl did not change."""

    source: Mapping[str, Any] = field(default_factory=dict, kw_only=True, repr=False, compare=False)
    _KEYS: ClassVar[_Keys] = ()

    @classmethod
    def json_keys(cls) -> tuple[str, ...]:
        """The keys xl knows (docs/contracts.md, "run.json")."""
        return tuple(key for _, key, _ in cls._KEYS)

    @classmethod
    def from_json(cls: type[_R], data: Mapping[str, Any]) -> _R:
        return cls(**{attr: decode(data.get(key)) for attr, key, decode in cls._KEYS}, source=data)

    def to_json(self) -> dict[str, Any]:
        """The row as run.json holds it: as read, with what changed since written over it; a row
        made here (no ``source``) writes every key xl knows."""
        out = dict(self.source)
        for attr, key, decode in self._KEYS:
            value = getattr(self, attr)
            if key in out:
                if decode(out[key]) != value:
                    out[key] = value
            elif value is not None or not self.source:
                out[key] = value
        return out


_R = TypeVar("_R", bound=_Row)


@dataclass(frozen=True)
class DeviceRow(_Row):
    """One GPU in run.json's ``devices``."""

    index: int | None
    uuid: str | None = None
    name: str | None = None

    _KEYS: ClassVar[_Keys] = (("index", "index", _int), ("uuid", "uuid", _text), ("name", "name", _text))


@dataclass(frozen=True)
class RankRow(_Row):
    """One rank in run.json's ``ranks``. ``host`` is the machine it runs on (the JSON key
    ``node``); ``state`` an ``outcome.RankPhase`` value."""

    rank: int | None
    local_rank: int | None = None
    host: str | None = None
    node_rank: int | None = None
    pid: int | None = None
    gpu: int | str | None = None  # its index (a name for a MIG instance); null on CPU
    gpu_uuid: str | None = None
    state: str | None = None
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    attempt: int | None = None
    waited_s: float | None = None  # once the run ended, for ranks xl.watch measured

    _KEYS: ClassVar[_Keys] = (
        ("rank", "rank", _int),
        ("local_rank", "local_rank", _int),
        ("host", "node", _text),
        ("node_rank", "node_rank", _int),
        ("pid", "pid", _int),
        ("gpu", "gpu", _gpu),
        ("gpu_uuid", "gpu_uuid", _text),
        ("state", "state", _text),
        ("exit_code", "exit_code", _int),
        ("started_at", "started_at", _number),
        ("ended_at", "ended_at", _number),
        ("attempt", "attempt", _int),
        ("waited_s", "waited_s", _number),
    )


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
    def from_json(cls, rank: int, data: dict[str, Any]) -> RankReport:
        text = {k: v if isinstance(v, str) else None for k, v in ((k, data.get(k)) for k in ("traceback", "error"))}
        return cls(
            rank=rank,
            local_rank=_int(data.get("local_rank")),
            group_rank=_int(data.get("node")),
            pid=_int(data.get("pid")),
            started_at=_number(data.get("started_at")),
            exit_code=_int(data.get("exit_code")),
            traceback=text["traceback"],
            error=text["error"],
            ended_at=_number(data.get("ended_at")),
            log_bytes_lost=_int(data.get("log_bytes_lost")) or 0,
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
    env: dict[str, str]
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
    data: dict[str, Any] = field(default_factory=dict, repr=False)  # the JSON, less run_id and status
    # The key order of the run.json this record was read from: another tool's keys, and ours,
    # are written back where they were (new keys go last).
    _keys: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)
    # The rows decoded last, with the JSON list they came from: a view that draws them on every
    # frame decodes them once per change of run.json.
    _rows: tuple[object, tuple[RankRow, ...]] = field(default=(None, ()), init=False, repr=False, compare=False)

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
        return _number(self.data.get("started_at"))

    @property
    def ended_at(self) -> float | None:
        return _number(self.data.get("ended_at"))

    @property
    def world_size(self) -> int | None:
        return _int(self.data.get("world_size"))

    @property
    def host(self) -> str | None:
        """The name of the machine this record's node runs on."""
        return _text(self.data.get("host"))

    @property
    def node_rank(self) -> int:
        """xl's number of this record's node (``--node-rank``; 0 on a one-node run)."""
        return _int(self.data.get("node_rank")) or 0

    @property
    def nnodes(self) -> int:
        return _int(self.data.get("nnodes")) or 1

    @property
    def nproc_per_node(self) -> int | None:
        return _int(self.data.get("nproc_per_node"))

    @property
    def spec(self) -> dict[str, Any]:
        """What was asked (``launcher.spec.LaunchSpec`` as JSON); {} when missing."""
        spec = self.data.get("spec")
        return spec if isinstance(spec, dict) else {}

    @property
    def max_restarts(self) -> int:
        """torchrun's --max-restarts the run was started with (the spec's; 0 when not said)."""
        return _int(self.spec.get("max_restarts")) or 0

    @property
    def rdzv(self) -> str | None:
        """The spec's --rdzv HOST:PORT (multi-node runs)."""
        return _text(self.spec.get("rdzv"))

    @property
    def argv(self) -> list[str]:
        """The exact torchrun command ([] when missing)."""
        argv = self.data.get("argv")
        return [str(a) for a in argv] if isinstance(argv, list) else []

    @property
    def env(self) -> dict[str, str]:
        """The variables xl set for the ranks ({} when missing)."""
        env = self.data.get("env")
        return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}

    @property
    def cwd(self) -> str | None:
        return _text(self.data.get("cwd"))

    @property
    def devices(self) -> tuple[DeviceRow, ...]:
        devices = self.data.get("devices")
        return tuple(DeviceRow.from_json(d) for d in devices if isinstance(d, dict)) if isinstance(devices, list) else ()

    @property
    def grace_s(self) -> float | None:
        """The stop grace the run was started with (None: not recorded, use the default)."""
        grace = _number(self.data.get("grace_s"))
        return grace if grace else None

    @property
    def stop_requested_at(self) -> float | None:
        """When a stop was asked (None: none was, or it is not a number)."""
        return _number(self.data.get("stop_requested_at"))

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
    def failure_json(self) -> dict[str, Any] | None:
        """``failure`` exactly as run.json holds it, for outputs that pass it on (``xl runs
        --json``); None when it is not an object."""
        failure = self.data.get("failure")
        return failure if isinstance(failure, dict) else None

    @property
    def versions(self) -> dict[str, Any]:
        """What the run was made with (``xl``, ``torch``, ...); {} when missing."""
        versions = self.data.get("versions")
        return versions if isinstance(versions, dict) else {}

    @property
    def time(self) -> dict[str, Any] | None:
        """Where the run's time went, once it ended (``timing``); None before."""
        spent = self.data.get("time")
        return spent if isinstance(spent, dict) else None

    @property
    def supervisor_pid(self) -> int | None:
        pid = _int(self.data.get("supervisor_pid"))
        return pid if pid is not None and pid > 0 else None

    @property
    def supervisor_started_at(self) -> float | None:
        """The supervisor process's create time, which tells it from a later process with its PID."""
        return _number(self.data.get("supervisor_started_at"))

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
    def from_json(cls, data: Mapping[str, Any], fallback_id: str = "") -> RunRecord:
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
    if isinstance(value, (_Row, Failure)):
        return value.to_json()
    if isinstance(value, list):
        return [v.to_json() if isinstance(v, _Row) else v for v in value]
    return value


def run_file(run_dir: Path) -> Path:
    return RunLayout(run_dir).run


def read_object(path: Path) -> dict[str, Any] | None:
    """A JSON object file of the run dir (run.json, collector.json); None while it is missing,
    damaged or not an object (a reader tries again on its next poll)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_json(run_dir: Path) -> dict[str, Any]:
    """run.json of ``run_dir`` as a plain dict ({} while it cannot be read)."""
    return read_object(run_file(run_dir)) or {}


def load(run_dir: Path) -> RunRecord | None:
    """The record of ``run_dir``; None while run.json is missing or unreadable."""
    data = read_json(run_dir)
    return RunRecord.from_json(data, run_dir.name) if data else None


def save(run_dir: Path, record: RunRecord) -> None:
    """Replace run.json atomically (a reader sees the old file or the new one, never half)."""
    write_json_atomic(run_file(run_dir), record.to_json())
