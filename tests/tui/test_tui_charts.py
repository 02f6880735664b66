"""The Monitor's charts: what the braille plot draws, and the chart widget in the Monitor."""

from __future__ import annotations

import math
import shutil

import runfixtures
from pilotwait import until
from where import FIXTURES

from xl.tui.app import build_app
from xl.tui.widgets.charts import (
    WIDE_MIN_INTERVAL_S,
    MetricChart,
    bands,
    plot,
    tick,
)

RUNS_FIXTURES = FIXTURES / "runs"
NOW = runfixtures.T0 + 130


def dots(rows: list[list[tuple[str, str | None]]]) -> list[str]:
    return ["".join(char for char, _ in row) for row in rows]


def test_a_rising_line_goes_from_bottom_left_to_top_right():
    drawn = plot([("r0", "cyan", [(float(x), float(x)) for x in range(100)])], 20, 5)
    assert drawn is not None
    rows, (x_min, x_max, y_min, y_max) = drawn
    assert (x_min, x_max, y_min, y_max) == (0, 99, 0, 99)
    lines = dots(rows)
    assert lines[-1][0] != " " and lines[0][-1] != " "  # starts bottom left, ends top right
    assert lines[0][0] == " " and lines[-1][-1] == " "
    assert all(colour == "cyan" for row in rows for char, colour in row if char != " ")


def test_later_lines_draw_over_earlier_ones_and_a_flat_line_sits_mid_height():
    rows, (_, _, y_min, y_max) = plot([("a", "red", [(0, 5.0), (10, 5.0)])], 10, 5)
    assert y_min < 5.0 < y_max
    assert [i for i, line in enumerate(dots(rows)) if line.strip()] == [2]
    rows, _ = plot(
        [
            ("a", "red", [(0, 1.0), (10, 1.0)]),
            ("b", "blue", [(0, 1.0), (10, 1.0)]),
            ("c", "red", [(0, 0.0)]),
        ],
        10,
        4,
    )
    assert {colour for row in rows for char, colour in row if char != " "} == {"blue", "red"}
    assert rows[0][5][1] == "blue"  # b's line, drawn after a's, shows


def test_non_finite_values_are_skipped_and_nothing_finite_draws_nothing():
    assert plot([("a", "red", [(0, math.nan), (1, math.inf)])], 10, 4) is None
    _, (_, _, y_min, y_max) = plot([("a", "red", [(0, 1.0), (1, math.nan), (2, 3.0)])], 10, 4)
    assert (y_min, y_max) == (1.0, 3.0)
    x, lo, mid, hi = bands({0: [(0.0, 1.0), (1.0, math.nan)], 1: [(0.0, 3.0)]}, bins=2)
    assert (lo, mid, hi) == ([1.0], [2.0], [3.0]) and len(x) == 1


def test_a_long_series_keeps_its_spike():
    """10,000 points are thinned to a few per dot column, but a one-point spike still shows."""
    points = [(float(i), 1.0) for i in range(10_000)]
    points[5_123] = (5_123.0, 100.0)
    rows, (_, _, _, y_max) = plot([("r0", "cyan", points)], 40, 6)
    assert y_max == 100.0
    assert dots(rows)[0].strip()  # the top row has the spike's dots


def test_axis_ticks_stay_short():
    assert [tick(v) for v in (0, 0.01234, 1.5, 532, 12_400, 3.2e6)] == [
        "0",
        "0.0123",
        "1.5",
        "532",
        "12.4k",
        "3.2M",
    ]


def _text(chart: MetricChart) -> list[str]:
    return ["".join(s.text for s in chart.render_line(y)) for y in range(chart.size.height)]


async def test_the_monitor_draws_loss_per_rank_and_bands_for_wide_runs(tmp_path, monkeypatch):
    runs = tmp_path / "xlhome" / "runs"
    shutil.copytree(RUNS_FIXTURES, runs)
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    app = build_app(
        monitor_run_dir=runs / "20260530-straggler", clock=lambda: NOW, poll_interval=0.2
    )
    async with app.run_test(size=(120, 40)) as pilot:
        chart = app.screen.query_one("#chart-loss", MetricChart)
        await until(pilot, lambda: "r1" in _text(chart)[0], "the loss chart's legend")
        lines = _text(chart)
        assert lines[0].split()[:5] == ["loss", "━", "r0", "━", "r1"]
        # The y axis spans the ranks' losses: the first loss logged is the highest.
        top = float(lines[1].split()[0])
        assert 2.0 < top < 3.0
        assert sum(1 for line in lines[1:-1] if any(0x2800 < ord(c) <= 0x28FF for c in line)) >= 5
        assert lines[-1].strip().startswith("└")
    app = build_app(monitor_run_dir=runs / "20260530-wide", clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        chart = app.screen.query_one("#chart-loss", MetricChart)
        await until(pilot, lambda: "median" in _text(chart)[0], "bands for 64 ranks")
        assert " r0 " not in _text(chart)[0] + " "  # the spread, not 64 lines of their own
        # Choosing a rank adds its line at once, without waiting for the wide-run redraw interval.
        await pilot.press("right_square_bracket")
        await until(
            pilot,
            lambda: "rank 1" in _text(chart)[0],
            "rank 1's line",
            timeout=WIDE_MIN_INTERVAL_S / 2,
        )
