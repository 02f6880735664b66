"""The stacks document's values, read once from JSON and written back as the same JSON.

A rank's answer (its socket), another node's entries (node 0's socket, the node link) and a
saved ``stacks/<t>.json`` are parsed here into frozen values; the verdict, the hang capture and
``xl stacks`` work on their fields, and ``to_json()`` writes each one with the keys in the order
the document has always had them (docs/contracts.md, "xl stacks --json"). A value of the wrong
type reads as absent, as run.json's rows do.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, overload

from xl.figures import number
from xl.launcher.stacks.collectives import (
    NO_COLLECTIVES,
    Collectives,
    Frozen,
    once,
    read_collectives,
)

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


# The values of a document are many (4,096 ranks send tens of thousands of frames) and the verdict
# reads them at once: a Frame is a tuple made by tuple.__new__ in the loop below, which costs a
# third of a frozen dataclass's __init__; the loop binds its names locally and tests JSON's own
# types first. The ranks of one job share their frames and stacks: an equal one already read is
# used again (once, as the collectives' columns are).
_new = tuple.__new__
_new_object = object.__new__


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
    new, frame, str_, int_, dict_, keep = _new, Frame, str, int, dict, once
    for f in value:
        if not isinstance(f, dict_):
            continue
        file, line, function = f.get("file"), f.get("line"), f.get("function")
        out.append(
            keep(
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


class Thread(Frozen):
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


class Threads(Frozen, Sequence[Thread]):
    """A rank's threads, as it lists them; frozen. Read from JSON, they are made when first read:
    the verdict reads the main thread of a few ranks, and a document of thousands of ranks then
    keeps one object a rank for them, not a tuple and a Thread per thread for the garbage
    collector to count (see Collectives)."""

    __slots__ = ("_json", "_made")
    _made: tuple[Thread, ...]
    _json: object  # the threads as JSON until they are made

    def __init__(self, threads: Iterable[Thread] = ()) -> None:
        _set_made(self, tuple(threads))

    @classmethod
    def _read(cls, value: object) -> Threads:
        """The threads of ``value`` (JSON), made when first read."""
        self = _new_object(cls)
        _set_threads_json(self, value)
        return self

    @property
    def _all(self) -> tuple[Thread, ...]:
        try:
            return self._made
        except AttributeError:  # read from JSON, not yet made
            made = _threads(self._json)  # two threads that make it at once make equal values
            _set_made(self, made)
            return made

    def __len__(self) -> int:
        return len(self._all)

    @overload
    def __getitem__(self, i: int) -> Thread: ...
    @overload
    def __getitem__(self, i: slice) -> Threads: ...
    def __getitem__(self, i: int | slice) -> Thread | Threads:
        if isinstance(i, slice):
            return Threads(self._all[i])
        return self._all[i]

    def __iter__(self) -> Iterator[Thread]:
        return iter(self._all)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Threads):
            return self._all == other._all
        if isinstance(other, tuple):
            return self._all == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._all)  # as the tuple of its threads, which it equals

    def __repr__(self) -> str:
        return f"Threads({self._all!r})"

    def __reduce__(self) -> tuple[type[Threads], tuple[tuple[Thread, ...]]]:
        return (Threads, (self._all,))  # copied or pickled as made, not slot by slot


_read_threads = Threads._read
_set_made = Threads.__dict__["_made"].__set__
_set_threads_json = Threads.__dict__["_json"].__set__


@dataclass(frozen=True, slots=True)
class RankStacks:
    """One rank's entry of the document: its threads and collectives, or the ``error`` that
    says why there are none. ``host`` is the JSON key ``node`` (run.json's word for the host);
    ``node_rank`` is set on the entries another node sent."""

    rank: int | None
    host: str | None = None
    pid: int | None = None
    threads: Sequence[Thread] | None = None  # None: no stacks (see ``error``)
    collectives: Collectives = NO_COLLECTIVES
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
            _read_threads(get("threads")) if "threads" in obj else None,
            read_collectives(get("collectives")),
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
        for key, value in (
            ("note", self.note), ("error", self.error), ("node_rank", self.node_rank),
            ("cpu_pct", self.cpu_pct),
        ):  # fmt: skip
            if value is not None:  # written only when known, in this order
                out[key] = value
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
