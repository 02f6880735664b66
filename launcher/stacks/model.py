"""The stacks document's values, read once from JSON and written back as the same JSON.

A rank's answer (its socket), another node's entries (node 0's socket, the node link) and a
saved ``stacks/<t>.json`` are parsed here into frozen values; the verdict, the hang capture and
``xl stacks`` work on their fields, and ``to_json()`` writes each one with the keys in the order
the document has always had them (docs/contracts.md, "xl stacks --json"). A value of the wrong
type reads as absent, as run.json's rows do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from xl.figures import number

# One tensor's shape per tensor of a collective (the Flight Recorder's input/output sizes).
Shapes = tuple[tuple[int, ...], ...]
# What JSON gives: parsed values are read from it, written back to it.
Json = Mapping[str, object]


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if type(value) is int else None


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _dicts(value: object) -> Iterable[Json]:
    return (v for v in _list(value) if isinstance(v, dict))


def _shapes(value: object) -> Shapes | None:
    if not isinstance(value, list) or not all(
        isinstance(s, list) and all(type(n) is int for n in s) for s in value
    ):
        return None
    return tuple(tuple(s) for s in value)


@dataclass(frozen=True, slots=True)
class Frame:
    file: str
    line: int | None
    function: str

    @classmethod
    def from_json(cls, obj: Json) -> Frame:
        return cls(str(obj.get("file")), _int(obj.get("line")), str(obj.get("function")))

    def to_json(self) -> dict[str, object]:
        return {"file": self.file, "line": self.line, "function": self.function}


@dataclass(frozen=True, slots=True)
class Thread:
    name: str
    frames: tuple[Frame, ...]  # innermost last

    @classmethod
    def from_json(cls, obj: Json) -> Thread:
        frames = tuple(Frame.from_json(f) for f in _dicts(obj.get("frames")))
        return cls(str(obj.get("name")), frames)

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "frames": [f.to_json() for f in self.frames]}


@dataclass(frozen=True, slots=True)
class Collective:
    """One Flight Recorder entry as the rank sends it (xl.launcher.rank.stacks)."""

    pg: str  # the process group's name
    seq: int | None
    op: str
    state: str  # "completed", "scheduled", "started", ...
    pg_id: str | None = None  # the group's number, the same on every rank
    ins: Shapes | None = None  # JSON "in": the input tensors' shapes
    outs: Shapes | None = None  # JSON "out"
    t: float | None = None  # when it began

    @property
    def group(self) -> str:
        """Which process group it is of, the same on every rank: its number where known (two
        subgroups may share a name), else its name."""
        return self.pg_id if self.pg_id is not None else self.pg

    @property
    def done(self) -> bool:
        return self.state == "completed"

    @classmethod
    def from_json(cls, obj: Json) -> Collective:
        pg_id = obj.get("pg_id")
        began = number(obj.get("t"))
        return cls(
            str(obj.get("pg")),
            _int(obj.get("seq")),
            str(obj.get("op")),
            str(obj.get("state")),
            None if pg_id is None else str(pg_id),
            _shapes(obj.get("in")),
            _shapes(obj.get("out")),
            began,
        )

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"pg": self.pg, "seq": self.seq, "op": self.op}
        out["state"] = self.state
        if self.pg_id is not None:
            out["pg_id"] = self.pg_id
        if self.ins is not None:
            out["in"] = [list(s) for s in self.ins]
        if self.outs is not None:
            out["out"] = [list(s) for s in self.outs]
        if self.t is not None:
            out["t"] = self.t
        return out


@dataclass(frozen=True, slots=True)
class RankStacks:
    """One rank's entry of the document: its threads and collectives, or the ``error`` that
    says why there are none. ``host`` is the JSON key ``node`` (run.json's word for the host);
    ``node_rank`` is set on the entries another node sent."""

    rank: int | None
    host: str | None = None
    pid: int | None = None
    threads: tuple[Thread, ...] | None = None  # None: no stacks (see ``error``)
    collectives: tuple[Collective, ...] = ()
    note: str | None = None
    error: str | None = None
    node_rank: int | None = None
    cpu_pct: float | None = None  # a stalled run's: its mean CPU since its last progress

    @property
    def main_frames(self) -> tuple[Frame, ...]:
        """The main thread's frames (the first thread's when none is called so)."""
        threads = self.threads or ()
        main = next((t for t in threads if t.name == "MainThread"), threads[0] if threads else None)
        return main.frames if main is not None else ()

    @classmethod
    def from_json(cls, obj: Json) -> RankStacks:
        cpu = number(obj.get("cpu_pct"))
        return cls(
            _int(obj.get("rank")),
            _text(obj.get("node")),
            _int(obj.get("pid")),
            tuple(Thread.from_json(t) for t in _dicts(obj.get("threads")))
            if "threads" in obj
            else None,
            tuple(Collective.from_json(c) for c in _dicts(obj.get("collectives"))),
            _text(obj.get("note")),
            _text(obj.get("error")),
            _int(obj.get("node_rank")),
            cpu,
        )

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"rank": self.rank, "node": self.host, "pid": self.pid}
        if self.threads is not None:
            out["threads"] = [t.to_json() for t in self.threads]
            out["collectives"] = [c.to_json() for c in self.collectives]
        if self.note is not None:
            out["note"] = self.note
        if self.error is not None:
            out["error"] = self.error
        if self.node_rank is not None:
            out["node_rank"] = self.node_rank
        if self.cpu_pct is not None:
            out["cpu_pct"] = self.cpu_pct
        return out


@dataclass(frozen=True, slots=True)
class Verdict:
    """Who the others wait for: ``ranks`` the culprits (none when nobody is named)."""

    ranks: tuple[int, ...]
    message: str
    mismatch: bool = False  # collectives that can never match: certain from one look

    @classmethod
    def from_json(cls, obj: Json) -> Verdict:
        ranks = tuple(r for r in _list(obj.get("ranks")) if type(r) is int)
        return cls(ranks, str(obj.get("message") or ""), obj.get("mismatch") is True)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"ranks": list(self.ranks)}
        if self.mismatch:
            out["mismatch"] = True
        out["message"] = self.message
        return out


@dataclass(frozen=True, slots=True)
class StacksDoc:
    """``xl stacks --json`` and ``stacks/<t>.json``: every rank's entry and the verdict.
    ``file`` is where a capture saved it (relative to the run dir), never written in it."""

    run_id: str
    t: float
    ranks: tuple[RankStacks, ...]
    verdict: Verdict
    file: str | None = None

    @classmethod
    def from_json(cls, obj: Json) -> StacksDoc:
        verdict = obj.get("verdict")
        return cls(
            str(obj.get("run_id")),
            float(number(obj.get("t")) or 0.0),
            tuple(RankStacks.from_json(e) for e in _dicts(obj.get("ranks"))),
            Verdict.from_json(verdict if isinstance(verdict, dict) else {}),
        )

    def to_json(self) -> dict[str, object]:
        return {
            "run_id": self.run_id,
            "t": self.t,
            "ranks": [e.to_json() for e in self.ranks],
            "verdict": self.verdict.to_json(),
        }


@dataclass(frozen=True, slots=True)
class Target:
    """A rank to ask, from run.json's ranks: ``remote`` when it lives on another node."""

    rank: int | None
    host: str | None = None
    pid: int | None = None
    node_rank: int | None = None
    remote: bool = False

    @classmethod
    def from_json(cls, obj: Json) -> Target:
        """A rank as run.json and the supervisor's roster write it (``remote`` where set)."""
        return cls(
            _int(obj.get("rank")),
            _text(obj.get("node")),
            _int(obj.get("pid")),
            _int(obj.get("node_rank")),
            obj.get("remote") is True,
        )

    def failed(self, error: str) -> RankStacks:
        """This rank's entry with no stacks: ``error`` says why."""
        return RankStacks(self.rank, self.host, self.pid, error=error)


class RosterRank(Protocol):
    """A rank of the supervisor's roster as telemetry holds it (``node``: its host)."""

    @property
    def rank(self) -> int | None: ...
    @property
    def node(self) -> str | None: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def node_rank(self) -> int | None: ...
    @property
    def remote(self) -> bool: ...


def targets(ranks: Sequence[Json | RosterRank | Target]) -> list[Target]:
    """The supervisor's roster (run.json-shaped rows, roster ranks, or targets) as targets."""
    out = []
    for r in ranks:
        if isinstance(r, Target):
            out.append(r)
        elif isinstance(r, Mapping):
            out.append(Target.from_json(r))
        else:
            out.append(Target(r.rank, r.node, r.pid, r.node_rank, r.remote))
    return out
