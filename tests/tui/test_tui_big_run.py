"""The Monitor past 64 ranks: nodes and outliers first, a node's ranks on `enter`
(docs/app.md, 'Past 64 ranks'). Runs held in memory (big_monitor_run.py): 16 nodes of 8 ranks,
the test sets which node is slow and which ranks failed or stalled, and checks what the Monitor
names against that."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pilotwait import until

from xl.tui.app import build_app
from xl.tui.screens.monitor import MonitorScreen
from xl.tui.screens.monitor_nodes import NodesView
from xl.tui.widgets.charts import MetricChart
from xl.tui.widgets.node_table import NodeTable
from xl.tui.widgets.rank_log import RankLog
from xl.tui.widgets.rank_table import RankTable
from xl.tui.widgets.text_lines import TextLines

_spec = importlib.util.spec_from_file_location(
    "big_monitor_run", Path(__file__).with_name("big_monitor_run.py")
)
assert _spec is not None and _spec.loader is not None
bigrun = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bigrun)

SIZE = (120, 40)
SLOW_NODE, FAILED, STALLED = bigrun.SLOW_NODE, bigrun.FAILED, bigrun.STALLED


def text_of(app, selector: str) -> str:
    return app.screen.query_one(selector, TextLines).text.plain


def monitor(run, size=SIZE):
    return build_app(
        bigrun.FakeRunBackend(run),
        monitor_run_dir=Path("/nonexistent/20261128-big"),
        clock=lambda: bigrun.T0 + run.now,
        poll_interval=0.2,
    ), size


async def test_a_big_run_leads_with_its_nodes_and_outliers():
    app, size = monitor(bigrun.troubled())
    async with app.run_test(size=size) as pilot:
        screen = app.screen
        nodes = screen.query_one(NodeTable)
        await until(pilot, lambda: len(nodes.rows) == 16, "a row per node")
        assert nodes.display and screen.query_one("#outliers").display
        assert not screen.query_one(RankTable).display  # no row per rank
        assert screen.focused is nodes
        slow = nodes.row_text(bigrun.host(SLOW_NODE))
        assert "slow ×2.2" in slow and "data 56%" in slow, slow
        assert "1.1" in slow and "8/8" in slow  # its min/median/max step time, all stepping
        failed = nodes.row_text(bigrun.host(FAILED // 8))
        assert "1 failed" in failed and "7/8" in failed and "slow" not in failed, failed
        assert "1 stalled" in nodes.row_text(bigrun.host(STALLED // 8))
        even = nodes.row_text(bigrun.host(0))
        assert "compute" in even and "slow" not in even and "failed" not in even, even
        out = text_of(app, "#outliers")
        # The slowest three are the slow node's: the straggler first.
        assert (
            "slowest (median rank 500ms):  rank 41 1.12s ×2.2 data on gpu-node-005  rank 4"
        ) in out, out
        assert "slow nodes:  gpu-node-005 ×2.2 data" in out
        assert "failed:  rank 77 on gpu-node-009 exit 3" in out
        assert "stalled:  rank 100 on gpu-node-012: has not stepped for 45 s" in out
        # The straggler banner keeps its phase.
        banner = screen.query_one("#straggler-banner")
        assert banner.display and "straggler  data : rank 41" in text_of(app, "#straggler-banner")

        # Drill down: the slow node's ranks in the rank table, escape back to the nodes.
        for _ in range(SLOW_NODE):
            await pilot.press("down")
        await pilot.press("enter")
        table = screen.query_one(RankTable)
        await until(pilot, lambda: table.display and table.row_count == 8, "the node's ranks")
        assert [str(c) for c in table.column("rank")] == [str(r) for r in range(40, 48)]
        assert not nodes.display and screen.focused is table
        assert "node gpu-node-005: its 8 ranks" in text_of(app, "#node-title")
        log = screen.query_one(RankLog)
        await until(pilot, lambda: log.rank == 40, "the log follows the node's first rank")
        await pilot.press("down")
        await until(pilot, lambda: log.rank == 41, "and the rank chosen")
        await pilot.press("escape")
        await until(pilot, lambda: nodes.display and not table.display, "back to the nodes")
        assert isinstance(app.screen, MonitorScreen) and screen.focused is nodes
        assert nodes.current is not None and nodes.current.node == bigrun.host(SLOW_NODE)


async def test_an_even_big_run_calls_nothing_slow():
    """128 ranks within ±2% of each other: the slowest are listed, and nothing is called slow,
    failed or stalled."""
    app, size = monitor(bigrun.FakeRun(128))
    async with app.run_test(size=size) as pilot:
        nodes = app.screen.query_one(NodeTable)
        await until(pilot, lambda: len(nodes.rows) == 16, "a row per node")
        out = text_of(app, "#outliers")
        assert out.startswith("slowest (median rank 500ms):") and out.count("  rank ") == 3, out
        assert "×" not in out and "slow nodes" not in out and "\n" not in out, out
        for row in nodes.rows:
            text = nodes.row_text(row.node)
            assert "8/8" in text and "compute 80%" in text, text
            assert row.slow is None and not row.down and "slow" not in text, text
        assert not app.screen.query_one("#straggler-banner").display


async def test_64_ranks_keep_a_row_per_rank():
    """At 64 ranks nothing changes: every rank's row, no node rows, no outliers."""
    run = bigrun.FakeRun(64)
    run.set(9, state="failed", exit_code=1)
    app, size = monitor(run)
    async with app.run_test(size=size) as pilot:
        screen = app.screen
        table = screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 64, "a row per rank")
        assert table.display and table.grouped and screen.focused is table
        assert not screen.query_one(NodeTable).display
        assert not screen.query_one("#outliers").display
        assert not screen.query_one("#node-title").display
        assert str(table.cell(9, "state")).startswith("failed")


async def test_a_big_run_charts_the_spread_a_poll_at_a_time():
    """Past 64 ranks the charts draw min / median / max and the followed rank, and each poll
    with newer points adds one point to them (no band over every rank's history)."""
    run = bigrun.FakeRun(128)
    app, size = monitor(run, size=(120, 50))
    async with app.run_test(size=size) as pilot:
        chart = app.screen.query_one("#chart-loss", MetricChart)
        await until(pilot, lambda: len(chart._lines) == 4, "the spread and the followed rank")
        assert [label for label, _, _ in chart._lines] == ["max", "median", "min", "rank 0"]
        spread = app.screen.query_one(NodesView).spreads["loss"]
        before = len(spread.xs)
        run.tick()
        await until(pilot, lambda: len(spread.xs) == before + 1, "a point for the new step")
        # The newest point is every rank's latest loss: min rank 0's, max rank 127's.
        latest = {r: rv.loss_history[-1][1] for r, rv in run.ranks.items()}
        assert spread.lo[-1] == min(latest.values()) and spread.hi[-1] == max(latest.values())
        run.tick(0)  # no newer point: nothing added
        await pilot.pause(0.6)
        assert len(spread.xs) == before + 1


async def test_ranks_not_running_are_listed_while_the_run_goes_on_not_once_it_ended():
    """A node whose 8 ranks exited early is one line of ranges; once the run has ended, every
    rank exited and none is listed, and nothing is called slow."""
    run = bigrun.FakeRun(128)
    for r in range(120, 128):
        run.set(r, state="exited", exit_code=0)
    app, size = monitor(run)
    async with app.run_test(size=size) as pilot:
        nodes = app.screen.query_one(NodeTable)
        await until(pilot, lambda: len(nodes.rows) == 16, "a row per node")
        await until(
            pilot,
            lambda: "exited:  8 ranks on 1 node: 120-127" in text_of(app, "#outliers"),
            "the exited node's ranks as one line",
        )
        assert "0/8" in nodes.row_text(bigrun.host(15)) and "8 exited" in nodes.row_text(
            bigrun.host(15)
        )
        await pilot.press("question_mark")
        await until(pilot, lambda: app.screen is not nodes.screen, "the help")
        assert "Past 64 ranks" in str(app.screen.text) and "`enter`: that node" in app.screen.text
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is nodes.screen, "back on the Monitor")
        for r in range(128):
            run.set(r, state="exited", exit_code=0)
        run.status = "succeeded"
        await until(
            pilot, lambda: "exited" not in text_of(app, "#outliers"), "no rank listed once over"
        )
        assert all(not row.down and row.slow is None for row in nodes.rows)


async def test_help_of_a_small_run_has_no_nodes_view():
    app, size = monitor(bigrun.FakeRun(16))
    async with app.run_test(size=size) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 16, "a row per rank")
        screen = app.screen
        await pilot.press("question_mark")
        await until(pilot, lambda: app.screen is not screen, "the help")
        assert "# Monitor" in app.screen.text and "Past 64 ranks" not in app.screen.text
