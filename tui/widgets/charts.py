"""Loss / throughput over time: one line per rank, or min/median/max bands for wide runs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence

from textual_plotext import PlotextPlot

# Past this many ranks, per-rank lines become an unreadable tangle: draw the spread instead.
BAND_THRESHOLD = 8
BINS = 60
# Wide runs: redraw at most this often, from each rank's most recent points only.
WIDE_MIN_INTERVAL_S = 5.0
WIDE_POINTS_PER_RANK = 150

Series = Mapping[int, Sequence[tuple[float, float]]]


def bands(series: Series, bins: int = BINS) -> tuple[list[float], list[float], list[float], list[float]]:
    """Bucket every rank's points by time; per bucket the min, median and max (x, lo, mid, hi)."""
    points = [(t, v) for pts in series.values() for t, v in pts if v == v]  # v == v drops NaN
    if not points:
        return [], [], [], []
    t_lo = min(t for t, _ in points)
    t_hi = max(t for t, _ in points)
    width = (t_hi - t_lo) / bins or 1.0
    buckets: dict[int, list[float]] = {}
    for t, v in points:
        buckets.setdefault(min(bins - 1, int((t - t_lo) / width)), []).append(v)
    xs, lo, mid, hi = [], [], [], []
    for b in sorted(buckets):
        vals = buckets[b]
        xs.append(t_lo + (b + 0.5) * width)
        lo.append(min(vals))
        mid.append(statistics.median(vals))
        hi.append(max(vals))
    return xs, lo, mid, hi


class MetricChart(PlotextPlot):
    """A plot that redraws only when its data changed (plotext rendering is not free)."""

    def __init__(self, title: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.title = title
        self._signature: tuple | None = None
        self._drawn_at = 0.0

    def set_series(self, series: Series, *, t0: float, highlight: int | None = None) -> None:
        signature = (
            highlight,
            tuple((r, len(p), p[-1][0] if p else None) for r, p in sorted(series.items())),
        )
        if signature == self._signature:
            return
        wide = len(series) > BAND_THRESHOLD
        now = time.monotonic()
        if wide and self._signature is not None and now - self._drawn_at < WIDE_MIN_INTERVAL_S:
            return
        self._signature = signature
        self._drawn_at = now
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(f"{self.title} (x: seconds since start)")
        drawn = {r: p for r, p in series.items() if p}
        if wide:
            drawn = {r: list(p)[-WIDE_POINTS_PER_RANK:] for r, p in drawn.items()}
        if not drawn:
            plt.title(f"{self.title}: no data yet")
        elif len(drawn) > BAND_THRESHOLD:
            xs, lo, mid, hi = bands(drawn)
            xs = [x - t0 for x in xs]
            plt.plot(xs, hi, label="max", marker="braille")
            plt.plot(xs, mid, label="median", marker="braille")
            plt.plot(xs, lo, label="min", marker="braille")
            if highlight in drawn:
                pts = drawn[highlight]
                plt.plot([t - t0 for t, _ in pts], [v for _, v in pts], label=f"rank {highlight}", marker="braille")
        else:
            for rank, pts in sorted(drawn.items()):
                plt.plot([t - t0 for t, _ in pts], [v for _, v in pts], label=f"r{rank}", marker="braille")
        self.refresh()
