"""Spread: a big run's chart lines, a point a poll from every rank's latest value, checked
against the values the test gave the ranks."""

from __future__ import annotations

import math

from xl.launcher.view.runview import RankView
from xl.tui.widgets.spread import KEEP, Spread


def ranks_at(t: float, values: list[float | None]) -> dict[int, RankView]:
    return {r: RankView(rank=r, loss=v, last_seen=t) for r, v in enumerate(values)}


def test_a_point_a_poll_from_the_latest_values():
    spread = Spread()
    assert spread.update(ranks_at(10.0, [3.0, 1.0, 2.0, None, math.nan]), "loss", "loss_history")
    assert (spread.xs, spread.lo, spread.mid, spread.hi) == ([10.0], [1.0], [2.0], [3.0])
    # Nobody seen since: no point; seen again, with an even count the median is the mean of two.
    assert not spread.update(ranks_at(10.0, [9.0, 9.0]), "loss", "loss_history")
    assert spread.update(ranks_at(11.0, [4.0, 1.0, 2.0, 3.0]), "loss", "loss_history")
    assert (spread.xs[-1], spread.lo[-1], spread.mid[-1], spread.hi[-1]) == (11.0, 1.0, 2.5, 4.0)
    assert spread.version == 2


def test_the_history_before_the_first_poll_and_a_long_run_stay_bounded():
    history = tuple((float(t), 10.0 - t / 100) for t in range(100))
    ranks = {r: RankView(rank=r, loss=9.0, last_seen=100.0, loss_history=history) for r in range(4)}
    spread = Spread()
    spread.update(ranks, "loss", "loss_history")
    assert len(spread.xs) > 10 and spread.xs[0] < 2.0 and spread.xs[-1] == 100.0
    assert spread.hi[0] <= 10.0 and spread.lo[-1] == 9.0
    for t in range(101, 101 + 2 * KEEP):
        spread.update(ranks_at(float(t), [1.0, 2.0]), "loss", "loss_history")
    assert len(spread.xs) <= KEEP and spread.xs[0] < 2.0 and spread.xs[-1] == 100.0 + 2 * KEEP
    assert spread.xs == sorted(spread.xs)
