"""The Monitor's samples/s for a rank: its latest rate while it trains, the run's own figure
(samples / time in steps) once it ended, as the end table and `xl runs RUN` show it."""

from __future__ import annotations

import pytest

from xl.launcher.view.runview import RankView
from xl.tui.widgets.rank_cells import format_cells, rank_values

SPS = 5  # the samples/s value in rank_values' row


def _rank(state: str) -> RankView:
    # 135 samples over 10 s in steps: 13.5/s for the run; the last line's rate 42.8/s.
    return RankView(
        rank=0, state=state, samples_per_s=42.8, samples_counted=135.0, samples_time_s=10.0
    )


@pytest.mark.parametrize("state", ["exited", "failed", "stopped"])
def test_an_ended_rank_shows_the_run_s_rate(state: str) -> None:
    values = rank_values(_rank(state), 0.0, None)
    assert values[SPS] == pytest.approx(13.5)
    assert "13.5" in str(format_cells(values)["sps"])


@pytest.mark.parametrize("state", ["running", "straggler", "stalled"])
def test_a_live_rank_shows_its_latest_rate(state: str) -> None:
    assert rank_values(_rank(state), 0.0, None)[SPS] == pytest.approx(42.8)


def test_an_ended_rank_without_counts_keeps_its_last_rate() -> None:
    # A parsed log's rate comes without a count: there is no run figure to show instead.
    rv = RankView(rank=0, state="exited", samples_per_s=42.8)
    assert rank_values(rv, 0.0, None)[SPS] == pytest.approx(42.8)
