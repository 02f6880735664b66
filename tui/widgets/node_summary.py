"""A big run in a few lines: a row per node and the ranks that stand out (docs/app.md, 'Past 64
ranks').

Past BIG_RUN ranks a table of every rank is more than a person reads, and more than a refresh
should cost; the Monitor leads instead with what this module works out from one poll's RankViews:

- per node, its ranks' min / median / max step time (the latest line's ``step_s``), the phase its
  stepping ranks spend most of their step in (the sum of their ``data_s`` / ``compute_s`` /
  ``comm_s`` / ``other_s``), and its ranks that are not running;
- the slowest few ranks, named, compared with the median rank;
- every rank that is not running: failed, stalled or stopped, and exited while the run goes on.

Plain functions over RankView fields, no Textual: one pass over the ranks a poll, cheap at 4,096.
A rank or node is called slow only when its step time is SLOW_RATIO times the median rank's or
more: the slowest ranks of an even run are listed, and nothing calls them slow.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from xl.stats import median

if TYPE_CHECKING:
    from xl.launcher.view.runview import RankView

# Past this many ranks the Monitor leads with nodes and outliers; up to it, every rank's row.
BIG_RUN = 64
# A rank or node this many times the median rank's step time, or more, is called slow.
SLOW_RATIO = 1.25
SLOWEST_SHOWN = 3
# Stepping states: a straggler still steps, a rank waiting in a hang's collective is the hang
# banner's (it names whom they wait for), not one rank's fault.
STEPPING = frozenset({"running", "straggler", "waiting"})
# Not running, whether or not the run is over: the ranks a person looks for first.
DOWN = ("failed", "stalled", "stopped", "exited")
PHASES = (("data", "data_s"), ("compute", "compute_s"), ("comm", "comm_s"), ("other", "other_s"))
NAMED_PER_STATE = 4  # ranks named one by one (with node and detail) before ranges take over


@dataclass(frozen=True)
class NodeRow:
    """One node's ranks as one poll found them."""

    node: str
    ranks: tuple[int, ...]
    running: int  # ranks in a STEPPING state
    step: float | None  # its least advanced rank's step
    time_min: float | None
    time_median: float | None
    time_max: float | None
    phase: str | None  # where its stepping ranks' time goes (PHASES), and that phase's share
    phase_share: float | None
    down: Mapping[str, int] = field(default_factory=dict)  # state (DOWN) -> ranks in it
    slow: float | None = None  # its median step time over the run's median, once SLOW_RATIO

    @property
    def key(self) -> tuple[object, ...]:
        """What its row shows: a row is drawn again only when this changes."""
        return (
            self.node,
            len(self.ranks),
            self.running,
            self.step,
            self.time_min,
            self.time_median,
            self.time_max,
            self.phase,
            None if self.phase_share is None else round(self.phase_share, 2),
            tuple(sorted(self.down.items())),
            None if self.slow is None else round(self.slow, 1),
        )


@dataclass(frozen=True)
class Slow:
    """One of the slowest ranks: its step time, its ratio to the median rank's and its phase."""

    rank: int
    node: str | None
    step_s: float
    ratio: float | None
    phase: str | None

    @property
    def flagged(self) -> bool:
        return self.ratio is not None and self.ratio >= SLOW_RATIO


@dataclass(frozen=True)
class Down:
    """A rank that is not running, and what says why (exit code, the event's message)."""

    rank: int
    node: str | None
    state: str
    exit_code: int | None
    diagnosis: str | None


@dataclass(frozen=True)
class Summary:
    nodes: list[NodeRow]
    slowest: list[Slow]
    down: list[Down]
    median_s: float | None  # the median stepping rank's step time

    @property
    def slow_nodes(self) -> list[NodeRow]:
        return sorted((n for n in self.nodes if n.slow), key=lambda n: -(n.slow or 0))


def is_big(ranks: Mapping[int, RankView] | int) -> bool:
    return (ranks if isinstance(ranks, int) else len(ranks)) > BIG_RUN


def phase_of(sums: Mapping[str, float]) -> tuple[str | None, float | None]:
    """The phase with the largest share of ``sums`` (PHASES' second names -> seconds)."""
    total = sum(max(0.0, sums.get(key, 0.0)) for _, key in PHASES)
    if total <= 0:
        return None, None
    name, key = max(PHASES, key=lambda p: sums.get(p[1], 0.0))
    return name, max(0.0, sums.get(key, 0.0)) / total


def is_down(rv: RankView, run_over: bool) -> bool:
    """Not running: failed, stalled or stopped; exited while the run goes on (early). Once the
    run is over its ranks have all exited or been stopped: only a failure stands out then."""
    if run_over:
        return rv.state == "failed"
    if rv.state == "exited" and rv.total_steps and rv.step is not None:
        return rv.step < rv.total_steps  # done with its steps: the others finish theirs
    return rv.state in DOWN


class _Node:
    """A node's figures as the one pass over the ranks gathers them."""

    __slots__ = ("down", "ranks", "running", "step", "sums", "times")

    def __init__(self) -> None:
        self.ranks: list[int] = []
        self.running = 0
        self.step: float | None = None
        self.times: list[float] = []
        self.sums = [0.0, 0.0, 0.0, 0.0]  # PHASES' seconds over its stepping ranks
        self.down: dict[str, int] = {}

    def row(self, node: str, run_median: float | None) -> NodeRow:
        times = sorted(self.times)
        mid = median(times) if times else None
        slow = mid / run_median if mid is not None and run_median else None
        phase, share = phase_of(dict(zip((k for _, k in PHASES), self.sums, strict=True)))
        return NodeRow(
            node=node,
            ranks=tuple(self.ranks),
            running=self.running,
            step=self.step,
            time_min=times[0] if times else None,
            time_median=mid,
            time_max=times[-1] if times else None,
            phase=phase,
            phase_share=share,
            down=self.down,
            slow=slow if slow is not None and slow >= SLOW_RATIO else None,
        )


def summarise(
    ranks: Mapping[int, RankView],
    labels: Mapping[int, str | None],
    nodes: Iterable[str],
    *,
    run_over: bool = False,
) -> Summary:
    """Nodes (in ``nodes`` order, RunView.nodes), the slowest ranks and the ranks not running.
    One pass over the ranks: at 4,096 it runs on every poll."""
    by_node: dict[str, _Node] = {node: _Node() for node in nodes}
    times: list[float] = []
    timed: list[tuple[float, int]] = []  # (-step time, rank) of the stepping ranks
    down: list[Down] = []
    for rank in sorted(ranks):
        rv = ranks[rank]
        label = labels.get(rank)
        acc = by_node.get(label or "?")
        if acc is None:
            acc = by_node[label or "?"] = _Node()
        acc.ranks.append(rank)
        if rv.step is not None and (acc.step is None or rv.step < acc.step):
            acc.step = rv.step
        if rv.state in STEPPING:
            acc.running += 1
            if rv.step_s is not None:
                acc.times.append(rv.step_s)
                times.append(rv.step_s)
                timed.append((-rv.step_s, rank))
            parts = (rv.data_s, rv.compute_s, rv.comm_s, rv.other_s)
            if None not in parts:
                sums = acc.sums
                for k in range(4):
                    sums[k] += parts[k]  # type: ignore[operator]
        elif is_down(rv, run_over):
            acc.down[rv.state] = acc.down.get(rv.state, 0) + 1
            down.append(Down(rank, label, rv.state, rv.exit_code, rv.diagnosis))
    run_median = median(times) if times else None
    rows = [acc.row(node, run_median) for node, acc in by_node.items() if acc.ranks]
    slowest = []
    for minus, rank in heapq.nsmallest(SLOWEST_SHOWN, timed):
        rv = ranks[rank]
        parts = (rv.data_s, rv.compute_s, rv.comm_s, rv.other_s)
        phase = rv.straggler_phase or (
            None
            if None in parts
            else phase_of(dict(zip((k for _, k in PHASES), parts, strict=True)))[0]  # type: ignore[arg-type]
        )
        ratio = -minus / run_median if run_median else None
        slowest.append(Slow(rank, labels.get(rank), -minus, ratio, phase))
    return Summary(rows, slowest, down, run_median)
