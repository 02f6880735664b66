"""Loss / throughput over time: one line per rank, or min/median/max bands for wide runs.

A line-API widget that draws with braille dots (2 x 4 per cell) under a title with the legend,
a y axis on the left and the x axis (seconds since the run started) at the bottom. Not a plotext
plot: building one takes ~15 ms (plotext's canvas, then its ANSI output parsed back into Rich
text), for every chart at every refresh where data changed, which would make the charts the
costliest part of the Monitor. This one draws the same picture from at most two points per dot
column in well under a millisecond, and only when its data or size changed. Wide runs redraw
every few seconds, so the drawing itself is kept lean too: the finite points and the bounds are
worked out once per draw (for the axis and the plot alike), the plot is a flat list of cells
turned straight into runs of text, and a step of at most one dot (most of them) is drawn without
the stepping.
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.segment import Segment
from rich.style import Style
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.strip import Strip
from textual.widget import Widget

from xl.stats import median_sorted

if TYPE_CHECKING:
    from xl.launcher.view.runview import RankView
    from xl.tui.widgets.spread import Spread

# The Monitor's charts: (chart key, the RankView field of a rank's latest point, its history).
RUN_CHARTS = (("loss", "loss", "loss_history"), ("sps", "samples_per_s", "samples_history"))
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
# The character for each combination of dots: a blank cell is a space.
_CHARS = [" ", *(chr(0x2800 + bits) for bits in range(1, 256))]
_X = operator.itemgetter(0)
_Y = operator.itemgetter(1)

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
        xs.append(t_lo + (b + 0.5) * width)
        lo.append(vals[0])
        mid.append(median_sorted(vals))
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
    cols = [int((x - x0) / x_span * (columns - 1)) for x, _ in points]
    ys = list(map(_Y, points))
    kept: list[tuple[float, float]] = []
    start = 0
    for end in range(1, len(points) + 1):
        if end < len(points) and cols[end] == cols[start]:
            continue
        group = ys[start:end]
        # The first of equal lows (highs): list.index and min/max all take the first.
        chosen = {start, end - 1, start + group.index(min(group)), start + group.index(max(group))}
        kept.extend(points[i] for i in sorted(chosen))
        start = end
    return kept


def _finite(lines: Sequence[Line]) -> list[tuple[str, list[tuple[float, float]]]]:
    """Each line's colour and its points with both coordinates finite."""
    isfinite = math.isfinite
    return [
        (colour, [(x, y) for x, y in pts if isfinite(y) and isfinite(x)])
        for _, colour, pts in lines
    ]


def _extent(
    finite: list[tuple[str, list[tuple[float, float]]]],
) -> tuple[float, float, float, float] | None:
    """``extent`` of points already made finite."""
    drawn = [pts for _, pts in finite if pts]
    if not drawn:
        return None
    # Per line then across lines: min and max still return the first of equal values.
    x_min = min(min(map(_X, pts)) for pts in drawn)
    x_max = max(max(map(_X, pts)) for pts in drawn)
    y_min = min(min(map(_Y, pts)) for pts in drawn)
    y_max = max(max(map(_Y, pts)) for pts in drawn)
    if y_max == y_min:  # a flat line sits mid-height
        pad = abs(y_min) * 0.1 or 1.0
        y_min, y_max = y_min - pad, y_max + pad
    return x_min, x_max, y_min, y_max


def extent(lines: Sequence[Line]) -> tuple[float, float, float, float] | None:
    """(x_min, x_max, y_min, y_max) of the finite points; a flat line gets room above and below."""
    return _extent(_finite(lines))


def _canvas(
    finite: list[tuple[str, list[tuple[float, float]]]],
    bounds: tuple[float, float, float, float],
    width: int,
    height: int,
) -> tuple[list[int], list[str | None]]:
    """The dot bits and colour of each cell, row after row (index ``row * width + column``)."""
    x_min, x_max, y_min, y_max = bounds
    dots_w, dots_h = width * 2, height * 4
    x_span, y_span = x_max - x_min, y_max - y_min
    x_last, y_last = dots_w - 1, dots_h - 1
    bits = [0] * (width * height)
    colours: list[str | None] = [None] * (width * height)

    for colour, pts in finite:
        if not pts:
            continue
        pts = _thin(pts, x_min, x_span, dots_w)
        mapped = [
            (
                round((x - x_min) / x_span * x_last) if x_span else 0,
                y_last - round((y - y_min) / y_span * y_last),
            )
            for x, y in pts
        ]
        # Straight lines between neighbours, a dot per step (later lines draw over earlier ones).
        # Each step ends where the next starts, so a step draws its end but not its start; most
        # steps are at most a dot long, and those (with the first point, a step of none) skip the
        # stepping.
        x0, y0 = mapped[0]
        for x1, y1 in mapped:
            dx, dy = x1 - x0, y1 - y0
            steps = max(abs(dx), abs(dy))
            if steps <= 1:
                cell = (y1 >> 2) * width + (x1 >> 1)
                bits[cell] |= _DOTS[x1 & 1][y1 & 3]
                colours[cell] = colour
            else:
                for s in range(1, steps + 1):
                    px = x0 + dx * s // steps
                    py = y0 + dy * s // steps
                    cell = (py >> 2) * width + (px >> 1)
                    bits[cell] |= _DOTS[px & 1][py & 3]
                    colours[cell] = colour
            x0, y0 = x1, y1
    return bits, colours


def plot(
    lines: Sequence[Line], width: int, height: int
) -> tuple[list[list[tuple[str, str | None]]], tuple[float, float, float, float]] | None:
    """Braille cells for ``lines`` in a ``width`` x ``height`` area: rows of (char, colour), and
    the (x_min, x_max, y_min, y_max) drawn. None when there is nothing finite to draw."""
    finite = _finite(lines)
    bounds = _extent(finite)
    if bounds is None or width <= 0 or height <= 0:
        return None
    bits, colours = _canvas(finite, bounds, width, height)
    rows = [
        [(_CHARS[b], c) for b, c in zip(bits[i : i + width], colours[i : i + width], strict=True)]
        for i in range(0, width * height, width)
    ]
    return rows, bounds


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

    def set_spread(
        self,
        spread: Spread,
        *,
        t0: float,
        highlight: int | None = None,
        followed: Sequence[tuple[float, float]] = (),
    ) -> None:
        """A big run's chart: the min / median / max lines its Spread kept (one point a poll),
        and the followed rank's own line; drawn again only when either changed."""
        signature = (
            "spread",
            spread.version,
            highlight,
            len(followed),
            followed[-1][0] if followed else None,
        )
        if signature == self._signature:
            return
        self._signature = signature
        lines: list[Line] = [
            (label, BAND_COLORS[label], points) for label, points in spread.lines(t0)
        ]
        if highlight is not None and followed:
            lines.append((f"rank {highlight}", HIGHLIGHT_COLOR, [(t - t0, v) for t, v in followed]))
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
        return draw(self.title, self._lines, self.visual_style.rich_style, width, height)


def draw(title: str, lines: Sequence[Line], base: Style, width: int, height: int) -> list[Strip]:
    """The chart's rows: the title with the legend, the plot beside its y axis, the x axis."""
    dim = base + Style(dim=True)
    heading = [Segment(f" {title} ", base + Style(bold=True))]
    if not lines:
        return [Strip([*heading, Segment("(no data yet)", dim)])]
    for label, colour, _ in lines:
        heading += [Segment(" ━ ", base + Style(color=colour)), Segment(label, base)]
    strips = [Strip(heading)]
    if height < 3:
        return strips
    rows_h = height - 2
    finite = _finite(lines)
    bounds = _extent(finite)
    if bounds is None:
        return [Strip([*heading, Segment("  (no finite values)", dim)])]
    x_min, x_max, y_min, y_max = bounds
    labels = {rows_h - 1: tick(y_min), 0: tick(y_max)}  # one row: the max names it
    if rows_h >= 5:
        labels[(rows_h - 1) // 2] = tick((y_min + y_max) / 2)
    axis_w = max(len(t) for t in labels.values()) + 1
    # One blank column on the right: the plot never touches what is beside it.
    plot_w = max(1, width - axis_w - 2)
    bits, colours = _canvas(finite, bounds, plot_w, rows_h)
    styles: dict[str | None, Style] = {}
    for i, start in enumerate(range(0, plot_w * rows_h, plot_w)):
        row_bits = bits[start : start + plot_w]
        text = "".join([_CHARS[b] for b in row_bits])
        segments = [
            Segment(labels.get(i, "").rjust(axis_w - 1) + " ", dim),
            Segment("│" if i else "┐", dim),
        ]
        # A run of one colour goes on over the blanks after it, up to a dot of another colour.
        run_start, run_colour = 0, colours[start]
        for column, b in enumerate(row_bits):
            if b and colours[start + column] != run_colour:
                if column > run_start:
                    segments.append(
                        Segment(text[run_start:column], _style(styles, base, run_colour))
                    )
                run_start, run_colour = column, colours[start + column]
        segments.append(Segment(text[run_start:], _style(styles, base, run_colour)))
        strips.append(Strip(segments))
    left, right = f"{x_min:.0f}s", f"{x_max:.0f}s"
    axis = " " * axis_w + "└" + left + " " * max(1, plot_w - len(left) - len(right)) + right
    strips.append(Strip([Segment(axis, dim)]))
    return strips


def _style(cache: dict[str | None, Style], base: Style, colour: str | None) -> Style:
    style = cache.get(colour)
    if style is None:
        style = cache[colour] = base if colour is None else base + Style(color=colour)
    return style


class RunCharts(Vertical):
    """The Monitor's two charts, loss and samples/s: a line per rank (bands past BAND_THRESHOLD
    ranks), or for a big run the spreads of every rank's latest point (Spread)."""

    def compose(self) -> ComposeResult:
        yield MetricChart("loss", id="chart-loss")
        yield MetricChart("samples/s", id="chart-sps")

    def show_ranks(
        self, ranks: Mapping[int, RankView], *, t0: float, highlight: int | None
    ) -> None:
        for key, _, history in RUN_CHARTS:
            series = {r: getattr(rv, history) for r, rv in ranks.items()}
            self.query_one(f"#chart-{key}", MetricChart).set_series(
                series, t0=t0, highlight=highlight
            )

    def show_spreads(
        self, spreads: Mapping[str, Spread], followed: RankView | None, *, t0: float,
        highlight: int | None,
    ) -> None:
        """A big run's charts: min / median / max, a point a poll, and the followed rank's
        own line."""
        for key, _, history in RUN_CHARTS:
            self.query_one(f"#chart-{key}", MetricChart).set_spread(
                spreads[key],
                t0=t0,
                highlight=highlight,
                followed=list(getattr(followed, history)) if followed is not None else (),
            )
