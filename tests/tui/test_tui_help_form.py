"""`?` shows the keys of the screen it was pressed on (the stacks view included, which now has a
footer); the Launch form never brings back a one-off multi-node setting, and a script's
remembered settings never undo what is being typed. Pilot drives the real app."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import runfixtures
from pilotwait import until
from textual import events
from textual.widgets import Input, Static
from textual.widgets._footer import FooterKey
from where import FIXTURES

from xl.doctor.report import Report
from xl.launcher.stacks.model import StacksDoc
from xl.tui import settings
from xl.tui.app import build_app
from xl.tui.backend import LocalBackend
from xl.tui.launchform import LaunchForm
from xl.tui.screens.help import HelpScreen
from xl.tui.screens.monitor import MonitorScreen
from xl.tui.screens.stacks import StacksScreen

RUNS_FIXTURES = FIXTURES / "runs"
SIZE = (120, 40)
NOW = runfixtures.T0 + 130
LIVE = "20260530-straggler"


class Backend(LocalBackend):
    """This machine, with an empty doctor and a stacks document of two ranks, rank 1 the culprit."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[Path] = []

    def doctor_report(self) -> Report:
        return Report(checks=[])

    def stacks(self, run_dir: Path) -> StacksDoc:
        self.asked.append(run_dir)
        frames = {0: ("train.py", 41, "main"), 1: ("data.py", 30, "load")}
        return StacksDoc.from_json({
            "run_id": run_dir.name,
            "t": NOW,
            "ranks": [
                {
                    "rank": r,
                    "pid": 100 + r,
                    "threads": [
                        {"name": "MainThread", "frames": [{"file": f, "line": n, "function": fn}]}
                    ],
                    "collectives": [],
                }
                for r, (f, n, fn) in frames.items()
            ],
            "verdict": {
                "ranks": [1],
                "message": "rank 1 never entered all_reduce #12: it is in load at data.py:30",
            },
        })


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(RUNS_FIXTURES, tmp_path / "xlhome" / "runs")
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


@asynccontextmanager
async def _on_launch(simnvml: Any) -> AsyncIterator[tuple[Any, Any]]:
    """The app on two simulated GPUs, on its Launch screen: (app, pilot)."""
    sim = simnvml(gpus=2)
    with sim.in_process():
        app = build_app(Backend(), clock=lambda: NOW, poll_interval=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("3")
            await until(pilot, lambda: app.screen.id == "launch", "Launch")
            yield app, pilot


async def _help(pilot: Any, key: str = "question_mark") -> str:
    app = pilot.app
    await pilot.press(key)
    await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
    text = app.screen.text
    await pilot.press("escape")
    await until(pilot, lambda: not isinstance(app.screen, HelpScreen), "the help closed")
    return text


async def test_help_is_the_keys_of_the_screen_it_was_pressed_on(simnvml, home):
    sim = simnvml(gpus=2)
    with sim.in_process():
        app = build_app(Backend(), clock=lambda: NOW, poll_interval=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.screen.id == "gpus" and app.screen.gpus, "GPUs")
            gpus = await _help(pilot)
            assert (
                gpus.startswith("# GPUs") and "`c`: clear the pick" in gpus and "`4` Runs" in gpus
            )
            await pilot.press("2")
            await until(pilot, lambda: app.screen.id == "doctor", "Doctor")
            doctor = await _help(pilot)
            assert doctor.startswith("# Doctor") and "`r`: run every check again" in doctor
            await pilot.press("3")
            await until(pilot, lambda: app.screen.id == "launch", "Launch")
            # `?` types into the Script field, which has the focus
            launch = await _help(pilot, "f1")
            assert (
                launch.startswith("# Launch")
                and "`ctrl+r`: launch" in launch
                and "`esc`: leave the field" in launch
            )
            await pilot.press("escape", "4")
            await until(pilot, lambda: app.screen.id == "runs", "Runs")
            runs = await _help(pilot)
            assert runs.startswith("# Runs") and "`enter` / click: open it in the Monitor" in runs
            assert "`space`: mark the run" in runs and "`c`: compare the two marked runs" in runs
            assert len({gpus, doctor, launch, runs}) == 4
            for text in (gpus, doctor, runs):  # not another screen's keys
                assert "ctrl+r" not in text and "stop the run" not in text


async def test_the_stacks_view_has_a_footer_help_and_the_whole_run_s_verdict(home):
    backend = Backend()
    app = build_app(
        backend,
        monitor_run_dir=home / "xlhome" / "runs" / LIVE,
        clock=lambda: NOW,
        poll_interval=0.2,
    )
    async with app.run_test(size=SIZE) as pilot:
        await until(
            pilot,
            lambda: isinstance(app.screen, MonitorScreen) and app.screen.status == "running",
            "the Monitor",
        )
        monitor = await _help(pilot)
        assert (
            monitor.startswith("# Monitor")
            and "`k`: ask every rank" in monitor
            and "`s`: stop the run" in monitor
        )
        assert "`1` GPUs" not in monitor  # `xl attach` shows the Monitor alone
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, StacksScreen), "the stacks view")
        stacks = app.screen
        body = stacks.query_one("#stacks-text", Static)
        await until(pilot, lambda: "pid 10" in str(body.render()), "the chosen rank's stacks")
        assert backend.asked == [home / "xlhome" / "runs" / LIVE]  # every rank asked, not one
        shown = str(body.render())
        rank = stacks.rank
        assert "verdict (all 2 ranks): rank 1 never entered all_reduce #12" in shown
        footer = {k.action for k in stacks.query(FooterKey)}
        assert {"refresh", "rank(-1)", "close", "app.help"} <= footer, footer
        await pilot.press("right_square_bracket")
        other = str(body.render())
        assert stacks.rank != rank and f"pid {100 + stacks.rank}" in other
        # the same verdict
        assert "verdict (all 2 ranks): rank 1 never entered all_reduce #12" in other
        help_text = await _help(pilot)
        assert help_text.startswith("# Stacks") and "`[` / `]`" in help_text
        assert app.screen is stacks
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "back to the Monitor")


async def test_a_multi_node_launch_is_not_remembered_for_its_script(simnvml, home):
    """Launched once as node 0 of 2: typing the script again brings back its other settings but
    not Nodes 2 (which made the next ctrl+r wait for a node that never came); settings an older
    xl remembered with nodes are read the same way."""
    settings.remember(
        "train.py",
        {
            **LaunchForm(
                target="train.py", args="lr=0.1", nnodes="2", rdzv="10.0.0.1:29400"
            ).to_dict()
        },
    )
    async with _on_launch(simnvml) as (app, pilot):
        launch = app.screen
        # the last script, at start
        assert launch.query_one("#target", Input).value == "train.py"
        assert launch.query_one("#args", Input).value == "lr=0.1"
        assert (
            launch.query_one("#nnodes", Input).value == "1"
            and launch.query_one("#rdzv", Input).value == ""
        )
        await until(pilot, lambda: launch.valid, "a valid form")
        assert "of 2" not in str(launch.query_one("#launch-validation", Static).render())

        # A multi-node form says so where it shows at 80x24, not only in the collapsed section.
        launch.query_one("#nnodes", Input).value = "2"
        launch.query_one("#rdzv", Input).value = "10.0.0.1:29400"
        await until(
            pilot,
            lambda: (
                "node 0 of 2" in str(launch.query_one("#launch-validation", Static).render())
            ),
            "the ready line names the nodes",
        )
        assert "waits for the others at 10.0.0.1:29400" in str(
            launch.query_one("#launch-validation", Static).render()
        )
    form = LaunchForm(target="train.py", nnodes="2", node_rank="0", rdzv="10.0.0.1:29400")
    assert {"nnodes", "node_rank", "rdzv"}.isdisjoint(form.remembered())
    assert form.remembered()["target"] == "train.py"


async def test_typing_past_a_remembered_script_keeps_every_key(simnvml, home):
    """The form fills in a remembered script's settings when its name is typed; keys typed after
    the name (fast, before the fill was handled) stay, in order."""
    settings.remember("train.py", LaunchForm(target="train.py", args="lr=0.1").remembered())
    # the last one: the form opens on it
    settings.remember("other.py", LaunchForm(target="other.py").remembered())
    async with _on_launch(simnvml) as (app, pilot):
        target = app.screen.query_one("#target", Input)
        target.value = ""
        await pilot.pause()
        for key in ("t", "r", "a", "i", "n", ".", "p", "y", "_", "v", "2"):
            target.post_message(events.Key(key, key))  # queued at once, as a fast typist's keys
        await until(
            pilot,
            lambda: target.value == "train.py_v2",
            f"every key, in order: {target.value!r}",
        )
        # train.py's settings came on the way and left with it: train.py_v2 has none.
        assert app.screen.query_one("#args", Input).value == ""
        target.value = "train.py"
        await until(
            pilot,
            lambda: app.screen.query_one("#args", Input).value == "lr=0.1",
            "train.py's settings",
        )


async def test_a_field_typed_while_a_script_change_waits_stays_the_persons(simnvml, home):
    """The person retypes a remembered value (Processes/node "2") while the Script field's change
    is still queued: when that change is handled, the old script's settings leave, but the value
    the person typed is theirs, equal to the old memory's or not."""
    remembered = LaunchForm(target="train.py", nproc="2", args="lr=0.1").remembered()
    settings.remember("train.py", remembered)
    (home / "new.py").write_text("print('hi')\n")
    async with _on_launch(simnvml) as (app, pilot):
        nproc = app.screen.query_one("#nproc", Input)
        args = app.screen.query_one("#args", Input)
        assert nproc.value == "2" and args.value == "lr=0.1"  # train.py's memory
        # In one tick, before any message is handled: a new script, and "2" typed again.
        app.screen.query_one("#target", Input).value = "new.py"
        nproc.value = ""
        nproc.value = "2"
        await until(pilot, lambda: args.value == "", "train.py's Args to leave with it")
        await pilot.pause()
        assert nproc.value == "2"
        assert "ready: 2 process(es)" in str(
            app.screen.query_one("#launch-validation", Static).render()
        )
