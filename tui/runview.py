"""What the Monitor derives from a RunView (the reader's snapshot): times, progress, ETA, series.

Pure functions over the reader's objects, so the screen only renders.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FINISHED = ("succeeded", "failed", "stopped")


def run_field(run: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        value = run.get(name)
        if value is not None:
            return value
    spec = run.get("spec")
    if isinstance(spec, Mapping):
        for name in names:
            if spec.get(name) is not None:
                return spec[name]
    return None


def started_at(run: Mapping[str, Any]) -> float | None:
    return run_field(run, "started_at", "start_time", "started", "t_start")


def ended_at(run: Mapping[str, Any]) -> float | None:
    return run_field(run, "ended_at", "end_time", "ended", "t_end")


def elapsed(run: Mapping[str, Any], now: float) -> float | None:
    start = started_at(run)
    if start is None:
        return None
    end = ended_at(run)
    return (end if end is not None else now) - start


def world_size(run: Mapping[str, Any], ranks: Mapping[int, Any]) -> int:
    value = run_field(run, "world_size")
    if isinstance(value, int):
        return value
    listed = run.get("ranks")
    return max(len(ranks), len(listed) if isinstance(listed, list) else 0)


def node_of(rv: Any) -> str | None:
    """The host a rank runs on, as run.json names it."""
    node = getattr(rv, "node", None)
    return None if node is None or node == "" else str(node)


def node_labels(ranks: Mapping[int, Any]) -> dict[int, str | None]:
    """Each rank's node as the Monitor shows it: its host, or "host #k" (k the node rank) when
    two of the run's nodes share a host, e.g. two xl nodes started on one machine. Nodes are
    told apart by xl's node rank where run.json has it, else by host."""
    keys: dict[int, Any] = {}
    hosts: dict[str, set[Any]] = {}
    for rank, rv in ranks.items():
        node_rank = getattr(rv, "node_rank", None)
        host = node_of(rv)
        keys[rank] = node_rank if isinstance(node_rank, int) else host
        if host is not None:
            hosts.setdefault(host, set()).add(keys[rank])
    labels: dict[int, str | None] = {}
    for rank, rv in ranks.items():
        host = node_of(rv)
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


def devices_text(run: Mapping[str, Any]) -> str:
    """``GPU 1,0 (NVIDIA A100-SXM4-80GB)``: indices in launch order, each model named once."""
    devices = [d for d in run.get("devices") or [] if isinstance(d, Mapping)]
    if not devices:
        return "CPU"
    names: list[str] = []
    for d in devices:
        name = str(d.get("name") or "?")
        if name not in names:
            names.append(name)
    return f"GPU {','.join(str(d.get('index')) for d in devices)} ({', '.join(names)})"


def history(rv: Any, which: str) -> Sequence[tuple[float, float]]:
    """(t, value) points of ``loss`` or ``samples_per_s`` for one rank (the reader's own deque)."""
    name = {"loss": "loss_history", "samples_per_s": "samples_history"}[which]
    return getattr(rv, name, None) or ()


@dataclass
class Progress:
    step: int
    total: int
    eta_s: float | None

    @property
    def fraction(self) -> float:
        return min(1.0, self.step / self.total) if self.total else 0.0


def progress(ranks: Mapping[int, Any], finished: bool) -> Progress | None:
    """The run's progress is its slowest rank's; so is its ETA (None when unknown)."""
    totals = [rv.total_steps for rv in ranks.values() if getattr(rv, "total_steps", None)]
    steps = [rv.step for rv in ranks.values() if getattr(rv, "step", None) is not None]
    if not totals or not steps:
        return None
    total = int(statistics.median(totals))
    step = int(min(steps))
    if finished:
        return Progress(step, total, None)
    etas = [e for rv in ranks.values() if (e := getattr(rv, "eta_s", None)) is not None]
    return Progress(step, total, max(etas) if etas else None)
