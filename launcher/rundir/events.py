"""events.jsonl: lifecycle and diagnoses, one JSON object a line (docs/contracts.md,
"events.jsonl").

The one place an event line is made and appended, for the supervisor, its telemetry and the
viewers that end an orphaned run. Every kind is an ``EventKind``; each family of kinds is a
dataclass whose ``to_json`` is the line's object, its keys in the order the page shows. A line
gets ``t`` (now) and ``rank`` (null) when its object has none.

And the one place a line is read back: ``parse_event`` makes a line's object an ``EventLine``
(its kind an ``EventKind``, its fields typed), so every reader past it matches on the kind and
reads typed fields; a kind xl does not write and keys it does not know stay in the line's
``data``, so nothing another tool wrote is lost.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

from xl.launcher.rundir.jsonl import decode_lines
from xl.launcher.rundir.lastbytes import last_lines
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.outcome import Cause, Failure


class EventKind(str, Enum):
    """Every kind of line xl writes in events.jsonl."""

    # the run's lifecycle (the supervisor, or whoever settles a run whose supervisor is gone)
    RUN_STARTED = "run_started"
    RANK_STARTED = "rank_started"
    RANK_EXITED = "rank_exited"
    FAILURE = "failure"
    RESTARTED = "restarted"
    STOP_REQUESTED = "stop_requested"
    EXIT_BARRIER = "exit_barrier"
    RUN_ENDED = "run_ended"
    WRITE_LOST = "write_lost"
    # telemetry's diagnoses and losses, and its collector's listening socket
    STALLED = "stalled"
    HANG = "hang"
    STRAGGLER = "straggler"
    RECOVERED = "recovered"
    SUPERVISOR_PAUSED = "supervisor_paused"
    NAN_LOSS = "nan_loss"
    GPU_MEM_HIGH = "gpu_mem_high"
    DROPPED = "dropped"
    METRICS_LOST = "metrics_lost"
    COLLECTOR_REOPENED = "collector_reopened"  # it listens again after it was closed under it
    COLLECTOR_UNAVAILABLE = "collector_unavailable"  # it cannot, yet
    # several nodes: node 0's view of the others, and a node > 0's of node 0
    NODE_STARTED = "node_started"
    NODE_ENDED = "node_ended"
    NODE_LOST = "node_lost"
    NODE_SUPERVISOR_LOST = "node_supervisor_lost"
    NODE_QUIET = "node_quiet"
    NODE_REFUSED = "node_refused"
    NODE_BACK = "node_back"
    NODES_UNFINISHED = "nodes_unfinished"
    NODES_NEVER_JOINED = "nodes_never_joined"
    WAITING_FOR_NODE_0 = "waiting_for_node_0"
    ENV_DIFF = "env_diff"


def _timed(t: float, kind: EventKind, rank: int | None, message: str) -> dict[str, object]:
    """The head of a line that telemetry times itself."""
    return {"t": t, "kind": kind.value, "rank": rank, "message": message}


class Event:
    """One line of events.jsonl: its ``kind`` and its object (``to_json``)."""

    kind: EventKind | str

    def to_json(self) -> dict[str, object]:
        raise NotImplementedError


@dataclass(frozen=True)
class Notice(Event):
    """A kind with a message only: run_started, stop_requested, exit_barrier,
    waiting_for_node_0, nodes_unfinished, nodes_never_joined; collector_reopened and
    collector_unavailable are timed by the collector (``t`` first, as telemetry's lines)."""

    kind: EventKind
    message: str
    t: float | None = None

    def to_json(self) -> dict[str, object]:
        said: dict[str, object] = {"kind": self.kind.value, "message": self.message}
        return said if self.t is None else {"t": self.t, **said}


@dataclass(frozen=True)
class RankStarted(Event):
    rank: int
    pid: int | None
    message: str
    kind: EventKind = field(default=EventKind.RANK_STARTED, init=False)

    def to_json(self) -> dict[str, object]:
        said = {"kind": self.kind.value, "rank": self.rank, "pid": self.pid}
        return {**said, "message": self.message}


@dataclass(frozen=True)
class RankExited(Event):
    rank: int
    exit_code: int | None
    message: str
    kind: EventKind = field(default=EventKind.RANK_EXITED, init=False)

    def to_json(self) -> dict[str, object]:
        said = {"kind": self.kind.value, "rank": self.rank, "exit_code": self.exit_code}
        return {**said, "message": self.message}


@dataclass(frozen=True)
class FailureEvent(Event):
    """The run's root cause: written once per failure, by the root cause itself, with the same
    ``cause`` as run.json's ``failure``."""

    failure: Failure
    kind: EventKind = field(default=EventKind.FAILURE, init=False)

    def to_json(self) -> dict[str, object]:
        failure = self.failure
        return {
            "kind": self.kind.value,
            "rank": failure.rank,
            "exit_code": failure.exit_code,
            "node": failure.host,
            "node_rank": failure.node_rank,
            "message": failure.message,
            "cause": failure.cause.to_json() if failure.cause is not None else None,
        }


@dataclass(frozen=True)
class Restarted(Event):
    attempt: int
    message: str
    kind: EventKind = field(default=EventKind.RESTARTED, init=False)

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind.value, "attempt": self.attempt, "message": self.message}


@dataclass(frozen=True)
class RunEnded(Event):
    status: str  # RunStatus's value
    message: str
    kind: EventKind = field(default=EventKind.RUN_ENDED, init=False)

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind.value, "status": self.status, "message": self.message}


@dataclass(frozen=True)
class WriteLost(Event):
    files: dict[str, int]  # bytes never written, by file
    message: str
    kind: EventKind = field(default=EventKind.WRITE_LOST, init=False)

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind.value, "rank": None, "files": self.files, "message": self.message}


@dataclass(frozen=True)
class NodeNotice(Event):
    """What one node of several says of another: node_lost, node_supervisor_lost, node_quiet
    (node 0 of another, ``node`` its host), node_lost and node_back (a node > 0 of node 0)."""

    kind: EventKind
    node_rank: int
    message: str
    node: str | None = None  # the other node's host, when known

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": self.kind.value}
        if self.node is not None:
            out["node"] = self.node
        out.update(node_rank=self.node_rank, message=self.message)
        return out


@dataclass(frozen=True)
class NodeRefused(Event):
    """A node that came with the wrong XL_TOKEN: its number and address, no text it sent."""

    node: str
    node_rank: int
    peer: str
    message: str
    kind: EventKind = field(default=EventKind.NODE_REFUSED, init=False)

    def to_json(self) -> dict[str, object]:
        said = {"kind": self.kind.value, "node": self.node, "node_rank": self.node_rank}
        return {**said, "peer": self.peer, "message": self.message}


@dataclass(frozen=True)
class EnvDiff(Event):
    """Node 0's word on one field in which one node's environment differs from the others'
    (docs/multinode.md, "One environment across nodes"): ``node`` is its node rank here."""

    node: int
    host: str
    name: str  # the fingerprint's field (its key "field")
    value: str | int | None
    others: str | int | None
    severity: str  # stop | warn
    fix: str | None
    message: str
    kind: EventKind = field(default=EventKind.ENV_DIFF, init=False)

    def to_json(self) -> dict[str, object]:
        said: dict[str, Any] = {"kind": self.kind.value, "node": self.node, "host": self.host}
        said.update(field=self.name, value=self.value, others=self.others)
        return {**said, "severity": self.severity, "fix": self.fix, "message": self.message}


@dataclass(frozen=True)
class FromNode(Event):
    """Another node's lifecycle event as node 0 records it: with that node's ``node`` and
    ``node_rank``, its message prefixed, and its run_started / run_ended its part's
    (node_started / node_ended)."""

    event: dict[str, Any]  # as the node sent it (its kind checked by the wire's protocol)
    node: str
    node_rank: int

    @property
    def kind(self) -> EventKind | str:  # type: ignore[override]
        kind = str(self.event["kind"])
        renamed = {
            EventKind.RUN_STARTED.value: EventKind.NODE_STARTED,
            EventKind.RUN_ENDED.value: EventKind.NODE_ENDED,
        }
        return renamed.get(kind, kind)

    def to_json(self) -> dict[str, object]:
        out = dict(self.event)
        kind = self.kind
        out["kind"] = kind.value if isinstance(kind, EventKind) else kind
        out.update(node=self.node, node_rank=self.node_rank)
        out["message"] = f"node {self.node_rank}: {self.event.get('message') or out['kind']}"
        return out


@dataclass(frozen=True)
class Diagnosis(Event):
    """Telemetry's word on a rank: stalled, straggler, recovered, nan_loss, gpu_mem_high,
    supervisor_paused (``rank`` null); ``extra`` holds the fields of its kind, in line order."""

    kind: EventKind
    rank: int | None
    message: str
    extra: dict[str, object] = field(default_factory=dict)
    t: float = field(default_factory=time.time)

    @property
    def idle_s(self) -> float | None:
        """stalled: how long the rank had made no progress."""
        return _float(self.extra.get("idle_s"))

    @property
    def of(self) -> EventKind | None:
        """recovered: the diagnosis it ends (stalled or straggler)."""
        return _KIND_OF.get(str(self.extra.get("of")))  # no kind is spelt as another value

    def to_json(self) -> dict[str, object]:
        return {**_timed(self.t, self.kind, self.rank, self.message), **self.extra}


@dataclass(frozen=True)
class Hang(Event):
    """A hang named: its culprits, the stacks document, and the culprits that were busy."""

    t: float
    rank: int | None  # the culprit, when there is one
    ranks: list[int]
    message: str
    stacks: str
    busy: list[int]
    kind: EventKind = field(default=EventKind.HANG, init=False)

    def to_json(self) -> dict[str, object]:
        said = {"t": self.t, "kind": self.kind.value, "rank": self.rank, "ranks": self.ranks}
        return {**said, "message": self.message, "stacks": self.stacks, "busy": self.busy}


@dataclass(frozen=True)
class Dropped(Event):
    t: float
    rank: int
    message: str
    count: int
    reason: str
    kind: EventKind = field(default=EventKind.DROPPED, init=False)

    def to_json(self) -> dict[str, object]:
        said = _timed(self.t, self.kind, self.rank, self.message)
        return {**said, "count": self.count, "reason": self.reason}


@dataclass(frozen=True)
class MetricsLost(Event):
    bytes: int
    message: str
    kind: EventKind = field(default=EventKind.METRICS_LOST, init=False)

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind.value, "rank": None, "bytes": self.bytes, "message": self.message}


Emit = Callable[[Event], None]  # telemetry's events on their way: made a line at the file only


def event_object(event: Event) -> dict[str, object]:
    """``event``'s object as its line holds it: ``t`` (now) and ``rank`` (None) filled in when
    missing."""
    out = event.to_json()
    out.setdefault("t", time.time())
    out.setdefault("rank", None)
    return out


def object_line(obj: dict[str, object]) -> str:
    return json.dumps(obj, default=str) + "\n"


def event_line(event: Event) -> str:
    """``event`` as its line (``event_object``)."""
    return object_line(event_object(event))


def append_line(run_dir: Path, line: str) -> None:
    """Append one made line to ``run_dir``'s events.jsonl (OSError when it cannot be written)."""
    with open(RunLayout(run_dir).events, "a", encoding="utf-8") as fh:
        fh.write(line)


def append_event(run_dir: Path, event: Event) -> None:
    """Append one event to ``run_dir``'s events.jsonl (OSError when it cannot be written)."""
    append_line(run_dir, event_line(event))


# ------------------------------------------------------------------------------------ reading
_KIND_OF: dict[str, EventKind] = {k.value: k for k in EventKind}
_new = tuple.__new__
_BIGGEST = 1 << 1023  # the int nearest a float's largest (exactly one)


def _int(value: object) -> int | None:
    """A JSON integer (never a bool: ``true`` is not rank 1)."""
    return value if type(value) is int else None


def _ints(value: object) -> tuple[int, ...]:
    return tuple(v for v in value if type(v) is int) if isinstance(value, list) else ()


def _float(value: object) -> float | None:
    """A finite JSON number, as a float."""
    if (type(value) is float or type(value) is int) and value - value == 0:  # type: ignore[operator]
        return float(value)  # type: ignore[arg-type]
    return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


class EventLine(NamedTuple):
    """One line of events.jsonl as read (``parse_event``): the fields every line has, typed, and
    the line's whole object in ``data``; the fields of its kind are the typed properties below
    (None, or empty, when the line does not hold them as the contract spells them). A tuple: made
    for a third of a frozen dataclass's cost, which a digest of thousands of stalls pays a line."""

    kind: EventKind | None  # None: a kind xl does not write (``name`` says which)
    name: str  # the kind as the line spells it ("" when it has none)
    t: float | None  # unix seconds; None when the line holds no finite time
    rank: int | None  # the rank meant, None when none is
    message: str  # for people ("" when the line has none)
    data: Mapping[str, Any]  # every key of the line, as JSON read it

    @property
    def said(self) -> str:
        """What a person reads of it: its message, else its kind's name."""
        return self.message or self.name

    # -- the fields of its kind (docs/contracts.md, "events.jsonl")
    @property
    def of(self) -> EventKind | None:
        """recovered: the diagnosis it ends (stalled or straggler)."""
        of = self.data.get("of")
        return _KIND_OF.get(of) if isinstance(of, str) else None

    @property
    def waiting_on(self) -> tuple[int, ...]:
        """stalled: the culprits a rank waits on in a collective (empty: it is one itself)."""
        return _ints(self.data.get("waiting_on"))

    @property
    def phase(self) -> str | None:
        """straggler: where the culprit loses its time (data, compute, comm or other)."""
        phase = self.data.get("phase")
        return phase if phase in ("data", "compute", "comm", "other") else None

    @property
    def ranks(self) -> tuple[int, ...]:
        """hang: its culprits."""
        return _ints(self.data.get("ranks"))

    @property
    def busy(self) -> tuple[int, ...]:
        """hang: the culprits that were working on the CPU."""
        return _ints(self.data.get("busy"))

    @property
    def stacks(self) -> str | None:
        """hang: where every rank's stack is (``stacks/<t>.json``)."""
        stacks = self.data.get("stacks")
        return None if stacks is None else str(stacks)

    @property
    def exit_code(self) -> int | None:
        """rank_exited, failure: the rank's exit code."""
        return _int(self.data.get("exit_code"))

    @property
    def idle_s(self) -> float | None:
        """stalled: how long the rank had made no progress."""
        return _float(self.data.get("idle_s"))

    @property
    def status(self) -> str | None:
        """run_ended: the run's status."""
        return _text(self.data.get("status"))

    @property
    def cause(self) -> Cause | None:
        """failure: why, in words a person can act on."""
        return Cause.from_json(self.data.get("cause"))

    @property
    def node_rank(self) -> int | None:
        return _int(self.data.get("node_rank"))

    @property
    def node(self) -> int | str | None:
        """A node's host (another node's events on node 0), or env_diff's node rank."""
        node = self.data.get("node")
        return node if type(node) is int or isinstance(node, str) else None

    def text(self, key: str) -> str | None:
        """A string field of its kind (env_diff's ``host``, ``field``, ``severity``, ``fix``)."""
        return _text(self.data.get(key))

    def reworded(self, message: str) -> EventLine:
        """The same event said in other words (its ``data`` keeps the line's)."""
        return self._replace(message=message)

    def to_json(self) -> dict[str, object]:
        """The line's object as JSON holds it (its message as reworded)."""
        return {**self.data, "message": self.message} if self.message else dict(self.data)


def parse_event(obj: object) -> EventLine | None:
    """A decoded events.jsonl line as an EventLine; None for what is not a JSON object."""
    if type(obj) is not dict:
        return None
    name = obj.get("kind")
    name = name if isinstance(name, str) else ""
    message = obj.get("message")
    said = message if isinstance(message, str) else "" if message is None else str(message)
    t = obj.get("t")  # _float inlined: a digest parses thousands of events in one go
    if type(t) is not float or t - t != 0.0:  # an int past a float's range: no time
        t = float(t) if type(t) is int and -_BIGGEST <= t <= _BIGGEST else None
    rank = obj.get("rank")
    return _new(
        EventLine,
        (_KIND_OF.get(name), name, t, rank if type(rank) is int else None, said, obj),
    )


def parse_lines(lines: list[bytes]) -> list[EventLine]:
    """events.jsonl's lines (bytes, one object each) as EventLines; what is not one is skipped."""
    return [e for e in map(parse_event, decode_lines(lines)) if e is not None]


def newest_events(run_dir: Path, limit: int = 64 << 10) -> list[EventLine]:
    """The events in the last ``limit`` bytes of ``run_dir``'s events.jsonl, oldest first."""
    return parse_lines(last_lines(RunLayout(run_dir).events, limit))
