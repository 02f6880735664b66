"""The app reaches GPUs, the doctor, the launcher and the run store only through its Backend.

A fake backend that answers from memory (no NVML, no doctor probes, no supervisor) drives every
screen: what the person sees comes from it, and what they do (launch, stop) goes to it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import runfixtures
from pilotwait import until
from textual.widgets import DataTable, Input, Static
from where import FIXTURES

from xl.doctor.report import Check, Report
from xl.gpu.nvml import Driver, Inventory
from xl.launcher.control import RunHandle
from xl.launcher.plan import Plan
from xl.launcher.rundir.runrecord import RunRecord
from xl.launcher.rundir.store import RunInfo
from xl.launcher.spec import LaunchSpec
from xl.launcher.stacks.model import StacksDoc
from xl.launcher.view.reader import RunReader
from xl.tui.app import build_app, exit_code
from xl.tui.screens.monitor import MonitorScreen
from xl.tui.widgets.text_lines import TextLines

RUNS_FIXTURES = FIXTURES / "runs"
SIZE = (120, 40)
NOW = runfixtures.T0 + 130
NOTICE = "on the other node run: XL_TOKEN=abc xl launch --nnodes 2 --node-rank 1 train.py"


class FakeBackend:
    """Answers from memory and records what the app asked it to do."""

    read_only = False

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.started: list[LaunchSpec] = []
        self.started_plans: list[Plan | None] = []
        self.plans: list[Plan] = []  # every plan handed out, in order
        self.stopped: list[Path] = []
        self.asked_stacks: list[int] = []

    def inventory(self) -> Inventory:
        return Inventory(Driver(None, None, error="the fake backend has no driver"))

    def doctor_report(self) -> Report:
        return Report(
            checks=[
                Check(
                    id="fake",
                    status="warn",
                    title="A fake check",
                    detail="from the fake",
                    fix="none",
                )
            ]
        )

    def plan(self, spec: LaunchSpec) -> Plan:
        self.plans.append(Plan(argv=["torchrun"], env={"CUDA_VISIBLE_DEVICES": "5"}, nproc=3))
        return self.plans[-1]

    def start(self, spec: LaunchSpec, plan: Plan | None = None) -> tuple[RunHandle, str | None]:
        self.started.append(spec)
        self.started_plans.append(plan)
        return RunHandle(self.run_dir.name, self.run_dir, pid=0), NOTICE

    def runs(self) -> list[RunInfo]:
        return [
            RunInfo(
                self.run_dir.name, self.run_dir, "from-the-fake", "running", "train.py",
                runfixtures.T0, None, 2, [], True,
            )
        ]

    def resolve(self, run: str) -> Path:
        return self.run_dir

    def reader(self, run_dir: Path) -> RunReader:
        return RunReader(run_dir)

    def run_status(self, run_dir: Path) -> str | None:
        return "failed"

    def run_record(self, run_dir: Path) -> RunRecord | None:
        return RunRecord.from_json(
            {
                "run_id": run_dir.name,
                "status": "failed",
                "failure": {"rank": 1, "exit_code": 3, "message": "from the fake"},
            }
        )

    def stop(self, run_dir: Path) -> None:
        self.stopped.append(run_dir)

    def stacks(self, run_dir: Path) -> StacksDoc:
        self.asked_stacks.append(run_dir)
        frames = [{"file": "train.py", "line": 41, "function": "load_batch"}]
        return StacksDoc.from_json({
            "run_id": run_dir.name,
            "t": NOW,
            "ranks": [
                {
                    "rank": rank,
                    "node": "here",
                    "pid": 4240 + rank,
                    "threads": [{"name": "MainThread", "frames": frames}],
                    "collectives": [],
                }
                for rank in (0, 1)
            ],
            "verdict": {"ranks": [1], "message": "the others wait for rank 1"},
        })


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeBackend:
    # An empty run store and no GPU library: anything not asked of the fake would show nothing.
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "elsewhere" / "20260530-straggler"
    shutil.copytree(RUNS_FIXTURES / "20260530-straggler", run_dir)
    return FakeBackend(run_dir)


def text_of(app, selector: str) -> str:
    widget = app.screen.query_one(selector)
    return widget.text.plain if isinstance(widget, TextLines) else str(widget.render())


async def test_every_screen_shows_what_the_backend_says_and_stop_goes_to_it(fake):
    app = build_app(fake, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await until(
            pilot,
            lambda: "the fake backend has no driver" in text_of(app, "#no-gpu"),
            "the fake's inventory",
        )
        await pilot.press("2")
        await until(
            pilot,
            lambda: app.screen.id == "doctor" and "A fake check" in text_of(app, "#doctor-detail"),
            "the fake's report",
        )
        await pilot.press("4")
        await until(pilot, lambda: app.screen.id == "runs", "runs screen")
        table = app.screen.query_one("#runs-table", DataTable)
        await until(pilot, lambda: table.row_count == 1, "the fake's one run")
        assert str(table.get_cell(fake.run_dir.name, "name")) == "from-the-fake"
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "monitor opened")
        await until(
            pilot, lambda: app.screen.status == "running", "the run read from its directory"
        )
        await pilot.press("s")
        await until(pilot, lambda: app.screen.id == "confirm", "asked before stopping")
        await pilot.press("y")
        await until(
            pilot, lambda: fake.stopped == [fake.run_dir], "the backend asked to stop the run"
        )


async def test_launch_plans_and_starts_through_the_backend(fake, tmp_path):
    """The form is checked against the backend's plan; Launch starts the run through it and
    shows the notice it returned (node 0's command for the other node, until that one joins)."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    fake.run_dir = tmp_path / "elsewhere" / "20260530-twonode"
    shutil.copytree(RUNS_FIXTURES / "20260530-twonode", fake.run_dir)
    run = json.loads((fake.run_dir / "run.json").read_text())
    run["ranks"] = [r for r in run["ranks"] if r["node"] == run["ranks"][0]["node"]]
    (fake.run_dir / "run.json").write_text(json.dumps(run))
    app = build_app(fake, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: app.screen.id == "launch", "launch screen")
        app.screen.query_one("#target", Input).value = "train.py"

        def verdict() -> str:
            return str(app.screen.query_one("#launch-validation", Static).render())

        await until(
            pilot,
            lambda: "3 process(es) per node on CUDA_VISIBLE_DEVICES=5" in verdict(),
            "the fake's plan: " + verdict(),
        )
        await pilot.press("ctrl+r")
        await until(
            pilot, lambda: isinstance(app.screen, MonitorScreen), "the started run's monitor"
        )
        assert [s.script for s in fake.started] == ["train.py"]
        # The run started on the plan the form showed as the key was pressed, not a new one.
        assert len(fake.started_plans) == 1 and fake.started_plans[0] is fake.plans[-1]
        assert app.screen.run_dir == fake.run_dir
        await until(pilot, lambda: app.screen.polls >= 2, "two polls")
        banner = app.screen.query_one("#notice-banner", Static)
        assert banner.display and "--node-rank 1 train.py" in str(banner.render())


async def test_exit_code_asks_the_backend_when_left_from_another_screen(fake):
    """run.json in the fixture says running (exit 0); the backend says failed: the backend wins."""
    app = build_app(
        fake, monitor_run_dir=fake.run_dir, attach_only=False, clock=lambda: NOW, poll_interval=0.2
    )
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "monitor")
        await pilot.press("escape")
        await until(pilot, lambda: app.screen.id == "gpus", "back on the GPUs screen")
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, "the app ended")
    assert exit_code(app) == 1


async def test_a_hang_shows_its_verdict_and_k_opens_the_chosen_rank_s_stacks(fake):
    with open(fake.run_dir / "events.jsonl", "a", encoding="utf-8") as fh:
        hang = {
            "t": NOW - 5,
            "kind": "hang",
            "rank": None,
            "ranks": [1],
            "stacks": "stacks/1.json",
            "message": "ranks 0,2,3 wait in all_reduce #12 for rank 1, in load_batch at data.py:88",
        }
        fh.write(json.dumps(hang) + "\n")
    app = build_app(
        fake, monitor_run_dir=fake.run_dir, attach_only=True, clock=lambda: NOW, poll_interval=0.2
    )
    async with app.run_test(size=SIZE) as pilot:
        await until(
            pilot,
            lambda: isinstance(app.screen, MonitorScreen) and app.screen.status == "running",
            "monitor",
        )
        banner = app.screen.query_one("#verdict-banner")
        await until(
            pilot,
            lambda: (
                banner.display and "for rank 1, in load_batch at data.py:88" in str(banner.render())
            ),
            "the verdict banner",
        )
        await pilot.press("k")
        await until(pilot, lambda: app.screen.id == "stacks", "the stacks screen")
        text = app.screen.query_one("#stacks-text")
        await until(
            pilot, lambda: "train.py:41 in load_batch" in str(text.render()), "the rank's frames"
        )
        chosen = app.screen_stack[-2].query_one("#rank-table").current_rank
        # The whole run is asked, the chosen rank shown under the whole run's verdict.
        assert fake.asked_stacks == [fake.run_dir]
        assert f"pid {4240 + chosen}" in str(
            text.render()
        ) and "verdict (all 2 ranks): the others wait for rank 1" in str(text.render())
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "back to the monitor")
