"""A rank's Flight Recorder entries as values: Collective, and Collectives, a rank's entries kept
as columns (docs/contracts.md, "xl stacks --json": a collective's keys).

Read from JSON by ``read_collectives`` (xl.launcher.stacks.model reads the rest of a rank's entry);
``once`` is the one place where a document's equal values (columns, shapes, frames) are shared.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple, TypeVar, overload

from xl.figures import number

# One tensor's shape per tensor of a collective (the Flight Recorder's input/output sizes).
Shapes = tuple[tuple[int, ...], ...]
_T = TypeVar("_T")

# A document's values are many and the verdict reads them at once. The ranks of one job share
# their frames, stacks, tensor shapes and most of their collectives' fields, so an equal value
# already read is used again (once): a document holds one of each, and the garbage collector, which
# runs by the number of objects kept, stays away (reading 4,096 ranks' stacks kept ~190 objects a
# rank and spent half its time in it). A Collective is a tuple made by tuple.__new__, a third of a
# frozen dataclass's __init__; the loop below binds its names locally and tests JSON's types first.
_new = tuple.__new__
_new_object = object.__new__
_SEEN: dict[object, object] = {}
_SEEN_MAX = 4096  # values kept to be shared; the dict starts again past this


def once(value: _T) -> _T:
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
    return once(tuple(out))


class Frozen:
    """A value whose slots its maker sets once (through the slots' own setters): none is set or
    deleted after."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot delete {name}")


class Collective(NamedTuple):
    """One Flight Recorder entry as the rank sends it (xl.launcher.rank.stacks)."""

    pg: str  # the process group's name
    seq: int | None
    op: str
    stage: str  # JSON "state": "scheduled", "started", "completed" (the Flight Recorder's word)
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
        return self.stage == "completed"

    @classmethod
    def from_json(cls, obj: Mapping[str, object]) -> Collective:
        return read_collectives([dict(obj)])[0]

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"pg": self.pg, "seq": self.seq, "op": self.op}
        out["state"] = self.stage
        if self.pg_id is not None:
            out["pg_id"] = self.pg_id
        if self.ins is not None:
            out["in"] = [list(s) for s in self.ins]
        if self.outs is not None:
            out["out"] = [list(s) for s in self.outs]
        if self.t is not None:
            out["t"] = self.t
        return out


class Columns(NamedTuple):
    """A rank's Flight Recorder entries but their start times, one tuple per field (``seq[i]``
    is the i-th entry's): what the ranks at one place of a job share."""

    pg: tuple[str, ...]
    seq: tuple[int | None, ...]
    op: tuple[str, ...]
    stage: tuple[str, ...]
    pg_id: tuple[str | None, ...]
    ins: tuple[Shapes | None, ...]
    outs: tuple[Shapes | None, ...]


class Collectives(Frozen, Sequence[Collective]):
    """A rank's Flight Recorder entries, oldest first: a sequence of Collective kept as columns,
    those the ranks share (``columns``, kept once for a document) and the start times (``t``).
    Frozen; a Collective is made when an entry is read (``[i]``, iteration).

    A document of 4,096 ranks holds 32,768 entries that differ by their start time alone. As a
    tuple each, they are objects the garbage collector tracks (a tuple subclass is never
    untracked), and their number starts one more full pass over all that ``json.loads`` made
    (~150 ms of a ~420 ms read at load 5). As columns a rank keeps two objects, this one and
    its start times, a tuple of floats the collector stops tracking; the verdict reads the
    shared columns once for all the ranks that have them."""

    __slots__ = ("columns", "t")
    columns: Columns
    t: tuple[float | None, ...]

    def __init__(self, entries: Iterable[Collective] = ()) -> None:
        made = tuple(entries)
        columns = tuple(zip(*made, strict=True)) if made else ((),) * len(Collective._fields)
        _set_columns(self, Columns._make(columns[:-1]))
        _set_t(self, columns[-1])

    def __len__(self) -> int:
        return len(self.t)

    @overload
    def __getitem__(self, i: int) -> Collective: ...
    @overload
    def __getitem__(self, i: slice) -> Collectives: ...
    def __getitem__(self, i: int | slice) -> Collective | Collectives:
        if isinstance(i, slice):
            return Collectives(self[j] for j in range(*i.indices(len(self))))
        pg, seq, op, stage, pg_id, ins, outs = self.columns
        row = (pg[i], seq[i], op[i], stage[i], pg_id[i], ins[i], outs[i], self.t[i])
        return _new(Collective, row)

    def __iter__(self) -> Iterator[Collective]:
        new, coll = _new, Collective
        for row in zip(*self.columns, self.t, strict=True):
            yield new(coll, row)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Collectives):
            return self.columns == other.columns and self.t == other.t
        if isinstance(other, tuple):
            return tuple(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))  # as the tuple of its entries, which it equals

    def __repr__(self) -> str:
        return f"Collectives({tuple(self)!r})"

    def __reduce__(self) -> tuple[type[Collectives], tuple[tuple[Collective, ...]]]:
        return (Collectives, (tuple(self),))  # copied or pickled as its entries


_set_columns = Collectives.__dict__["columns"].__set__
_set_t = Collectives.__dict__["t"].__set__


def _made(columns: Columns, t: tuple[float | None, ...]) -> Collectives:
    self = _new_object(Collectives)
    _set_columns(self, columns)
    _set_t(self, t)
    return self


NO_COLLECTIVES = _made(Columns((), (), (), (), (), (), ()), ())


def read_collectives(value: object) -> Collectives:
    """A rank's ``collectives`` list: its dicts as Collectives (text as text, a ``seq`` that is no
    int and a ``t`` that is no finite number as None, shapes only when every size is an int)."""
    if not isinstance(value, list) or not value:
        return NO_COLLECTIVES
    pgs: list[str] = []
    seqs: list[int | None] = []
    ops: list[str] = []
    stages: list[str] = []
    pg_ids: list[str | None] = []
    ins_: list[Shapes | None] = []
    outs_: list[Shapes | None] = []
    ts: list[float | None] = []
    str_, int_, float_, shapes = str, int, float, _shapes
    timed = False
    for c in value:
        if not isinstance(c, dict):
            continue
        get = c.get
        pg, seq, op, stage, pg_id, began = (
            get("pg"), get("seq"), get("op"), get("state"), get("pg_id"), get("t")
        )
        ins, outs = get("in"), get("out")
        pgs.append(pg if type(pg) is str_ else str_(pg))
        seqs.append(seq if type(seq) is int_ else None)
        ops.append(op if type(op) is str_ else str_(op))
        stages.append(stage if type(stage) is str_ else str_(stage))
        pg_ids.append(pg_id if pg_id is None or type(pg_id) is str_ else str_(pg_id))
        ins_.append(None if ins is None else shapes(ins))
        outs_.append(None if outs is None else shapes(outs))
        if began is not None:
            timed = True
            began = began if type(began) is float_ and began - began == 0 else number(began)
        ts.append(began)
    # The ranks at one place of a job share every column but the start times: kept once.
    columns = _new(
        Columns,
        (tuple(pgs), tuple(seqs), tuple(ops), tuple(stages), tuple(pg_ids), tuple(ins_),
         tuple(outs_)),
    )  # fmt: skip
    return _made(once(columns), tuple(ts) if timed else once(tuple(ts)))
