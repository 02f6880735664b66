"""RunView: the one derived model of a run, which every view only draws.

The reader (reader.py) builds one per poll: run.json as the typed record, each rank's RankView
(its state decided by the one rank-outcome rule, outcome.py), the hang in force and the run's
root-cause failure. Each is decided here or in the reader, once per read; the Monitor and its
widgets, the console view (launcher/cli/console.py) and the exporter draw what it says and decide
none of it again. LIFECYCLE_STYLE is the one table of how a rank's state or the run's status looks,
and OUTCOME_STYLE of how the run's last line does, in every view.

Standard library only (no Rich): the console view loads it before it knows it will draw.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import chain, islice
from typing import Any, overload

from xl.launcher.rundir.events import EventKind, EventLine
from xl.launcher.rundir.outcome import DONE_STATES, Failure
from xl.launcher.rundir.runrecord import RunRecord, RunStatus
from xl.launcher.view.timing import describe as describe_time
from xl.stats import median

# How each rank state and run status is drawn (a Rich style), the same in the app and the console
# view: an ended rank is quiet, only a failure stands out.
LIFECYCLE_STYLE: dict[str, str] = {
    "starting": "dim",
    "running": "green",
    "straggler": "yellow",
    "stalled": "bold yellow",
    "waiting": "yellow",  # in a collective, for the stalled rank a hang's verdict names
    "exited": "dim",
    "stopped": "dim",
    "failed": "bold red",
    "succeeded": "green",
    "orphaned": "magenta",
}

HISTORY = 600  # points kept per series and rank, spread over the whole run
Point = tuple[float, float]  # (t, value)


def lifecycle_style(name: str | None, default: str = "") -> str:
    """The style a rank's state or the run's status is drawn in (``default`` for one the table
    does not know)."""
    return LIFECYCLE_STYLE.get(name or "", default)


# The line a view ends on ("run ... succeeded after 12.3s"), by the run's status: in the app's
# closing text and the console view's last line alike. Anything but success or failure (a stop, a
# view left before the end) in yellow.
OUTCOME_STYLE: dict[str, str] = {"succeeded": "bold green", "failed": "bold red"}


def outcome_style(status: str | None) -> str:
    """The style of the run's outcome line."""
    return OUTCOME_STYLE.get(status or "", "bold yellow")


class History(Sequence[tuple[float, float]]):
    """A rank's (t, value) points over the whole run, at most ``cap`` of them.

    A deque of the last N points shows only the last few seconds of a rank that logs a hundred
    times a second. Here, whenever the kept points reach ``cap``, every other one goes and from
    then on only every 2nd (then 4th, ...) new point is kept: the points stay evenly spread from
    the first to the newest, which is always there (the view shows the latest value).
    """

    __slots__ = ("_cap", "_kept", "_latest", "_left", "_snap", "_stride")

    def __init__(self, cap: int = HISTORY) -> None:
        self._cap = max(2, cap)
        self._kept: list[tuple[float, float]] = []
        self._latest: tuple[float, float] | None = None  # newest point, when not kept
        self._stride = 1
        # Points to come until the next one is kept (a countdown: one attribute read a point,
        # what the reader pays 1,300 times a poll on a 64-rank run).
        self._left = 1
        self._snap: Points | None = None  # the last snapshot: the next one while nothing came

    def append(self, point: tuple[float, float]) -> None:
        left = self._left - 1
        if left:
            self._left = left
            self._latest = point
            return
        self._left = self._stride
        self._latest = None
        kept = self._kept
        kept.append(point)
        if len(kept) >= self._cap:
            # A new list, not ``del kept[1::2]``: the old one stays as the snapshots taken of it
            # saw it (Points shares it instead of copying it).
            kept = self._kept = kept[::2]
            self._stride *= 2
            if kept[-1] is not point:
                # It went with the others: it stays shown until a newer one comes, and the next
                # point kept is one new stride after the last one kept.
                self._latest = point
                self._left = self._stride // 2
            else:
                self._left = self._stride

    def _points(self) -> list[tuple[float, float]]:
        return self._kept if self._latest is None else [*self._kept, self._latest]

    def __len__(self) -> int:
        return len(self._kept) + (self._latest is not None)

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return iter(self._points())

    @overload
    def __getitem__(self, index: int) -> tuple[float, float]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[float, float]]: ...
    def __getitem__(self, index: int | slice) -> tuple[float, float] | list[tuple[float, float]]:
        if index == -1 and self._latest is not None:
            return self._latest
        return self._points()[index]

    def __repr__(self) -> str:
        return f"History({self._points()!r})"

    def snapshot(self) -> Points:
        """The points as they are now, for a view to draw while this goes on taking new ones."""
        kept, snap = self._kept, self._snap
        if (
            snap is None
            or snap._n != len(kept)
            or snap._items is not kept
            or snap._latest is not self._latest
        ):
            snap = self._snap = Points(kept, len(kept), self._latest)
        return snap


class Points(Sequence[Point]):
    """A History as it was when a view was read: it never changes, and costs no copy.

    It shares the History's list: that list is only ever appended to past the ``n`` points seen
    here (a History thins into a new list), so the first ``n`` stay what they were, whichever
    thread goes on reading the run. ``latest`` is the newest point when the list did not keep it.
    """

    __slots__ = ("_items", "_latest", "_n")

    def __init__(
        self, items: Sequence[Point] = (), n: int = -1, latest: Point | None = None
    ) -> None:
        self._items = items
        self._n = len(items) if n < 0 else n
        self._latest = latest

    def __len__(self) -> int:
        return self._n + (self._latest is not None)

    def __iter__(self) -> Iterator[Point]:
        kept = islice(self._items, self._n)
        return kept if self._latest is None else chain(kept, (self._latest,))

    @overload
    def __getitem__(self, index: int) -> Point: ...
    @overload
    def __getitem__(self, index: slice) -> list[Point]: ...
    def __getitem__(self, index: int | slice) -> Point | list[Point]:
        if isinstance(index, slice):
            return list(self)[index]
        size = len(self)
        at = index + size if index < 0 else index
        if not 0 <= at < size:
            raise IndexError("Points index out of range")
        return self._items[at] if at < self._n else self._latest  # type: ignore[return-value]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=False))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Points({list(self)!r})"


@dataclass(frozen=True)
class RankView:
    """One rank as one read of the run found it: a snapshot that nothing changes afterwards, so a
    view may draw it on any thread while the reader goes on reading (reader.py keeps each rank's
    live figures and hands out one of these per rank and poll)."""

    rank: int
    host: str | None = None  # the machine it runs on (run.json's key ``node``)
    node_rank: int | None = None  # xl's node rank: tells apart two nodes on one host
    gpu: int | str | None = None
    pid: int | None = None
    state: str = "running"  # running|straggler|stalled|waiting|exited|failed|stopped
    step: float | None = None
    total_steps: float | None = None
    loss: float | None = None
    # The latest evaluation's, never a training loss (docs/frameworks.md).
    eval_loss: float | None = None
    eval_epoch: float | None = None  # the epoch that evaluation was taken at, where told
    epoch: float | None = None
    lr: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    steps_per_s: float | None = None
    gpu_util: float | None = None
    gpu_mem_used_mib: float | None = None
    gpu_mem_total_mib: float | None = None
    rss_mib: float | None = None
    cpu_pct: float | None = None
    comm_wait_s: float | None = None
    cuda_alloc_mib: float | None = None  # torch's own counters, from ranks that use CUDA
    cuda_reserved_mib: float | None = None
    # Where its steps' time goes (xl.figures; the latest line's per-step means, in seconds):
    # data_s + compute_s + comm_s + other_s == step_s. None until a line gives them.
    step_s: float | None = None
    data_s: float | None = None
    compute_s: float | None = None
    comm_s: float | None = None
    other_s: float | None = None
    mem_peak_mib: float | None = None  # CUDA: its peak allocated memory during its last step
    mem_mib: float | None = None  # its footprint: PSS over the rank and its children (sys lines)
    gpu_proc_mem_mib: float | None = None  # what its processes hold on its GPU (NVML, per process)
    last_seen: float | None = None
    exit_code: int | None = None
    diagnosis: str | None = None  # the message of the stalled/straggler event in force
    straggler_phase: str | None = None  # a straggler's: data, compute, comm or other (its event's)
    eta_s: float | None = None  # seconds to total_steps at its recent step rate (None: unknown)
    loss_history: Sequence[Point] = Points()
    samples_history: Sequence[Point] = Points()
    gpu_util_history: Sequence[Point] = Points()
    step_s_history: Sequence[Point] = Points()
    # Seconds its steps spent in each phase since the reader began (phase_totals: "data_s" ->
    # seconds, summed over the lines it read, each line's per-step mean times its ``steps``),
    # and the steps those lines stand for. A huge file's reader starts at its tail: the run's
    # whole split is the digest's (digest.json ``ranks``).
    phase_totals: Mapping[str, float] = field(default_factory=dict)
    steps_timed: int = 0
    # The samples of the lines that gave both a count and its rate, and the time they took (each
    # line's count over its rate: the steps' own time for the step hooks' lines, the time since
    # the previous count for xl.log's): the run's samples/s is one over the other.
    samples_counted: float = 0.0
    samples_time_s: float = 0.0

    @property
    def run_samples_per_s(self) -> float | None:
        """Samples / time in steps over what was read of the run, where lines gave counts; else
        the last line's rate (a parsed log's rate comes without a count)."""
        if self.samples_time_s > 0:
            return self.samples_counted / self.samples_time_s
        return self.samples_per_s

    @property
    def row_samples_per_s(self) -> float | None:
        """What the rank's row shows: its latest rate while it lives, the run's figure once it
        ended (as the end table and `xl runs RUN` show it)."""
        return self.run_samples_per_s if self.state in DONE_STATES else self.samples_per_s

    @property
    def split(self) -> dict[str, float] | None:
        """Its last step's split, {"data_s": .., "compute_s": .., "comm_s": .., "other_s": ..}
        (per-step seconds), when its latest line gave all four."""
        parts = {
            "data_s": self.data_s,
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "other_s": self.other_s,
        }
        if any(v is None for v in parts.values()):
            return None
        return {k: float(v) for k, v in parts.items() if v is not None}

    @property
    def progress(self) -> float | None:
        if self.step is None or not self.total_steps:
            return None
        return max(0.0, min(1.0, self.step / self.total_steps))


@dataclass(frozen=True)
class Hang:
    """A hang's verdict while it is in force: who the other ranks wait for (``culprits``, as the
    verdict named them; ``stuck``, those of them that have not moved since), and its stacks."""

    message: str
    culprits: tuple[int, ...]
    stacks: str | None = None
    stuck: frozenset[int] = frozenset()
    label: str = "hang"  # "stalled" when every culprit was working (hang_label)


def hang_label(event: EventLine) -> str:
    """How a ``hang`` event is shown: "hang", or "stalled" when every culprit it names was using
    the CPU (its ``busy``): a long computation outside the collectives stalls the others just as a
    hang does, and its message says which it may be."""
    culprits = set(event.ranks)
    return "stalled" if culprits and culprits <= set(event.busy) else "hang"


# The kinds the hang rule matches, as module names: every event of a run goes through it, and
# an enum member read off its class costs a call of the enum's own attribute lookup.
_HANG, _RECOVERED, _STALLED = EventKind.HANG, EventKind.RECOVERED, EventKind.STALLED


class HangRule:
    """The one rule for "is there a hang, and is it over", fed the run's events in order.

    The supervisor writes a ``hang`` event when it diagnoses a stall (launcher/stacks/hang.py),
    naming its culprits. The hang is over once every culprit made progress again (a ``recovered``
    of a stall; a victim moving again ends nothing), or, for a hang that names none, once any
    rank did; and when the run ends (RunView.hang).
    """

    def __init__(self) -> None:
        self.hang: Hang | None = None

    def see(self, event: EventLine) -> None:
        kind, hang = event.kind, self.hang
        if kind is _HANG:
            culprits = event.ranks
            self.hang = Hang(
                event.message, culprits, event.stacks, frozenset(culprits), hang_label(event)
            )
        elif kind is _RECOVERED and hang is not None and event.of is _STALLED:
            stuck = hang.stuck - {event.rank}
            self.hang = replace(hang, stuck=stuck) if stuck else None


def failure_of(record: RunRecord, event: EventLine | None) -> Failure | None:
    """The run's root cause: run.json's ``failure``, else (before the supervisor wrote it) the
    newest ``failure`` event (``event``); None while nothing failed."""
    recorded = record.failure
    if recorded is not None:
        return recorded
    if event is None:
        return None
    return Failure(
        rank=event.rank,
        exit_code=None,
        traceback=None,
        error=None,
        message=event.message,
        host=None,
        node_rank=None,
        cause=event.cause,
    )


@dataclass(frozen=True)
class Progress:
    step: int
    total: int
    eta_s: float | None

    @property
    def fraction(self) -> float:
        return min(1.0, self.step / self.total) if self.total else 0.0


@dataclass(frozen=True)
class RunView:
    """One read of a run: what every view draws. ``loaded`` is False until run.json was read
    (``record`` is then an empty one, status "unknown"). Made for its readers alone: nothing in
    it changes once the reader handed it out (its ranks are RankView snapshots, its lists new)."""

    record: RunRecord
    ranks: dict[int, RankView]
    events: list[EventLine]
    new_events: list[EventLine]
    loaded: bool = True
    hang_found: Hang | None = None  # the hang rule's, before the run's end is taken into account
    failure: Failure | None = None  # the root cause (failure_of), once any rank failed

    @property
    def status(self) -> str:
        return self.record.status

    @property
    def final(self) -> bool:
        return self.record.final

    @property
    def failed(self) -> bool:
        return self.record.status == RunStatus.FAILED.value

    @property
    def run_id(self) -> str | None:
        return self.record.run_id or None

    @property
    def hang(self) -> Hang | None:
        """The hang in force: none once the run ended."""
        return None if self.final else self.hang_found

    def elapsed(self, now: float) -> float | None:
        return elapsed(self.record, now)

    @property
    def time_spent(self) -> str | None:
        """Where a finished run's time went, in one line (timing.describe); None while it runs
        or when its record has no accounting."""
        return describe_time(self.record.time) if self.final else None

    @property
    def world_size(self) -> int:
        if self.record.world_size is not None:
            return self.record.world_size
        return max(len(self.ranks), len(self.record.ranks))

    @property
    def devices_text(self) -> str:
        """``GPU 1,0 (NVIDIA A100-SXM4-80GB)``: indices in launch order, each model named once."""
        devices = self.record.devices
        if not devices:
            return "CPU"
        names: list[str] = []
        for d in devices:
            name = d.name or "?"
            if name not in names:
                names.append(name)
        return f"GPU {','.join(str(d.index) for d in devices)} ({', '.join(names)})"

    @property
    def all_nodes_joined(self) -> bool:
        """Every node of a multi-node run has a rank with a pid in node 0's run.json."""
        nnodes = self.record.nnodes
        joined = {
            r.node_rank if r.node_rank is not None else r.host for r in self.record.ranks if r.pid
        }
        return len(joined) >= nnodes

    @cached_property
    def node_labels(self) -> dict[int, str | None]:
        return node_labels(self.ranks)

    @cached_property
    def nodes(self) -> list[str]:
        """The run's nodes (their labels), in the order of their lowest rank."""
        return node_order(self.node_labels)

    def progress(self) -> Progress | None:
        """The run's progress is its slowest rank's; so is its ETA (None when unknown, or once
        the run ended)."""
        ranks = self.ranks.values()
        totals = [rv.total_steps for rv in ranks if rv.total_steps]
        steps = [rv.step for rv in ranks if rv.step is not None]
        if not totals or not steps:
            return None
        total, step = int(median(totals)), int(min(steps))
        if self.final:
            return Progress(step, total, None)
        etas = [e for rv in ranks if (e := rv.eta_s) is not None]
        return Progress(step, total, max(etas) if etas else None)


def elapsed(record: RunRecord, now: float) -> float | None:
    """Seconds from the start to the end (to ``now`` while it runs); None before it started."""
    if record.started_at is None:
        return None
    return (record.ended_at if record.ended_at is not None else now) - record.started_at


def node_labels(ranks: Mapping[int, RankView]) -> dict[int, str | None]:
    """Each rank's node as the views show it: its host, or "host #k" (k the node rank) when two
    of the run's nodes share a host, e.g. two xl nodes started on one machine. Nodes are told
    apart by xl's node rank where run.json has it, else by host."""
    keys: dict[int, Any] = {}
    hosts: dict[str, set[Any]] = {}
    for rank, rv in ranks.items():
        host = rv.host or None
        keys[rank] = rv.node_rank if isinstance(rv.node_rank, int) else host
        if host is not None:
            hosts.setdefault(host, set()).add(keys[rank])
    labels: dict[int, str | None] = {}
    for rank, rv in ranks.items():
        host = rv.host or None
        if host is None:
            labels[rank] = None if keys[rank] is None else f"node {keys[rank]}"
        elif len(hosts[host]) > 1:
            labels[rank] = f"{host} #{keys[rank]}"
        else:
            labels[rank] = host
    return labels


def node_order(labels: Mapping[int, str | None]) -> list[str]:
    """The run's nodes (node_labels), in the order of their lowest rank (as torch numbers ranks)."""
    first: dict[str, int] = {}
    for rank, node in labels.items():
        if node is not None and (node not in first or rank < first[node]):
            first[node] = rank
    return sorted(first, key=first.__getitem__)
