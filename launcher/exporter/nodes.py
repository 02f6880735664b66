"""The exporter's per-node series: what a run past ``PER_NODE_PAST`` ranks exports by default
(docs/exporter.md, "Big runs").

A series set per rank costs Prometheus a series per rank and figure (4,096 ranks: ~82,000 series,
8 MiB of exposition a scrape, seconds to write); a node's ranks summed up (the spread of their
step times and phases, their samples, how many are in each state) is what a dashboard and an alert
of a big run look at, in a series set per node. ``xl exporter --per-rank`` keeps every rank's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from xl.figures import PHASES
from xl.launcher.view.runview import RankView
from xl.stats import median_sorted

# A run of more ranks than this exports per-node series unless --per-rank is given: 256 ranks are
# ~5,000 per-rank series (about 0.5 MiB a scrape), 4,096 ranks would be ~82,000.
PER_NODE_PAST = 256
N = ("run_id", "node", "Hostname")  # Hostname: dcgm-exporter's spelling
SPREAD = ("min", "median", "max")
PHASE_STATS = ("median", "max")  # where the node's typical rank and its worst lose time


def spread(values: list[float]) -> dict[str, float]:
    """min, median and max of ``values`` (not empty)."""
    ordered = sorted(values)
    return {"min": ordered[0], "median": median_sorted(ordered), "max": ordered[-1]}


@dataclass
class _Node:
    """What one node's ranks add up to."""

    step_s: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=dict)
    steps: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    last_step_t: list[float] = field(default_factory=list)
    samples_per_s: float | None = None
    samples_total: float | None = None
    states: dict[str, int] = field(default_factory=dict)


class NodeSeries:
    """The per-node families of one scrape: ``add`` each big run's ranks, then ``families``."""

    def __init__(self, states: tuple[str, ...]) -> None:
        self.states = states
        self.nodes: dict[tuple[str, str, str], _Node] = {}

    def add(
        self,
        run_id: str,
        views: Mapping[int, RankView],
        states: Mapping[int, str],
        samples_total: Mapping[int, float],
        last_step_t: Mapping[int, float],
        default_host: str,
    ) -> None:
        """A run's ranks, each counted on its node (``node_rank``; its host where none)."""
        for rank, view in views.items():
            node_rank = view.node_rank if view.node_rank is not None else 0
            key = (run_id, str(node_rank), view.host or default_host)
            node = self.nodes.get(key)
            if node is None:
                node = self.nodes[key] = _Node()
            state = states.get(rank, "running")
            node.states[state] = node.states.get(state, 0) + 1
            if view.step_s is not None:
                node.step_s.append(view.step_s)
            for name, seconds in (view.split or {}).items():
                node.phases.setdefault(name.removesuffix("_s"), []).append(seconds)
            if view.step is not None:
                node.steps.append(view.step)
            if view.loss is not None:
                node.losses.append(view.loss)
            if rank in last_step_t:
                node.last_step_t.append(last_step_t[rank])
            if view.samples_per_s is not None:
                node.samples_per_s = (node.samples_per_s or 0.0) + view.samples_per_s
            if rank in samples_total:
                node.samples_total = (node.samples_total or 0.0) + samples_total[rank]

    def families(self) -> list[Metric]:
        step_s = GaugeMetricFamily(
            "xl_node_step_seconds",
            "Step time of the node's ranks, in seconds: the fastest, median and slowest rank's "
            "(stat).",
            labels=(*N, "stat"),
        )
        phase = GaugeMetricFamily(
            "xl_node_step_phase_seconds",
            "Of the node's ranks' step times, the seconds in each phase: the median and the "
            "largest rank's (stat).",
            labels=(*N, "phase", "stat"),
        )
        step = GaugeMetricFamily(
            "xl_node_train_step",
            "The last logged step of the node's furthest-behind (min) and furthest-ahead (max) "
            "rank.",
            labels=(*N, "stat"),
        )
        loss = GaugeMetricFamily(
            "xl_node_train_loss", "The median of the node's ranks' last losses.", labels=N
        )
        last = GaugeMetricFamily(
            "xl_node_last_step_timestamp_seconds",
            "Unix time of the last logged step of the node's rank that stepped longest ago.",
            labels=N,
        )
        rate = GaugeMetricFamily(
            "xl_node_samples_per_second",
            "The node's ranks' samples per second at their last steps, summed.",
            labels=N,
        )
        samples = CounterMetricFamily(
            "xl_node_samples",
            "Samples the node's ranks' steps took since the run started, summed.",
            labels=N,
        )
        ranks = GaugeMetricFamily(
            "xl_node_ranks",
            "The node's ranks in each state (as xl_rank_state).",
            labels=(*N, "state"),
        )
        for key, node in sorted(self.nodes.items(), key=_order):
            labels = list(key)
            if node.step_s:
                for stat, value in spread(node.step_s).items():
                    step_s.add_metric([*labels, stat], value)
            for short in PHASES:
                values = node.phases.get(short)
                if values:
                    got = spread(values)
                    for stat in PHASE_STATS:
                        phase.add_metric([*labels, short, stat], got[stat])
            if node.steps:
                step.add_metric([*labels, "min"], min(node.steps))
                step.add_metric([*labels, "max"], max(node.steps))
            if node.losses:
                loss.add_metric(labels, spread(node.losses)["median"])
            if node.last_step_t:
                last.add_metric(labels, min(node.last_step_t))
            if node.samples_per_s is not None:
                rate.add_metric(labels, node.samples_per_s)
            if node.samples_total is not None:
                samples.add_metric(labels, node.samples_total)
            for state in self.states:
                ranks.add_metric([*labels, state], node.states.get(state, 0))
        return [step_s, phase, step, loss, last, rate, samples, ranks]


def _order(item: tuple[tuple[str, str, str], _Node]) -> tuple[str, int, str]:
    run_id, node, host = item[0]
    return run_id, int(node) if node.isdigit() else -1, host


def per_node(ranks: int, per_rank: bool) -> bool:
    """Whether a run of ``ranks`` ranks exports per-node series (not ``per_rank`` forced)."""
    return not per_rank and ranks > PER_NODE_PAST
