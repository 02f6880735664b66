"""Per-GPU utilization history: one sparkline per GPU, fed a sample each poll.

One line-API widget draws every GPU's label and sparkline: a Label + Sparkline per GPU would
render 8 sparklines through Rich, and every container under them, on each poll (most of the GPUs
screen's CPU, measured); the same picture drawn a line at a time costs a fraction of that.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from rich.color import Color
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.renderables._blend_colors import blend_colors
from textual.scroll_view import ScrollView
from textual.strip import Strip

if TYPE_CHECKING:
    from xl.gpu.inventory import GPU

HISTORY = 60  # samples kept per GPU: one minute at the 1 s poll
BARS = "▁▂▃▄▅▆▇█"
LABEL_WIDTH = 7  # "GPU 12 "


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


def _bar_cells(samples: Sequence[float], width: int) -> list[tuple[str, float, int]]:
    """(bar, height ratio, columns) runs across the width: max per bucket, scaled min..max."""
    data = list(samples)
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


class GPUHistory(ScrollView):
    """Utilization over the last minute for every GPU, newest on the right.

    Each line is "GPU <i>" and a sparkline drawn like Textual's Sparkline (max per bucket, scaled
    between the window's min and max, colours blended from the two component classes below). A
    line is repainted only when the columns it draws change.
    """

    # Styled in the app's stylesheet (tui/xl.tcss), like every other widget of the app.
    COMPONENT_CLASSES: ClassVar[set[str]] = {"sparkline--max-color", "sparkline--min-color"}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._order: list[int] = []
        self.samples: dict[int, deque[float]] = {}
        self._drawn: dict[int, tuple[Any, Strip]] = {}
        self._styles: dict[float, Style] = {}
        self._styles_key: Any = None
        self._colors: tuple[Color, Color] | None = None  # sparkline ends; reset on a style change
        self._fresh: dict[int, tuple[int, tuple[Any, ...]]] = {}

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._colors = None

    def update_gpus(self, gpus: Sequence[GPU]) -> None:
        order = [g.index for g in gpus]
        for gpu in gpus:
            samples = self.samples.get(gpu.index)
            if samples is None:
                samples = self.samples[gpu.index] = deque([0.0] * HISTORY, maxlen=HISTORY)
            samples.append(float(gpu.util_gpu or 0))
        if order != self._order:
            for index in set(self.samples) - set(order):
                del self.samples[index]
                self._drawn.pop(index, None)
                self._fresh.pop(index, None)
            self._order = order
            self.virtual_size = Size(self.size.width, len(order))
            self.refresh()
            return
        width = max(0, self.size.width - LABEL_WIDTH)
        changed = []
        for y, index in enumerate(order):
            cells = tuple(_bar_cells(self.samples[index], width)) if width else ()
            self._fresh[index] = (width, cells)  # render_line reuses it
            drawn = self._drawn.get(index)
            if drawn is None or drawn[0][0] != width or drawn[0][-1] != cells:
                changed.append(y)
        if changed:
            # One region for all changed lines; unchanged ones between them come from the cache.
            self.refresh_lines(changed[0], changed[-1] - changed[0] + 1)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.visual_style.rich_style
        line = y + self.scroll_offset.y
        if not 0 <= line < len(self._order) or width <= 0:
            return Strip.blank(width, base)
        index = self._order[line]
        if self._colors is None:
            _, background = self.background_colors
            low = (background + self.get_component_styles("sparkline--min-color").color).rich_color
            high = (background + self.get_component_styles("sparkline--max-color").color).rich_color
            self._colors = (low, high)
        low, high = self._colors
        spark_width = max(0, width - LABEL_WIDTH)
        fresh = self._fresh.pop(index, None)
        if fresh is not None and fresh[0] == spark_width:
            cells = fresh[1]
        else:
            cells = tuple(_bar_cells(self.samples[index], spark_width)) if spark_width else ()
        key = (spark_width, base, low, high, cells)
        drawn = self._drawn.get(index)
        if drawn is not None and drawn[0] == key:
            return drawn[1]
        if self._styles_key != (base, low, high) or len(self._styles) > 4096:
            self._styles_key = (base, low, high)
            self._styles = {}
        label = f"GPU {index}"[:LABEL_WIDTH]
        # Label then blank, as the label widget of old drew it (the blank has no foreground).
        segments = [
            Segment(label, base),
            Segment(" " * (LABEL_WIDTH - len(label)), Style(bgcolor=base.bgcolor)),
        ]
        for bar, ratio, columns in cells:
            style = self._styles.get(ratio)
            if style is None:
                style = self._styles[ratio] = base + Style.from_color(_blend(low, high, ratio))
            segments.append(Segment(bar * columns, style))
        strip = Strip(segments, width)
        self._drawn[index] = (key, strip)
        return strip


def _blend(low: Color, high: Color, ratio: float) -> Color:
    return blend_colors(low, high, ratio)
