"""Loss / throughput over time: one line per rank, or min/median/max bands for wide runs.

A line-API widget that draws with braille dots (2 x 4 per cell) under a title with the legend,
a y axis on the left and the x axis (seconds since the run started) at the bottom. It used to be
a plotext plot: building one took ~15 ms (plotext's canvas, then its ANSI output parsed back into
Rich text), for every chart at every refresh where data changed, which made the charts the
costliest part of the Monitor. This one draws the same picture from at most two points per dot
column in well under a millisecond, and only when its data or size changed.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip
from textual.widget import Widget

# Past this many ranks, per-rank lines become an unreadable tangle: draw the spread instead.
BAND_THRESHOLD = 8
BINS = 60
# Wide runs: redraw at most this often, from about this many points of each rank.
WIDE_MIN_INTERVAL_S = 5.0
WIDE_POINTS_PER_RANK = BINS
# Line colours: ranks in turn; for bands, max / median / min and the rank being followed.
PALETTE = ("cyan", "magenta", "yellow", "green", "blue", "red", "bright_cyan", "bright_magenta")
BAND_COLORS = {"max": "red", "median": "cyan", "min": "green"}
HIGHLIGHT_COLOR = "bright_white"
# Braille dot bits by (x, y) inside a cell of 2 x 4 dots.
_DOTS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))

Series = Mapping[int, Sequence[tuple[float, float]]]
Line = tuple[str, str, list[tuple[float, float]]]  # label, colour, points


def bands(
    series: Series, bins: int = BINS
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Bucket every rank's points by time; per bucket the min, median and max (x, lo, mid, hi).

    Each rank's points are in time order (as the reader keeps them), so the time span comes from
    their ends; non-finite values are left out.
    """
    spans = [(pts[0][0], pts[-1][0]) for pts in series.values() if pts]
    if not spans:
        return [], [], [], []
    t_lo = min(lo for lo, _ in spans)
    t_hi = max(hi for _, hi in spans)
    width = (t_hi - t_lo) / bins or 1.0
    buckets: list[list[float]] = [[] for _ in range(bins)]
    last = bins - 1
    for pts in series.values():
        for t, v in pts:
            if v - v == 0:  # finite: NaN and inf fail this
                b = int((t - t_lo) / width)
                buckets[b if 0 <= b <= last else (last if b > last else 0)].append(v)
    xs, lo, mid, hi = [], [], [], []
    for b, vals in enumerate(buckets):
        if not vals:
            continue
        vals.sort()
        n = len(vals)
        xs.append(t_lo + (b + 0.5) * width)
        lo.append(vals[0])
        mid.append(vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2)
        hi.append(vals[-1])
    return xs, lo, mid, hi


def tick(value: float) -> str:
    """A short axis label: 0.0123, 1.5, 532, 12.4k."""
    if value == 0:
        return "0"
    size = abs(value)
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if size >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _thin(
    points: list[tuple[float, float]], x0: float, x_span: float, columns: int
) -> list[tuple[float, float]]:
    """Per dot column, only the first, lowest, highest and last points, in order: the same
    picture (spikes included) from far fewer lines."""
    if len(points) <= 4 * columns or not x_span:
        return points
    kept: list[tuple[float, float]] = []
    group: list[tuple[float, float]] = []
    column = None
    for point in [*points, (math.inf, 0.0)]:  # the sentinel closes the last column
        col = int((point[0] - x0) / x_span * (columns - 1)) if math.isfinite(point[0]) else None
        if col != column and group:
            chosen = {
                0,
                len(group) - 1,
                group.index(min(group, key=lambda p: p[1])),
                group.index(max(group, key=lambda p: p[1])),
            }
            kept.extend(group[i] for i in sorted(chosen))
            group = []
        column = col
        group.append(point)
    return kept


def extent(lines: Sequence[Line]) -> tuple[float, float, float, float] | None:
    """(x_min, x_max, y_min, y_max) of the finite points; a flat line gets room above and below."""
    finite = [
        (x, y) for _, _, pts in lines for x, y in pts if math.isfinite(y) and math.isfinite(x)
    ]
    if not finite:
        return None
    x_min = min(x for x, _ in finite)
    x_max = max(x for x, _ in finite)
    y_min = min(y for _, y in finite)
    y_max = max(y for _, y in finite)
    if y_max == y_min:  # a flat line sits mid-height
        pad = abs(y_min) * 0.1 or 1.0
        y_min, y_max = y_min - pad, y_max + pad
    return x_min, x_max, y_min, y_max


def plot(
    lines: Sequence[Line], width: int, height: int
) -> tuple[list[list[tuple[str, str | None]]], tuple[float, float, float, float]] | None:
    """Braille cells for ``lines`` in a ``width`` x ``height`` area: rows of (char, colour), and
    the (x_min, x_max, y_min, y_max) drawn. None when there is nothing finite to draw."""
    bounds = extent(lines)
    if bounds is None or width <= 0 or height <= 0:
        return None
    x_min, x_max, y_min, y_max = bounds
    dots_w, dots_h = width * 2, height * 4
    x_span, y_span = x_max - x_min, y_max - y_min
    bits = [[0] * width for _ in range(height)]
    colours: list[list[str | None]] = [[None] * width for _ in range(height)]

    for _, colour, pts in lines:
        pts = _thin(
            [(x, y) for x, y in pts if math.isfinite(y) and math.isfinite(x)], x_min, x_span, dots_w
        )
        mapped = [
            (
                round((x - x_min) / x_span * (dots_w - 1)) if x_span else 0,
                dots_h - 1 - round((y - y_min) / y_span * (dots_h - 1)),
            )
            for x, y in pts
        ]
        if len(mapped) == 1:
            mapped.append(mapped[0])
        # Straight lines between neighbours, a dot per step (later lines draw over earlier ones).
        for (x0, y0), (x1, y1) in itertools.pairwise(mapped):
            dx, dy = x1 - x0, y1 - y0
            steps = max(abs(dx), abs(dy), 1)
            for s in range(steps + 1):
                px = x0 + dx * s // steps
                py = y0 + dy * s // steps
                row = py >> 2
                bits[row][px >> 1] |= _DOTS[px & 1][py & 3]
                colours[row][px >> 1] = colour
    rows = [
        [(chr(0x2800 + b) if b else " ", c) for b, c in zip(brow, crow, strict=True)]
        for brow, crow in zip(bits, colours, strict=True)
    ]
    return rows, (x_min, x_max, y_min, y_max)


class MetricChart(Widget):
    """A chart that redraws only when its data or size changed."""

    def __init__(self, title: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.title = title
        self._signature: tuple | None = None
        self._drawn_at = 0.0
        self._lines: list[Line] = []
        self._strips: list[Strip] | None = None  # drawn for the current size and style

    def set_series(self, series: Series, *, t0: float, highlight: int | None = None) -> None:
        signature = (
            highlight,
            tuple((r, len(p), p[-1][0] if p else None) for r, p in sorted(series.items())),
        )
        if signature == self._signature:
            return
        wide = len(series) > BAND_THRESHOLD
        now = time.monotonic()
        if (
            wide
            and self._signature is not None
            and self._signature[0] == highlight  # a rank just chosen shows at once
            and now - self._drawn_at < WIDE_MIN_INTERVAL_S
        ):
            return
        self._signature = signature
        self._drawn_at = now
        drawn = {r: list(p) for r, p in series.items() if p}
        if wide:
            # The bands need a few points per bin, not every point: evenly spaced ones over each
            # rank's whole history keep the window and bound the work (64 ranks x 600 points).
            drawn = {r: p[:: max(1, len(p) // WIDE_POINTS_PER_RANK)] for r, p in drawn.items()}
        lines: list[Line] = []
        if len(drawn) > BAND_THRESHOLD:
            xs, lo, mid, hi = bands(drawn)
            xs = [x - t0 for x in xs]
            for label, values in (("max", hi), ("median", mid), ("min", lo)):
                lines.append((label, BAND_COLORS[label], list(zip(xs, values, strict=True))))
            if highlight in drawn:  # the followed rank: every point
                lines.append(
                    (
                        f"rank {highlight}",
                        HIGHLIGHT_COLOR,
                        [(t - t0, v) for t, v in series[highlight]],
                    )
                )
        else:
            for i, (rank, pts) in enumerate(sorted(drawn.items())):
                lines.append((f"r{rank}", PALETTE[i % len(PALETTE)], [(t - t0, v) for t, v in pts]))
        self._lines = lines
        self._strips = None
        self.refresh()

    def on_resize(self) -> None:
        self._strips = None

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips = None

    def render_line(self, y: int) -> Strip:
        if self._strips is None:
            self._strips = self._draw(self.size.width, self.size.height)
        width = self.size.width
        base = self.visual_style.rich_style
        if y < len(self._strips):
            return self._strips[y].crop_extend(0, width, base)
        return Strip.blank(width, base)

    def _draw(self, width: int, height: int) -> list[Strip]:
        base = self.visual_style.rich_style
        dim = base + Style(dim=True)
        title = [Segment(f" {self.title} ", base + Style(bold=True))]
        if not self._lines:
            return [Strip([*title, Segment("(no data yet)", dim)])]
        for label, colour, _ in self._lines:
            title += [Segment(" ━ ", base + Style(color=colour)), Segment(label, base)]
        strips = [Strip(title)]
        if height < 3:
            return strips
        rows_h = height - 2
        bounds = extent(self._lines)
        if bounds is None:
            return [Strip([*title, Segment("  (no finite values)", dim)])]
        _, _, y_min, y_max = bounds
        labels = {rows_h - 1: tick(y_min), 0: tick(y_max)}  # one row: the max names it
        if rows_h >= 5:
            labels[(rows_h - 1) // 2] = tick((y_min + y_max) / 2)
        axis_w = max(len(t) for t in labels.values()) + 1
        # One blank column on the right: the plot never touches what is beside it.
        drawn = plot(self._lines, max(1, width - axis_w - 2), rows_h)
        assert drawn is not None
        rows, (x_min, x_max, _, _) = drawn
        styles: dict[str | None, Style] = {}
        for i, row in enumerate(rows):
            segments = [
                Segment(labels.get(i, "").rjust(axis_w - 1) + " ", dim),
                Segment("│" if i else "┐", dim),
            ]
            run_text = ""
            run_colour: str | None = row[0][1] if row else None
            for char, cell_colour in row:
                if cell_colour != run_colour and char != " ":
                    if run_text:
                        segments.append(Segment(run_text, _style(styles, base, run_colour)))
                    run_text, run_colour = "", cell_colour
                run_text += char
            if run_text:
                segments.append(Segment(run_text, _style(styles, base, run_colour)))
            strips.append(Strip(segments))
        plot_w = len(rows[0]) if rows else 0
        left, right = f"{x_min:.0f}s", f"{x_max:.0f}s"
        axis = " " * axis_w + "└" + left + " " * max(1, plot_w - len(left) - len(right)) + right
        strips.append(Strip([Segment(axis, dim)]))
        return strips


def _style(cache: dict[str | None, Style], base: Style, colour: str | None) -> Style:
    style = cache.get(colour)
    if style is None:
        style = cache[colour] = base if colour is None else base + Style(color=colour)
    return style
