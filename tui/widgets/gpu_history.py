"""Per-GPU utilization history: one Sparkline per GPU, fed a sample each poll."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Label, Sparkline

HISTORY = 60  # samples kept per GPU: one minute at the 1 s poll


class GPUHistoryRow(Horizontal):
    def __init__(self, index: int) -> None:
        super().__init__(id=f"hist-{index}", classes="hist-row")
        self.index = index
        self.samples: deque[float] = deque([0.0] * HISTORY, maxlen=HISTORY)

    def compose(self) -> ComposeResult:
        yield Label(f"GPU {self.index}", classes="hist-label")
        yield Sparkline(list(self.samples), summary_function=max)

    def push(self, util: int | None) -> None:
        self.samples.append(float(util or 0))
        self.query_one(Sparkline).data = list(self.samples)


class GPUHistory(VerticalScroll):
    """Utilization over the last minute for every GPU, newest on the right."""

    def update_gpus(self, gpus: Sequence[Any]) -> None:
        rows = {row.index: row for row in self.query(GPUHistoryRow)}
        for gpu in gpus:
            row = rows.pop(gpu.index, None)
            if row is None:
                row = GPUHistoryRow(gpu.index)
                self.mount(row)
                row.samples.append(float(gpu.util_gpu or 0))
            else:
                row.push(gpu.util_gpu)
        for stale in rows.values():
            stale.remove()
