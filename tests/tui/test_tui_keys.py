"""Keys as a new user presses them: Ctrl-C, `d`, focus and Escape, and the one GPU selection
shared by the picker and the Launch form. Pilot drives the real app; recorded runs stand in for
live ones and a backend that records stop() stands in for the supervisor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from monitorpilot import LIVE, NOW, StopBackend, copy_runs, launched_app, monitor_shown
from pilotwait import until
from textual.widgets import DataTable, Input, Static

from xl.tui import settings
from xl.tui.app import build_app, exit_code
from xl.tui.launchform import LaunchForm
from xl.tui.widgets.gpu_table import GPUTable
from xl.tui.widgets.rank_table import RankTable

SIZE = (120, 40)
DONE = "20260530-healthy"  # succeeded


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    return copy_runs(tmp_path, monkeypatch)


def text_of(app: Any, selector: str) -> str:
    return str(app.screen.query_one(selector, Static).render())


def exit_message(capsys: pytest.CaptureFixture[str]) -> str:
    """What the app printed as it closed (stderr), unwrapped."""
    return " ".join(capsys.readouterr().err.split())


# -- Ctrl-C ------------------------------------------------------------------------------------


async def test_ctrl_c_in_the_monitor_xl_launch_opened_stops_the_run(runs, capsys):
    """As torchrun and `--no-tui`: Ctrl-C stops the run the command started, the app closes once
    it has ended and the command exits 1 (stopped)."""
    backend = StopBackend()
    app = launched_app(backend, runs / LIVE)
    async with app.run_test(size=SIZE) as pilot:
        await monitor_shown(pilot)
        await pilot.press("ctrl+c")
        await until(pilot, lambda: not app.is_running, "the app closed once the run ended")
    assert backend.stopped == [runs / LIVE]
    assert exit_code(app) == 1
    assert f"xl: run {LIVE} stopped" in exit_message(capsys)  # the outcome stays on the terminal


async def test_second_ctrl_c_leaves_the_run_stopping(runs, capsys):
    backend = StopBackend(ends=False)
    app = launched_app(backend, runs / LIVE)
    async with app.run_test(size=SIZE) as pilot:
        await monitor_shown(pilot)
        await pilot.press("ctrl+c")
        await until(pilot, lambda: backend.stopped, "the stop asked for")
        assert app.is_running  # waiting for the run to end, the Monitor still showing it
        await pilot.press("ctrl+c")
        await until(pilot, lambda: not app.is_running, "the app closed at once")
    assert exit_code(app) == 130
    assert "stopping" in exit_message(capsys)


async def test_ctrl_c_elsewhere_quits_as_q_does(runs, capsys):
    """`xl attach` (a run the command did not start) and the bare app: Ctrl-C is `q`, and no run
    is stopped (Textual's own Ctrl-C only said "press ctrl+q")."""
    backend = StopBackend()
    app = build_app(backend, monitor_run_dir=runs / LIVE, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await monitor_shown(pilot)
        await pilot.press("ctrl+c")
        await until(pilot, lambda: not app.is_running, "`xl attach` closed")
    assert backend.stopped == [] and exit_code(app) == 0
    assert f"xl attach {LIVE}" in exit_message(capsys)  # detached: how to come back

    app = build_app(backend, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: app.screen.id == "launch", "Launch")
        await pilot.press("ctrl+c")  # even from inside a form field
        await until(pilot, lambda: not app.is_running, "the app quit")
    assert backend.stopped == [] and app.return_code == 0


# -- `d` ---------------------------------------------------------------------------------------


async def test_d_in_the_apps_monitor_goes_back_and_in_xl_launch_detaches(runs, capsys):
    backend = StopBackend()
    app = build_app(backend, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await until(
            pilot,
            lambda: app.screen.id == "runs" and app.screen.query_one(DataTable).row_count == 5,
            "Runs",
        )
        runs_screen = app.screen
        table = app.screen.query_one(DataTable)
        table.move_cursor(row=table.get_row_index(LIVE))
        await pilot.press("enter")
        monitor = await monitor_shown(pilot)
        assert monitor.status == "running"
        await pilot.press("d")
        await until(pilot, lambda: app.screen is runs_screen, "back on Runs, as escape does")
        assert app.is_running and backend.stopped == []

    # `xl launch`: d on the run it started closes the app, the run goes on (exit 0).
    app = launched_app(backend, runs / LIVE)
    async with app.run_test(size=SIZE) as pilot:
        await monitor_shown(pilot)
        await pilot.press("d")
        await until(pilot, lambda: not app.is_running, "detached")
    assert backend.stopped == [] and exit_code(app) == 0
    assert "keeps running" in exit_message(capsys)


# -- Focus and Escape --------------------------------------------------------------------------


async def test_each_screen_focuses_its_main_widget_and_escape_leaves_a_field(simnvml, runs):
    sim = simnvml(gpus=2)
    with sim.in_process():
        app = build_app(StopBackend(), clock=lambda: NOW, poll_interval=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await until(
                pilot, lambda: isinstance(app.focused, GPUTable), "GPUs: the table has the focus"
            )
            await pilot.press("2")
            await until(
                pilot,
                lambda: app.focused is app.screen.query_one("#doctor-table"),
                "Doctor: its table",
            )
            await pilot.press("3")
            await until(pilot, lambda: app.screen.id == "launch", "Launch")
            target = app.screen.query_one("#target", Input)
            assert app.focused is target  # typing goes into the Script field at once
            await pilot.press("t", "r", "a", "i", "n", ".", "p", "y", "3", "q")
            assert target.value == "train.py3q" and app.screen.id == "launch" and app.is_running
            footer_keys = {
                b.key
                for _, b, enabled, _ in app.screen.active_bindings.values()
                if enabled and b.show
            }
            assert "escape" in footer_keys  # "esc Leave field" in the footer while in a field
            await pilot.press("escape")
            assert not isinstance(app.focused, Input)
            await pilot.press("4")  # now a screen key, not text
            await until(pilot, lambda: app.screen.id == "runs", "Runs")
            assert target.value == "train.py3q"
            await until(
                pilot, lambda: app.focused is app.screen.query_one("#runs-table"), "Runs: its table"
            )
            await until(
                pilot, lambda: app.screen.query_one(DataTable).row_count == 5, "runs listed"
            )
            await pilot.press("enter")
            await monitor_shown(pilot)
            assert isinstance(app.focused, RankTable)


async def test_back_from_the_monitor_no_launch_field_takes_the_screen_keys(simnvml, runs):
    """The issue's case: launch, `esc` out of the Monitor, press `4`: it used to land in the GPUs
    field ("1,3" became "1,34"); now it opens Runs."""

    class Starts(StopBackend):
        def start(self, spec: Any, plan: Any = None) -> Any:
            class Handle:
                run_dir = runs / LIVE

            return Handle(), None

    sim = simnvml(gpus=4)
    with sim.in_process():
        app = build_app(Starts(), clock=lambda: NOW, poll_interval=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.screen.query_one(GPUTable).row_count == 4, "GPU rows")
            await pilot.press("3")
            await until(pilot, lambda: app.screen.id == "launch", "Launch")
            launch = app.screen
            launch.query_one("#target", Input).value = "train.py"
            launch.query_one("#gpus", Input).focus()
            launch.query_one("#gpus", Input).value = "1,3"
            await until(pilot, lambda: launch.valid, "a valid form")
            await pilot.press("ctrl+r")
            await monitor_shown(pilot)
            await pilot.press("escape")
            await until(pilot, lambda: app.screen is launch, "back on Launch")
            await pilot.press("4")
            await until(pilot, lambda: app.screen.id == "runs", "4 opens Runs")
            assert launch.query_one("#gpus", Input).value == "1,3"


# -- One GPU selection -------------------------------------------------------------------------


async def test_picker_and_launch_form_show_one_selection(simnvml, runs):
    sim = simnvml(gpus=4)
    with sim.in_process():
        app = build_app(StopBackend(), poll_interval=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.screen.query_one(GPUTable).row_count == 4, "GPU rows")
            gpus = app.screen
            await pilot.press("space", "down", "space")
            assert "CUDA_VISIBLE_DEVICES=0,1" in text_of(app, "#cvd")
            await pilot.press("3")
            await until(pilot, lambda: app.screen.id == "launch", "Launch")
            launch = app.screen
            assert launch.query_one("#gpus", Input).value == "0,1"

            # Clear on the picker: the form follows, and would launch on every GPU.
            await pilot.press("escape", "1")
            await until(pilot, lambda: app.screen is gpus, "GPUs")
            await pilot.press("c")
            assert "the launch uses every GPU" in text_of(app, "#cvd")
            await pilot.press("3")
            await until(pilot, lambda: app.screen is launch, "Launch")
            assert launch.query_one("#gpus", Input).value == ""
            launch.query_one("#target", Input).value = "train.py"
            await until(pilot, lambda: launch.valid, "valid")
            assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in text_of(app, "#launch-validation")

            # Typed in the form: the picker shows it.
            launch.query_one("#gpus", Input).value = "3,2"
            await pilot.pause()
            await pilot.press("escape", "1")
            await until(pilot, lambda: app.screen is gpus, "GPUs")
            assert "CUDA_VISIBLE_DEVICES=3,2" in text_of(app, "#cvd")
            assert str(gpus.query_one(GPUTable).get_cell("3", "sel")) == "[1]"
            await pilot.press("3")
            await until(pilot, lambda: app.screen is launch, "Launch")
            launch.query_one("#gpus", Input).value = "auto:2"
            await pilot.pause()
            await pilot.press("escape", "1")
            await until(pilot, lambda: app.screen is gpus, "GPUs")
            assert "--gpus auto:2" in text_of(app, "#cvd")
            assert all(
                str(gpus.query_one(GPUTable).get_cell(str(i), "sel")) == "[ ]" for i in range(4)
            )


async def test_a_scripts_remembered_gpus_are_its_own_never_the_next_xl_s_pick(simnvml, runs):
    """The GPUs last launched with train.py: the next `xl` opens with none picked, and opening
    the Launch form on train.py leaves it so (its other settings come back); typed again, train.py
    brings its GPUs back (the picker then shows them), says so, and they leave with it when Script
    names another script or nothing."""
    settings.remember(
        "train.py", LaunchForm(target="train.py", args="--lr 3e-4", gpus="1,3").to_dict()
    )
    sim = simnvml(gpus=4)
    with sim.in_process():
        app = build_app(StopBackend(), poll_interval=0.2)
        async with app.run_test(size=SIZE) as pilot:
            gpus = app.screen
            await until(pilot, lambda: gpus.query_one(GPUTable).row_count == 4, "GPU rows")
            await until(
                pilot,
                lambda: "No GPU picked" in text_of(app, "#cvd"),
                "the picker says none is picked",
            )
            assert app.selection.order == []
            assert all(
                str(gpus.query_one(GPUTable).get_cell(str(i), "sel")) == "[ ]" for i in range(4)
            )
            await pilot.press("3")
            await until(pilot, lambda: app.screen.id == "launch", "Launch")
            launch = app.screen
            field = {
                name: launch.query_one(f"#{name}", Input) for name in ("target", "args", "gpus")
            }
            assert (field["target"].value, field["args"].value, field["gpus"].value) == (
                "train.py",
                "--lr 3e-4",
                "",
            )
            assert app.selection.order == []
            await until(
                pilot,
                lambda: "Args: as train.py was last launched" in text_of(app, "#launch-validation"),
                "the note",
            )
            # Script emptied: train.py's settings go with it, the picker's too.
            field["target"].value = ""
            await until(
                pilot,
                lambda: field["args"].value == "" and field["gpus"].value == "",
                "train.py's settings gone",
            )
            assert app.selection.order == [] and "last launched" not in text_of(
                app, "#launch-validation"
            )
            # Back to train.py: they come back; a value the person changes is theirs and stays.
            field["target"].value = "train.py"
            await until(
                pilot,
                lambda: field["args"].value == "--lr 3e-4" and field["gpus"].value == "1,3",
                "train.py's settings back",
            )
            field["args"].value = "--lr 1e-3"
            await pilot.pause()
            await until(
                pilot,
                lambda: "GPUs: as train.py was last launched" in text_of(app, "#launch-validation"),
                "the note",
            )
            field["target"].value = "other.py"
            await until(pilot, lambda: field["gpus"].value == "", "train.py's GPUs gone")
            assert field["args"].value == "--lr 1e-3" and app.selection.order == []
            # GPUs picked on the GPUs screen are the person's: another script does not replace them.
            await pilot.press("escape", "1")
            await until(pilot, lambda: app.screen is gpus, "GPUs")
            await pilot.press("down", "down", "space")
            await until(pilot, lambda: app.selection.order == [2], "GPU 2 picked")
            await pilot.press("3")
            await until(
                pilot,
                lambda: app.screen is launch and field["gpus"].value == "2",
                "the pick in the form",
            )
            field["target"].value = "train.py"
            await until(
                pilot, lambda: field["args"].value == "--lr 1e-3", "the form handled train.py"
            )
            await pilot.pause()
            assert field["gpus"].value == "2" and app.selection.order == [2]


# -- A Monitor opened small -------------------------------------------------------------------


async def test_a_monitor_opened_small_shows_its_charts_once_the_terminal_grows(runs):
    app = build_app(monitor_run_dir=runs / "20260530-twonode", clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        await monitor_shown(pilot)
        charts = app.screen.query_one("#charts")
        assert not charts.display  # no room at 80x24
        await pilot.resize_terminal(200, 60)
        await until(pilot, lambda: charts.display, "the charts after the terminal grew")
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: not charts.display, "hidden again when it shrank")
        await pilot.press("c")  # the person's choice wins over the size from now on
        assert charts.display
        await pilot.resize_terminal(100, 25)
        await pilot.pause()
        assert charts.display
