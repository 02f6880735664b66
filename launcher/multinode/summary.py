"""What a node > 0 tells node 0 of its ranks' training: one row a rank a second, not a frame a step.

A node's ranks send their ``xl.log`` frames to their own node's collector (its metrics.jsonl has
every line); its supervisor hands each rank's records to ``Summary.add`` and, once a second,
sends node 0 what ``take`` returns: for each rank that logged, one ``train`` row standing for the
steps it took since the last one (``steps``; their step times the per-step means, ``samples``
summed, ``step``, ``loss`` and every other key the last value given), its last line without a
step when it came after (an evaluation's sign of life: ``eval_batches``), and its last ``sys``
line (the rank's own: communication waits, CUDA counters). Node 0 stores the rows as
metrics.jsonl ``train`` lines (docs/contracts.md, "metrics.jsonl": ``steps``) and diagnoses them
as its own ranks' (docs/contracts.md, "Node frames": ``train``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from xl.figures import number

# per-step means over the row's steps (a line's own figures are per-step means of its ``steps``)
_MEANS = ("step_s", "data_s", "compute_s", "comm_s", "other_s")
_SUMS = ("samples", "tokens")
# rows of one ``train`` message (protocol.MAX_TRAIN_ROWS): a node of many ranks sends several
ROWS_PER_MESSAGE = 256


def _steps(rec: dict[str, Any]) -> int:
    steps = rec.get("steps")
    return steps if type(steps) is int and steps > 0 else 1


@dataclass
class _Rank:
    """One rank's lines since the last ``take``."""

    row: dict[str, Any] = field(default_factory=dict)  # every key of its stepped lines, the last
    steps: int = 0
    weights: dict[str, float] = field(default_factory=dict)  # steps behind each mean
    means: dict[str, float] = field(default_factory=dict)  # seconds summed over those steps
    sums: dict[str, float] = field(default_factory=dict)
    peak: float | None = None  # mem_peak_mib: the largest
    unstepped: dict[str, Any] | None = None  # its last train line without a step, after them
    sys: dict[str, Any] | None = None

    def add(self, rec: dict[str, Any]) -> None:
        kind = rec.get("kind")
        if kind == "sys":
            self.sys = rec
            return
        if kind != "train":
            return
        if "step" not in rec:
            self.unstepped = rec
            return
        self.unstepped = None
        n = _steps(rec)
        self.steps += n
        self.row.update(rec)
        for key in _MEANS:
            value = number(rec.get(key))
            if value is not None:
                self.means[key] = self.means.get(key, 0.0) + value * n
                self.weights[key] = self.weights.get(key, 0.0) + n
        for key in _SUMS:
            value = number(rec.get(key))
            if value is not None:
                self.sums[key] = self.sums.get(key, 0.0) + value
        peak = number(rec.get("mem_peak_mib"))
        if peak is not None:
            self.peak = peak if self.peak is None else max(self.peak, peak)

    def rows(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.steps:
            row = dict(self.row)
            row["steps"] = self.steps
            for key, total in self.means.items():
                row[key] = round(total / self.weights[key], 6)
            for key, total in self.sums.items():
                row[key] = int(total) if float(total).is_integer() else round(total, 6)
            stepped = self.means.get("step_s")
            for key, rate in (("samples", "samples_per_s"), ("tokens", "tokens_per_s")):
                if key in self.sums and stepped:
                    row[rate] = round(self.sums[key] / stepped, 3)
            if self.peak is not None:
                row["mem_peak_mib"] = self.peak
            out.append(row)
        if self.unstepped is not None:
            out.append(self.unstepped)
        if self.sys is not None:
            out.append(self.sys)
        return out


class Summary:
    """Records of this node's ranks (``add``, from the collector's thread), summed up each second
    (``take``, from the sampler's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ranks: dict[int, _Rank] = {}

    # edge: telemetry's records, as the collector parsed them
    def add(self, rank: int, records: list[dict[str, Any]]) -> None:
        with self._lock:
            acc = self._ranks.get(rank)
            if acc is None:
                acc = self._ranks[rank] = _Rank()
            for rec in records:
                acc.add(rec)

    # edge: the train rows, as the link carries them
    def take(self) -> list[dict[str, Any]]:
        """Each rank's rows since the last call, rank by rank."""
        with self._lock:
            ranks, self._ranks = self._ranks, {}
        return [row for rank in sorted(ranks) for row in ranks[rank].rows()]
