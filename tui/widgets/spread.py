"""A big run's charts: the spread of its ranks' latest values, one point a poll.

MetricChart's bands bucket every rank's whole history by time: at 4,096 ranks that is a quarter
of a million points sorted on the Monitor's main thread each time a chart redraws. Past
node_summary.BIG_RUN ranks the Monitor keeps this instead: each poll takes every rank's latest
value (RankView.loss, .samples_per_s: one look per rank), and adds one (time, min, median, max)
to the chart when any rank was seen since the last one added. The history from before the
Monitor opened comes once, at its first poll, from the bands of an even sample of the ranks
(SEED_RANKS).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import attrgetter
from typing import TYPE_CHECKING

from xl.stats import median_sorted
from xl.tui.widgets.charts import bands

if TYPE_CHECKING:
    from xl.launcher.view.runview import RankView

Point = tuple[float, float]
SEED_RANKS = 256  # ranks whose histories give the spread from before the Monitor opened
_LAST_SEEN = attrgetter("last_seen")
KEEP = 600  # points kept a line: the older half is thinned to every other point past it


class Spread:
    """One chart's (time, min, median, max) points, grown a poll at a time."""

    def __init__(self) -> None:
        self.xs: list[float] = []
        self.lo: list[float] = []
        self.mid: list[float] = []
        self.hi: list[float] = []
        self.seeded = False
        self.version = 0  # bumped whenever a point is added

    def update(self, ranks: Mapping[int, RankView], value: str, history: str) -> bool:
        """Take this poll's ranks: their latest ``value`` (a RankView field, e.g. ``loss``) at
        the newest ``last_seen``; the first time, the spread of their ``history`` (e.g.
        ``loss_history``) before it. True when a point was added."""
        if not self.seeded:
            self.seeded = True
            self._seed(ranks, history)
        rvs = ranks.values()
        values = [v for v in map(attrgetter(value), rvs) if v is not None and v - v == 0]
        latest = max((t for t in map(_LAST_SEEN, rvs) if t is not None), default=None)
        if not values or latest is None or (self.xs and latest <= self.xs[-1]):
            return False
        values.sort()
        self._add(latest, values[0], median_sorted(values), values[-1])
        self.version += 1
        return True

    def _seed(self, ranks: Mapping[int, RankView], history: str) -> None:
        chosen = sorted(ranks)
        step = max(1, len(chosen) // SEED_RANKS)
        sample = {r: getattr(ranks[r], history) for r in chosen[::step]}
        xs, lo, mid, hi = bands({r: pts for r, pts in sample.items() if len(pts) > 1})
        for point in zip(xs, lo, mid, hi, strict=True):
            self._add(*point)

    def _add(self, t: float, lo: float, mid: float, hi: float) -> None:
        self.xs.append(t)
        self.lo.append(lo)
        self.mid.append(mid)
        self.hi.append(hi)
        if len(self.xs) > KEEP:  # thin the older half: the whole run stays on the chart
            half = KEEP // 2
            for line in (self.xs, self.lo, self.mid, self.hi):
                line[:half] = line[:half:2]

    def lines(self, t0: float) -> Iterable[tuple[str, list[Point]]]:
        """("max" | "median" | "min", points with times from ``t0``)."""
        xs = [x - t0 for x in self.xs]
        for label, values in (("max", self.hi), ("median", self.mid), ("min", self.lo)):
            yield label, list(zip(xs, values, strict=True))
