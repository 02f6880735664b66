"""What a node frame may carry: node 0 checks every message of another node before it records it.

A node frame is a wire frame whose header names the node instead of a rank
(``{"v", "node", "host", "pid", "seq"}``; the connection proved the token in its handshake,
``xl.handshake``); each body line is one JSON object with a
``type``:

    ranks    {"ranks": [...]}                 its ranks as in its run.json
    log      {"rank", "data"}                 a rank's output (text; undecodable bytes escaped)
    event    {"event": {...}}                 a lifecycle event (rank_started, rank_exited, ...)
    failure  {"failure": {...}, "at": t}      its root cause, and when it happened
    end      {"status", "failure", "at"}      its run ended
    rec      {"rank", "line"}                 a metrics.jsonl line it sampled
    train    {"rows": [{...}, ...]}           its ranks' train lines of the last second, one row a
                                              rank standing for its ``steps`` (multinode.summary)
    stacks   {"id", "ranks": [...]}           its ranks' entries of the stacks document, answering
                                              node 0's ``{"stacks": {"id", "rank", "timeout"}}``
    fingerprint {"fingerprint": {...}}        what must match across the nodes
                                              (xl.doctor.fingerprint): a link's first message
    logs     {"id", "rank", "offset", "data", "size"}
                                              a piece of a rank's output file (up to MAX_LOGS_DATA
                                              from ``offset``; ``size`` the file's), answering
                                              node 0's ``{"logs": {"id", "rank", "offset"}}``

Node 0 answers with reply frames (``{"ack": seq}``, ``{"stop": {...}}``, ``{"stacks": {...}}``,
``{"logs": {...}}``). The
sending side (xl.launcher.multinode.nodelink) sends these values, each made its line as it is
written; the receiving side, the collector (xl.launcher.telemetry.collector), calls
``parse_message`` on every body line: it checks the line and returns one frozen value per type
(``RanksMessage`` ... ``LogsMessage``), all node 0 reads past it. A rank's row is run.json's typed
row, written back with what it came with; what stays JSON (an event, a fingerprint, a stacks
entry, a train row) is written as it came, to events.jsonl, the run dir or the wire. """

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xl import wire
from xl.launcher.rundir.events import EventKind
from xl.launcher.rundir.outcome import Failure
from xl.launcher.rundir.rows import RankRow
from xl.launcher.rundir.runrecord import RunStatus, is_final

# Events of another node that node 0 records too; the rest (its diagnoses) node 0 makes itself
# from the metrics it receives.
FORWARDED_EVENTS = frozenset({
    EventKind.RUN_STARTED, EventKind.RANK_STARTED, EventKind.RANK_EXITED, EventKind.STOP_REQUESTED,
    EventKind.RUN_ENDED, EventKind.EXIT_BARRIER,
})
MESSAGE_TYPES = frozenset(
    {"ranks", "log", "event", "failure", "end", "rec", "stacks", "train", "logs", "fingerprint"}
)
MAX_RANKS = 1 << 16
MAX_LOG_CHUNK = 16 << 10
# A piece of a rank's output that node 0 asked for (``xl logs`` there): its bytes as text, escaped
# where they are not UTF-8, so one JSON line stays well within a frame.
MAX_LOGS_DATA = 64 << 10
MAX_TRAIN_ROWS = 256  # rows of one train message (summary.ROWS_PER_MESSAGE)
MAX_TEXT = 64 << 10  # a traceback
MAX_FIELD_TEXT = 4096  # any other text of an event, rank or failure
CLIPPED = "[...]"
_MAX_FIELDS = 32
_RANK_LIMIT = 1 << 20
# A stacks answer is one body line, so it must fit in one frame (wire.MAX_FRAME) with room to
# spare: clip_stacks keeps each rank's entry within these, the innermost frames first.
MAX_STACKS_ID = 64
MAX_THREADS = 16
MAX_FRAMES = 64
MAX_COLLECTIVES = 64
MAX_STACKS_TEXT = 512
MAX_STACKS_LINE = wire.MAX_FRAME // 2
# A collective's tensor shapes (xl.launcher.rank.stacks: "in"/"out", which the collective-mismatch
# verdict compares): the only values of a collective that are not scalars.
SHAPE_KEYS = ("in", "out")
_MAX_SHAPES = 32  # tensors (the rank keeps up to its MAX_SIZES)
_MAX_DIMS = 64  # dimensions of one tensor


def _check_value(value: Any, max_text: int) -> None:
    kind = type(value)
    if kind is float:
        if not math.isfinite(value):
            raise wire.FrameError("bad_value")
    elif kind is str:
        if len(value) > max_text:
            raise wire.FrameError("bad_value")
    elif not (value is None or kind is int or kind is bool):
        raise wire.FrameError("bad_value")


def _check_fields(
    obj: Any, *, max_text: int = MAX_FIELD_TEXT, text_keys: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """A flat dict of scalars (strings capped), as events, ranks and failures are."""
    if type(obj) is not dict or len(obj) > _MAX_FIELDS:
        raise wire.FrameError("bad_node_message")
    for key, value in obj.items():
        if type(key) is not str or len(key) > wire.MAX_KEY_LEN:
            raise wire.FrameError("bad_key")
        _check_value(value, MAX_TEXT if key in text_keys else max_text)
    return obj


def _rank(value: Any) -> int:
    if type(value) is not int or not 0 <= value < _RANK_LIMIT:
        raise wire.FrameError("bad_rank")
    return int(value)


def _time(value: Any) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise wire.FrameError("bad_time")
    return float(value)


# Each message a node sends is one of these values; its ``to_json`` (its body line) is called
# only by NodeLink.send, as the line is written to the link.
@dataclass(frozen=True, slots=True)
class RanksMessage:
    ranks: tuple[RankRow, ...]  # its ranks' rows as its run.json has them: node 0's has them too

    def to_json(self) -> dict[str, object]:
        return {"type": "ranks", "ranks": [row.to_json() for row in self.ranks]}


@dataclass(frozen=True, slots=True)
class LogMessage:
    rank: int
    data: str  # a piece of its output, bytes that are not UTF-8 escaped (surrogateescape)

    def to_json(self) -> dict[str, object]:
        return {"type": "log", "rank": self.rank, "data": self.data}


@dataclass(frozen=True, slots=True)
class EventMessage:
    kind: EventKind  # one of FORWARDED_EVENTS
    event: Mapping[str, object]  # as it sent it: events.jsonl takes it with the node's name

    def to_json(self) -> dict[str, object]:
        return {"type": "event", "event": self.event}


@dataclass(frozen=True, slots=True)
class FailureMessage:
    failure: Failure  # its root cause
    at: float  # when it happened (unix s)
    own: bool = True  # it names the node that sent it (or no node): not node 0's own, coming back

    def to_json(self) -> dict[str, object]:
        return {"type": "failure", "failure": self.failure.to_json(), "at": self.at}


@dataclass(frozen=True, slots=True)
class EndMessage:
    status: RunStatus  # a final one
    failure: FailureMessage | None  # its root cause, when it failed
    at: float

    def to_json(self) -> dict[str, object]:
        failure = None if self.failure is None else self.failure.failure.to_json()
        return {"type": "end", "status": self.status.value, "failure": failure, "at": self.at}


@dataclass(frozen=True, slots=True)
class RecMessage:
    rank: int
    line: str  # a metrics.jsonl line, checked as a rank's own where it is stored

    def to_json(self) -> dict[str, object]:
        return {"type": "rec", "rank": self.rank, "line": self.line}


@dataclass(frozen=True, slots=True)
class TrainMessage:
    # train rows as telemetry records them, each checked as a rank's record where it is stored
    rows: Sequence[Mapping[str, object]]

    def to_json(self) -> dict[str, object]:
        return {"type": "train", "rows": list(self.rows)}


@dataclass(frozen=True, slots=True)
class StacksMessage:
    id: str
    # entries of the stacks document, as the asker serves them
    ranks: Sequence[Mapping[str, object]]

    def to_json(self) -> dict[str, object]:
        return {"type": "stacks", "id": self.id, "ranks": list(self.ranks)}


@dataclass(frozen=True, slots=True)
class FingerprintMessage:
    fingerprint: Mapping[str, object]  # as the run dir's fingerprints file keeps it

    def to_json(self) -> dict[str, object]:
        return {"type": "fingerprint", "fingerprint": self.fingerprint}


@dataclass(frozen=True, slots=True)
class LogsMessage:
    id: str
    rank: int
    offset: int
    data: str | None  # None: the file could not be read
    size: int  # the file's

    def to_json(self) -> dict[str, object]:  # on node 0 also what `xl logs` reads off its socket
        return {"type": "logs", "id": self.id, "rank": self.rank, "offset": self.offset,
                "data": self.data, "size": self.size}


@dataclass(frozen=True, slots=True)
class RefusedMessage:
    """Not on the wire: the collector's word that a node tried to join with a wrong token."""

    reason: str
    peer: str  # its address


Outgoing = (RanksMessage | LogMessage | EventMessage | FailureMessage | EndMessage | RecMessage
            | TrainMessage | StacksMessage | FingerprintMessage | LogsMessage)
NodeMessage = Outgoing | RefusedMessage


# edge: one body line of a node frame, as JSON decoded it
def parse_message(obj: object, node: int) -> NodeMessage:
    """One body line of node ``node``'s frame (already JSON-decoded), checked, as its typed
    message; FrameError when bad."""
    if type(obj) is not dict or obj.get("type") not in MESSAGE_TYPES:
        raise wire.FrameError("bad_node_message")
    kind = obj["type"]
    if kind == "log":
        rank = _rank(obj.get("rank"))
        data = obj.get("data")
        if type(data) is not str or len(data) > MAX_LOG_CHUNK:
            raise wire.FrameError("bad_value")
        return LogMessage(rank, data)
    if kind == "rec":
        rank = _rank(obj.get("rank"))
        line = obj.get("line")
        if type(line) is not str or len(line) > wire.MAX_RECORD:
            raise wire.FrameError("record_too_large")
        return RecMessage(rank, line)
    if kind == "train":
        # each row is checked as a rank's record is (wire.parse_record) where it is stored
        rows = _list(obj.get("rows"), MAX_TRAIN_ROWS)
        if not all(type(row) is dict and row.get("kind") == "train" for row in rows):
            raise wire.FrameError("bad_kind")
        return TrainMessage(rows)
    if kind == "event":
        event = _check_fields(obj.get("event"))
        if event.get("kind") not in FORWARDED_EVENTS:
            raise wire.FrameError("bad_kind")
        return EventMessage(EventKind(event["kind"]), event)
    if kind == "ranks":
        ranks = obj.get("ranks")
        if type(ranks) is not list or len(ranks) > MAX_RANKS:
            raise wire.FrameError("bad_node_message")
        for info in ranks:
            _rank(_check_fields(info).get("rank"))
        return RanksMessage(tuple(RankRow.from_json(info) for info in ranks))
    if kind == "stacks":
        return _check_stacks(obj)
    if kind == "logs":
        return _check_logs(obj)
    if kind == "fingerprint":
        _check_fingerprint(obj.get("fingerprint"))
        return FingerprintMessage(obj["fingerprint"])
    if kind == "failure":
        return _failure(obj.get("failure"), _time(obj.get("at")), node)
    status = obj.get("status")  # end
    if type(status) is not str or not is_final(status):  # a list would not even hash
        raise wire.FrameError("bad_value")
    at = _time(obj.get("at"))
    failure = obj.get("failure")
    return EndMessage(RunStatus(status), None if failure is None else _failure(failure, at, node),
                      at)


def _failure(obj: Any, at: float, node: int) -> FailureMessage:
    _check_failure(obj)
    return FailureMessage(Failure.from_json(obj), at, obj.get("node_rank", node) == node)


MAX_EVIDENCE = 16


def _check_failure(obj: Any) -> None:
    """A failure: flat scalars (its traceback up to 64 KiB), and its ``cause`` (null, or
    ``{"kind", "summary", "fix", "evidence": [str...]}``, each text capped)."""
    if type(obj) is not dict:
        raise wire.FrameError("bad_node_message")
    cause = obj.get("cause")
    _check_fields(
        {k: v for k, v in obj.items() if k != "cause"}, text_keys=frozenset({"traceback"})
    )
    if cause is None:
        return
    if type(cause) is not dict or set(cause) - {"kind", "summary", "fix", "evidence"}:
        raise wire.FrameError("bad_value")
    evidence = _list(cause.get("evidence", []), MAX_EVIDENCE)
    _check_fields({k: v for k, v in cause.items() if k != "evidence"})
    for line in evidence:
        if type(line) is not str:
            raise wire.FrameError("bad_value")
        _check_value(line, MAX_FIELD_TEXT)


def _list(value: Any, cap: int) -> list[Any]:
    if type(value) is not list or len(value) > cap:
        raise wire.FrameError("bad_node_message")
    return value


# A fingerprint's variables (the ranks' NCCL_*, TORCH_*, CUDA_*) and facts: more than an event's
# fields, each text capped as an event's are.
_MAX_FINGERPRINT_VARS = 512
_MAX_FINGERPRINT_FIELDS = 64


def _check_fingerprint(obj: Any) -> None:
    """A node's fingerprint: flat scalars (``fields``), text variables (``env``), and texts."""
    if type(obj) is not dict or set(obj) - {
        "host", "fields", "env", "python", "nproc", "nccl_from", "ifname", "ld_library_path"
    }:
        raise wire.FrameError("bad_node_message")
    fields, env = obj.get("fields", {}), obj.get("env", {})
    if type(fields) is not dict or len(fields) > _MAX_FINGERPRINT_FIELDS:
        raise wire.FrameError("bad_node_message")
    if type(env) is not dict or len(env) > _MAX_FINGERPRINT_VARS:
        raise wire.FrameError("bad_node_message")
    for key, value in (*fields.items(), *env.items()):
        if type(key) is not str or len(key) > wire.MAX_KEY_LEN:
            raise wire.FrameError("bad_key")
        _check_value(value, MAX_FIELD_TEXT)
    for key in env.values():
        if type(key) is not str:
            raise wire.FrameError("bad_value")
    rest = {k: v for k, v in obj.items() if k not in ("fields", "env")}
    for key, value in rest.items():
        _check_value(value, MAX_TEXT if key == "ld_library_path" else MAX_FIELD_TEXT)


def _check_logs(obj: dict[str, Any]) -> LogsMessage:
    """A node's answer to a logs request: a piece of one rank's output file."""
    ident, data = obj.get("id"), obj.get("data")
    if type(ident) is not str or not 0 < len(ident) <= MAX_STACKS_ID:
        raise wire.FrameError("bad_value")
    rank = _rank(obj.get("rank"))
    if data is not None and (type(data) is not str or len(data) > MAX_LOGS_DATA):
        raise wire.FrameError("bad_value")
    for key in ("offset", "size"):
        if type(obj.get(key)) is not int or not 0 <= obj[key] < 1 << 62:
            raise wire.FrameError("bad_value")
    return LogsMessage(ident, rank, obj["offset"], data, obj["size"])


def _check_stacks(obj: dict[str, Any]) -> StacksMessage:
    """A node's answer to a stacks request: entries as the stacks document has them, capped."""
    ident = obj.get("id")
    if type(ident) is not str or not 0 < len(ident) <= MAX_STACKS_ID:
        raise wire.FrameError("bad_value")
    entries = _list(obj.get("ranks"), MAX_RANKS)
    for entry in entries:
        if type(entry) is not dict:
            raise wire.FrameError("bad_node_message")
        rest = {k: v for k, v in entry.items() if k not in ("threads", "collectives")}
        _rank(_check_fields(rest, max_text=MAX_FIELD_TEXT).get("rank"))
        for thread in _list(entry.get("threads", []), MAX_THREADS):
            if type(thread) is not dict or set(thread) - {"name", "frames"}:
                raise wire.FrameError("bad_node_message")
            _check_value(thread.get("name"), MAX_STACKS_TEXT)
            for frame in _list(thread.get("frames", []), MAX_FRAMES):
                _check_fields(frame, max_text=MAX_STACKS_TEXT)
        for coll in _list(entry.get("collectives", []), MAX_COLLECTIVES):
            if type(coll) is not dict:
                raise wire.FrameError("bad_node_message")
            _check_fields(
                {k: v for k, v in coll.items() if k not in SHAPE_KEYS}, max_text=MAX_STACKS_TEXT
            )
            for key in SHAPE_KEYS:
                if key in coll and not is_shapes(coll[key]):
                    raise wire.FrameError("bad_value")
    return StacksMessage(ident, entries)


def is_shapes(value: object) -> bool:
    """A collective's tensor shapes (``in``/``out``): a list of up to _MAX_SHAPES tensors, each a
    list of up to _MAX_DIMS non-negative ints."""
    return (
        type(value) is list
        and len(value) <= _MAX_SHAPES
        and all(
            type(shape) is list
            and len(shape) <= _MAX_DIMS
            and all(type(n) is int and 0 <= n < 1 << 63 for n in shape)
            for shape in value
        )
    )


def reply(obj: Mapping[str, object]) -> bytes:
    """Node 0's reply frame, as it goes on the wire."""
    return wire.encode_frame(json.dumps(obj, separators=(",", ":")).encode())
