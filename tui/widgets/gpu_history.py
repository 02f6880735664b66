"""Per-GPU utilization history: one sparkline per GPU, fed a sample each poll."""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Sequence
from typing import Any

from rich.color import Color
from rich.segment import Segment
from rich.style import Style
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.renderables._blend_colors import blend_colors
from textual.strip import Strip
from textual.widgets import Label, Sparkline

HISTORY = 60  # samples kept per GPU: one minute at the 1 s poll
BARS = "▁▂▃▄▅▆▇█"


@functools.lru_cache(maxsize=32)
def _layout(n: int, width: int) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
    """Which samples each bucket summarises, and runs of (bucket, columns) across the width.

    Same arithmetic as textual.renderables.sparkline (in integers where it uses Fractions, the
    same float walk over buckets), so the picture is the one the stock Sparkline draws.
    """
    bounds = []
    for b in range(width):
        start, end = (n * b) // width, (n * (b + 1)) // width
        if end > start:
            bounds.append((start, end))
    runs: list[list[int]] = []
    index = 0.0
    step = len(bounds) / width
    for _ in range(width):
        bucket = int(index)
        if runs and runs[-1][0] == bucket:
            runs[-1][1] += 1
        else:
            runs.append([bucket, 1])
        index += step
    return tuple(bounds), tuple((b, c) for b, c in runs)


def _bar_cells(data: Sequence[float], width: int) -> list[tuple[str, float, int]]:
    """(bar, height ratio, columns) runs across the width: max per bucket, scaled min..max."""
    n = len(data)
    if n == 0:
        return [("▁", 0.0, width)]
    if n == 1:
        return [("█", 1.0, width)]
    lo, hi = min(data), max(data)
    extent = hi - lo or 1
    bounds, runs = _layout(n, width)
    ratios = [(max(data[a:b]) - lo) / extent for a, b in bounds]
    cells: list[tuple[str, float, int]] = []
    for bucket, columns in runs:
        ratio = ratios[bucket]
        if cells and cells[-1][1] == ratio:
            bar, _, count = cells[-1]
            cells[-1] = (bar, ratio, count + columns)
        else:
            cells.append((BARS[int(ratio * 7) % 8], ratio, columns))
    return cells


class UtilSparkline(Sparkline):
    """A Sparkline that draws its one line straight into a cached Strip.

    The stock widget renders through Rich (a Style and a colour blend per column, then Textual's
    generic renderable path) every time its data changes: with eight of them at one sample a second
    that was half of the GPUs screen's CPU. The picture is identical; a line is rebuilt only when
    its columns change, and colours are blended once per distinct height.
    """

    def __init__(self, data: Sequence[float], **kwargs: Any) -> None:
        super().__init__(data, summary_function=max, **kwargs)
        self._drawn: tuple[Any, Strip] | None = None
        self._styles: dict[float, Style] = {}
        self._styles_key: Any = None

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.visual_style.rich_style
        if y != 0 or width <= 0:
            return Strip.blank(width, base)
        _, background = self.background_colors
        low = (background + self.get_component_styles("sparkline--min-color").color).rich_color
        high = (background + self.get_component_styles("sparkline--max-color").color).rich_color
        cells = _bar_cells(list(self.data or ()), width)
        key = (width, base, low, high, tuple(cells))
        if self._drawn is not None and self._drawn[0] == key:
            return self._drawn[1]
        if self._styles_key != (base, low, high) or len(self._styles) > 4096:
            self._styles_key = (base, low, high)
            self._styles = {}
        segments = []
        for bar, ratio, columns in cells:
            style = self._styles.get(ratio)
            if style is None:
                style = self._styles[ratio] = base + Style.from_color(self._blend(low, high, ratio))
            segments.append(Segment(bar * columns, style))
        strip = Strip(segments, width)
        self._drawn = (key, strip)
        return strip

    def set_samples(self, samples: Sequence[float]) -> None:
        """New data; repainted only if the line it draws is not the one on screen."""
        data = list(samples)
        drawn = self._drawn
        if drawn is not None and drawn[0][0] == self.size.width and drawn[0][-1] == tuple(_bar_cells(data, drawn[0][0])):
            self.set_reactive(Sparkline.data, data)
        else:
            self.data = data

    @staticmethod
    def _blend(low: Color, high: Color, ratio: float) -> Color:
        return blend_colors(low, high, ratio)


class GPUHistoryRow(Horizontal):
    def __init__(self, index: int) -> None:
        super().__init__(id=f"hist-{index}", classes="hist-row")
        self.index = index
        self.samples: deque[float] = deque([0.0] * HISTORY, maxlen=HISTORY)
        self.line = UtilSparkline(list(self.samples))

    def compose(self) -> ComposeResult:
        yield Label(f"GPU {self.index}", classes="hist-label")
        self.line.data = list(self.samples)
        yield self.line

    def push(self, util: int | None) -> None:
        self.samples.append(float(util or 0))
        self.line.set_samples(self.samples)


class GPUHistory(VerticalScroll):
    """Utilization over the last minute for every GPU, newest on the right."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._rows: dict[int, GPUHistoryRow] = {}

    def update_gpus(self, gpus: Sequence[Any]) -> None:
        rows = dict(self._rows)
        for gpu in gpus:
            row = rows.pop(gpu.index, None)
            if row is None:
                row = self._rows[gpu.index] = GPUHistoryRow(gpu.index)
                self.mount(row)
                row.samples.append(float(gpu.util_gpu or 0))
            else:
                row.push(gpu.util_gpu)
        for index, stale in rows.items():
            del self._rows[index]
            stale.remove()
