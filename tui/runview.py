"""What the Monitor derives from a RunView (the reader's snapshot): times, progress, ETA, series.

Pure functions over the reader's objects, so the screen only renders. run.json's fields are read
through its one owner, xl.launcher.rundir.record (a pure data module: no process, no I/O here).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text

from xl.launcher.rundir.record import FINAL, RunRecord

# The record's own set of final statuses, under the name the screens use.
FINISHED = FINAL


def _record(run: Mapping[str, Any] | RunRecord) -> RunRecord:
    return run if isinstance(run, RunRecord) else RunRecord.from_json(dict(run))


def run_field(run: Mapping[str, Any] | RunRecord, *names: str) -> Any:
    """The first of run.json's ``names`` that is set (None when none is)."""
    rec = _record(run)
    return next((v for v in map(rec.get, names) if v is not None), None)


def started_at(run: Mapping[str, Any] | RunRecord) -> float | None:
    return _record(run).started_at


def ended_at(run: Mapping[str, Any] | RunRecord) -> float | None:
    return _record(run).ended_at


def elapsed(run: Mapping[str, Any] | RunRecord, now: float) -> float | None:
    rec = _record(run)
    if rec.started_at is None:
        return None
    return (rec.ended_at if rec.ended_at is not None else now) - rec.started_at


def world_size(run: Mapping[str, Any] | RunRecord, ranks: Mapping[int, Any]) -> int:
    rec = _record(run)
    if rec.world_size is not None:
        return rec.world_size
    return max(len(ranks), len(rec.ranks))


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


def devices_text(run: Mapping[str, Any] | RunRecord) -> str:
    """``GPU 1,0 (NVIDIA A100-SXM4-80GB)``: indices in launch order, each model named once."""
    devices = _record(run).devices
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


def outcome_text(run: Mapping[str, Any] | RunRecord, run_id: str, status: str, now: float) -> Text:
    """What stays on the terminal once the app closes on an ended run, as the plain view leaves
    it: the root cause's traceback, the outcome line, and the command that shows the failed
    rank's whole output."""
    rec = _record(run)
    failure = (rec.failure or {}) if status == "failed" else {}
    rank = failure.get("rank")
    out = Text()
    if failure.get("traceback"):
        out.append(f"xl: traceback of rank {rank}:\n", style="bold")
        out.append(str(failure["traceback"]).rstrip("\n") + "\n")
    took = elapsed(rec, now)
    line = f"xl: run {run_id} {status}" + (f" after {took:.1f}s" if took is not None else "")
    why = failure.get("message")
    if not why and rank is not None:
        code = failure.get("exit_code")
        why = f"rank {rank} failed first" + (f" (exit code {code})" if code is not None else "")
    if why:
        line += f": {why}"
    out.append(line, style={"succeeded": "bold green", "failed": "bold red"}.get(status, "bold yellow"))
    if status == "failed":
        whose = f" --rank {rank}" if isinstance(rank, int) else ""
        out.append(f"\nxl: every line it printed: xl logs {run_id}{whose}")
    return out
