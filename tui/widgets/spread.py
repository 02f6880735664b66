"""A big run's charts: the spread of its ranks' latest values, one point a poll.

MetricChart's bands bucket every rank's whole history by time: at 4,096 ranks that is a quarter
of a million points sorted on the Monitor's main thread each time a chart redraws. Past
node_summary.BIG_RUN ranks the Monitor keeps this instead: each poll takes every rank's newest
point (one look per rank), and adds one (time, min, median, max) to the chart when any rank has a
newer point than the last one added. The history from before the Monitor opened comes once, at
its first poll, from the bands of an even sample of the ranks (SEED_RANKS).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from xl.tui.widgets.charts import bands

Point = tuple[float, float]
SEED_RANKS = 256  # ranks whose histories give the spread from before the Monitor opened
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

    def update(self, histories: Mapping[int, Sequence[Point]]) -> bool:
        """Take this poll's histories (rank -> its points); True when a point was added."""
        if not self.seeded:
            self.seeded = True
            self._seed(histories)
        latest_t: float | None = None
        values: list[float] = []
        for pts in histories.values():
            if not pts:
                continue
            t, v = pts[-1]
            if v - v == 0:  # finite: NaN and inf fail this
                values.append(v)
                if latest_t is None or t > latest_t:
                    latest_t = t
        if latest_t is None or (self.xs and latest_t <= self.xs[-1]):
            return self._bumped(False)
        values.sort()
        n = len(values)
        mid = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
        self._add(latest_t, values[0], mid, values[-1])
        return self._bumped(True)

    def _bumped(self, added: bool) -> bool:
        if added:
            self.version += 1
        return added

    def _seed(self, histories: Mapping[int, Sequence[Point]]) -> None:
        ranks = sorted(r for r, pts in histories.items() if len(pts) > 1)
        if not ranks:
            return
        step = max(1, len(ranks) // SEED_RANKS)
        sample = {r: histories[r] for r in ranks[::step]}
        xs, lo, mid, hi = bands(sample)
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
