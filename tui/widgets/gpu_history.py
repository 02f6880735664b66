"""Per-GPU utilization history: one sparkline per GPU, fed a sample each poll."""

from __future__ import annotations

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


def _bar_cells(data: Sequence[float], width: int) -> list[tuple[str, float]]:
    """(bar, height ratio) per column: Textual's Sparkline bucketing and scaling, one line high.

    Same arithmetic as textual.renderables.sparkline (max per bucket, scaled between the window's
    min and max), in integers where it used Fractions, so the picture is the one it draws.
    """
    n = len(data)
    if n == 0:
        return [("▁", 0.0)] * width
    if n == 1:
        return [("█", 1.0)] * width
    lo, hi = min(data), max(data)
    extent = hi - lo or 1
    buckets = []
    for b in range(width):
        part = data[(n * b) // width : (n * (b + 1)) // width]
        if part:
            buckets.append(max(part))
    cells = []
    index = 0.0
    step = len(buckets) / width
    for _ in range(width):
        ratio = (buckets[int(index)] - lo) / extent
        cells.append((BARS[int(ratio * 7) % 8], ratio))
        index += step
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
        if self._styles_key != (base, low, high):
            self._styles_key = (base, low, high)
            self._styles = {}
        segments = []
        for bar, ratio in cells:
            style = self._styles.get(ratio)
            if style is None:
                style = self._styles[ratio] = base + Style.from_color(self._blend(low, high, ratio))
            segments.append(Segment(bar, style))
        strip = Strip(segments, width)
        self._drawn = (key, strip)
        return strip

    @staticmethod
    def _blend(low: Color, high: Color, ratio: float) -> Color:
        return blend_colors(low, high, ratio)


class GPUHistoryRow(Horizontal):
    def __init__(self, index: int) -> None:
        super().__init__(id=f"hist-{index}", classes="hist-row")
        self.index = index
        self.samples: deque[float] = deque([0.0] * HISTORY, maxlen=HISTORY)

    def compose(self) -> ComposeResult:
        yield Label(f"GPU {self.index}", classes="hist-label")
        yield UtilSparkline(list(self.samples))

    def push(self, util: int | None) -> None:
        self.samples.append(float(util or 0))
        self.query_one(UtilSparkline).data = list(self.samples)


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
