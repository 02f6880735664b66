"""Runs and Monitor screens fed recorded run directories (tests/fixtures/runs, runfixtures.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import runfixtures
from textual.widgets import DataTable, Static

from xl.tui.app import build_app
from xl.tui.screens.monitor import MonitorScreen
from xl.tui.widgets.rank_log import RankLog
from xl.tui.widgets.rank_table import RankTable

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
SIZE = (120, 40)
NOW = runfixtures.T0 + 130  # a fixed "now": stable elapsed and last-seen values


async def until(pilot, predicate, what: str, tries: int = 200) -> None:
    for _ in range(tries):
        if predicate():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"never happened: {what}")


def text_of(app, selector: str) -> str:
    return str(app.screen.query_one(selector, Static).render())


@pytest.fixture
def xl_home(tmp_path, monkeypatch) -> Path:
    runs = tmp_path / "xlhome" / "runs"
    shutil.copytree(FIXTURES, runs)
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    return runs


def cell(table: DataTable, row: str, col: str) -> str:
    return str(table.get_cell(row, col))


async def test_runs_lists_runs_and_opens_one_in_the_monitor(xl_home):
    app = build_app(clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await until(pilot, lambda: app.screen.id == "runs", "runs screen")
        table = app.screen.query_one("#runs-table", DataTable)
        await until(pilot, lambda: table.row_count == 4, "4 runs listed")
        assert cell(table, "20260530-failed", "status") == "failed"
        assert cell(table, "20260530-healthy", "status") == "succeeded"
        # run.json says running, but no supervisor is alive: the list says so.
        assert cell(table, "20260530-straggler", "status") == "orphaned"
        assert cell(table, "20260530-wide", "world") == "64"
        assert cell(table, "20260530-healthy", "dur") == "1m42s"
        assert cell(table, "20260530-failed", "name") == "llama-oom"
        table.move_cursor(row=table.get_row_index("20260530-failed"))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "monitor opened")
        assert app.screen.run_dir == xl_home / "20260530-failed"
        await until(pilot, lambda: "llama-oom" in text_of(app, "#run-header"), "header of the run")
        await pilot.press("escape")
        await until(pilot, lambda: app.screen.id == "runs", "back to runs")


async def test_monitor_healthy_run(xl_home):
    app = build_app(monitor_run_dir=xl_home / "20260530-healthy", clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        table = screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 2, "two ranks")
        header = text_of(app, "#run-header")
        assert "bert-finetune" in header and "succeeded" in header
        assert "world size 2" in header and "elapsed 1m42s" in header
        assert "GPU 1,0 (NVIDIA A100" in header  # devices in the chosen order
        assert cell(table, "0", "step") == "100/100"
        assert cell(table, "1", "gpu") == "0"
        assert cell(table, "0", "state") == "exited"
        assert not screen.query_one("#failure-banner").display
        assert "step 100/100" in str(screen.query_one("#eta").render())
        # The log follows the highlighted rank; ] switches rank.
        log = screen.query_one(RankLog)
        await until(pilot, lambda: log.rank == 0 and log.line_count > 0, "rank 0 log")
        assert "[rank 0] step 100" in "\n".join(log.lines)
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: log.rank == 1, "rank 1 log")
        assert all("[rank 1]" in line for line in log.lines if line)
        # Charts toggle.
        assert screen.query_one("#charts").display
        await pilot.press("c")
        assert not screen.query_one("#charts").display
        # Nothing to stop in a finished run; q leaves with 0.
        await pilot.press("s")
        assert isinstance(app.screen, MonitorScreen)
        await pilot.press("q")
    assert app.return_code == 0


async def test_monitor_straggler_run_names_the_slow_rank(xl_home):
    app = build_app(monitor_run_dir=xl_home / "20260530-straggler", clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 2, "two ranks")
        await until(pilot, lambda: cell(table, "1", "state") == "straggler", "rank 1 straggler")
        assert cell(table, "0", "state") != "straggler"
        assert int(cell(table, "0", "step").split("/")[0]) > int(cell(table, "1", "step").split("/")[0])
        assert app.screen.query_one("#progress-row").display


async def test_monitor_failed_run_shows_root_cause_and_traceback(xl_home):
    app = build_app(monitor_run_dir=xl_home / "20260530-failed", clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 2, "two ranks")
        banner = app.screen.query_one("#failure-banner", Static)
        await until(pilot, lambda: banner.display, "failure banner")
        text = str(banner.render())
        assert "rank 1 failed first" in text
        assert "torch.OutOfMemoryError: CUDA out of memory" in text
        assert cell(table, "1", "state") == "failed"
        await pilot.press("q")
    assert app.return_code == 0  # attach: looking at a failed run is not a failure


async def test_monitor_handles_64_ranks(xl_home):
    app = build_app(monitor_run_dir=xl_home / "20260530-wide", clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RankTable)
        await until(pilot, lambda: table.row_count == 64, "64 ranks")
        assert cell(table, "63", "node") == "node7"
        await pilot.press("left_square_bracket")  # wraps to the last rank
        log = app.screen.query_one(RankLog)
        await until(pilot, lambda: log.rank == 63, "rank 63 log")
