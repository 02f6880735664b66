"""The app's comparison: Runs marks two runs with space, c opens them side by side (the table and
one chart of both runs' loss and samples/s over steps). Two real runs (gloo CPU ranks through
the real `xl launch`) that differ in one argument; driven with Pilot, and in tmux at 80x24.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pilotwait import until
from procs import XL, kill_run, wait_no_processes, xl, xl_env
from textual.widgets import DataTable, Static
from tmuxterm import Tmux, wait_for
from where import SUPPORT

from xl.tui.app import build_app
from xl.tui.screens.compare import CompareChart, CompareScreen

pytestmark = pytest.mark.e2e

SCRIPT = SUPPORT / "stall_ddp.py"
SMALL = (80, 24)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("tui-compare-home")
    env = xl_env(home)
    argvs = {"slow": ["--lr", "0.05"], "fast": []}
    procs = {
        name: subprocess.Popen(
            [
                *XL, "launch", "--no-tui", "--nproc", "2", "--name", name, str(SCRIPT), "--steps",
                "60", *args,
            ],
            env=env,
            cwd=home,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, args in argvs.items()
    }
    dirs: list[Path] = []
    try:
        for proc in procs.values():
            out, _ = proc.communicate(timeout=240)
            assert proc.returncode == 0, out[-2000:]
        dirs = [Path(r["run_dir"]) for r in json.loads(xl(["runs", "--json"], env).stdout)]
        assert len(dirs) == 2
        yield home
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        for run_dir in dirs:
            kill_run(run_dir)
            wait_no_processes(run_dir, timeout=30)


def _ids(home: Path) -> list[str]:
    """Run ids as the Runs screen lists them: newest first."""
    runs = json.loads(xl(["runs", "--json"], xl_env(home)).stdout)
    return [r["run_id"] for r in sorted(runs, key=lambda r: r["started_at"], reverse=True)]


def _args(run_id: str) -> str:
    """What the runs' args look like in the table (they were launched at once: either is first)."""
    return "--steps 60 --lr 0.05" if "-slow-" in run_id else "--steps 60"


@pytest.fixture
def app_env(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XL_HOME", str(home))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    return home


def _chart_text(chart: CompareChart) -> str:
    return "\n".join(chart.render_line(y).text for y in range(chart.size.height))


async def test_space_marks_two_runs_and_c_compares_them(app_env: Path) -> None:
    ids = _ids(app_env)
    app = build_app()
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("4")
        table = app.screen.query_one("#runs-table", DataTable)
        await until(pilot, lambda: table.row_count == 2, "both runs listed")
        await pilot.press("c")  # nothing marked: a hint, no comparison
        await pilot.pause()
        assert app.screen.id == "runs"
        await pilot.press("space", "space")  # a mark pressed twice is taken back
        assert app.screen.marked == []  # type: ignore[attr-defined]
        await pilot.press("space", "down", "space")
        assert app.screen.marked == ids  # type: ignore[attr-defined]
        assert "reverse" in str(table.get_cell(ids[0], "id").style)  # a marked run's id stands out
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, CompareScreen), "the comparison opened")
        screen = app.screen
        body = screen.query_one("#compare-table", Static)
        await until(pilot, lambda: "step time" in str(body.render()), "the comparison made")
        text = str(body.render())
        # The one thing that differs, and the figures of both runs.
        args = next(line for line in text.splitlines() if line.strip().startswith("args"))
        assert args.split(None, 1)[1].split("  ")[0] == _args(ids[0]) and args.rstrip().endswith(
            _args(ids[1])
        ), args
        for label in ("samples/s", "startup", "training", "shutdown", "loss (60 steps)"):
            assert label in text, label
        assert all(len(line) <= SMALL[0] for line in text.splitlines())
        heading = str(screen.query_one("#compare-runs", Static).render())
        assert f"A {ids[0]}" in heading and f"B {ids[1]}" in heading
        # One chart: both runs' loss above, both runs' samples/s below, over the same steps.
        chart = screen.query_one(CompareChart)
        assert chart.size.height >= 9 and chart.region.bottom <= SMALL[1] - 1  # above the footer
        drawn = _chart_text(chart)
        assert (
            " loss " in drawn
            and " samples/s " in drawn
            and "step 1" in drawn
            and "step 60" in drawn
        )
        assert drawn.count("━ A") == 2 and drawn.count("━ B") == 2
        assert any(ch in drawn for ch in "⠁⠂⠄⡀⠈⠐⠠⢀")  # points plotted, not only the legend
        await pilot.press("escape")
        await until(pilot, lambda: app.screen.id == "runs", "back to Runs")


async def test_a_damaged_run_is_said_on_the_screen(app_env: Path, tmp_path: Path) -> None:
    runs_dir = app_env / "runs"
    damaged = runs_dir / "29990101-000000-damaged"
    damaged.mkdir()
    try:
        (damaged / "run.json").write_text("{not json")
        app = build_app()
        async with app.run_test(size=SMALL) as pilot:
            await pilot.press("4")
            table = app.screen.query_one("#runs-table", DataTable)
            await until(pilot, lambda: table.row_count == 3, "three runs listed")
            await pilot.press("space", "down", "space", "c")  # the damaged run is listed first
            await until(
                pilot, lambda: isinstance(app.screen, CompareScreen), "the comparison opened"
            )
            body = app.screen.query_one("#compare-table", Static)
            await until(pilot, lambda: "Cannot compare" in str(body.render()), "the damage said")
            assert "damaged" in str(body.render())
    finally:
        shutil.rmtree(damaged)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_the_comparison_reads_at_80x24_in_a_real_terminal(home: Path, tmp_path: Path) -> None:
    ids = _ids(home)
    env = {
        "XL_HOME": str(home),
        "XL_CONFIG_HOME": str(tmp_path / "config"),
        "TERM": "xterm-256color",
        "PATH": os.environ["PATH"],
    }
    tmux = Tmux()
    try:
        tmux.start("c", [sys.executable, "-m", "xl"], env, size=SMALL)
        screen = lambda: tmux.screen("c")  # noqa: E731 - read again at every poll
        wait_for(lambda: "GPUs" in screen(), "the app", screen=screen)
        tmux.keys("c", "4")
        wait_for(
            lambda: ids[0] in screen() and ids[1] in screen(), "both runs listed", screen=screen
        )
        tmux.keys("c", "Space")
        tmux.keys("c", "Down")
        tmux.keys("c", "Space")
        tmux.keys("c", "c")
        shown = wait_for(
            lambda: "samples/s" in (s := screen()) and "step 60" in s and s,
            "the comparison",
            screen=screen,
        )
        lines = shown.splitlines()
        assert len(lines) <= SMALL[1] and all(len(line) <= SMALL[0] for line in lines)
        assert f"A {ids[0]}" in shown and f"B {ids[1]}" in shown
        assert any(line.strip().startswith("args") and "--lr 0.05" in line for line in lines), shown
        assert " loss " in shown and "━ A" in shown and "━ B" in shown
        tmux.keys("c", "Escape")
        wait_for(
            lambda: "Run id" in screen() and "samples/s" not in screen(),
            "back to Runs",
            screen=screen,
        )
        tmux.keys("c", "q")
        wait_for(lambda: "xl-exit=0" in screen(), "the app to quit", screen=screen)
    finally:
        tmux.kill()


async def test_the_monitor_of_a_finished_run_says_where_its_time_went(app_env: Path) -> None:
    from xl.tui.widgets.text_lines import TextLines  # noqa: PLC0415 - only this test reads the header

    run_dir = app_env / "runs" / _ids(app_env)[0]
    app = build_app(monitor_run_dir=run_dir)
    async with app.run_test(size=SMALL) as pilot:
        header = app.screen.query_one("#run-header", TextLines)
        await until(
            pilot, lambda: "time: startup" in header.text.plain, "the accounting in the header"
        )
        line = header.text.plain.splitlines()[-1]
        assert line.startswith("time: startup ") and "training " in line and "shutdown " in line, (
            line
        )
