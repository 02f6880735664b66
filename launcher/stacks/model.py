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
from typing import NamedTuple, Protocol, TypeVar

from xl.figures import number

# One tensor's shape per tensor of a collective (the Flight Recorder's input/output sizes).
Shapes = tuple[tuple[int, ...], ...]
# What JSON gives: parsed values are read from it, written back to it.
Json = Mapping[str, object]
_T = TypeVar("_T")


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if type(value) is int else None


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _dicts(value: object) -> Iterable[Json]:
    return (v for v in _list(value) if isinstance(v, dict))


# The values of a document are many (4,096 ranks send tens of thousands of frames and collectives)
# and the verdict reads them at once: Frame and Collective are tuples, made by tuple.__new__ in the
# loops below, which costs a third of a frozen dataclass's __init__; the loops bind their names
# locally and test JSON's own types first. The ranks of one job share their frames, stacks and
# tensor shapes, so an equal value already read is used again (_once): a document holds one of each,
# and the garbage collector, which runs by the number of objects kept, stays away (reading 4,096
# ranks' stacks kept ~190 objects a rank and spent half its time in it).
_new = tuple.__new__
_SEEN: dict[object, object] = {}
_SEEN_MAX = 4096  # values kept to be shared; the dict starts again past this


def _once(value: _T) -> _T:
    """``value``, or an equal one read before (``value`` holds str, int and None alone, in tuples:
    equal means the same)."""
    seen = _SEEN.get(value)
    if seen is not None:
        return seen  # type: ignore[return-value]
    if len(_SEEN) >= _SEEN_MAX:
        _SEEN.clear()
    _SEEN[value] = value
    return value


def _shapes(value: object) -> Shapes | None:
    if not isinstance(value, list):
        return None
    out = []
    for s in value:
        if not isinstance(s, list):
            return None
        for n in s:
            if type(n) is not int:
                return None
        out.append(tuple(s))
    return _once(tuple(out))


class Frame(NamedTuple):
    file: str
    line: int | None
    function: str

    @classmethod
    def from_json(cls, obj: Json) -> Frame:
        return _frames([dict(obj)])[0]

    def to_json(self) -> dict[str, object]:
        return {"file": self.file, "line": self.line, "function": self.function}


def _frames(value: object) -> tuple[Frame, ...]:
    """A thread's ``frames`` list: its dicts as Frames (``file``/``function`` as text, ``line``
    None unless an int)."""
    if not isinstance(value, list):
        return ()
    out = []
    new, frame, str_, int_, dict_, once = _new, Frame, str, int, dict, _once
    for f in value:
        if not isinstance(f, dict_):
            continue
        file, line, function = f.get("file"), f.get("line"), f.get("function")
        out.append(
            once(
                new(
                    frame,
                    (
                        file if type(file) is str_ else str_(file),
                        line if type(line) is int_ else None,
                        function if type(function) is str_ else str_(function),
                    ),
                )
            )
        )
    return once(tuple(out))


class Thread:
    """A thread's name and its frames, innermost last; frozen. A thread read from JSON makes its
    frames when they are first read: the verdict reads the main thread's of a few ranks, and a
    document of thousands of ranks is mostly frames nobody reads before it is written back."""

    __slots__ = ("_frames", "_json", "name")
    name: str
    _frames: tuple[Frame, ...] | None
    _json: object  # the frames as JSON until they are made

    def __init__(self, name: str, frames: tuple[Frame, ...]) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "_frames", frames)

    @classmethod
    def _read(cls, name: str, frames: object) -> Thread:
        """A thread whose frames (``frames``: JSON) are made when first read."""
        self = _new_object(cls)
        _set_name(self, name)
        _set_json(self, frames)
        return self

    @property
    def frames(self) -> tuple[Frame, ...]:
        try:
            return self._frames  # type: ignore[return-value]
        except AttributeError:  # read from JSON, not yet made
            made = _frames(self._json)  # two threads that make it at once make equal values
            object.__setattr__(self, "_frames", made)
            return made

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Thread is frozen: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Thread is frozen: cannot delete {name}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Thread):
            return NotImplemented
        return self.name == other.name and self.frames == other.frames

    def __hash__(self) -> int:
        return hash((self.name, self.frames))

    def __repr__(self) -> str:
        return f"Thread(name={self.name!r}, frames={self.frames!r})"

    def __reduce__(self) -> tuple[type[Thread], tuple[str, tuple[Frame, ...]]]:
        return (Thread, (self.name, self.frames))  # copied or pickled as made, not slot by slot

    @classmethod
    def from_json(cls, obj: Json) -> Thread:
        return cls(str(obj.get("name")), _frames(obj.get("frames")))

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "frames": [f.to_json() for f in self.frames]}


_new_object = object.__new__
_set_name = Thread.__dict__["name"].__set__  # the slots' own setters
_set_json = Thread.__dict__["_json"].__set__


def _threads(value: object) -> tuple[Thread, ...]:
    out = []
    make, str_ = Thread._read, str
    for t in _list(value):
        if isinstance(t, dict):
            name = t.get("name")
            out.append(make(name if type(name) is str_ else str_(name), t.get("frames")))
    return tuple(out)


class Collective(NamedTuple):
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
        return _collectives([dict(obj)])[0]

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


def _collectives(value: object) -> tuple[Collective, ...]:
    """A rank's ``collectives`` list: its dicts as Collectives (text as text, a ``seq`` that is no
    int and a ``t`` that is no finite number as None, shapes only when every size is an int)."""
    if not isinstance(value, list):
        return ()
    out = []
    new, coll, str_, int_, float_, shapes, once = _new, Collective, str, int, float, _shapes, _once
    for c in value:
        if not isinstance(c, dict):
            continue
        get = c.get
        pg, seq, op, state, pg_id, began = (
            get("pg"), get("seq"), get("op"), get("state"), get("pg_id"), get("t")
        )
        ins, outs = get("in"), get("out")
        made = new(
            coll,
            (
                pg if type(pg) is str_ else str_(pg),
                seq if type(seq) is int_ else None,
                op if type(op) is str_ else str_(op),
                state if type(state) is str_ else str_(state),
                pg_id if pg_id is None or type(pg_id) is str_ else str_(pg_id),
                None if ins is None else shapes(ins),
                None if outs is None else shapes(outs),
                began if type(began) is float_ and began - began == 0 else number(began),
            ),
        )
        # Without its start time, one collective reads the same on every rank: kept once.
        out.append(made if began is not None else once(made))
    return tuple(out)


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
        threads = self.threads
        if not threads:
            return ()
        if threads[0].name == "MainThread":  # where the rank puts it
            return threads[0].frames
        return next((t for t in threads if t.name == "MainThread"), threads[0]).frames

    @classmethod
    def from_json(cls, obj: Json) -> RankStacks:
        get = obj.get
        rank, host, pid, note = get("rank"), get("node"), get("pid"), get("note")
        error, node_rank, cpu = get("error"), get("node_rank"), get("cpu_pct")
        # The keys a rank's answer has are JSON's own types: tested first, inline.
        return cls(
            rank if type(rank) is int else None,
            host if type(host) is str or host is None else _text(host),
            pid if type(pid) is int else None,
            _threads(get("threads")) if "threads" in obj else None,
            _collectives(get("collectives")),
            None if note is None else _text(note),
            None if error is None else _text(error),
            node_rank if type(node_rank) is int else None,
            None if cpu is None else number(cpu),
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
